"""Run by tests/test_sglang_plugin.py under the SGLang test environment's python (.ci/sglang_env.sh).

Spawns one process per TP rank the way SGLang starts its schedulers (multiprocessing, spawn context,
a gloo process group); each calls SGLang's own `load_plugins()` first thing, then builds SGLang layers
and runs them on the CPU. A control process with the plugin not allowlisted runs the same layers.
Writes what it saw to the JSON file named on the command line.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys


def _torchvision_ops() -> None:
    # PyPI's torchvision 0.28 is built for CUDA torch: its C++ ops cannot load on the CPU wheel, and its
    # import then registers fake kernels for two ops that do not exist. Declaring their schemas lets it
    # import; sglang imports it only for multimodal preprocessing, which nothing here runs.
    import torch

    for op in ("nms", "qnms"):
        torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def rank_main(rank: int, world: int, port: int, spec: dict, queue) -> None:
    try:
        queue.put((rank, _rank_main(rank, world, port, spec)))
    except BaseException as exc:  # report, do not hang the parent
        import traceback

        queue.put((rank, {"error": f"{exc!r}\n{traceback.format_exc()}"}))


def _rank_main(rank: int, world: int, port: int, spec: dict) -> dict:
    import torch

    _torchvision_ops()
    if rank < 0:
        os.environ["SGLANG_PLUGINS"] = "some_other_plugin"  # the control: kernelbot's plugin not allowlisted
    from sglang.srt.plugins import load_plugins

    load_plugins()  # as SGLang's scheduler does, before any model code runs
    if rank >= 0:
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                             world_size=world)
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.rotary_embedding.base import LinearScalingRotaryEmbedding, RotaryEmbedding

    torch.manual_seed(rank + 1)
    hidden, eps = spec["hidden"], spec["eps"]
    out: dict = {"hooked": all(hasattr(c.forward, "__wrapped__") for c in (RMSNorm, SiluAndMul, RotaryEmbedding)),
                 "max_diff": {}}

    def check(name: str, layer: torch.nn.Module, *args, **kwargs) -> None:
        got = layer(*args, **kwargs)
        want = layer.forward_native(*args, **kwargs)  # SGLang's own path, which the hook does not touch
        pairs = zip(got, want, strict=True) if isinstance(got, tuple) else [(got, want)]
        out["max_diff"][name] = max(float((g.float() - w.float()).abs().max()) for g, w in pairs)

    norm = RMSNorm(hidden, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(hidden) + 0.5)
        for i in range(rank + 1):  # rank r makes r+1 calls the pack covers: counts must tell ranks apart
            check(f"pack_fp32_{i}", norm, torch.randn(*spec["fp32_shape"]))
        check("pack_fp32_fewer_rows", norm, torch.randn(4, hidden))  # rows vary by batch: fewer are covered
        check("more_rows", norm, torch.randn(7, hidden))
        check("pack_fp32_residual", norm, torch.randn(*spec["fp32_shape"]), torch.randn(*spec["fp32_shape"]))
        llama_style = RMSNorm(hidden, eps=eps, cast_x_before_out_mul=True).to(torch.bfloat16)
        llama_style.weight.copy_(torch.rand(hidden) + 0.5)
        check("pack_bf16", llama_style, torch.randn(*spec["bf16_shape"]).to(torch.bfloat16))
        default_bf16 = RMSNorm(hidden, eps=eps).to(torch.bfloat16)
        check("numerics_bf16", default_bf16, torch.randn(*spec["bf16_shape"]).to(torch.bfloat16))
        bf16_pair = [torch.randn(*spec["bf16_shape"]).to(torch.bfloat16) for _ in range(2)]
        check("residual_bf16", llama_style, *bf16_pair)
        norm.enter_torch_compile(num_tokens=4)
        check("torch_compile", norm, torch.randn(*spec["fp32_shape"]))
        norm.leave_torch_compile()

        class OwnNorm(RMSNorm):  # a subclass computing something else: the kernel was not verified against it
            def forward_native(self, x, *args, **kwargs):
                return super().forward_native(x, *args, **kwargs) * 2

        own = OwnNorm(hidden, eps=eps)
        check("own_numerics", own, torch.randn(*spec["fp32_shape"]))
        silu = SiluAndMul()
        check("pack_fp32_silu", silu, torch.randn(3, spec["silu_width"]))
        check("silu_more_rows", silu, torch.randn(9, spec["silu_width"]))
        check("silu_other_width", silu, torch.randn(3, 16))

        rope = spec["rope"]
        head, q_width, k_width = rope["head"], rope["q_heads"] * rope["head"], rope["kv_heads"] * rope["head"]
        args = (head, head, rope["max_pos"], rope["base"], True)

        def qkv(tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            # as SGLang's attention calls it: q and k are column slices of one qkv projection
            fused = torch.randn(tokens, q_width + 2 * k_width)
            positions = torch.randint(0, rope["max_pos"], (tokens,))
            return positions, fused[:, :q_width], fused[:, q_width:q_width + k_width]

        rotary = RotaryEmbedding(*args, torch.float32)
        check("pack_fp32_rope", rotary, *qkv(rope["tokens"]))
        check("pack_fp32_rope_fewer_rows", rotary, *qkv(1))
        check("rope_more_rows", rotary, *qkv(rope["tokens"] + 1))
        check("rope_offsets", rotary, *qkv(2), offsets=torch.ones(2, dtype=torch.long))
        check("rope_other_base", RotaryEmbedding(head, head, rope["max_pos"], 500000, True, torch.float32),
              *qkv(2))
        scaled = LinearScalingRotaryEmbedding(*args, 2.0, torch.float32)  # its own cache: other angles
        check("rope_scaled", scaled, *qkv(2))
    from kernelbot.engine import sglang_plugin

    sglang_plugin.flush()
    return out


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    os.environ.update({"SGLANG_PLUGINS": "kernelbot_pack", "KERNELBOT_PACK_DIR": spec["pack_dir"],
                       "KERNELBOT_COUNTS_DIR": spec["counts_dir"]})
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    ranks = [*range(spec["world"]), -1]
    procs = [ctx.Process(target=rank_main, args=(r, spec["world"], spec["port"], spec, queue)) for r in ranks]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    with open(spec["out"], "w") as f:
        json.dump({str(k): v for k, v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
