"""On a GPU node, Triton candidates' races between programs are checked in the interpreter on the node's CPU at small
sizes (interpreter_race.py), tried here without a GPU: the decision and the small plan directly, and a whole verify
with device="cuda" whose GPU parts are simulated (each test's docstring says how)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import write_module
from test_verify import RMS_TASK

from kernelbot.agent.tasks.references import reference_source
from kernelbot.agent.verify import cases, compile_gate, interpreter_race, run, sanitizer
from kernelbot.agent.verify.interpreter_race import Coverage
from kernelbot.agent.verify.messages import Facts, Profile, PtxasReport, VerifyResult
from kernelbot.records import Check, SanitizerRun, Verdict
from kernelbot.sandbox import SandboxResult

GPU_REPORT = VerifyResult(facts=Facts(), profile=Profile())


def test_a_finished_gpu_job_plans_a_small_interpreter_job_on_the_nodes_cpu() -> None:
    planned = interpreter_race.plan_for("cuda", GPU_REPORT, triton_installed=True)
    assert planned is not None and planned.coverage is Coverage.RUN and planned.budget == cases.SMALL
    assert interpreter_race.plan_for("cpu", GPU_REPORT, triton_installed=True) is None  # the CPU job checks itself
    assert interpreter_race.plan_for("cuda", None, triton_installed=True) is None  # nothing to add to


def test_cuda_code_is_left_to_compute_sanitizer_and_a_node_without_triton_leaves_race_not_run() -> None:
    built = GPU_REPORT.model_copy(update={"ptxas": [PtxasReport(ok=True)]})
    cuda = interpreter_race.plan_for("cuda", built, triton_installed=True)
    assert cuda is not None and cuda.coverage is Coverage.NOT_TRITON and "CUDA code" in cuda.why
    missing = interpreter_race.plan_for("cuda", GPU_REPORT, triton_installed=False)
    assert missing is not None and missing.coverage is Coverage.NOT_RUN and "pip install triton" in missing.why
    sanitized = [Check(id="race", status="pass", detail="compute-sanitizer racecheck/synccheck: no errors"),
                 Check(id="out_of_bounds", status="pass", detail="compute-sanitizer memcheck: no errors")]
    race, bounds = interpreter_race.merged(sanitized, missing)
    assert race.status == "not_run" and "racecheck" in race.detail and "not installed" in race.detail
    assert bounds.status == "pass" and "not installed" in bounds.detail  # memcheck still saw every access
    race, _ = interpreter_race.merged(sanitized, cuda)
    assert race.status == "pass" and "CUDA code" in race.detail


def test_a_cpu_job_that_never_reaches_its_judge_is_no_pass() -> None:
    crashed = Verdict(candidate_id="c", verdict="fail", failed=["crash"], shapes=[], seconds=1.0, checks=[
        Check(id="crash", status="fail", detail="RuntimeError: Expected all tensors to be on cuda"),
        Check(id="correctness", status="not_run", detail="not reached")])
    found = interpreter_race.outcome(crashed)
    assert found.coverage is Coverage.NOT_RUN and "on cuda" in found.why
    race, = interpreter_race.merged([Check(id="race", status="pass", detail="racecheck: no errors")], found)
    assert race.status == "not_run"
    race, = interpreter_race.merged([Check(id="race", status="fail", detail="racecheck: 2 errors")], found)
    assert race.status == "fail"


BIG_REFERENCE = """
import torch
from torch import nn

batch_size = 4096
dim = 16384


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
"""


def _input_bytes(plan: cases.Plan) -> list[int]:
    return [cases._nbytes(case.inputs) for case in plan.cases]


def test_the_small_plan_keeps_every_input_set_within_its_budget(tmp_path: Path) -> None:
    task = run.task_from_reference(write_module(tmp_path / "big.py", BIG_REFERENCE))
    module = run.load_reference(tmp_path / "big.py")
    full, small = cases.plan(module, task, 3), cases.plan(module, task, 3, budget=cases.SMALL)
    assert max(_input_bytes(full)) > cases.SMALL.original  # the same reference at the usual sizes is far larger
    assert _input_bytes(full)[0] > cases.SMALL.scaled
    assert _input_bytes(small)[0] <= cases.SMALL.scaled
    assert max(_input_bytes(small)) <= cases.SMALL.original and len(small.cases) >= 9  # fuzzed sizes included


def test_the_small_plan_halves_an_optimize_tasks_free_dims_to_fit(tmp_path: Path) -> None:
    task = RMS_TASK.model_copy(update={"input_shapes": [[64, 128, 64]]})  # 2 MiB of input alone
    module = run.load_reference(write_module(tmp_path / "reference.py", reference_source(task)))
    small = cases.plan(module, task, 3, budget=cases.SMALL)
    assert cases.footprint(module, {"INPUT_SHAPES": [list(small.cases[0].inputs[0].shape)]}) <= cases.SMALL_BYTES
    assert small.cases[0].inputs[0].shape[-1] == 64  # the weight-bound dim never changes
    assert list(cases.plan(module, task, 3).cases[0].inputs[0].shape) == [64, 128, 64]  # as observed otherwise


TRITON_CANDIDATE = '''
import torch
import triton
import triton.language as tl
from kernelbot.kernel_library.rmsnorm.reference import Model


@triton.jit
def _rms(x_ptr, w_ptr, out_ptr, sums, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    tl.store(sums + SLOT, tl.sum(x * x, axis=0))  # SLOT 0: every program stores its partial sum to sums[0]
    inv = 1.0 / tl.sqrt(tl.load(sums + SLOT) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * n_cols + cols, w * x * inv, mask=mask)


class ModelNew(Model):
    def forward(self, x):
        x = x.contiguous()
        n = x.shape[-1]
        rows = x.numel() // n
        out = torch.empty_like(x)
        sums = torch.empty(rows, dtype=torch.float32, device=x.device)
        _rms[(rows,)](x, self.weight, out, sums, n, self.variance_epsilon, BLOCK=triton.next_power_of_2(n))
        return out
'''
SANITIZED = [Check(id="race", status="pass", detail="compute-sanitizer racecheck/synccheck: no errors"),
             Check(id="out_of_bounds", status="pass", detail="compute-sanitizer memcheck: no errors"),
             Check(id="unwritten_output", status="pass", detail="compute-sanitizer initcheck: no errors")]


def _verify_as_if_on_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slot: str, arch: str = "sm_90") -> Verdict:
    """verify(device="cuda") with the GPU simulated: torch.cuda.is_available() says yes; the GPU job is the same job
    run on this CPU in the interpreter with its Triton report dropped (on a GPU no interpreter watches, so the GPU
    verdict's own `race` is compute-sanitizer's alone); compute-sanitizer is stubbed to find nothing. The extra job on
    the node's CPU is real: verify(device="cpu") at the small sizes, in the sandbox, with Triton's interpreter."""
    real_run_job, jobs = run.run_job, []

    def run_job(job: dict, workdir: Path, timeout: float, env: dict[str, str], gpu: int | None = None
                ) -> SandboxResult:
        if job["kind"] != "verify":  # the CPU job's compile gate: a job of its own there, run as it is
            return real_run_job(job, workdir, timeout=timeout, env=env, gpu=gpu)
        jobs.append((job["device"], job["triton"]))
        if job["device"] == "cpu":
            return real_run_job(job, workdir, timeout=timeout, env=env, gpu=gpu)
        # run as a CPU job, whose process filter refuses Triton's ptxas: no compile gate in it (its Triton report,
        # the gate's builds included, is dropped anyway)
        cpu_env = {k: v for k, v in env.items() if k != compile_gate.TARGET_ENV}
        result = real_run_job({**job, "device": "cpu", "triton": True}, workdir, timeout=timeout,
                              env={**cpu_env, "TRITON_INTERPRET": "1"}, gpu=None)
        if result.payload is not None:
            result.payload["triton"] = None
        return result

    monkeypatch.setattr(run.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(run, "device_target", lambda index: arch)  # the simulated GPU's own architecture
    monkeypatch.setattr(run, "run_job", run_job)
    monkeypatch.setattr(run, "sanitize", lambda *args: sanitizer.Sanitized(list(SANITIZED), [
        SanitizerRun(tool=tool, ran=True) for tool in sanitizer.SANITIZER_TOOLS]))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    cand = write_module(tmp_path / "c" / "candidate.py", TRITON_CANDIDATE.replace("SLOT", slot))
    verdict = run.verify(RMS_TASK, ref, cand, tmp_path / "w", device="cuda", timeout=300)
    assert jobs == [("cuda", False), ("cpu", True)]  # the GPU job, then the interpreter's on the node's CPU
    return verdict


@pytest.mark.parametrize("slot,race", [("0", "fail"), pytest.param("row", "pass", marks=pytest.mark.slow)])
def test_on_a_gpu_node_a_race_between_triton_programs_fails_race_through_the_interpreter_on_its_cpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slot: str, race: str) -> None:
    """Every program storing its partial sum to sums[0] is right when programs run one at a time (the simulated GPU
    job's correctness passes) and compute-sanitizer finds nothing: only the interpreter's job sees the race. With a
    slot per row the same kernel is race-free and passes."""
    verdict = _verify_as_if_on_a_gpu(tmp_path, monkeypatch, slot)
    status = {c.id: c for c in verdict.checks}
    assert status["correctness"].status == "pass", status["correctness"]
    assert status["race"].status == race, status["race"]
    assert "racecheck/synccheck: no errors" in status["race"].detail
    assert "Triton interpreter on the node's CPU at small sizes" in status["race"].detail
    assert ("sums+0" in status["race"].detail) == (race == "fail")
    assert status["out_of_bounds"].status == "pass" and "memcheck" in status["out_of_bounds"].detail
    assert verdict.triton_launches > 0 and verdict.verdict == ("pass" if race == "pass" else "fail")
    assert verdict.interpreter_race is Coverage.CHECKED and all(r.ran for r in verdict.sanitizer_runs)  # typed


def test_a_gpu_verdict_does_not_build_the_cpu_library_and_a_failed_build_ends_in_a_verdict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU job and the interpreter's re-check on the node's CPU run no C++ candidate: the CPU library is never
    built for them, so a node without ninja or a compiler (simulated: the build raises torch's own error) still gets
    the verdict, race checked by the interpreter."""
    from kernelbot.kernel_library import cpp_build

    tried: list[bool] = []

    def no_ninja() -> dict[str, str]:
        tried.append(True)
        raise RuntimeError("Ninja is required to load C++ extensions (pip install ninja to get it)")

    monkeypatch.setattr(cpp_build, "prebuild_library", no_ninja)
    verdict = _verify_as_if_on_a_gpu(tmp_path, monkeypatch, "row", arch="sm_80")
    assert tried == [] and verdict.verdict == "pass", verdict.failed
    # the interpreter's job compiled the candidate's kernel for the GPU's own architecture
    assert verdict.builds and all(b.ok and b.target == "sm_80" and b.kernel == "_rms" for b in verdict.builds)
    race = next(c for c in verdict.checks if c.id == "race")
    assert race.status == "pass" and "Triton interpreter on the node's CPU" in race.detail


def test_an_interpreter_job_that_raises_leaves_race_not_run_and_the_gpu_verdict_stands() -> None:
    def broken(budget: cases.SizeBudget) -> Verdict:
        raise RuntimeError("the node's CPU job could not start")

    found = interpreter_race.run(interpreter_race.InterpreterRace(coverage=Coverage.RUN), broken)
    assert found.coverage is Coverage.NOT_RUN and "RuntimeError: the node's CPU job could not start" in found.why
    race, = interpreter_race.merged([Check(id="race", status="pass", detail="racecheck: no errors")], found)
    assert race.status == "not_run" and "could not start" in race.detail
