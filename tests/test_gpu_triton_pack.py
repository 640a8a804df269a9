"""A pack whose kernel is a Triton wrapper applies and runs: the engine binds a library kernel's hot path only where
the kernel has one (Triton wrappers have no `bound`), so the first pack with an accepted Triton kernel does not end
the run. Each Triton wrapper a transformers model routes is applied here and runs through Triton's interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelbot.engine import TorchEngine
from kernelbot.engine.models import resolve_spec
from kernelbot.kernel_library import FAMILIES
from kernelbot.records import Pack, PackEntry

# family → the module of llama-micro it replaces
ROUTED = {"rmsnorm": "model.norm", "linear": "lm_head", "gated_mlp": "model.layers.0.mlp",
          "decode_attention": "model.layers.0.self_attn"}


def _shapes(engine: TorchEngine, family: str) -> list[list[int]]:
    """The decode step's call, as the profile records it (for attention: hidden states, cos, sin and the cache)."""
    batch, hidden = engine.spec.batch, engine.spec.hidden or 0
    if family != "decode_attention":
        return [[batch, 1, hidden]]
    attention = engine.model.get_submodule(ROUTED[family])
    heads, d = attention.k_proj.out_features // attention.head_dim, attention.head_dim
    cached = engine.spec.prompt_len
    return [[batch, 1, hidden], [1, 1, d], [1, 1, d], [batch, heads, cached, d], [batch, heads, cached, d]]


def _triton_entry(engine: TorchEngine, family_name: str, pack_dir: Path) -> PackEntry:
    family = FAMILIES[family_name]
    module = engine.model.get_submodule(ROUTED[family_name])
    config = family.configs["triton"][0]
    (pack_dir / "kernels").mkdir(parents=True, exist_ok=True)
    (pack_dir / "kernels" / f"{family_name}.py").write_text(family.candidate_source("triton", config))
    return PackEntry(task_id=family_name, candidate_id=family_name, family=family_name,
                     module_class=type(module).__name__, input_shapes=_shapes(engine, family_name),
                     init_args=family.init_args(module), dtype=engine.spec.dtype, backend="triton", config=config,
                     source_file=f"kernels/{family_name}.py", source_hash="0", verification="pass", speedup=2.0)


@pytest.mark.parametrize("family", sorted(ROUTED))
def test_a_pack_with_a_triton_kernel_applies_and_its_kernel_runs(tmp_path: Path, family: str) -> None:
    assert "triton" in FAMILIES[family].wrappers
    spec, _ = resolve_spec("llama-micro", "float32", 2, 4, 1, 0)
    engine = TorchEngine(spec)
    expected = engine.run_workload()
    pack = Pack(version="v", run_id="r", device="cpu", entries=[_triton_entry(engine, family, tmp_path)])
    engine.apply_pack(pack, tmp_path)
    tokens = engine.run_workload()
    engine.remove_pack()
    assert engine.patcher.counts[family] > 0, "the Triton kernel was never called"
    assert torch.equal(tokens, expected)
