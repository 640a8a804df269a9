"""The library's C++ kernels against eager PyTorch at a Qwen2.5-0.5B shape's real sizes, bf16, with weights beyond
the caches: decode (batch 8) and prefill (8 x 512 tokens) rows of the projections, the gated MLP, the LM head at
decode, and attention over the KV cache at 512-2048-token contexts (decode) and over a 512-token prompt (prefill).

Each row: eager's and the kernel's time a call (median of interleaved rounds), the ratio, the roofline floor from
this CPU's peaks measured at bf16 (a 2048^3 bf16 GEMM and a 32 MiB copy), and each one's share of its floor.
Weights are cycled over enough copies of each module that a round's working set exceeds twice the last-level cache,
as a model's layers stream their weights from memory (a row whose weights fit anyway says so). Each side is called as
the model calls it: eager's attention concatenates its cache (transformers' DynamicLayer), the kernel's `step`
appends into a cache with room (kv_with_room), each copy of the module with a cache of its own.

    python benchmarks/real_scale_kernels.py [--rounds 7] [--smallest]

--smallest: llama-micro's sizes, two rounds (a smoke run of this script, not a measurement). Nothing else should run
meanwhile: the figures are timings.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from kernelbot.agent.verify.cases import overrides
from kernelbot.agent.verify.run import load_reference
from kernelbot.dtypes import DTYPE_BYTES
from kernelbot.hardware import host
from kernelbot.hardware.peaks import measure_cpu
from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.decode_attention.cache import kv_with_room

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 896, 4864, 14, 2, 64, 151936  # Qwen2.5-0.5B
BATCH, PROMPT = 8, 512


def cases(smallest: bool) -> list[tuple[str, str, list[Any], list[list[int]]]]:
    """(label, family, init args, input shapes) at the real sizes (or llama-micro's)."""
    hidden, inter, heads, kv, d, vocab, batch, prompt = (
        (128, 344, 4, 2, 32, 512, 2, 16) if smallest else (HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB, BATCH,
                                                           PROMPT))
    contexts = (prompt,) if smallest else (512, 1024, 2048)
    attention = [hidden, heads, kv, d, True]
    out = [(f"o_proj, {rows}", "linear", [hidden, hidden, False], [[batch, t, hidden]])
           for rows, t in (("decode", 1), ("prefill", prompt))]
    out += [(f"gated MLP, {rows}", "gated_mlp", [hidden, inter], [[batch, t, hidden]])
            for rows, t in (("decode", 1), ("prefill", prompt))]
    out.append(("LM head, decode", "linear", [hidden, vocab, False], [[batch, 1, hidden]]))
    out += [(f"attention, decode over {c}", "decode_attention", attention,
             [[batch, 1, hidden], [1, 1, d], [1, 1, d], [batch, kv, c, d], [batch, kv, c, d]]) for c in contexts]
    out.append((f"attention, prefill of {prompt}", "decode_attention", attention,
                [[batch, prompt, hidden], [1, prompt, d], [1, prompt, d], [batch, kv, 0, d], [batch, kv, 0, d]]))
    return out


def modules(family: str, init: list[Any], copies: int) -> tuple[list[torch.nn.Module], list[torch.nn.Module]]:
    """`copies` pairs of (eager reference, kernel) with the same weights in each pair."""
    fam = FAMILIES[family]
    source = load_reference(fam.reference_path)
    module, cls = fam.wrappers["cpp"].split(":")
    wrapper = getattr(importlib.import_module(f"kernelbot.kernel_library.{family}.{module}"), cls)
    refs, kernels = [], []
    for _ in range(copies):
        ref = source.Model(*init, "bfloat16").eval()
        kernel = wrapper(*init, "bfloat16").eval()
        kernel.load_state_dict(ref.state_dict())
        refs.append(ref)
        kernels.append(kernel)
    return refs, kernels


def inputs(family: str, init: list[Any], shapes: list[list[int]]) -> list[Any]:
    source = load_reference(FAMILIES[family].reference_path)
    if hasattr(source, "get_inputs"):
        with overrides(source, {"INPUT_SHAPES": shapes, "INIT_ARGS": [*init, "bfloat16"], "DTYPE": torch.bfloat16}):
            return source.get_inputs()
    return [torch.randn(s).bfloat16() for s in shapes]


def as_in_the_model(family: str, kernels: list[torch.nn.Module], x: list[Any]) -> list[Callable[[], Any]]:
    """Each kernel called as the model calls it: an attention's step appending the new token into a cache of its own
    with room, holding x's past (the pure form would copy the whole cache every call); any other, its forward."""
    if family != "decode_attention":
        return [functools.partial(k, *x) for k in kernels]
    hidden, cos, sin, past_key, past_value = x
    past = past_key.shape[2]
    calls = []
    for kernel in kernels:
        key_cache, value_cache = kv_with_room(past_key.clone(), past_value.clone(), hidden.shape[1])
        step = kernel.bound(hidden.dtype).step
        calls.append(functools.partial(step, hidden, cos, sin, key_cache, value_cache, past))
    return calls


def per_call_us(calls: list[Callable[[], Any]], n: int) -> float:
    """n calls cycling over `calls` (each a different copy of the weights)."""
    start = time.perf_counter()
    for i in range(n):
        calls[i % len(calls)]()
    return (time.perf_counter() - start) / n * 1e6


def time_pair(family: str, refs: list[torch.nn.Module], kernels: list[torch.nn.Module], x: list[Any], rounds: int
              ) -> tuple[float, float]:
    with torch.inference_mode():
        ref_calls = [functools.partial(r, *x) for r in refs]
        kernel_calls = as_in_the_model(family, kernels, x)
        for call in ref_calls + kernel_calls:  # warm: the kernels pack their weights on their first call
            call()
        n = max(len(refs), int(0.05 / max(per_call_us(ref_calls, len(refs)) / 1e6, 1e-7)))
        ref_t, ker_t = [], []
        for r in range(rounds):
            pair = [(ref_t, ref_calls), (ker_t, kernel_calls)]
            for ts, calls in pair if r % 2 == 0 else pair[::-1]:
                ts.append(per_call_us(calls, n))
    return statistics.median(ref_t), statistics.median(ker_t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--smallest", action="store_true")
    args = parser.parse_args()
    rounds = 2 if args.smallest else args.rounds
    torch.manual_seed(0)
    device = measure_cpu("bfloat16")
    llc = host.last_level_cache_bytes()
    start = host.sample()
    print(f"{device.name}, {device.threads} threads; peaks {device.peak_gflops} GFLOP/s, {device.peak_gbps} GB/s "
          f"({device.peaks_source}); last-level cache {llc >> 20} MiB")
    print("| kernel | shapes | weights MiB x copies | eager µs | kernelbot µs | ratio | floor µs | eager of floor | "
          "kernelbot of floor |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, family, init, shapes in cases(args.smallest):
        fam = FAMILIES[family]
        weight_bytes = _state_bytes(family, init)
        copies = max(1, min(64, -(-2 * llc // max(weight_bytes, 1))))
        refs, kernels = modules(family, init, copies)
        x = inputs(family, init, shapes)
        eager_us, kernel_us = time_pair(family, refs, kernels, x, rounds)
        floor = device.floor_us(*fam.cost(cost_dims(family, init, shapes), DTYPE_BYTES["bfloat16"]))
        fits = " (fits the cache)" if copies * weight_bytes < 2 * llc else ""
        print(f"| {label} | {shapes[0]} | {weight_bytes / 2**20:.1f} x {copies}{fits} | {eager_us:.1f} | "
              f"{kernel_us:.1f} | {eager_us / kernel_us:.2f}x | {floor:.1f} | {floor / eager_us:.0%} | "
              f"{floor / kernel_us:.0%} |", flush=True)
        del refs, kernels
    load = host.host_load(since=start)
    print(f"host over the run: {load.summary()}")


def cost_dims(family: str, init: list[Any], shapes: list[list[int]]) -> list[list[int]]:
    """The dims each family's cost reads: the inputs, then the weight its first op multiplies by."""
    if family == "linear":
        return [*shapes, [init[1], init[0]]]
    if family == "gated_mlp":
        return [*shapes, [init[1], init[0]]]
    hidden, heads, _, d = init[:4]
    return [*shapes, [heads * d, hidden]]  # decode attention: q_proj's weight gives heads x head_dim


def _state_bytes(family: str, init: list[Any]) -> int:
    refs, _ = modules(family, init, 1)
    return sum(t.numel() * t.element_size() for t in refs[0].state_dict().values())


if __name__ == "__main__":
    main()
