"""One GPU per candidate and the health check after a crash, against a stand-in NVML (no GPU on this machine)
and against the real one, which must say it could not check rather than pass."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from kernelbot.sandbox import gpu
from kernelbot.sandbox.runner import run_job


class FakeNVMLError(Exception):
    pass


def fake_nvml(holders=(), ecc=0, broken=False) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, m.NVML_VOLATILE_ECC = 1, 0
    m.nvmlInit = m.nvmlShutdown = lambda: None

    def handle(index):
        if broken:
            raise FakeNVMLError("GPU is lost")
        return index

    m.nvmlDeviceGetHandleByIndex = handle
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [SimpleNamespace(pid=p) for p in holders]
    m.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=3 << 20)
    m.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: ecc
    return m


def test_healthy_gpu_passes(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(holders=[999]))
    assert gpu.check_health(0, {123}, ecc_before=0) == "GPU 0 healthy after the crash (3 MiB in use)"


@pytest.mark.parametrize("nvml, message", [
    (fake_nvml(holders=[123]), "still hold it"),
    (fake_nvml(ecc=2), "2 new uncorrectable ECC"),
    (fake_nvml(broken=True), "does not answer NVML"),
])
def test_unhealthy_gpu_is_refused(monkeypatch, nvml, message):
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with pytest.raises(gpu.GPUUnhealthy, match=message):
        gpu.check_health(0, {123}, ecc_before=0, wait_s=0.3)


def test_without_nvml_nothing_is_claimed(monkeypatch):
    broken = types.ModuleType("pynvml")

    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")

    broken.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert gpu.check_health(0, set(), None).startswith("GPU 0 health not checked: NVML unavailable")
    assert gpu.ecc_errors(0) is None


def test_a_crashed_job_sees_only_its_gpu_and_the_gpu_is_checked(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    result = run_job({"kind": "noop"}, tmp_path / "w", timeout=0.5, gpu=1)  # ends by timeout: torch takes longer
    assert result.status == "timeout"
    assert "GPU 1 only (CUDA_VISIBLE_DEVICES)" in result.protections
    assert "GPU 1 healthy after the crash (3 MiB in use)" in result.protections
    ok = run_job({"kind": "noop"}, tmp_path / "w2", timeout=60, gpu=1)
    assert ok.status == "ok" and not any("healthy" in p for p in ok.protections)  # checked only after a failure
    assert gpu.isolation_env(1)["CUDA_VISIBLE_DEVICES"] == "1"


def test_bad_gpu_index_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("KERNELBOT_GPU", "first")
    with pytest.raises(ValueError, match="KERNELBOT_GPU='first'"):
        gpu.assigned_gpu()
