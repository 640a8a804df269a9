"""GPU state next to every GPU measurement (nvidia-ml-py): clocks, temperature, power and throttle reasons,
so a slow number can be told from a throttled GPU. Without a GPU this says so; nothing is made up."""

from __future__ import annotations

from typing import Any

# nvmlClocksEventReason* / nvmlClocksThrottleReason* bits (same values in both namings)
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def decode_reasons(mask: int) -> list[str]:
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    return names + ([f"unknown_0x{unknown:x}"] if unknown else [])


def snapshot() -> dict[str, Any]:
    """One reading per GPU, or {"available": False, "reason": ...}."""
    try:
        import pynvml
    except ImportError:
        return {"available": False, "reason": "nvidia-ml-py is not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"available": False, "reason": f"NVML could not start: {exc}"}
    try:
        return {"available": True, "gpus": [_read(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]}
    except pynvml.NVMLError as exc:
        return {"available": False, "reason": f"NVML query failed: {exc}"}
    finally:
        pynvml.nvmlShutdown()


def _read(nvml: Any, index: int) -> dict[str, Any]:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    mask = int(reasons_fn(h))
    name = nvml.nvmlDeviceGetName(h)
    return {
        "index": index,
        "name": name.decode() if isinstance(name, bytes) else name,
        "sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
        "mem_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
        "max_sm_clock_mhz": nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM),
        "temperature_c": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
        "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
        "power_limit_w": nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
        "throttle_mask": mask,
        "throttle_reasons": decode_reasons(mask),
        # idle is not a slowdown; anything else means the clocks were held down during the measurement
        "throttled": bool(mask & ~0x1),
    }
