"""The device layer (hardware/device.py), the engine on a chosen device, and the prepared GPU check's
CPU-side parts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kernelbot import KernelbotError
from kernelbot.engine.models import resolve_spec
from kernelbot.engine.torch_engine import TorchEngine
from kernelbot.hardware import device as devmod
from kernelbot.hardware.device import DeviceChoice, pick_device, read_gpu_state

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = ROOT / "benchmarks" / "gpu_check"
NO_GPU = "torch 9.9+cpu is a CPU-only build"
# the loop's files outside the device layer: none may name the backend
DEVICE_AGNOSTIC = ("agent/measure/timing.py", "agent/measure/end_to_end.py", "engine/torch_engine.py",
                   "engine/graph_decode.py", "hardware/host.py")


@pytest.fixture
def without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devmod, "gpu_missing_reason", lambda: NO_GPU)


@pytest.fixture
def with_one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch reports one GPU named 'Fake H200'; nothing touches a real device."""
    monkeypatch.setattr(devmod, "gpu_missing_reason", lambda: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Fake H200")


def test_auto_picks_the_cpu_when_no_gpu_is_visible_and_says_why(without_gpu: None) -> None:
    choice = pick_device("auto")
    assert (choice.kind, choice.spec, choice.is_gpu) == ("cpu", "cpu", False)
    assert NO_GPU in choice.reason


def test_auto_picks_the_gpu_when_one_is_visible(with_one_gpu: None) -> None:
    choice = pick_device("auto")
    assert (choice.kind, choice.spec, choice.name, choice.is_gpu) == ("cuda", "cuda:0", "Fake H200", True)
    assert choice.torch_device == torch.device("cuda:0")


def test_asking_for_cuda_without_a_gpu_is_one_line_naming_the_fix(without_gpu: None) -> None:
    with pytest.raises(KernelbotError) as err:
        pick_device("cuda")
    message = str(err.value)
    assert "\n" not in message
    assert message == (f"--device cuda: no CUDA device is visible here ({NO_GPU}); run on a GPU node or use "
                       "--device cpu")


def test_a_gpu_index_beyond_the_visible_ones_and_unknown_devices_are_refused(with_one_gpu: None) -> None:
    assert pick_device("cuda:0").index == 0
    with pytest.raises(KernelbotError, match=r"cuda:3: only 1 CUDA device"):
        pick_device("cuda:3")
    for bad in ("tpu", "cpu:1", "cuda:x"):
        with pytest.raises(KernelbotError, match="unknown device; use auto, cpu, cuda or cuda:N"):
            pick_device(bad)


def test_the_reason_names_a_hidden_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devmod.gpu_missing_reason() == "CUDA_VISIBLE_DEVICES='' hides every GPU"


def test_the_cpu_times_on_the_host_clock_and_has_nothing_to_flush_or_read(without_gpu: None) -> None:
    cpu = pick_device("cpu")
    cpu.synchronize()
    cpu.empty_cache()
    assert cpu.l2_flusher() is None and cpu.l2_bytes() is None and cpu.gpu_state() is None
    watch = cpu.stopwatch()
    watch.start()
    sum(range(10000))
    watch.stop()
    assert watch.elapsed_ns() > 0 and cpu.clock == "perf_counter_ns"
    assert cpu.profiler_activities() == [torch.profiler.ProfilerActivity.CPU]
    gpu = DeviceChoice(kind="cuda", name="Fake H200", reason="test")
    assert torch.profiler.ProfilerActivity.CUDA in gpu.profiler_activities()


class FakeNVML:
    """The few pynvml calls read_gpu_state makes, answering as a throttled GPU shared with pid 999 would."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 1, 0

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object) -> int:
        return 0x1 | 0x40  # idle and hardware thermal slowdown

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=os.getpid()), SimpleNamespace(pid=999)]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: object) -> list[SimpleNamespace]:
        raise RuntimeError("not supported")

    def nvmlDeviceGetClockInfo(self, handle: object, which: int) -> int:
        return 1980 if which == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetMaxClockInfo(self, handle: object, which: int) -> int:
        return 1980

    def nvmlDeviceGetTemperature(self, handle: object, which: int) -> int:
        return 71


def test_gpu_state_decodes_throttling_and_lists_only_other_processes() -> None:
    state = read_gpu_state(FakeNVML(), object(), {os.getpid()})
    assert (state.sm_clock_mhz, state.mem_clock_mhz, state.temperature_c) == (1980, 3201, 71)
    assert state.throttle_reasons == ["gpu_idle", "hw_thermal_slowdown"] and state.throttled is True
    assert state.other_processes == [999]


def test_a_gpu_without_nvml_reports_none_fields_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    state = DeviceChoice(kind="cuda", name="Fake H200", reason="test").gpu_state()
    assert state is not None and state.available is False and state.sm_clock_mhz is None
    assert "nvidia-ml-py is not installed" in state.note


def _micro() -> object:
    spec, _ = resolve_spec("llama-micro", dtype="float32", batch=2, prompt_len=4, decode_steps=2)
    return spec


def test_the_engine_on_the_cpu_device_runs_as_before_and_its_twins_keep_the_device() -> None:
    spec = _micro()
    default, placed = TorchEngine(spec), TorchEngine(spec, device="cpu")
    assert placed.device.kind == "cpu" and default.device.kind == "cpu"
    assert torch.equal(default.run_workload(), placed.run_workload())
    assert placed.prompts.device.type == "cpu"
    assert all(p.device.type == "cpu" for p in placed.model.parameters())
    assert placed.in_float64().device is placed.device
    assert placed.compiled().device is placed.device


def test_the_engine_refuses_cuda_where_there_is_none(without_gpu: None) -> None:
    with pytest.raises(KernelbotError, match="no CUDA device is visible"):
        TorchEngine(_micro(), device="cuda")


def test_outside_the_device_layer_the_loop_never_names_the_backend() -> None:
    for name in DEVICE_AGNOSTIC:
        text = (ROOT / name).read_text().lower()
        assert "cuda" not in text, f"{name} names the backend; go through kernelbot.hardware.device"


# As on a GPU node, where kernelbot is not installed: the check must import it from its own copy, whatever the
# working directory (this checkout's kernelbot/ holds none of the parts and must not shadow the copy).
NOT_INSTALLED = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path_hooks[:] = [h for h in sys.path_hooks if not getattr(h, "__module__", "").startswith("__editable__")]
sys.path_importer_cache.clear()
"""


def _dry_run(tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict]:
    hide = tmp_path / "not_installed"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(NOT_INSTALLED)
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(hide)}
    check = subprocess.run([sys.executable, "-c", "import kernelbot.agent"], env=env, cwd=tmp_path,
                           capture_output=True)
    assert check.returncode != 0, "kernelbot still imports: the test would not show how the node imports it"
    proc = subprocess.run([str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--work", str(tmp_path / "work"),
                           str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=180, cwd=ROOT)
    return proc, json.loads((tmp_path / "out" / "summary.json").read_text())


def test_the_gpu_check_dry_run_walks_every_step_and_writes_a_complete_summary(tmp_path: Path) -> None:
    proc, summary = _dry_run(tmp_path)
    assert summary["dry_run"] is True and summary["problems"] == [], summary["problems"]
    assert not [m for m, error in summary["probe"]["imports"].items() if error]
    # kernelbot as the check installs it: a copy of this checkout laid out as pyproject maps it
    site = tmp_path / "work" / "site" / "kernelbot"
    assert (site / "agent" / "optimize.py").read_text() == (ROOT / "agent" / "optimize.py").read_text()
    assert (site / "records.py").is_file()
    steps = [line.split(" ", 1)[0] for line in summary["plan"]]
    assert steps == ["smoke", "verify_correct", "verify_racy", "optimize"]
    for line in summary["plan"]:
        for word in line.split():
            if word.startswith(str(GPU_CHECK)):
                assert Path(word).is_file(), word
    assert "--device cuda --dtype bfloat16" in summary["plan"][3]
    # every step ran (through its stub), every expectation was read from its outputs, the figures beside them
    assert [s["name"] for s in summary["steps"]] == steps
    assert all(s["returncode"] in (0, 1) and not s["timed_out"] for s in summary["steps"])
    assert len(summary["expectations"]) == 10 and all(e["met"] for e in summary["expectations"])
    # every stage's worst-case limit, printed and summed under the 6 minutes a check may take of the device's time
    limits = {limit["name"]: limit["limit_s"] for limit in summary["limits"]}
    assert list(limits) == ["preflight", "smoke", "verify_correct+verify_racy", "optimize", "gpu_after"]
    assert summary["worst_case_s"] == sum(limits.values()) < 6 * 60
    assert all(f"{name} ≤ {limit} s" in proc.stdout for name, limit in limits.items())
    assert f"in all ≤ {summary['worst_case_s']} s of 360 s" in proc.stdout
    assert len(summary["figures"]) == 2 and summary["finished"] and summary["ok"]
    assert proc.returncode == 0
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"smoke.json", "report.json", "verdict_correct.json",
                                                              "verdict_racy.json", "optimize_log.txt", "summary.json"}
    if not torch.cuda.is_available():
        assert any("no GPU is visible here" in note for note in summary["notes"])


def test_the_gpu_check_fails_fast_in_one_line_without_a_gpu(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: the real check would run")
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run([str(ROOT / "benchmarks" / "gpu_check.sh"), "--work", str(tmp_path / "work"),
                           str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gpu_check: ") and "no GPU is visible here" in last
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["steps"] == [] and any("no GPU is visible here" in p for p in summary["problems"])


@pytest.mark.slow  # 25-50 s each on 2 shared cores: the interpreter runs every program of every input set
@pytest.mark.parametrize(("candidate", "race"), [("correct_triton.py", "pass"), ("racy_triton.py", "fail")])
def test_the_gpu_checks_two_triton_kernels_are_told_apart_by_the_race_check_here(tmp_path: Path, candidate: str,
                                                                                    race: str) -> None:
    """On the CPU, through Triton's interpreter: both compute the right rows one program at a time; only the
    racy one shares an address between programs."""
    from kernelbot.agent.verify.run import task_from_reference, verify

    reference = GPU_CHECK / "reference.py"
    verdict = verify(task_from_reference(reference), reference, GPU_CHECK / candidate, tmp_path / "w", seed=1,
                     timeout=300)
    status = {c.id: c.status for c in verdict.checks}
    assert status["compile"] == status["correctness"] == status["out_of_bounds"] == "pass"
    assert status["race"] == race


def test_a_gpu_without_room_for_the_float64_weights_does_not_hold_them(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = DeviceChoice(kind="cuda", name="a full GPU", reason="test")
    monkeypatch.setattr(DeviceChoice, "free_bytes", lambda self: 10 << 30 if self.is_gpu else None)
    assert gpu.holds(7 << 30) and not gpu.holds(9 << 30)  # a quarter kept for activations and the KV cache
    assert pick_device("cpu").holds(1 << 50)


def test_the_float64_twin_widens_the_models_own_weights_tensor_by_tensor_and_keeps_ties() -> None:
    from kernelbot.engine.torch_engine import float64_copy

    engine = TorchEngine(resolve_spec("llama-micro", dtype="bfloat16", batch=2, prompt_len=4, decode_steps=2)[0])
    engine.model.lm_head.weight = engine.model.model.embed_tokens.weight  # tied, as many small models are
    with torch.no_grad():
        engine.model.model.norm.weight.mul_(3.0)  # changed after the build: the twin must hold what the model holds
    twin = float64_copy(engine.model, torch.device("cpu"))
    assert twin.lm_head.weight is twin.model.embed_tokens.weight
    assert all(p.dtype == torch.float64 for p in twin.parameters())
    assert all(p.dtype == torch.bfloat16 for p in engine.model.parameters())  # the model itself untouched
    assert torch.equal(twin.model.norm.weight, engine.model.model.norm.weight.double())


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a narrower worker needs a host with two cores or more")
def test_a_served_cpu_runs_peaks_are_measured_again_on_the_cores_the_engine_binds_its_worker_to(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelbot.hardware import peaks
    from kernelbot.records import Device

    host = Device(kind="cpu", name="cpu", threads=len(os.sched_getaffinity(0)), peak_gflops=900.0, peak_gbps=100.0,
                  peaks_source="measured")
    core, seen = min(os.sched_getaffinity(0)), []

    def measured(dtype: str) -> Device:  # what the cores it ran on would give: half the peaks on one core
        seen.append((sorted(os.sched_getaffinity(0)), torch.get_num_threads(), dtype))
        return host.model_copy(update={"threads": torch.get_num_threads(), "peak_gflops": 450.0, "peak_gbps": 40.0})

    monkeypatch.setattr(peaks, "measure_cpu", measured)
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    worker = peaks.on_worker_cores(host, [core], "bfloat16", None)
    assert seen == [([core], 1, "bfloat16")]  # measured bound to the worker's core, with one thread
    assert os.sched_getaffinity(0) == affinity and torch.get_num_threads() == threads  # this process as it was
    assert (worker.peak_gflops, worker.peak_gbps, worker.threads) == (450.0, 40.0, 1)
    assert f"({core})" in worker.peaks_source and "900.0 → 450.0 GFLOP/s" in worker.notes[-1]
    given = peaks.on_worker_cores(host, [core], "bfloat16", peaks.PeakOverride(gbps=55.0))
    assert given.peak_gbps == 55.0 and given.peak_gflops == 450.0  # the command line's peak still wins
    # an engine that binds no narrower, or a GPU's record: as it was, nothing measured
    assert peaks.on_worker_cores(host, sorted(affinity), "bfloat16", None) is host
    assert peaks.on_worker_cores(host, [], "bfloat16", None) is host
    gpu = host.model_copy(update={"kind": "cuda"})
    assert peaks.on_worker_cores(gpu, [core], "bfloat16", None) is gpu and len(seen) == 2
