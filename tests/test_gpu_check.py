"""The prepared GPU check (benchmarks/gpu_check.sh) must work the first time a GPU is lent: it fits 6 minutes of device
time in the worst case with a smoke step first, a step past its limit is killed with everything it started and still
leaves a summary, the summary is rewritten after every step and when the check is stopped, the CUDA-graph comparison
is a figure and not part of the exit code, the interpreter's absence fails only its own expectation, and missing
wheels are refused in one line that says how to fetch them."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = ROOT / "benchmarks" / "gpu_check"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"gpu_check_{name}", GPU_CHECK / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


driver = _load("driver")


def test_the_whole_check_fits_six_minutes_of_device_time_in_the_worst_case(tmp_path: Path) -> None:
    batches = driver.plan("python3", tmp_path / "work", tmp_path / "out")
    assert [s.name for s in batches[0]] == ["smoke"] and batches[0][0].timeout_s <= 40
    limits = driver.limits(batches)
    assert [limit.name for limit in limits] == ["preflight", "smoke", "verify_correct+verify_racy", "optimize",
                                                "gpu_after"]
    assert sum(limit.limit_s for limit in limits) < 6 * 60 == driver.LIMIT_S
    for batch in batches:
        for step in batch:
            if "kernelbot.cli" not in step.argv:
                continue
            job_s = int(step.argv[step.argv.index("--timeout") + 1])
            if "verify" in step.argv:  # the GPU job, the sanitizers' (one job's time shared), the interpreter's job
                assert 3 * job_s < step.timeout_s, step.name
            else:  # optimize starts no candidate past its budget, and one candidate's jobs then fit the rest
                budget_s = float(step.argv[step.argv.index("--budget-hours") + 1]) * 3600
                assert budget_s > 0 and budget_s + 4 * job_s + driver.TAIL_S <= step.timeout_s + 1, step.name


def test_a_step_past_its_limit_is_killed_with_the_processes_it_started_in_sessions_of_their_own(tmp_path: Path
                                                                                              ) -> None:
    """A sandboxed job starts a session of its own: killing the step's process group alone would leave it running."""
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    pid_file = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    outcome, = driver.run_together([_step("spawner", code, 3)], dict(os.environ), out, work,
                                   driver.Log(out / "gpu_check.log"))
    assert outcome.timed_out
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # killed; reaped by init shortly after
        if not Path(f"/proc/{grandchild}").exists() or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        os.kill(grandchild, signal.SIGKILL)
        pytest.fail("the step's grandchild in its own session outlived the step's limit")


def test_a_check_told_to_stop_kills_its_running_step_and_writes_the_summary(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    log = driver.Log(out / "gpu_check.log")
    summary = driver.Summary(ok=False, dry_run=False)
    signal.signal(signal.SIGALRM, driver._stop)
    signal.alarm(2)
    try:
        with pytest.raises(driver.Stopped, match="SIGALRM"):
            driver.run_batches([[_step("long", "import time; time.sleep(120)", 60)]], dict(os.environ), out, work,
                               log, summary)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    args = driver._parser().parse_args([str(out)])
    original = driver._steps

    def stopped(*_: object) -> int:
        raise driver.Stopped("SIGTERM")

    driver._steps = stopped
    try:
        assert driver.check(args, out, work, log, summary) == 1
    finally:
        driver._steps = original
    written = json.loads((out / "summary.json").read_text())
    assert written["problems"][-1].startswith("stopped by SIGTERM") and written["worst_case_s"] < 360


def _step(name: str, code: str, timeout_s: int) -> object:
    return driver.Step(name, [sys.executable, "-c", code], timeout_s)


def test_a_step_past_its_limit_is_stopped_and_the_summary_is_written_after_every_step(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    seen: list[list[str]] = []
    real_write = driver.write_summary

    def spy(outdir: Path, summary: object) -> None:
        real_write(outdir, summary)
        seen.append([s["name"] for s in json.loads((outdir / "summary.json").read_text())["steps"]])

    summary = driver.Summary(ok=False, dry_run=False)
    batches = [[_step("slow", "import time; time.sleep(60)", 1)], [_step("quick", "print('done')", 30)]]
    original, driver.write_summary = driver.write_summary, spy
    try:
        driver.run_batches(batches, dict(os.environ), out, work, driver.Log(out / "gpu_check.log"), summary)
    finally:
        driver.write_summary = original
    assert seen == [["slow"], ["slow", "quick"]]  # on disk after each step, not only at the end
    slow, quick = summary.steps
    assert slow.timed_out and slow.seconds < 30 and not quick.timed_out and quick.returncode == 0


SMOKE = "import json, sys; open(sys.argv[1], 'w').write(json.dumps({{'runs': [{{'what': 'CUDA starts in a sandboxed " \
        "job', 'ok': {ok}, 'seconds': 1.0, 'detail': 'x'}}], 'cuda_ok': {ok}}}))"


@pytest.mark.parametrize("cuda_ok", [True, False, None])  # None: the smoke step overran and wrote nothing
def test_when_cuda_does_not_start_in_the_sandbox_the_later_steps_are_skipped_and_say_why(tmp_path: Path,
                                                                                         cuda_ok: bool | None) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    code = "import time; time.sleep(60)" if cuda_ok is None else SMOKE.format(ok=cuda_ok)
    smoke = driver.Step("smoke", [sys.executable, "-c", code, str(out / "smoke.json")], 2)
    summary = driver.Summary(ok=False, dry_run=False)
    driver.run_batches([[smoke], [_step("later", "print('ran')", 30)]], dict(os.environ), out, work,
                       driver.Log(out / "gpu_check.log"), summary)
    skipped = cuda_ok is False
    assert [o.name for o in summary.steps] == (["smoke"] if skipped else ["smoke", "later"])
    assert summary.skipped == (["later"] if skipped else [])
    first = summary.expectations[0]
    if cuda_ok is None:
        assert first.what.startswith("the smoke step ran") and not first.met and summary.steps[0].timed_out
    else:
        assert first.what == "CUDA starts in a sandboxed job" and first.met is cuda_ok
    if skipped:
        assert "skipped: the smoke step showed CUDA does not start" in summary.expectations[-1].detail


def test_the_cuda_graph_comparison_is_a_figure_not_an_expectation(tmp_path: Path) -> None:
    stub = _load("stub_step")
    report = stub.report(tmp_path).model_copy(update={"graph_decode_ms": None, "speedup": 1.1,
                                                      "notes": ["CUDA-graph decode: capture failed (stub)"]})
    (tmp_path / "report.json").write_text(report.model_dump_json())
    expectations, figures = driver.optimize_expectations(tmp_path)
    assert expectations and all(e.met for e in expectations)
    assert not any("CUDA-graph" in e.what or "goal" in e.what for e in expectations)
    assert [f.detail for f in figures][0] == "CUDA-graph decode: capture failed (stub)"
    assert figures[1].detail.startswith("not met")


# A Python that lacks what the node's image lacks: pydantic and pysimdjson do not import.
WITHOUT_WHEELS = """
import sys
class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pydantic", "pydantic_core", "simdjson"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, _Absent())
"""


def _refusal(tmp_path: Path, *extra: str) -> tuple[int, list[str]]:
    hide = tmp_path / "node_python"
    hide.mkdir(exist_ok=True)
    (hide / "sitecustomize.py").write_text(WITHOUT_WHEELS)
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(hide)}
    proc = subprocess.run([str(ROOT / "benchmarks" / "gpu_check.sh"), "--work", str(tmp_path / "work"), *extra,
                           str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=180)
    return proc.returncode, proc.stderr.strip().splitlines()


def test_missing_wheels_are_refused_in_one_line_that_says_how_to_fetch_them(tmp_path: Path) -> None:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    code, lines = _refusal(tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("gpu_check: ") and "pydantic" in lines[0] and "simdjson" in lines[0]
    assert f"fetch_wheels.py DIR --python-version {version}" in lines[0] and "--wheels DIR" in lines[0]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["steps"] == [] and summary["problems"] == [lines[0].removeprefix("gpu_check: ")]


def test_wheels_for_another_python_are_refused_before_anything_is_installed(tmp_path: Path) -> None:
    fetch = _load("fetch_wheels")
    other = "cp39" if sys.version_info[:2] != (3, 9) else "cp310"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for pin in fetch.NODE_WHEELS:  # the pure-Python ones would do; the compiled ones are for another Python
        name, version = pin.split("==")
        tag = f"{other}-{other}-manylinux_2_17_x86_64" if name in ("pydantic-core", "pysimdjson") else "py3-none-any"
        (wheels / f"{fetch._normal(name)}-{version}-{tag}.whl").write_bytes(b"")
    code, lines = _refusal(tmp_path, "--wheels", str(wheels))
    assert code == 2 and len(lines) == 1, lines
    assert "lacks pydantic-core==" in lines[0] and "pysimdjson==" in lines[0] and "pydantic==" not in lines[0]
    assert not (tmp_path / "work" / "wheels_site").exists()


def test_the_fetch_command_asks_pip_for_binary_wheels_for_the_nodes_python(tmp_path: Path) -> None:
    fetch = _load("fetch_wheels")
    cmd = fetch.command(tmp_path, "3.12")
    assert cmd[1:4] == ["-m", "pip", "download"] and "--only-binary=:all:" in cmd and "--no-deps" in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and "manylinux2014_x86_64" in cmd
    assert [a for a in cmd if "==" in a] == list(fetch.NODE_WHEELS)
    assert fetch.missing(tmp_path, "3.12") == list(fetch.NODE_WHEELS)


def _expectations(tmp_path: Path, correct: object, racy: object, interpreter_problem: str = "") -> dict[str, object]:
    (tmp_path / "verdict_correct.json").write_text(correct.model_dump_json())  # type: ignore[attr-defined]
    (tmp_path / "verdict_racy.json").write_text(racy.model_dump_json())  # type: ignore[attr-defined]
    return {e.what: e for e in driver.verify_expectations(tmp_path, interpreter_problem)}


def test_the_sanitizer_expectation_needs_every_tool_to_have_run(tmp_path: Path) -> None:
    stub = _load("stub_step")
    correct, racy = stub.verdict("correct"), stub.verdict("racy")
    assert all(e.met for e in _expectations(tmp_path, correct, racy).values())
    runs = [r.model_copy(update={"ran": r.tool != "memcheck"}) for r in correct.sanitizer_runs]
    found = _expectations(tmp_path, correct.model_copy(update={"sanitizer_runs": runs}), racy)
    assert not found[driver.SANITIZER_RAN].met and "memcheck: did not run" in found[driver.SANITIZER_RAN].detail
    assert sorted(r.tool for r in correct.sanitizer_runs) == sorted(driver.SANITIZER_TOOLS)


def test_without_the_interpreter_only_its_own_expectation_is_unmet_and_says_why(tmp_path: Path) -> None:
    """The node's Triton interpreter does not run (the preflight said so): `race` is not_run in the verdict, which
    neither the correct kernel's verdict nor the sanitizer expectation may count against it."""
    from kernelbot.records import InterpreterCoverage

    stub = _load("stub_step")
    correct = stub.verdict("correct")
    checks = [c.model_copy(update={"status": "not_run", "detail": "compute-sanitizer racecheck/synccheck: no errors; "
                                   "no Triton interpreter on the node's CPU"}) if c.id == "race" else c
              for c in correct.checks]
    correct = correct.model_copy(update={"checks": checks, "not_run": ["race"],
                                         "interpreter_race": InterpreterCoverage.NOT_RUN})
    found = _expectations(tmp_path, correct, stub.verdict("racy"), "ImportError: numpy 2.4")
    assert [what for what, e in found.items() if not e.met] == [driver.INTERPRETED]
    assert "the preflight found it does not run here: ImportError: numpy 2.4" in found[driver.INTERPRETED].detail


def test_the_racy_kernel_is_expected_to_fail_correctness_on_the_gpu_not_racecheck(tmp_path: Path) -> None:
    """Its race is in global memory, which racecheck does not watch: a verdict failing only `race` (as a racecheck
    finding would) does not meet the expectation; one failing correctness does."""
    stub = _load("stub_step")
    correct, racy = stub.verdict("correct"), stub.verdict("racy")
    assert "correctness" in racy.failed and all(r.errors == 0 for r in racy.sanitizer_runs)
    assert _expectations(tmp_path, correct, racy)[driver.RACY_CAUGHT].met
    checks = [c.model_copy(update={"status": "pass"}) if c.id == "correctness" else c for c in racy.checks]
    only_race = racy.model_copy(update={"checks": checks, "failed": ["race"]})
    assert not _expectations(tmp_path, correct, only_race)[driver.RACY_CAUGHT].met


def test_a_node_whose_interpreter_does_not_run_is_told_which_expectation_that_affects(tmp_path: Path) -> None:
    summary, work = driver.Summary(ok=False, dry_run=True), tmp_path / "work"
    work.mkdir()
    site = driver.make_site(ROOT, work / "site")
    env = driver._environment(site)
    broken = driver.INTERPRETER_PROBE.replace("_double[(1,)]", "raise ImportError('numpy 2.4 breaks it'); _double")
    original, driver.INTERPRETER_PROBE = driver.INTERPRETER_PROBE, broken
    try:
        driver.preflight(sys.executable, env, site, work, None, driver.Log(tmp_path / "log"), summary,
                         driver.plan(sys.executable, work, tmp_path))
    finally:
        driver.INTERPRETER_PROBE = original
    assert summary.interpreter_problem == "ImportError: numpy 2.4 breaks it"
    note = next(n for n in summary.notes if "interpreter does not run here" in n)
    assert driver.INTERPRETED in note and "no other expectation depends on it" in note


def test_the_smoke_step_hands_the_sandbox_jobs_it_can_read_and_reports_each(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The smoke's three jobs with the sandbox stubbed (no GPU here): each job is one the harness accepts, its files
    load as the harness loads them, and the record says which ran."""
    import torch

    import kernelbot.sandbox
    from kernelbot.agent.verify import sanitizer
    from kernelbot.agent.verify.messages import JOB, BenchJob, BenchResult, Done, Facts, SanitizeJob, SentPlan
    from kernelbot.sandbox import SandboxResult

    def run_job(job: dict, workdir: Path, timeout: float, env: dict | None = None, wrapper: list | None = None,
                gpu: int | None = None) -> SandboxResult:
        parsed = JOB.validate_python(job)
        assert gpu == 0 and timeout <= 14
        if isinstance(parsed, SanitizeJob):
            SentPlan.model_validate(torch.load(parsed.plan))
            payload = Done()
        else:
            assert isinstance(parsed, BenchJob) and parsed.device == "cuda"
            assert len(torch.load(parsed.inputs)) == 2
            payload = BenchResult(reference_us=[3.0], candidate_us=[3.0], reference_mean_us=[3.0],
                                  candidate_mean_us=[3.0], iters=1, facts=Facts())
        if wrapper:  # under compute-sanitizer: say it ran and found nothing
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "stderr.txt").write_text("========= ERROR SUMMARY: 0 errors\n")
        return SandboxResult("ok", 1.0, 0, "", payload.model_dump(mode="json"))

    monkeypatch.setattr(kernelbot.sandbox, "run_job", run_job)
    monkeypatch.setattr(sanitizer, "run_job", run_job)
    smoke = _load("smoke")
    monkeypatch.setattr(smoke.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert smoke.main([str(tmp_path / "smoke.json"), "--budget", "14"]) == 0
    record = smoke.Smoke.model_validate_json((tmp_path / "smoke.json").read_text())
    assert record.cuda_ok and [r.ok for r in record.runs] == [True, True, True]
    assert "3.0 µs a call" in record.runs[1].detail
