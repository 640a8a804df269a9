"""The device a run computes on, and everything the loop needs from it: the one place that names CUDA.

`pick_device("auto" | "cpu" | "cuda" | "cuda:N")` answers with a DeviceChoice; the rest of the loop asks it to
synchronise, empty its cache, flush its L2, time a stretch of work (device events on a GPU, perf_counter_ns on a
CPU) and read its state through NVML, and never spells the backend itself.

The clocks and synchronisation used for timing are bound when this module is imported, so code imported later (a
candidate kernel) that replaces `time.perf_counter_ns` or torch's event class does not reach them.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict

from kernelbot import KernelbotError
from kernelbot.records import GpuState

DeviceKind = Literal["cpu", "cuda"]
CHOICES = ("auto", "cpu", "cuda")
MIN_FLUSH_BYTES = 64 << 20  # an L2 flush writes at least this much, and twice the L2 when that is more

_perf_counter_ns = time.perf_counter_ns
_Event = torch.cuda.Event
_current_stream = torch.cuda.current_stream
_synchronize = torch.cuda.synchronize
GRAPH_WARMUP_CALLS = 2  # lazily built state (cuBLAS handles, cache tensors) exists before capture


class Stopwatch(Protocol):
    """start() … stop(), then elapsed_ns() (which waits for the device to reach stop)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def elapsed_ns(self) -> int: ...


def timed_call(fn: Callable[..., Any], args: Iterable[Any], watch: Stopwatch,
               flush: Callable[[], None] | None = None) -> tuple[float, Any]:
    """(µs, output) of fn(*args): `flush` first (queued ahead of the call on a GPU: the device is busy with it while
    the call is launched), then the call between `watch`'s marks."""
    if flush is not None:
        flush()
    watch.start()
    out = fn(*args)
    watch.stop()
    return watch.elapsed_ns() / 1e3, out


class HostStopwatch:
    """perf_counter_ns around the work: on a CPU the work is done when the call returns."""

    def __init__(self) -> None:
        self._t0 = self._t1 = 0

    def start(self) -> None:
        self._t0 = _perf_counter_ns()

    def stop(self) -> None:
        self._t1 = _perf_counter_ns()

    def elapsed_ns(self) -> int:
        return self._t1 - self._t0


class EventStopwatch:
    """A pair of events recorded on the device's current stream: the GPU's own time between them."""

    def __init__(self, index: int) -> None:
        self._index = index
        self._start, self._end = _Event(enable_timing=True), _Event(enable_timing=True)

    def start(self) -> None:
        self._start.record(_current_stream(self._index))

    def stop(self) -> None:
        self._end.record(_current_stream(self._index))

    def elapsed_ns(self) -> int:
        self._end.synchronize()
        return round(self._start.elapsed_time(self._end) * 1e6)  # elapsed_time is in ms


class DeviceChoice(BaseModel):
    """The device a run uses, why it was chosen, and the operations the loop needs on it."""

    model_config = ConfigDict(frozen=True)

    kind: DeviceKind
    index: int = 0
    name: str
    reason: str

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def spec(self) -> str:
        """torch's name for it: "cpu" or "cuda:N"."""
        return f"cuda:{self.index}" if self.is_gpu else "cpu"

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.spec)

    def describe(self) -> str:
        return f"{self.spec} ({self.name}; {self.reason})"

    def synchronize(self) -> None:
        """Wait until the device has done all the work queued on it (a no-op on a CPU)."""
        if self.is_gpu:
            _synchronize(self.index)

    def empty_cache(self) -> None:
        """Give the caching allocator's unused blocks back (a no-op on a CPU)."""
        if self.is_gpu:
            torch.cuda.empty_cache()

    def stopwatch(self) -> Stopwatch:
        return EventStopwatch(self.index) if self.is_gpu else HostStopwatch()

    @property
    def clock(self) -> str:
        return "device events" if self.is_gpu else "perf_counter_ns"

    def profiler_activities(self) -> list[torch.profiler.ProfilerActivity]:
        """What torch.profiler records on this device: CPU ops, and on a GPU its kernels too."""
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.is_gpu:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        return activities

    def l2_bytes(self) -> int | None:
        if not self.is_gpu:
            return None
        return int(getattr(torch.cuda.get_device_properties(self.index), "L2_cache_size", 0)) or None

    def free_bytes(self) -> int | None:
        """The device's free memory now; None on a CPU (the host's memory is the OS's to manage)."""
        if not self.is_gpu:
            return None
        return int(torch.cuda.mem_get_info(self.index)[0])

    def holds(self, nbytes: int) -> bool:
        """Whether `nbytes` more fit in the device's free memory with a quarter to spare (activations, a KV cache);
        a CPU always holds them."""
        free = self.free_bytes()
        return free is None or 1.25 * nbytes <= free

    def l2_flusher(self) -> Callable[[], None] | None:
        """A call that writes a buffer larger than the GPU's L2, so the next timed call starts with a cold cache;
        None on a CPU (its caches are not flushed: a CPU run times warm calls)."""
        if not self.is_gpu:
            return None
        size = max(2 * (self.l2_bytes() or 0), MIN_FLUSH_BYTES)
        buffer = torch.empty(size, dtype=torch.int8, device=self.torch_device)
        return buffer.zero_

    def capture(self, step: Callable[[], None]) -> Callable[[], None]:
        """`step` (which reads and writes only fixed buffers) recorded once as a CUDA graph, after warm-up calls on
        a side stream as capture requires; returns the graph's replay. A CPU has no graphs: one line, use eager."""
        if not self.is_gpu:
            raise KernelbotError("graph-captured decode needs a GPU: on a CPU compare against eager and torch.compile")
        with torch.cuda.device(self.index):  # capture records on the current device's streams
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(GRAPH_WARMUP_CALLS):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
        return graph.replay

    def gpu_state(self, own_pids: Iterable[int] = ()) -> GpuState | None:
        """The GPU's clocks, temperature, throttle reasons and other processes now; None on a CPU."""
        if not self.is_gpu:
            return None
        try:
            import pynvml
        except ImportError:
            return GpuState(available=False, note="nvidia-ml-py is not installed: no clocks, temperature or "
                                                  "throttle reasons")
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # pynvml.NVMLError and its many subclasses, or a missing libnvidia-ml
            return GpuState(available=False, note=f"NVML could not start: {exc}")
        try:
            index, how = self._nvml_index(pynvml)
            state = read_gpu_state(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index), set(own_pids))
            return state.model_copy(update={"nvml_index": index, "note": how})
        except Exception as exc:  # a field this GPU or driver does not report
            return GpuState(available=False, note=f"NVML query failed: {exc}")
        finally:
            pynvml.nvmlShutdown()

    def _nvml_index(self, nvml: Any) -> tuple[int, str]:
        """NVML numbers every GPU of the node; torch only the visible ones: match them by UUID, else by
        CUDA_VISIBLE_DEVICES, else take torch's index as NVML's."""
        try:
            uuid = str(torch.cuda.get_device_properties(self.index).uuid)
            uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            return int(nvml.nvmlDeviceGetIndex(handle)), "NVML device matched by UUID"
        except Exception:  # older torch without uuid, or NVML that does not know it
            pass
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if self.index < len(visible) and visible[self.index].isdigit():
            return int(visible[self.index]), "NVML device from CUDA_VISIBLE_DEVICES"
        return self.index, "NVML device assumed at torch's index"


def read_gpu_state(nvml: Any, handle: Any, own_pids: set[int]) -> GpuState:
    """Clocks, temperature, throttle reasons and the processes on the GPU, from an initialised NVML module."""
    from kernelbot.hardware.telemetry import decode_reasons

    reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    mask = int(reasons_fn(handle))
    pids: set[int] = set()
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            pids.update(int(p.pid) for p in getattr(nvml, query)(handle))
        except Exception:  # not supported on this GPU or driver
            continue
    return GpuState(
        available=True,
        sm_clock_mhz=int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
        mem_clock_mhz=int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
        max_sm_clock_mhz=int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)),
        temperature_c=int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        throttle_reasons=decode_reasons(mask), throttled=bool(mask & ~0x1),  # 0x1: idle, not a slowdown
        other_processes=sorted(pids - own_pids))


def gpu_missing_reason() -> str | None:
    """Why torch sees no CUDA device here, or None when it sees one."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no GPU or no driver"
    return None


def cpu_model_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def cpu_device(reason: str = "asked for") -> DeviceChoice:
    return DeviceChoice(kind="cpu", name=cpu_model_name(), reason=reason)


def gpu_device(index: int, reason: str) -> DeviceChoice:
    count = torch.cuda.device_count()
    if index >= count:
        raise KernelbotError(f"--device cuda:{index}: only {count} CUDA device(s) are visible here; use cuda:0 to "
                             f"cuda:{count - 1}")
    return DeviceChoice(kind="cuda", index=index, name=torch.cuda.get_device_name(index), reason=reason)


def pick_device(requested: str = "auto") -> DeviceChoice:
    """"auto": a CUDA device when one is visible, else the CPU; "cpu"; "cuda" or "cuda:N", which must exist."""
    kind, _, index = requested.strip().lower().partition(":")
    if kind not in CHOICES or (index and (kind != "cuda" or not index.isdigit())):
        raise KernelbotError(f"--device {requested!r}: unknown device; use auto, cpu, cuda or cuda:N")
    if kind == "cpu":
        return cpu_device()
    missing = gpu_missing_reason()
    if kind == "auto":
        return cpu_device(f"auto: {missing}") if missing else gpu_device(0, "auto: a CUDA device is visible")
    if missing:
        raise KernelbotError(f"--device {requested}: no CUDA device is visible here ({missing}); run on a GPU node "
                             "or use --device cpu")
    return gpu_device(int(index or 0), "asked for")
