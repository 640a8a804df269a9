"""The device a run measures on, with its peaks: measured on the device itself (a GEMM and a copy), on a CPU and on a
GPU alike. On a GPU the datasheet table (datasheet.py) is a cross-check beside the measurement, not its source, so a
GPU the table does not know still gets a roofline; peaks given on the command line replace both."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel

from kernelbot import KernelbotError
from kernelbot.hardware.device import cpu_model_name
from kernelbot.hardware.host import last_level_cache_bytes
from kernelbot.records import Device, Hotspot

if TYPE_CHECKING:
    from kernelbot.hardware.device import DeviceChoice

REPEATS = 5  # timed runs of each measurement after one untimed; the best counts
# (GEMM side, copy bytes): large enough that launch and timer overheads vanish, small enough to take under a second.
# A CPU's copy is at least CACHES_OVER times its last-level cache: a 32 MiB copy on a 32 MiB L3 measured 39 to 100
# GB/s from run to run on one host, whose memory streams 35-37 GB/s (a 256 MiB copy or sum).
CPU_SIZES = (2048, 32 << 20)
CACHES_OVER = 4
GPU_SIZES = (8192, 1 << 30)
# measured / datasheet outside this band: the table's row is for another SKU, or the GPU is throttled or shared
AGREE = (0.5, 1.1)


class PeakOverride(BaseModel):
    """Peaks given on the command line (--peak-tflops, --peak-gbps); either may be left to the measurement."""

    tflops: float | None = None
    gbps: float | None = None

    def check(self) -> None:
        for name, value in (("--peak-tflops", self.tflops), ("--peak-gbps", self.gbps)):
            if value is not None and not value > 0:
                raise KernelbotError(f"{name} {value}: a peak must be a positive number (TFLOP/s, GB/s)")


def best_seconds(fn: Callable[[], Any], device: DeviceChoice, repeats: int = REPEATS) -> float:
    """The fastest of `repeats` runs of fn after one untimed run, each timed by the device's own stopwatch (events
    on a GPU, perf_counter_ns on a CPU)."""
    fn()
    device.synchronize()
    best = float("inf")
    for _ in range(repeats):
        watch = device.stopwatch()
        watch.start()
        fn()
        watch.stop()
        best = min(best, watch.elapsed_ns() / 1e9)
    return best


def measure_peaks(device: DeviceChoice, dtype: torch.dtype, side: int, copy_bytes: int) -> tuple[float, float]:
    """(GFLOP/s of a side×side×side GEMM in dtype on random data, GB/s of a copy counting bytes read and written)."""
    return _gemm_gflops(device, dtype, side), _copy_gbps(device, copy_bytes)


def _gemm_gflops(device: DeviceChoice, dtype: torch.dtype, side: int) -> float:
    a, b = (torch.randn(side, side, device=device.torch_device).to(dtype) for _ in range(2))
    return 2 * side**3 / best_seconds(lambda: a @ b, device) / 1e9


def _copy_gbps(device: DeviceChoice, copy_bytes: int) -> float:
    src = torch.randn(copy_bytes // 4, device=device.torch_device)
    dst = torch.empty_like(src)
    return 2 * copy_bytes / best_seconds(lambda: dst.copy_(src), device) / 1e9


def measure_cpu(dtype: str = "float32") -> Device:
    """This CPU's peak GEMM throughput at the run's dtype (a bf16 GEMM runs on the matrix engine, AMX or
    AVX-512-BF16, several times an fp32 one's) and its streaming bandwidth, measured now (under a second)."""
    from kernelbot.hardware.device import cpu_device

    side, copy_bytes = CPU_SIZES[0], max(CPU_SIZES[1], CACHES_OVER * last_level_cache_bytes())
    gflops, gbps = measure_peaks(cpu_device(), getattr(torch, dtype), side, copy_bytes)
    return Device(kind="cpu", name=cpu_model_name(), threads=torch.get_num_threads(),
                  peak_gflops=round(gflops, 1), peak_gbps=round(gbps, 1),
                  peaks_source=f"measured on this machine: {side}^3 {dtype} GEMM, {copy_bytes >> 20} MiB copy")


def measure_cpu_on(cores: list[int], dtype: str) -> Device:
    """measure_cpu with this thread bound to `cores` and torch's threads as many: the peaks of the cores an engine
    binds its worker to (vLLM gives it all but one on a small host), where every kernel of a served model runs."""
    import os

    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(len(cores))
        measured = measure_cpu(dtype)
    finally:
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)
    return measured.model_copy(update={"peaks_source": f"{measured.peaks_source}, on the {len(cores)} of "
                                                       f"{len(affinity)} cores the engine binds its worker to "
                                                       f"({','.join(map(str, cores))})"})


def on_worker_cores(device: Device, cores: list[int], dtype: str, override: PeakOverride | None) -> Device:
    """A CPU run's device as a served engine's worker has it: the peaks measured again on the worker's `cores` where
    the engine binds it to fewer cores than the run measured on (the command line's peaks still win); else as it
    is."""
    if device.kind != "cpu" or not cores or len(cores) >= device.threads:
        return device
    worker = with_override(measure_cpu_on(cores, dtype), override)
    return worker.model_copy(update={"notes": [
        *device.notes, f"peaks measured again on the engine's worker's {len(cores)} of {device.threads} cores, where "
                       f"every kernel of the served model runs: {device.peak_gflops} → {worker.peak_gflops} GFLOP/s, "
                       f"{device.peak_gbps} → {worker.peak_gbps} GB/s"]})


def measure_gpu(device: DeviceChoice, dtype: str) -> Device:
    """A GPU's peaks at the run's dtype, measured on it now (about a second), beside the datasheet's where the table
    knows the GPU; its multiprocessors are the record's threads."""
    side, copy_bytes = GPU_SIZES
    gflops, gbps = measure_peaks(device, getattr(torch, dtype), side, copy_bytes)
    device.empty_cache()
    sms = torch.cuda.get_device_properties(device.index).multi_processor_count
    return Device(kind=device.kind, name=device.name, threads=sms, peak_gflops=round(gflops, 1),
                  peak_gbps=round(gbps, 1), notes=datasheet_notes(device.name, dtype, gflops, gbps),
                  peaks_source=f"measured on this GPU: {side}^3 {dtype} GEMM on random data, {copy_bytes >> 20} MiB "
                               "copy")


def datasheet_notes(name: str, dtype: str, gflops: float, gbps: float) -> list[str]:
    """The table's row for this GPU beside the measurement, and a warning where the two disagree."""
    from kernelbot.hardware.datasheet import lookup

    row = lookup([{"name": name}])
    if row is None:
        return [f"{name} is not in the datasheet table (hardware/datasheet.py): measured peaks only"]
    ratios = {"GEMM": gflops / (row.tflops(dtype) * 1e3), "copy": gbps / row.gbps}
    notes = [f"datasheet ({row.source}): {row.tflops(dtype)} TFLOP/s {dtype}, {row.gbps} GB/s; measured "
             + ", ".join(f"{what} {ratio:.0%} of it" for what, ratio in ratios.items())]
    off = [what for what, ratio in ratios.items() if not AGREE[0] <= ratio <= AGREE[1]]
    if off:
        notes.append(f"measured {' and '.join(off)} outside {AGREE[0]:.0%}–{AGREE[1]:.0%} of the datasheet: the "
                     "table's row may be another SKU, or the GPU was throttled or shared while measured")
    return notes


def with_override(device: Device, override: PeakOverride | None) -> Device:
    """The record with the peaks given on the command line in place of the measured ones."""
    if override is None or (override.tflops is None and override.gbps is None):
        return device
    override.check()
    given = [f"{v} {unit}" for v, unit in ((override.tflops, "TFLOP/s"), (override.gbps, "GB/s")) if v is not None]
    return device.model_copy(update={
        "peak_gflops": device.peak_gflops if override.tflops is None else override.tflops * 1e3,
        "peak_gbps": device.peak_gbps if override.gbps is None else override.gbps,
        "peaks_source": f"{', '.join(given)} given on the command line; otherwise {device.peaks_source}",
        "notes": [*device.notes, f"measured: {device.peak_gflops} GFLOP/s, {device.peak_gbps} GB/s"]})


def with_attained(device: Device, hotspots: list[Hotspot]) -> Device:
    """The device with its peaks raised to what a profiled hotspot attained, where one did better than the
    microbenchmark (peaks measured while the host was busy come out low, and would put floors above measured times:
    the memory-bound work would seem to have no headroom); the record itself where none did."""
    gflops = max((h.flops * h.calls / (h.total_us * 1e3) for h in hotspots if h.family and h.total_us > 0), default=0.0)
    gbps = max((h.bytes * h.calls / (h.total_us * 1e3) for h in hotspots if h.family and h.total_us > 0), default=0.0)
    raised = {}
    if gflops > device.peak_gflops:
        raised["peak_gflops"] = math.ceil(gflops * 10) / 10  # up: no floor above the time that attained it
    if gbps > device.peak_gbps:
        raised["peak_gbps"] = math.ceil(gbps * 10) / 10
    if not raised:
        return device
    what = ", ".join(f"{k.removeprefix('peak_')} {device.model_dump()[k]} → {v}" for k, v in raised.items())
    return device.model_copy(update={**raised, "notes": [
        *device.notes, f"peaks raised to what the profiled work attained ({what}): the measurement came out low "
                       "(a busy host?), and floors above measured times would hide the headroom"]})


def device_record(device: DeviceChoice, dtype: str, override: PeakOverride | None = None) -> Device:
    """The run's Device record: peaks measured on the device at the run's dtype, with the command line's in their
    place where given."""
    measured = measure_gpu(device, dtype) if device.is_gpu else measure_cpu(dtype)
    return with_override(measured, override)
