"""The device a run measures on, with its peaks: measured on a CPU, from a table on GPUs."""

from __future__ import annotations

import platform
import time

import torch

from kernelbot.records import Device


def _best_seconds(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def cpu_model_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def measure_cpu() -> Device:
    """Peak fp32 GEMM throughput and streaming bandwidth of this CPU, measured now (about 0.3 s)."""
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    gflops = 2 * n**3 / _best_seconds(lambda: a @ b) / 1e9
    src = torch.randn(32 * 1024 * 1024 // 4)
    dst = torch.empty_like(src)
    gbps = 2 * src.numel() * 4 / _best_seconds(lambda: dst.copy_(src)) / 1e9
    return Device(kind="cpu", name=cpu_model_name(), threads=torch.get_num_threads(),
                  peak_gflops=round(gflops, 1), peak_gbps=round(gbps, 1),
                  peaks_source="measured on this machine: 1024^3 fp32 GEMM, 32 MiB copy")
