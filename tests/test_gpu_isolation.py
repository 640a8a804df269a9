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
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
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


@pytest.mark.parametrize("visible,index,child", [
    (None, 1, "1"),  # this process sees every GPU: index N is the node's N-th
    ("3,5", 1, "5"),  # a scheduler gave this process GPUs 3 and 5: its second is the node's 5
    ("GPU-aaaa, GPU-bbbb", 0, "GPU-aaaa"),  # UUIDs pass on as written
    ("MIG-1234", 0, "MIG-1234"),
])
def test_a_jobs_gpu_is_this_processs_nth_visible_gpu_not_the_nodes(monkeypatch, visible, index, child):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    assert gpu.isolation_env(index) == {"CUDA_VISIBLE_DEVICES": child}  # the parent's order stays in force


def test_a_gpu_index_past_this_processs_visible_list_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with pytest.raises(ValueError, match=r"GPU 2: this process sees 2 GPU\(s\) \(CUDA_VISIBLE_DEVICES='3,5'\)"):
        gpu.isolation_env(2)


def test_the_health_check_asks_nvml_about_the_gpu_the_job_really_ran_on(monkeypatch):
    asked: list[object] = []
    nvml = fake_nvml()
    by_index = nvml.nvmlDeviceGetHandleByIndex
    nvml.nvmlDeviceGetHandleByIndex = lambda i: asked.append(i) or by_index(i)
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: asked.append(uuid) or 0
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    gpu.check_health(1, set(), ecc_before=0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa")
    gpu.ecc_errors(0)
    assert asked == [5, "GPU-aaaa"]


def test_the_docker_runner_hands_the_container_the_nodes_name_for_the_gpu(tmp_path, monkeypatch):
    from kernelbot.sandbox import docker_runner

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    environment, device = docker_runner._environment({"device": "cuda"}, tmp_path, None, 1)
    assert device == "5" and "CUDA_VISIBLE_DEVICES" not in environment  # inside, its one GPU is index 0
