"""The sparse MoE block's C++ backend: the model's own router (the same ops, so the same experts are chosen), then
every chosen expert's gated MLP over its tokens in one call into kernel_library/sparse_moe/moe.cpp, whose experts'
weights are packed once into the small-M GEMMs' panels."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch

from kernelbot.kernel_library.cpp_wrapper import CppWrapper, Pack
from kernelbot.kernel_library.linear.cpp import bf16_path, pack_panels, pack_panels_bf16
from kernelbot.kernel_library.sparse_moe.reference import Model

SOURCE = Path(__file__).with_name("moe.cpp")


@functools.cache
def per_expert(pack: Pack, halves: int) -> Pack:
    """A packer of [E, halves * N, K] stacked weights -> each expert's panels stacked [E, ...]; with two halves (gate
    rows, then up rows) the panels interleave them, as the gated kernels take them. Cached: one packer per kind, so
    PackedWeights sees the same packer and keeps its panels."""
    return lambda ws: torch.stack([pack(list(expert.chunk(halves, dim=0))) for expert in ws[0].detach()])


class SparseMoeCpp(CppWrapper, Model):
    SOURCE = SOURCE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bound(x.dtype)(x)

    def bound(self, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
        """forward for inputs of this dtype, with every expert's weights packed once: the engine's hot path."""
        ext, grain = self._ext, self.CONFIG["grain"]
        experts = self.experts
        inter, hidden = experts.down_proj.shape[-1], experts.down_proj.shape[-2]
        pack = pack_panels_bf16 if bf16_path(ext, dtype) else pack_panels
        gate_up = self.packed("gate_up", [experts.gate_up_proj], per_expert(pack, 2))
        down = self.packed("down", [experts.down_proj], per_expert(pack, 1))

        def run(x: torch.Tensor) -> torch.Tensor:
            rows = x.reshape(-1, hidden).contiguous()
            weights, index = self.route(rows)
            out = ext.moe_experts(rows, index.contiguous(), weights.contiguous(), gate_up, down, inter, grain)
            return out.to(x.dtype).view(x.shape)
        return run
