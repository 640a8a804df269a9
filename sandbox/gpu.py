"""One GPU per candidate, and a health check before the next candidate may use it.

A candidate sees only its GPU (`CUDA_VISIBLE_DEVICES`). GPUs are numbered as this process sees them (torch's
cuda:N): where a scheduler (Slurm, Kubernetes, Ray) already narrowed this process's CUDA_VISIBLE_DEVICES, GPU N is
the N-th entry of that list (an index, a UUID or a MIG id, passed on as written), not the node's N-th GPU. The
child keeps this process's CUDA_DEVICE_ORDER, so the entry means the same there. A hung kernel ends with its
process (the runner kills the whole process group). After a candidate crashed or timed out, NVML must show the GPU
answering, with no new uncorrectable ECC errors and no process of the dead candidate still holding it, before it is
used again.
"""

from __future__ import annotations

import os
import time
from typing import Any


class GPUUnhealthy(RuntimeError):
    """The GPU a candidate ran on did not come back healthy; no further candidate should use it."""


def assigned_gpu() -> int:
    """The GPU kernelbot's candidates use on this node: KERNELBOT_GPU, else 0."""
    value = os.environ.get("KERNELBOT_GPU", "0")
    if not value.isdigit():
        raise ValueError(f"KERNELBOT_GPU={value!r}: expected a GPU index such as 0")
    return int(value)


def device_kind(device: str) -> str:
    """"cpu" or "cuda", of a device as verify and bench take it: "cpu", "cuda" or "cuda:N"."""
    return device.partition(":")[0]


def job_gpu(device: str) -> int | None:
    """The GPU a job on `device` runs on, as an index among this process's visible GPUs (torch's numbering): None on
    the CPU, N for "cuda:N", the assigned one (KERNELBOT_GPU, else 0) for "cuda"."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return None
    return int(index) if index else assigned_gpu()


def visible_gpu(index: int) -> str:
    """This process's index-th visible GPU, as CUDA_VISIBLE_DEVICES names it to a child: the index-th entry of this
    process's own list where it has one, else the index itself."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return str(index)
    entries = [e.strip() for e in listed.split(",") if e.strip()]
    if index >= len(entries):
        raise ValueError(f"GPU {index}: this process sees {len(entries)} GPU(s) (CUDA_VISIBLE_DEVICES={listed!r}); "
                         f"set KERNELBOT_GPU (or --device cuda:N) to an index below {len(entries)}")
    return entries[index]


def isolation_env(index: int) -> dict[str, str]:
    """The child's view: exactly this process's index-th GPU."""
    return {"CUDA_VISIBLE_DEVICES": visible_gpu(index)}


def _nvml() -> Any:
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def _handle(nvml: Any, index: int) -> Any:
    """NVML's handle of this process's index-th GPU: by UUID where the entry is one; else NVML's numbering, which is
    the PCI bus order (what a numeric entry means under CUDA_DEVICE_ORDER=PCI_BUS_ID, and on a node of one kind of
    GPU under CUDA's default order too)."""
    entry = visible_gpu(index)
    if entry.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    return nvml.nvmlDeviceGetHandleByUUID(entry)


def ecc_errors(index: int) -> int | None:
    """Volatile uncorrectable ECC errors so far, or None where ECC or NVML is not available."""
    try:
        nvml = _nvml()
    except Exception:
        return None
    try:
        h = _handle(nvml, index)
        return int(nvml.nvmlDeviceGetTotalEccErrors(h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                    nvml.NVML_VOLATILE_ECC))
    except Exception:
        return None
    finally:
        nvml.nvmlShutdown()


def check_health(index: int, dead_pids: set[int], ecc_before: int | None, wait_s: float = 10.0) -> str:
    """A line saying the GPU is healthy; raises GPUUnhealthy when it is not. Without NVML nothing can be
    checked, and the line says so."""
    try:
        nvml = _nvml()
    except Exception as exc:
        return f"GPU {index} health not checked: NVML unavailable ({exc})"
    try:
        h = _handle(nvml, index)
        deadline = time.monotonic() + wait_s
        while True:
            holders = {p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)} & dead_pids
            if not holders or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if holders:
            raise GPUUnhealthy(f"GPU {index}: processes {sorted(holders)} of the crashed candidate still hold it")
        memory = nvml.nvmlDeviceGetMemoryInfo(h)
        try:
            ecc = int(nvml.nvmlDeviceGetTotalEccErrors(h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                       nvml.NVML_VOLATILE_ECC))
        except nvml.NVMLError:
            ecc = None
        if ecc is not None and ecc_before is not None and ecc > ecc_before:
            raise GPUUnhealthy(f"GPU {index}: {ecc - ecc_before} new uncorrectable ECC error(s)")
        return f"GPU {index} healthy after the crash ({memory.used >> 20} MiB in use)"
    except nvml.NVMLError as exc:  # e.g. the GPU fell off the bus
        raise GPUUnhealthy(f"GPU {index} does not answer NVML: {exc}") from exc
    finally:
        nvml.nvmlShutdown()
