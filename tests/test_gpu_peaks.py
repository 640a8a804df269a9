"""A first real GPU node: its peaks are measured on it (the datasheet table only cross-checks them), peaks given on
the command line replace them, and CUDA sources are compiled for its own compute capability."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kernelbot import KernelbotError
from kernelbot.agent.verify.cuda_check import compile_report
from kernelbot.hardware import peaks as peaks_mod
from kernelbot.hardware.device import DeviceChoice, cpu_device
from kernelbot.hardware.peaks import PeakOverride, device_record, measure_peaks, with_override


@pytest.fixture
def gpu_measures(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """A GPU whose GEMM runs at 500 TFLOP/s and whose copy at 3000 GB/s, measured at the sizes asked; nothing
    touches a real device."""
    asked: list[tuple[str, int, int]] = []

    def measure(device: DeviceChoice, dtype: torch.dtype, side: int, copy_bytes: int) -> tuple[float, float]:
        asked.append((str(dtype), side, copy_bytes))
        return 500_000.0, 3000.0

    monkeypatch.setattr(peaks_mod, "measure_peaks", measure)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(multi_processor_count=78))
    monkeypatch.setattr(DeviceChoice, "empty_cache", lambda self: None)
    return asked


def _gpu(name: str) -> DeviceChoice:
    return DeviceChoice(kind="cuda", name=name, reason="test")


def test_a_gpu_the_table_does_not_know_gets_measured_peaks_not_an_error(gpu_measures: list) -> None:
    record = device_record(_gpu("NVIDIA H20"), "bfloat16")
    assert (record.kind, record.threads, record.peak_gflops, record.peak_gbps) == ("cuda", 78, 500_000.0, 3000.0)
    assert gpu_measures == [("torch.bfloat16", *peaks_mod.GPU_SIZES)]  # the GEMM at the run's dtype
    assert "measured on this GPU" in record.peaks_source
    assert any("not in the datasheet table" in n for n in record.notes)


def test_the_datasheet_is_a_cross_check_beside_the_measurement(gpu_measures: list) -> None:
    record = device_record(_gpu("NVIDIA H200"), "bfloat16")
    assert record.peak_gflops == 500_000.0  # measured, not the table's 989 TFLOP/s
    assert any("datasheet" in n and "GEMM 51% of it" in n and "copy 62% of it" in n for n in record.notes)
    assert not any("outside" in n for n in record.notes)
    slow = device_record(_gpu("NVIDIA B200"), "bfloat16")  # 500 of 2250 TFLOP/s: far off the datasheet
    assert any("GEMM and copy outside 50%–110%" in n for n in slow.notes)


def test_peaks_given_on_the_command_line_replace_the_measured_ones(gpu_measures: list) -> None:
    record = device_record(_gpu("NVIDIA H20"), "bfloat16", PeakOverride(tflops=148.0, gbps=4000.0))
    assert (record.peak_gflops, record.peak_gbps) == (148_000.0, 4000.0)
    assert "given on the command line" in record.peaks_source
    assert any("measured: 500000.0 GFLOP/s, 3000.0 GB/s" in n for n in record.notes)
    half = device_record(_gpu("NVIDIA H20"), "bfloat16", PeakOverride(gbps=4000.0))
    assert (half.peak_gflops, half.peak_gbps) == (500_000.0, 4000.0)
    with pytest.raises(KernelbotError, match="--peak-tflops -1.0: a peak must be a positive number"):
        with_override(record, PeakOverride(tflops=-1.0))


def test_the_same_measurement_runs_on_the_cpu_with_its_own_clock() -> None:
    gflops, gbps = measure_peaks(cpu_device(), torch.float32, 128, 1 << 20)
    assert gflops > 0 and gbps > 0
    record = device_record(cpu_device(), "float32")
    assert record.kind == "cpu" and record.peak_gflops > 0 and "measured on this machine" in record.peaks_source


def test_a_cpus_peaks_are_measured_at_the_runs_dtype() -> None:
    assert "bfloat16 GEMM" in device_record(cpu_device(), "bfloat16").peaks_source
    assert "float32 GEMM" in device_record(cpu_device(), "float32").peaks_source


CUDA_SOURCE = "__global__ void add(const float* x, float* y, int n) { int i = threadIdx.x; if (i < n) y[i] += x[i]; }"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cuda_sources_are_compiled_for_the_visible_gpus_capability(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    report = compile_report([CUDA_SOURCE], tmp_path)
    assert report["ok"], report["log"]
    assert [k["arch"] for k in report["kernels"]] == ["sm_100"]


def test_a_cpus_bandwidth_is_measured_on_a_copy_several_times_its_last_level_cache(monkeypatch) -> None:
    """A 32 MiB copy on a 32 MiB L3 read 39 to 100 GB/s from run to run on one host whose memory streams 36: the
    copy that sets a CPU's roofline streams from memory, whatever the cache."""
    asked: list[int] = []
    monkeypatch.setattr(peaks_mod, "measure_peaks", lambda device, dtype, side, copy_bytes: (asked.append(copy_bytes)
                                                                                             or (1000.0, 40.0)))
    for llc in (1 << 20, 96 << 20):
        monkeypatch.setattr(peaks_mod, "last_level_cache_bytes", lambda llc=llc: llc)
        assert "MiB copy" in peaks_mod.measure_cpu("bfloat16").peaks_source
    assert asked == [peaks_mod.CPU_SIZES[1], peaks_mod.CACHES_OVER * (96 << 20)]
