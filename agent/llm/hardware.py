"""What the prompt says about the machine: the Device record, plus NVML's view of a GPU when there is one."""

from __future__ import annotations

from kernelbot.records import Device

_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def _cpu_flags() -> list[str]:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in _CPU_FLAGS if f in have]
    except OSError:
        pass
    return []


def gpu_facts(index: int = 0) -> dict[str, str]:
    """Name, SMs, memory, clocks and peak bandwidth of GPU `index` (nvidia-ml-py and torch); {} when unknown."""
    facts: dict[str, str] = {}
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(index)
            facts.update(name=props.name, sm_count=str(props.multi_processor_count),
                         compute_capability=f"{props.major}.{props.minor}",
                         memory=f"{props.total_memory / 2**30:.0f} GiB")
    except Exception:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            facts["name"] = name.decode() if isinstance(name, bytes) else name
            sm_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
            mem_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
            bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
            facts["sm_clock"] = f"{sm_mhz} MHz"
            # DDR: two transfers per memory clock
            facts["peak_bandwidth"] = f"{2 * mem_mhz * 1e6 * bus_bits / 8 / 1e9:.0f} GB/s (from NVML clocks)"
            facts["memory"] = f"{pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30:.0f} GiB"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no nvidia-ml-py, no driver, or a field this GPU does not report
        pass
    return facts


def hardware_lines(device: Device) -> list[str]:
    lines = [f"Device: {device.name} ({device.kind}); peaks {device.peak_gflops} GFLOP/s and {device.peak_gbps} GB/s "
             f"({device.peaks_source})."]
    if device.kind == "cpu":
        flags = _cpu_flags()
        lines.append(f"{device.threads} threads; ISA extensions: {', '.join(flags) or 'unknown'}.")
    else:
        facts = gpu_facts()
        if facts:
            lines.append("GPU: " + "; ".join(f"{k.replace('_', ' ')} {v}" for k, v in facts.items()) + ".")
    lines += [f"Note: {n}" for n in device.notes[:3]]
    return lines
