"""The prepared GPU check (benchmarks/gpu_check.sh) must work the first time a GPU is lent: it fits its 7.5 minutes with
a smoke step first, a step past its limit still leaves a summary, the summary is rewritten after every step, the
CUDA-graph comparison is a figure and not part of the exit code, and missing wheels are refused in one line that
says how to fetch them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
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


def test_the_plan_fits_seven_and_a_half_minutes_with_a_short_smoke_step_first(tmp_path: Path) -> None:
    batches = driver.plan("python3", tmp_path / "work", tmp_path / "out")
    assert [s.name for s in batches[0]] == ["smoke"] and batches[0][0].timeout_s <= 50
    assert sum(max(s.timeout_s for s in batch) for batch in batches) <= 7.5 * 60 == driver.BUDGET_S
    for batch in batches:
        for step in batch:
            if "kernelbot.cli" in step.argv:  # every candidate job has a limit the step's own limit covers
                job_s = int(step.argv[step.argv.index("--timeout") + 1])
                sanitizer_s = job_s if "verify" in step.argv else 0  # its four tools share one job's time
                assert job_s + sanitizer_s < step.timeout_s, step.name


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


def test_the_sanitizer_expectation_needs_every_tool_to_have_run(tmp_path: Path) -> None:
    stub = _load("stub_step")
    verdict = stub.verdict("correct")
    (tmp_path / "verdict_correct.json").write_text(verdict.model_dump_json())
    assert all(e.met for e in driver.verify_expectations(tmp_path) if "compute-sanitizer" in e.what)
    # memcheck did not run: the verdict keeps the judge's own out_of_bounds check, which passed
    checks = [c.model_copy(update={"detail": "guards intact"}) if c.id == "out_of_bounds" else c
              for c in verdict.checks]
    (tmp_path / "verdict_correct.json").write_text(verdict.model_copy(update={"checks": checks}).model_dump_json())
    sanitizer = next(e for e in driver.verify_expectations(tmp_path) if "compute-sanitizer" in e.what)
    assert not sanitizer.met and "out_of_bounds pass: guards intact" in sanitizer.detail


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
            payload = BenchResult(reference_us=[3.0], candidate_us=[3.0], iters=1, facts=Facts())
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
