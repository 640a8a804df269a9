"""The one timing protocol for a callable on a device, and the telemetry that says whether the numbers can be trusted.

`timed_call` (hardware/device.py, beside the stopwatches; the sandboxed benchmark uses it too): one call of
the protocol, for whatever times calls one at a time: the L2 flush queued first (on a GPU), then the call between the
device's own stopwatch marks (device events on a GPU: the kernels' time, not their launch and a host synchronisation).

`time_callable`: a few warm-up calls, then N timed calls. Each call gets the next input set of a pool, cycled, so no
call sees the inputs the call before it saw (nothing can be cached between calls); each call's output goes to a check
callback, so a callable cannot be fast by being wrong on some calls; on a GPU a buffer larger than the L2 is written
before each timed call, so every call starts cold. Each call is timed alone, by device events on a GPU and
perf_counter_ns on a CPU (hardware/device.py). The record holds every call's time, the median, quartiles and
spread, and the host's load (hardware/host.py) and the GPU's clocks, temperature, throttling and other
processes (NVML) before and after.

`compare`: a gain is claimed only beyond the measured noise (the interquartile ranges do not overlap).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, Field

from kernelbot import KernelbotError
from kernelbot.hardware import host
from kernelbot.hardware.device import DeviceChoice, GpuState, timed_call

Check = Callable[[int, Any], str | None]  # (input set index, output) → None when right, else what is wrong


class WrongOutputError(RuntimeError):
    """A call's output failed the check: the timing is refused, with the call and input set that failed."""

    def __init__(self, call: str, input_set: int, problem: str) -> None:
        super().__init__(f"{call} (input set {input_set}): {problem}")
        self.call, self.input_set, self.problem = call, input_set, problem


class Telemetry(BaseModel):
    """What else was going on: the host's load, and on a GPU its NVML state."""

    host: host.HostLoad
    gpu: GpuState | None = None  # None on a CPU
    contended: bool
    notes: list[str] = Field(default_factory=list)


class Timing(BaseModel):
    device: str
    clock: str  # "device events" or "perf_counter_ns"
    warmup: int
    calls: int
    input_sets: int
    input_order: list[int]  # the input set each timed call got
    l2_flushed: bool
    per_call_us: list[float]
    median_us: float
    p25_us: float
    p75_us: float
    min_us: float
    spread: float  # (p75 - p25) / median
    before: Telemetry
    after: Telemetry

    @property
    def contended(self) -> bool:
        return self.before.contended or self.after.contended


class Gain(BaseModel):
    speedup: float  # reference median / candidate median
    noise: float  # the larger of the two spreads
    beyond_noise: bool  # faster, with the interquartile ranges apart
    contended: bool  # either timing was taken on a busy host or a shared GPU
    note: str = ""


def quantile(xs: Sequence[float], q: float) -> float:
    """The q-quantile (0 < q < 1) by linear interpolation; the value itself for one sample."""
    if len(xs) == 1:
        return float(xs[0])
    return statistics.quantiles(xs, n=100, method="inclusive")[round(q * 100) - 1]


def telemetry(device: DeviceChoice, since: host.ProcSample | None = None) -> Telemetry:
    load = host.host_load(since)
    gpu = device.gpu_state(host.own_tree(_parents(), os.getpid())) if device.is_gpu else None
    notes = []
    if load.contended:
        notes.append(f"host busy: {load.summary()}")
    shared = bool(gpu and gpu.other_processes)
    if shared:
        notes.append(f"other processes on the GPU: {gpu.other_processes}")
    if gpu is not None and not gpu.available:
        notes.append(f"GPU state unknown: {gpu.note}")
    if gpu is not None and gpu.throttled:
        notes.append(f"GPU clocks held down: {', '.join(gpu.throttle_reasons)}")
    return Telemetry(host=load, gpu=gpu, contended=load.contended or shared, notes=notes)


def _parents() -> dict[int, int]:
    snap = host.sample()
    return snap.parents if snap else {}


def time_callable(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], device: DeviceChoice, *,
                  check: Check, calls: int = 20, warmup: int = 3, flush_l2: bool = True) -> Timing:
    """Time fn(*input_sets[k]) over `calls` calls after `warmup` untimed ones, k cycling through the pool."""
    if len(input_sets) < 2:
        raise KernelbotError(f"timing needs at least 2 input sets to cycle through (got {len(input_sets)}), so that "
                             "no call sees the inputs of the call before it")
    if calls < 1 or warmup < 0:
        raise KernelbotError(f"timing needs at least 1 timed call and no negative warm-up (got {calls}, {warmup})")
    flush = device.l2_flusher() if flush_l2 else None
    for i in range(warmup):
        _checked(fn, input_sets, i, check, f"warm-up call {i + 1}")
    device.synchronize()
    before = telemetry(device)
    start = host.sample()
    order, times = [], []
    for c in range(calls):
        k = (warmup + c) % len(input_sets)
        us, out = timed_call(fn, input_sets[k], device.stopwatch(), flush)
        times.append(us)
        order.append(k)
        _verify(check, k, out, f"timed call {c + 1}")
    after = telemetry(device, start)
    med = statistics.median(times)
    p25, p75 = quantile(times, 0.25), quantile(times, 0.75)
    return Timing(device=device.spec, clock=device.clock, warmup=warmup, calls=calls, input_sets=len(input_sets),
                  input_order=order, l2_flushed=flush is not None, per_call_us=[round(t, 3) for t in times],
                  median_us=round(med, 3), p25_us=round(p25, 3), p75_us=round(p75, 3), min_us=round(min(times), 3),
                  spread=round((p75 - p25) / med, 4) if med > 0 else 0.0, before=before, after=after)


def _checked(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], k: int, check: Check, label: str) -> None:
    k %= len(input_sets)
    _verify(check, k, fn(*input_sets[k]), label)


def _verify(check: Check, k: int, out: Any, label: str) -> None:
    problem = check(k, out)
    if problem:
        raise WrongOutputError(label, k, problem)


def time_once(fn: Callable[[], Any], device: DeviceChoice) -> float:
    """One call's time in ms, the device idle before it and done after it (end-to-end runs)."""
    device.synchronize()
    watch = device.stopwatch()
    watch.start()
    fn()
    watch.stop()
    return watch.elapsed_ns() / 1e6


def compare(reference: Timing, candidate: Timing) -> Gain:
    """The candidate's speedup over the reference, claimed only when their interquartile ranges are apart."""
    speedup = reference.median_us / candidate.median_us if candidate.median_us > 0 else float("inf")
    contended = reference.contended or candidate.contended
    notes = [n for t in (reference, candidate) for n in t.before.notes + t.after.notes]
    return Gain(speedup=round(speedup, 4), noise=max(reference.spread, candidate.spread),
                beyond_noise=candidate.p75_us < reference.p25_us, contended=contended,
                note="; ".join(dict.fromkeys(notes)))

