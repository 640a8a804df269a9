"""Decode attention over vLLM's paged KV cache at a Qwen2.5-0.5B shape (14 heads, 2 KV heads, head size 64, bf16,
8 sequences, 128-token blocks, vLLM's CPU "vec" layout) at 512-2048-token contexts: vLLM's own CPU kernel
(`cpu_attention_with_kv_cache`, the op a served pack kernel replaces), kernelbot's paged attention kernel, and the
family's PyTorch reference (what an optimize run's benchmark times the kernel against), each beside the roofline floor
(every sequence's keys and values read once, at this CPU's bandwidth measured at bf16).

Each timed call reads a different copy of the cache (enough copies that a round's working set is twice the
last-level cache), as a model's 24 layers stream theirs from memory, on as many threads (bound to as many cores) as
the served worker has: vLLM binds its worker to all cores but the one it leaves its frontend, one core on a 2-core
host. Timed on both cores, the earlier kernel won 1.65x (on one core 1.23x) where the engine measured 0.96x.

    .venv-vllm/bin/python benchmarks/served_attention.py [--rounds 7] [--threads N] [--smallest]

Needs vLLM's CPU build (.ci/vllm_env.sh). --smallest: one 256-token context, two rounds (a smoke run of this
script, not a measurement). Nothing else should run meanwhile: the figures are timings.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable

import torch

from kernelbot.hardware import host
from kernelbot.hardware.peaks import measure_cpu
from kernelbot.kernel_library.paged_attention.cpp import PagedAttentionCpp
from kernelbot.kernel_library.paged_attention.reference import Model

HEADS, KV_HEADS, HEAD_DIM, BLOCK, SEQS = 14, 2, 64, 128, 8  # Qwen2.5-0.5B; vLLM's CPU block size


def batch(context: int, copies: int) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor, torch.Tensor,
                                                torch.Tensor]:
    """A decode step's query, `copies` caches, and the metadata: each sequence at `context` tokens, its blocks
    scattered over the cache."""
    per_seq = math.ceil(context / BLOCK)
    blocks = SEQS * per_seq
    query = torch.randn(SEQS, HEADS, HEAD_DIM).bfloat16()
    caches = [torch.randn(blocks, KV_HEADS, BLOCK, 2 * HEAD_DIM).bfloat16() for _ in range(copies)]
    table = torch.randperm(blocks, dtype=torch.int32).reshape(SEQS, per_seq)
    lens = torch.full((SEQS,), context, dtype=torch.int32)
    starts = torch.arange(SEQS + 1, dtype=torch.int32)
    return query, caches, table, lens, starts


def vllm_call(query: torch.Tensor, table: torch.Tensor, lens: torch.Tensor, starts: torch.Tensor
              ) -> Callable[[torch.Tensor], torch.Tensor]:
    """vLLM's CPU attention as its backend calls it at decode (the scheduler metadata built once per step)."""
    from vllm import _custom_ops as ops

    meta = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=SEQS, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, seq_lens=lens, dtype=query.dtype,
        query_start_loc=starts, causal=True, sliding_window_size=-1, isa="vec",
        enable_kv_split=True)  # vLLM's default (VLLM_CPU_ATTN_SPLIT_KV)
    out = torch.empty_like(query)

    def run(cache: torch.Tensor) -> torch.Tensor:
        kv = cache.view(cache.shape[0], KV_HEADS, BLOCK * 2, HEAD_DIM)
        keys, values = kv.chunk(2, dim=2)
        ops.cpu_attention_with_kv_cache(
            query=query, key_cache=keys, value_cache=values, output=out, query_start_loc=starts, seq_lens=lens,
            scale=HEAD_DIM ** -0.5, causal=True, alibi_slopes=None, sliding_window=-1, block_table=table,
            softcap=0.0, scheduler_metadata=meta, s_aux=None)
        return out

    return run


def paged(module: torch.nn.Module, query: torch.Tensor, table: torch.Tensor, lens: torch.Tensor, starts: torch.Tensor
          ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The family's module (kernel or reference) on one cache."""
    return lambda cache: module(query, cache, table, lens, starts)


def per_call_us(run: Callable[[torch.Tensor], torch.Tensor], caches: list[torch.Tensor], calls: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        run(caches[i % len(caches)])
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=max(1, len(os.sched_getaffinity(0)) - 1),
                        help="threads, bound to the first as many cores (default: the served worker's, all but one)")
    parser.add_argument("--smallest", action="store_true")
    args = parser.parse_args()
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.threads])
    torch.set_num_threads(args.threads)
    rounds, contexts = (2, (256,)) if args.smallest else (args.rounds, (512, 1024, 2048))
    torch.manual_seed(0)
    device = measure_cpu("bfloat16")
    llc = host.last_level_cache_bytes()
    start = host.sample()
    print(f"{device.name}, {device.threads} threads; {device.peak_gbps} GB/s ({device.peaks_source}); last-level "
          f"cache {llc >> 20} MiB")
    print("| context | KV MiB x copies | vLLM µs | kernelbot µs | reference µs | kernelbot over vLLM | floor µs | "
          "vLLM of floor | kernelbot of floor |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    scale = HEAD_DIM ** -0.5
    kernel, reference = PagedAttentionCpp(HEADS, KV_HEADS, HEAD_DIM, scale), Model(HEADS, KV_HEADS, HEAD_DIM, scale)
    for context in contexts:
        kv_bytes = SEQS * context * KV_HEADS * 2 * HEAD_DIM * 2  # keys and values, bf16
        copies = max(2, min(64, -(-2 * llc // kv_bytes)))
        query, caches, table, lens, starts = batch(context, copies)
        runs = {"vllm": vllm_call(query, table, lens, starts), "kernelbot": paged(kernel, query, table, lens, starts),
                "reference": paged(reference, query, table, lens, starts)}
        want = reference(query, caches[0], table, lens, starts).float()
        for name, run in runs.items():  # each answers the same, before anything is timed
            error = float((run(caches[0]).float() - want).abs().max())
            assert error < 2e-2, f"{name} differs from the reference by {error:.3g} at context {context}"
        times: dict[str, list[float]] = {name: [] for name in runs}
        with torch.inference_mode():
            calls = max(copies, int(0.05 / max(per_call_us(runs["kernelbot"], caches, copies) / 1e6, 1e-7)))
            for r in range(rounds):
                order = list(runs) if r % 2 == 0 else list(runs)[::-1]
                for name in order:
                    n = calls if name != "reference" else max(2, calls // 20)  # the reference loops in Python
                    times[name].append(per_call_us(runs[name], caches, n))
        us = {name: statistics.median(t) for name, t in times.items()}
        floor = device.floor_us(0.0, kv_bytes)
        print(f"| {context} | {kv_bytes / 2**20:.1f} x {copies} | {us['vllm']:.1f} | {us['kernelbot']:.1f} | "
              f"{us['reference']:.1f} | {us['vllm'] / us['kernelbot']:.2f}x | {floor:.1f} | {floor / us['vllm']:.0%} | "
              f"{floor / us['kernelbot']:.0%} |", flush=True)
    print(f"host over the run: {host.host_load(since=start).summary()}")


if __name__ == "__main__":
    main()
