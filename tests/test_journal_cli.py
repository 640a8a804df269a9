"""The overnight CLI: resume, status and budgets — bad input is one line; options survive the journal; the time
budget keeps back what finishing needs; and (slow) a real run stops within its budget and still reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kernelbot.agent.journal.db import Journal
from kernelbot.agent.journal.run_state import Clock
from kernelbot.agent.llm.budget import Budget
from kernelbot.agent.llm.llm_options import LLMOptions
from kernelbot.agent.optimize import OptimizeOptions
from kernelbot.cli import main


def _one_line(capsys, *needles: str) -> None:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("argv, needles", [
    (["optimize", "--resume", "{tmp}/nothing"], ["no journal.sqlite", "nothing to resume"]),
    (["optimize", "--resume", "{tmp}", "--run-dir", "{tmp}/x"], ["drop --run-dir"]),
    (["optimize", "--budget-hours", "-1", "--run-dir", "{tmp}/r"], ["--budget-hours must be positive"]),
    (["optimize", "--iterations", "0", "--run-dir", "{tmp}/r"], ["--iterations must be at least 1"]),
    (["status", "{tmp}/nothing"], ["no such run directory"]),
    (["status", "{tmp}"], ["not a kernelbot run directory"]),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, needles):
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    _one_line(capsys, *needles)


def test_a_run_directory_in_use_is_refused_and_a_finished_one_is_not_restarted(tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from kernelbot.agent.journal.db import Journal\n"
                               "j = Journal(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(120)", str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["optimize", "--model", "llama-micro", "--run-dir", str(tmp_path)]) == 2
        _one_line(capsys, f"in use by kernelbot process {holder.pid}", "kernelbot status")
        assert main(["status", str(tmp_path)]) == 0
        assert f"(pid {holder.pid})" in capsys.readouterr().out
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    with Journal(tmp_path) as j:
        j.set_meta("options", OptimizeOptions(model="llama-micro", run_dir=tmp_path).model_dump(mode="json"))
    assert main(["optimize", "--model", "llama-micro", "--run-dir", str(tmp_path)]) == 2
    _one_line(capsys, "already holds a run", "--resume")


def test_options_survive_the_journal(tmp_path):
    opts = OptimizeOptions(model="llama-micro", run_dir=tmp_path, families=["rmsnorm"], budget_hours=7.5,
                           store=tmp_path / "store", llm=LLMOptions(model="openai/x", api_base="http://h:1/v1",
                                                                    price=(1.0, 2.0),
                                                                    budget=Budget(max_cost=5.0, max_tokens=10**6)))
    with Journal(tmp_path) as j:
        j.set_meta("options", opts.model_dump(mode="json"))
    with Journal(tmp_path) as j:
        assert OptimizeOptions.model_validate(j.meta("options")) == opts


def test_the_time_budget_spans_sessions_and_keeps_the_finish_back(tmp_path):
    with Journal(tmp_path) as j:
        j.set_meta("elapsed_s", 3500.0)  # an earlier session used 3500 s of the hour
        clock = Clock(j, budget_hours=1.0)
        assert 3500 <= clock.elapsed() < 3510 and clock.left() <= 100
        assert clock.affords(50) and not clock.affords(200)
        clock.reserve = 80
        assert not clock.affords(50) and clock.spent() is None  # a first candidate's guessed 10 s still fit
        clock.longest_candidate = 50
        assert not clock.affords_candidate() and str(clock.spent()).startswith("time budget: 0.97")
        clock.longest_candidate = 5
        assert clock.affords_candidate() and clock.spent() is None
        unlimited = Clock(j, None)
        unlimited.reserve = 10**9
        assert unlimited.affords(10**6) and unlimited.spent() is None


def test_a_generate_step_the_time_budget_refuses_returns_the_spent_budget_as_its_stop(tmp_path, monkeypatch):
    """The run's stop reason is not a field any step writes: the step returns the budget that refused its work (a
    typed value, what was used of it then), its note names it, and the run's loop alone keeps it."""
    from rich.console import Console

    from kernelbot.agent import generate
    from kernelbot.agent.journal.run_state import BudgetSpent, RunState
    from kernelbot.agent.stages import Stages
    from kernelbot.records import Device, Task

    monkeypatch.setattr(generate, "build_library", lambda stages: None)  # nothing is built: no candidate may start
    task = Task(id="t1", hotspot_id="h01", family="rmsnorm", module_class="LlamaRMSNorm", dtype="float32",
                input_shapes=[[4, 1, 128]], free_dims=[[0]], init_args=[128], share=0.2, floor_us=0.5)
    device = Device(kind="cpu", name="test cpu", threads=2, peak_gflops=1.0, peak_gbps=1.0, peaks_source="test")
    with Journal(tmp_path) as j:
        j.set_meta("elapsed_s", 3600.0)  # an earlier session used the whole hour
        state = RunState(j, Clock(j, budget_hours=1.0), None, "cpu:test cpu")
        generation = generate.Generation(OptimizeOptions(), tmp_path, state, Stages(Console(quiet=True), tmp_path),
                                         device)
        generated = generation.generate([task], [], {})
    assert isinstance(generated.stopped, BudgetSpent) and generated.stopped.limit_s == 3600.0
    assert str(generated.stopped).startswith("time budget: 1.0")
    assert generated.rows == [] and generated.notes == [f"t1 and later tasks not tried: {generated.stopped}"]
    assert not hasattr(state, "stop_reason")


@pytest.mark.slow
def test_a_real_run_stops_within_its_time_budget_and_still_reports(tmp_path):
    run_dir, budget_h = tmp_path / "budget", 0.03  # 108 s: far less than every family's candidates need
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kernelbot.cli", "optimize", "--model", "llama-micro", "--batch", "4",
                           "--prompt-len", "8", "--decode-steps", "4", "--no-compile", "--rounds", "3",
                           "--min-share", "0", "--no-store", "--budget-hours", str(budget_h), "--run-dir",
                           str(run_dir)], capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["stop_reason"].startswith("time budget"), report["stop_reason"]
    assert report["seconds"] <= budget_h * 3600, report["seconds"]
    assert wall <= budget_h * 3600 + 45, wall  # + interpreter start and imports, which the run cannot see
    assert (run_dir / "report.html").exists() and "stopped early by the time budget" in (
        run_dir / "report.md").read_text()
