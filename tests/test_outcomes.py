"""A candidate's outcome is a value (KernelOutcome): what is shown, picked, outpaced or deferred is decided from
values, never from the wording of a reason, which is for people only."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError
from rich.console import Console

from kernelbot.agent.optimize import OptimizeOptions
from kernelbot.agent.report.markdown import _kernel_rows, summary_table
from kernelbot.agent.tasks import plan as plan_mod
from kernelbot.agent.tasks.plan import ModelTasks, plan_tasks, signature
from kernelbot.agent.verify import evaluate as evaluate_mod
from kernelbot.agent.verify.evaluate import evaluate
from kernelbot.engine.extract import NotExtractable
from kernelbot.outcomes import Accepted, new_row, pick_best
from kernelbot.records import Bench, Candidate, Check, Hotspot, KernelOutcome, KernelResult, Report, Task, Verdict

MISLEADING_VERIFIED = "verified; 9.99x beyond noise (this wording must decide nothing)"


def _task() -> Task:
    return Task(id="t1", hotspot_id="h01", family="rmsnorm", module_class="LlamaRMSNorm", dtype="float32",
                input_shapes=[[4, 1, 128]], free_dims=[[0]], init_args=[128], share=0.2, floor_us=0.5)


def _cand(cid: str) -> Candidate:
    return Candidate(id=cid, task_id="t1", backend="cpp", proposer="builtin", config={}, source_hash=cid)


def _row(cid: str, outcome: KernelOutcome, reason: str, speedup: float | None = None) -> KernelResult:
    return KernelResult(op="rmsnorm", module="LlamaRMSNorm", backend="cpp", shapes=[[4, 1, 128]], status="rejected",
                        reason=reason, speedup=speedup, outcome=outcome, candidate_id=f"t1/{cid}")


def _bench(cid: str, speedup: float, significant: bool = True) -> Bench:
    return Bench(candidate_id=cid, rounds=9, reference_us=10.0, candidate_us=10.0 / speedup, reference_spread=0.01,
                 candidate_spread=0.01, speedup=speedup, significant=significant)


def _verdict(cid: str, passed: bool) -> Verdict:
    check = Check(id="correctness", status="pass" if passed else "fail", detail="" if passed else "verified? no")
    return Verdict(candidate_id=cid, verdict="pass" if passed else "fail", failed=[] if passed else ["correctness"],
                   checks=[check], shapes=[[[4, 1, 128]]], seconds=0.1)


def _shown_in_summary(kernels: list[KernelResult]) -> str:
    report = Report.model_construct(run_id="r", speedup=1.0, baseline_ms=1.0, optimized_ms=1.0, compiled_ms=None,
                                    kernels=kernels)
    out = io.StringIO()
    Console(file=out, width=300).print(summary_table(report))
    return out.getvalue()


def test_a_row_whose_reason_starts_with_verified_but_whose_outcome_is_failed_is_shown_as_a_failure() -> None:
    shown = _shown_in_summary([_row("liar", KernelOutcome.FAILED, MISLEADING_VERIFIED),
                               _row("quiet", KernelOutcome.NOT_FASTER, "failed correctness (wording only)", 1.01)])
    assert "t1/liar" in shown
    assert "t1/quiet" not in shown  # verified and not faster: not a failure worth reading, whatever its reason says


def test_an_explicit_outcome_wins_over_a_reason_that_says_otherwise() -> None:
    row = _row("liar", KernelOutcome.FAILED, MISLEADING_VERIFIED)
    again = KernelResult.model_validate_json(row.model_dump_json())
    assert again.outcome is KernelOutcome.FAILED and not again.outcome.verified


def test_pick_best_outpaces_rows_by_their_outcome_not_their_reason(tmp_path: Path) -> None:
    task = _task()
    best = Accepted(task, _cand("fast"), tmp_path / "fast.py", _verdict("fast", True), _bench("fast", 3.0))
    rows = [_row("fast", KernelOutcome.FASTER, "any words", 3.0),
            _row("second", KernelOutcome.FASTER, "words that do not start with v", 2.0),
            _row("posing", KernelOutcome.NOT_FASTER, MISLEADING_VERIFIED, 1.02)]
    ranked, chosen = pick_best(task, rows, [best])
    assert chosen is best
    fast, second, posing = ranked
    assert (fast.status, fast.outcome) == ("accepted", KernelOutcome.ACCEPTED)
    assert second.outcome is KernelOutcome.OUTPACED and "fast was faster still" in second.reason
    assert posing.outcome is KernelOutcome.NOT_FASTER and posing.reason == MISLEADING_VERIFIED


@pytest.mark.parametrize(("passed", "bench", "expected"), [
    (True, _bench("c", 2.0, significant=True), KernelOutcome.FASTER),
    (True, _bench("c", 1.01, significant=False), KernelOutcome.NOT_FASTER),
    (False, None, KernelOutcome.FAILED),
    (True, RuntimeError("the harness broke"), KernelOutcome.HARNESS_ERROR),
])
def test_evaluate_records_what_happened_as_an_outcome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, passed: bool,
                                                       bench: Bench | Exception | None,
                                                       expected: KernelOutcome) -> None:
    def fake_bench(*_: Any, **__: Any) -> Bench:
        if isinstance(bench, Exception):
            raise bench
        assert bench is not None
        return bench

    monkeypatch.setattr(evaluate_mod, "verify", lambda *_, **__: _verdict("c", passed))
    monkeypatch.setattr(evaluate_mod, "bench", fake_bench)
    path = tmp_path / "c" / "candidate.py"
    path.parent.mkdir()
    out = evaluate(_task(), tmp_path, _cand("c"), path, "cpu", seed=0, timeout=5.0, bench_rounds=3)
    assert out.row.outcome is expected
    assert (out.accepted is not None) == (expected is KernelOutcome.FASTER)


def test_a_verified_cpp_candidate_on_a_gpu_is_not_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evaluate_mod, "verify", lambda *_, **__: _verdict("c", True))
    path = tmp_path / "c" / "candidate.py"
    path.parent.mkdir()
    out = evaluate(_task(), tmp_path, _cand("c"), path, "cuda", seed=0, timeout=5.0, bench_rounds=3)
    assert out.row.outcome is KernelOutcome.NOT_TIMED and out.row.outcome.verified


@pytest.mark.parametrize(("declared", "launches", "expected"), [
    ("cpp", 3, KernelOutcome.NOT_TIMED),  # Triton in disguise: it ran in the interpreter
    ("triton", 0, KernelOutcome.FASTER),  # "triton" in its source, C++ in its calls: timed
])
def test_what_a_candidate_launched_decides_whether_it_is_timed_on_a_cpu_not_its_declared_backend(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, declared: str, launches: int,
        expected: KernelOutcome) -> None:
    verdict = _verdict("c", True).model_copy(update={"triton_launches": launches})
    monkeypatch.setattr(evaluate_mod, "verify", lambda *_, **__: verdict)
    monkeypatch.setattr(evaluate_mod, "bench", lambda *_, **__: _bench("c", 2.0))
    path = tmp_path / "c" / "candidate.py"
    path.parent.mkdir()
    cand = _cand("c").model_copy(update={"backend": declared})
    out = evaluate(_task(), tmp_path, cand, path, "cpu", seed=0, timeout=5.0, bench_rounds=3)
    assert out.row.outcome is expected, out.row.reason
    assert out.row.backend == ("triton" if launches else declared)


def test_a_row_made_without_running_anything_has_no_candidate() -> None:
    assert new_row(_task(), _cand("c")).outcome is KernelOutcome.NO_CANDIDATE


@pytest.mark.parametrize(("status", "reason", "expected"), [
    ("accepted", "verified; 2.00x beyond noise", KernelOutcome.ACCEPTED),
    ("rejected", "verified; 2.00x beyond noise", KernelOutcome.FASTER),
    ("rejected", "verified and faster (2.00x), but cpp-2 was faster still", KernelOutcome.OUTPACED),
    ("rejected", "verified but not faster beyond noise: 1.01x (spread 2%/3%)", KernelOutcome.NOT_FASTER),
    ("rejected", "verified (compiled); not timed: a cpp kernel does not run on this cuda device",
     KernelOutcome.NOT_TIMED),
    ("rejected", "failed correctness: max abs error 3.1", KernelOutcome.FAILED),
    ("rejected", "harness error: RuntimeError: boom", KernelOutcome.HARNESS_ERROR),
    ("rejected", "LLM answer unusable: no code block", KernelOutcome.NO_CANDIDATE),
    ("rejected", "not verified here: Triton's CPU interpreter takes minutes", KernelOutcome.NOT_VERIFIED),
])
def test_an_older_row_without_an_outcome_loads_with_the_outcome_its_reason_stated(status: str, reason: str,
                                                                                 expected: KernelOutcome) -> None:
    old = {"op": "rmsnorm", "module": "LlamaRMSNorm", "backend": "cpp", "shapes": [[4, 1, 128]], "status": status,
           "reason": reason, "speedup": None}
    assert KernelResult.model_validate(old).outcome is expected


def test_the_report_table_shows_the_outcome_not_a_guess_from_the_reason() -> None:
    rows = [line for line in _kernel_rows([_row("liar", KernelOutcome.FAILED, MISLEADING_VERIFIED)])
            if "t1/liar" in line]
    assert len(rows) == 1 and "| rejected | failed |" in rows[0]


def _generic_hotspot(share: float = 0.3) -> Hotspot:
    return Hotspot(id="h07", module_class="OddBlock", module_paths=["model/layers.0/odd"], family=None,
                   input_dims=[[4, 8, 64]], dtype="float32", calls=4, total_us=100.0, share=share, score_us=90.0)


def test_a_hotspot_over_the_max_tasks_budget_is_deferred_to_a_later_iteration(tmp_path: Path) -> None:
    h, deferred = _generic_hotspot(), {}
    engine = SimpleNamespace(model=None, run_workload=None)  # not touched: a deferred hotspot gets no task
    tasks, notes = plan_tasks([h], ModelTasks(engine), OptimizeOptions(max_tasks=0), tmp_path, attempted=set(),
                              deferred=deferred)
    assert tasks == [] and notes == []
    assert deferred == {signature(h): "h07 OddBlock [[4, 8, 64]] (30.0%): no task, over the --max-tasks 0 budget "
                                       "of iteration 1"}


def test_a_hotspot_whose_no_task_reason_mentions_max_tasks_is_noted_not_deferred(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def cannot_extract(*_: Any) -> Any:
        raise NotExtractable("its forward reads sys.argv for --max-tasks")

    monkeypatch.setattr(plan_mod, "module_labels", lambda *_: {})
    monkeypatch.setattr(plan_mod, "make_generic_task", cannot_extract)
    h, deferred = _generic_hotspot(), {}
    engine = SimpleNamespace(model=None, run_workload=None)
    tasks, notes = plan_tasks([h], ModelTasks(engine), OptimizeOptions(max_tasks=8), tmp_path, attempted=set(),
                              deferred=deferred)
    assert tasks == [] and deferred == {}
    assert notes == ["h07 OddBlock [[4, 8, 64]] (30.0%): no task, no generic task: its forward reads sys.argv for "
                     "--max-tasks"]



def test_where_no_generic_candidate_can_be_made_a_generic_hotspot_is_refused_before_it_takes_a_task_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_extract(*_: Any) -> Any:
        raise AssertionError("a refused hotspot must not be extracted (it runs the model)")

    monkeypatch.setattr(plan_mod, "module_labels", must_not_extract)
    monkeypatch.setattr(plan_mod, "make_generic_task", must_not_extract)
    h, deferred = _generic_hotspot(), {}
    engine = SimpleNamespace(model=None, run_workload=None)
    why = "no generic task: the built-in generator writes C++ for CPUs"
    tasks, notes = plan_tasks([h], ModelTasks(engine, why), OptimizeOptions(max_tasks=0), tmp_path, attempted=set(),
                              deferred=deferred)
    assert tasks == [] and deferred == {}  # refused, not deferred: a later iteration cannot do better
    assert notes == [f"h07 OddBlock [[4, 8, 64]] (30.0%): no task, {why}"]


def test_a_rows_status_follows_its_outcome_and_is_written_for_readers_of_the_file() -> None:
    row = _row("c", KernelOutcome.FASTER, MISLEADING_VERIFIED)
    assert (row.accepted, row.status) == (False, "rejected")
    row = row.model_copy(update={"outcome": KernelOutcome.ACCEPTED})  # the crowning step gives the outcome only:
    assert (row.accepted, row.status) == (True, "accepted")  # the status cannot lag behind
    assert KernelResult.model_validate_json(row.model_dump_json()) == row and '"status":"accepted"' in \
        row.model_dump_json()


def test_a_candidates_origin_is_a_value_and_older_records_get_theirs_from_the_proposers_name() -> None:
    from kernelbot.records import Origin

    assert _cand("c").origin is Origin.BUILTIN
    old = {"id": "c", "task_id": "t1", "backend": "cpp", "config": {}, "source_hash": "c"}
    assert Candidate.model_validate({**old, "proposer": "llm:openai/x"}).origin is Origin.LLM
    assert Candidate.model_validate({**old, "proposer": "store:builtin"}).origin is Origin.STORE
    # a name proves nothing once the origin is recorded: the value decides
    assert Candidate.model_validate({**old, "proposer": "llm:x", "origin": "builtin"}).origin is Origin.BUILTIN


def test_the_reports_rows_are_built_once_from_what_was_learnt_later_and_the_evaluated_rows_stay_as_they_were() -> None:
    from kernelbot.agent.measure.end_to_end import Measured, final_rows
    from kernelbot.records import EndToEndTimes, Fidelity

    won, lost = _row("won", KernelOutcome.ACCEPTED, "verified; 2x"), _row("lost", KernelOutcome.FAILED, "failed x")
    dropped = _row("gone", KernelOutcome.ACCEPTED, "verified; 3x")
    before = [r.model_copy(deep=True) for r in (won, lost, dropped)]
    measured = Measured(calls={"t1__won": 40, "t1__gone": 7}, fallbacks={"LlamaRMSNorm": 3},
                        fidelity=Fidelity(max_abs_logit_diff=0.0, greedy_match=True, token_agreement=1.0),
                        times=EndToEndTimes(eager=[1.0], kernelbot=[0.5]))
    rows = final_rows([won, lost, dropped], measured, {"t1": 1.4}, {"t1/gone": "slower in the model"}, {})
    assert [(r.calls, r.fallback_calls, r.region_compile_speedup) for r in rows] == \
        [(40, 3, 1.4), (0, 0, 1.4), (7, 3, 1.4)]
    assert rows[2].outcome is KernelOutcome.SLOWER_IN_MODEL and rows[2].reason == "slower in the model"
    assert [won, lost, dropped] == before  # joined into new rows: nothing patched the evaluated ones
    assert [r.calls for r in final_rows([won], None, {}, {}, {})] == [0]  # not measured: no calls to report


def test_setting_a_field_of_a_kernel_row_after_it_is_made_raises_so_later_steps_make_new_rows(tmp_path: Path) -> None:
    task = _task()
    row = _row("fast", KernelOutcome.FASTER, "verified; 3.00x beyond noise", 3.0)
    for name, value in (("outcome", KernelOutcome.ACCEPTED), ("reason", "patched"), ("calls", 7)):
        with pytest.raises(ValidationError, match="frozen"):
            setattr(row, name, value)
    best = Accepted(task, _cand("fast"), tmp_path / "fast.py", _verdict("fast", True), _bench("fast", 3.0))
    out = evaluate_mod.Outcome(row, accepted=best)
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.accepted = None  # type: ignore[misc]
    (ranked,), chosen = pick_best(task, [row], [best])
    assert chosen is best and ranked.outcome is KernelOutcome.ACCEPTED
    assert row.outcome is KernelOutcome.FASTER and row.reason == "verified; 3.00x beyond noise"


def test_a_duel_lost_is_joined_into_the_losers_row_whichever_step_made_it_and_takes_it_out_of_the_pack() -> None:
    from kernelbot.agent.measure.end_to_end import Measured, final_rows
    from kernelbot.records import EndToEndTimes, Fidelity

    incumbent = _row("builtin", KernelOutcome.ACCEPTED, "verified; 2x", 2.0)  # an earlier iteration's winner
    challenger = _row("llm-r0-s0", KernelOutcome.ACCEPTED, "verified; 3x", 3.0)
    why = "verified and faster than the op, but 1.50x against llm-r0-s0 in a duel, which replaced it"
    measured = Measured(calls={"t1__llm-r0-s0": 40}, fallbacks={"LlamaRMSNorm": 3},
                        fidelity=Fidelity(max_abs_logit_diff=0.0, greedy_match=True, token_agreement=1.0),
                        times=EndToEndTimes(eager=[1.0], kernelbot=[0.5]))
    lost, won = final_rows([incumbent, challenger], measured, {}, {}, {"t1/builtin": why})
    assert (lost.outcome, lost.reason, lost.fallback_calls) == (KernelOutcome.OUTPACED, why, 0)
    assert (won.outcome, won.fallback_calls, won.calls) == (KernelOutcome.ACCEPTED, 3, 40)
    assert incumbent.outcome is KernelOutcome.ACCEPTED  # the row as made stays: the duel is a record of its own


def test_a_duel_benchmarks_the_challenger_against_the_incumbents_own_code_in_the_sandbox(tmp_path) -> None:
    # the benchmark's runner may read its own module only: the incumbent, kept elsewhere in the run, travels inside it
    from helpers import write_module

    from kernelbot.agent.tasks.references import reference_source
    from kernelbot.agent.verify.evaluate import duel

    task = _task().model_copy(update={"init_args": [128, 1e-6]})
    task_dir = tmp_path / "t1"
    write_module(task_dir / "reference.py", reference_source(task))
    library = "from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp as ModelNew\n"
    incumbent, challenger = (Accepted(task, _cand(cid), write_module(task_dir / "candidates" / cid / "candidate.py",
                                                                     library), _verdict(cid, True), _bench(cid, 2.0))
                             for cid in ("store-cpp", "llm-r0-s0"))
    result = duel(task, task_dir, incumbent, challenger, seed=0, timeout=300, rounds=2, device="cpu")
    assert result.candidate_id == "llm-r0-s0" and result.reference_us > 0 and result.candidate_us > 0
    assert (task_dir / "duels" / "llm-r0-s0-vs-store-cpp" / "bench.json").exists()


TORCH_RMSNORM = '''
import torch
from torch import nn


class ModelNew(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
'''


@pytest.mark.parametrize("requested,gpu", [pytest.param("cuda", 0, marks=pytest.mark.slow), ("cuda:1", 1)])
def test_a_duel_on_a_gpu_run_is_benchmarked_on_the_runs_gpu(tmp_path, monkeypatch, requested: str, gpu: int) -> None:
    """A GPU run (simulated: its Device says cuda; each benchmark job the sandbox gets is recorded, then run on this
    CPU) crowns a challenger: the duel's benchmark runs on the run's GPU, the one the run named (cuda:1) or the
    assigned one (cuda), never on the CPU."""
    from helpers import write_module
    from rich.console import Console

    from kernelbot.agent import generate
    from kernelbot.agent.journal.db import Journal
    from kernelbot.agent.journal.run_state import Clock, RunState
    from kernelbot.agent.run_options import OptimizeOptions
    from kernelbot.agent.stages import Stages
    from kernelbot.agent.tasks.references import reference_source
    from kernelbot.agent.verify import bench as bench_mod
    from kernelbot.records import Device

    real_run_job, jobs = bench_mod.run_job, []

    def run_job(job: dict, workdir, timeout: float, env: dict, gpu: int | None):
        jobs.append((job["device"], gpu))
        return real_run_job({**job, "device": "cpu"}, workdir, timeout=timeout, env=env, gpu=None)

    monkeypatch.setattr(bench_mod, "run_job", run_job)
    monkeypatch.setattr(bench_mod, "gpu_state", lambda index: None)
    monkeypatch.delenv("KERNELBOT_GPU", raising=False)
    task = _task()
    device = Device(kind="cuda", name="simulated GPU", threads=132, peak_gflops=1.0, peak_gbps=1.0,
                    peaks_source="test")
    (tmp_path / "run").mkdir()
    with Journal(tmp_path / "run") as journal:
        generation = generate.Generation(OptimizeOptions(device=requested, bench_rounds=2), tmp_path / "run",
                                         RunState(journal, Clock(journal, None), None, ""),
                                         Stages(Console(quiet=True), tmp_path / "run"), device)
        task_dir = generation.task_dir(task)
        write_module(task_dir / "reference.py", reference_source(task))
        incumbent, challenger = (
            Accepted(task, _cand(cid), write_module(task_dir / "candidates" / cid / "candidate.py", TORCH_RMSNORM),
                     _verdict(cid, True), _bench(cid, 2.0)) for cid in ("store-triton", "llm-r0-s0"))
        winner, _ = generation._crown(task, incumbent, challenger)
    assert jobs == [("cuda", gpu)] and winner in (incumbent, challenger)


@pytest.mark.parametrize("fails_in", ["nothing", "bench"])
def test_the_tensors_a_candidates_jobs_exchanged_are_deleted_once_read_and_their_records_stay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails_in: str) -> None:
    def job(files: tuple[str, ...], result: Any) -> Any:
        def run(task: Task, reference: Path, path: Path, workdir: Path, **_: Any) -> Any:
            workdir.mkdir(parents=True, exist_ok=True)
            for name in files:
                (workdir / name).write_bytes(b"tensor")
            (workdir / "result.json").write_text("{}")
            if fails_in == "bench" and "inputs.pt" in files:
                raise RuntimeError("benchmark refused")
            return result
        return run

    monkeypatch.setattr(evaluate_mod, "verify", job(("plan.pt", "state_dict_0.pt", "outputs.pt"), _verdict("c", True)))
    monkeypatch.setattr(evaluate_mod, "bench", job(("state_dict.pt", "inputs.pt", "outputs.pt"), _bench("c", 2.0)))
    path = tmp_path / "c" / "candidate.py"
    path.parent.mkdir()
    out = evaluate(_task(), tmp_path, _cand("c"), path, "cpu", seed=0, timeout=5.0, bench_rounds=3)
    assert out.row.outcome is (KernelOutcome.FASTER if fails_in == "nothing" else KernelOutcome.HARNESS_ERROR)
    assert not list(path.parent.rglob("*.pt"))
    assert (path.parent / "verify" / "result.json").exists() and (path.parent / "bench" / "result.json").exists()
    assert (path.parent / "verdict.json").exists()
