"""One GPU per candidate, and a health check before the next candidate may use it.

A candidate sees only its GPU (`CUDA_VISIBLE_DEVICES`). A hung kernel ends with its process (the runner kills
the whole process group). After a candidate crashed or timed out, NVML must show the GPU answering, with no
new uncorrectable ECC errors and no process of the dead candidate still holding it, before it is used again.
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


def isolation_env(index: int) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": str(index), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _nvml() -> Any:
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def ecc_errors(index: int) -> int | None:
    """Volatile uncorrectable ECC errors so far, or None where ECC or NVML is not available."""
    try:
        nvml = _nvml()
    except Exception:
        return None
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
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
        h = nvml.nvmlDeviceGetHandleByIndex(index)
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
