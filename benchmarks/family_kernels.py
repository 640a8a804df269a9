"""Each family's C++ kernel vs its PyTorch reference at the default model's decode shapes, in fp32 or bf16
(`python benchmarks/family_kernels.py [--dtype bfloat16] [--rounds N]`)."""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import torch

from kernelbot.agent.verify.cases import overrides
from kernelbot.agent.verify.run import load_reference
from kernelbot.kernel_library import FAMILIES

WEIGHTED = ("rmsnorm", "linear", "gated_mlp")  # their last init arg is the weights' dtype
CASES = {  # family -> (init args, input shapes): llama-tiny at decode, batch 8
    "rmsnorm": ([512, 1e-6], [[8, 1, 512]]),
    "linear": ([512, 512, False], [[8, 1, 512]]),
    "gated_mlp": ([512, 1376], [[8, 1, 512]]),
    "silu_and_mul": ([], [[8, 1, 2 * 1376]]),  # SGLang's activation between gate_up and down
    # SGLang's RotaryEmbedding: 8 heads of 64, positions, query, key
    "rotary_embedding": ([64, 64, 2048, 10000.0, True, "float32"], [[8], [8, 512], [8, 512]]),
}


def per_call_us(fn, xs, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn(*xs)
    return (time.perf_counter() - t0) / iters * 1e6


def main(rounds: int = 15, dtype: str = "float32") -> None:
    torch.manual_seed(0)
    for name, (init, shapes) in CASES.items():
        family = FAMILIES[name]
        if dtype not in family.dtypes["cpp"]:
            print(f"{name:16s} no {dtype} C++ kernel")
            continue
        init = [*init, dtype] if name in WEIGHTED else init
        source = load_reference(family.reference_path)
        reference = source.Model(*init).eval()
        module, cls = family.wrappers["cpp"].split(":")
        kernel = getattr(importlib.import_module(f"kernelbot.kernel_library.{name}.{module}"), cls)(*init).eval()
        kernel.load_state_dict(reference.state_dict())
        if hasattr(source, "get_inputs"):  # inputs that are not all random floats (positions)
            with overrides(source, {"INPUT_SHAPES": shapes, "INIT_ARGS": init, "DTYPE": getattr(torch, dtype)}):
                x = source.get_inputs()
        else:
            x = [torch.randn(s).to(getattr(torch, dtype)) for s in shapes]
        with torch.inference_mode():
            for m in (reference, kernel):
                for _ in range(5):
                    m(*x)
            iters = max(1, int(0.01 / (per_call_us(reference, x, 3) / 1e6)))
            ref_t, new_t = [], []
            for r in range(rounds):
                pair = [(ref_t, reference), (new_t, kernel)]
                for ts, m in pair if r % 2 == 0 else pair[::-1]:
                    ts.append(per_call_us(m, x, iters))
        ref, new = statistics.median(ref_t), statistics.median(new_t)
        print(f"{name:16s} {str(shapes):26s} {dtype} torch {ref:8.1f} us   kernelbot cpp {new:8.1f} us   "
              f"{ref / new:5.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    main(args.rounds, args.dtype)
