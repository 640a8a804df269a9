"""One candidate through the sandbox: verify, then (where it can be timed here) benchmark; the verdict,
benchmark and a plain-text report (what an LLM is shown in its repair round) come back, never an exception."""

from __future__ import annotations

import traceback
from pathlib import Path

from kernelbot.agent.verify.bench import bench
from kernelbot.agent.verify.run import verify
from kernelbot.outcomes import Accepted, Outcome, new_row
from kernelbot.records import Bench, Candidate, KernelOutcome, Task, Verdict
from kernelbot.rundir import write_record
from kernelbot.sandbox.gpu import device_kind as kind_of

DETAIL_CHARS = 1500  # per failed check, in the report


SEVERITY = ("sandbox_violation", "harness_tamper", "timing_tamper", "crash", "timeout", "compile")


def _failure_report(verdict: Verdict) -> str:
    lines = [f"verdict: fail ({', '.join(verdict.failed)})"]
    for c in verdict.checks:
        if c.status == "fail":
            lines.append(f"- {c.id}: {c.detail[:DETAIL_CHARS]}")
    passed = [c.id for c in verdict.checks if c.status == "pass"]
    if passed:
        lines.append(f"passed: {', '.join(passed)}")
    return "\n".join(lines)


def evaluate(task: Task, task_dir: Path, cand: Candidate, path: Path, device: str, *, seed: int,
             timeout: float, bench_rounds: int, target: str | None = None) -> Outcome:
    """`device`: the run's, as verify and bench take it ("cpu", "cuda" or "cuda:N"); `target`: the GPU architecture
    its kernels are compiled for ahead of time (None: verify's default)."""
    device_kind = kind_of(device)
    verdict: Verdict | None = None
    timed: Bench | None = None
    try:
        # no seed: each verification draws a fresh secret one (recorded in the verdict), so no candidate can
        # predict its inputs; verify itself runs Triton in the interpreter on a CPU (run.interpreted_triton)
        verdict = verify(task, task_dir / "reference.py", path, path.parent / "verify", timeout=timeout,
                         device=device, target=target)
        write_record(path.parent / "verdict.json", verdict)
        if verdict.verdict == "fail":
            return _failed(task, cand, path, verdict)
        if (why := untimed_here(cand, verdict, device_kind)) is not None:
            return _untimed(task, cand, verdict, device_kind, why)
        timed = bench(task, task_dir / "reference.py", path, path.parent / "bench", rounds=bench_rounds,
                      seed=seed, timeout=timeout, device=device)
        write_record(path.parent / "bench.json", timed)
        return _timed(task, cand, path, verdict, timed)
    except Exception as exc:  # a broken candidate or harness error is this candidate's verdict, not the run's
        reason = f"harness error: {type(exc).__name__}: {exc}"[:400]
        (path.parent / "error.txt").write_text(traceback.format_exc())
        row = new_row(task, cand, KernelOutcome.HARNESS_ERROR, reason, verdict=verdict)
        return Outcome(row, verdict, timed, report=reason)
    finally:
        drop_tensors(path.parent / "verify", path.parent / "bench")


def drop_tensors(*workdirs: Path) -> None:
    """The tensors a job exchanged with its sandbox (weights, input draws, outputs: up to a gigabyte a candidate at a
    0.5B model's sizes), deleted once read: the verdict and benchmark records keep what was found, and the seeds to
    draw them again. A job's logs and result stay."""
    for workdir in workdirs:
        for scratch in workdir.glob("*.pt"):
            scratch.unlink(missing_ok=True)


def _failed(task: Task, cand: Candidate, path: Path, verdict: Verdict) -> Outcome:
    """A failed verdict: the gravest failure explains it best (what it tried, then whether it ran, then the rest)."""
    failing = sorted((c for c in verdict.checks if c.status == "fail"),
                     key=lambda c: SEVERITY.index(c.id) if c.id in SEVERITY else len(SEVERITY))
    failed = failing[0] if failing else None
    reason = (f"failed {', '.join(c.id for c in failing)}: {failed.detail[:300]}" if failed else
              "not verified: correctness could not run here (" +
              next(c.detail for c in verdict.checks if c.id == "correctness")[:200] + ")")
    row = new_row(task, cand, KernelOutcome.FAILED if failed else KernelOutcome.NOT_VERIFIED, reason,
                  verdict=verdict)
    # the sandbox's long paths say nothing to a model and cost tokens
    return Outcome(row, verdict, report=_failure_report(verdict).replace(str(path.parent.resolve()), "<candidate>"))


def _untimed(task: Task, cand: Candidate, verdict: Verdict, device_kind: str, why: str) -> Outcome:
    how = "Triton interpreter" if verdict.triton_launches else "compiled"
    row = new_row(task, cand, KernelOutcome.NOT_TIMED, f"verified ({how}); not timed: {why}", verdict=verdict)
    return Outcome(row, verdict,
                   report=f"verdict: pass on {len(verdict.shapes)} input sets; not timed on this {device_kind}")


def _timed(task: Task, cand: Candidate, path: Path, verdict: Verdict, timed: Bench) -> Outcome:
    """A verified candidate's benchmark: faster beyond the noise (a winner of its task, so far), or not."""
    busy = f"; timed on a busy host ({timed.host.summary()})" if timed.host and timed.host.contended else ""
    if timed.by_mean:
        busy += "; timed by each round's mean call: its slow calls cost more than the host's stalls"
    if timed.cache_resident:
        busy += (f"; what it reads fits the cache even over {timed.weight_copies} copies of its weights and "
                 f"{timed.input_draws} draws of its inputs: a warm-cache figure")
    if timed.significant:
        outcome, reason = KernelOutcome.FASTER, f"verified; {timed.speedup:.2f}x beyond noise{busy}"
    else:
        outcome, reason = KernelOutcome.NOT_FASTER, (f"verified but not faster beyond noise: {timed.speedup:.2f}x "
                                                     f"(spread {timed.reference_spread:.0%}/"
                                                     f"{timed.candidate_spread:.0%}){busy}")
    speed = "faster beyond noise" if timed.significant else "not faster beyond noise"
    report = (f"verdict: pass on {len(verdict.shapes)} input sets\n"
              f"benchmark ({timed.rounds} interleaved rounds, medians): reference {timed.reference_us:.2f} µs, "
              f"yours {timed.candidate_us:.2f} µs per call, {timed.speedup:.2f}x; {speed}"
              f"; roofline floor {task.floor_us:.2f} µs")
    return Outcome(new_row(task, cand, outcome, reason, verdict=verdict, timed=timed), verdict, timed,
                   Accepted(task, cand, path, verdict, timed) if timed.significant else None, report)


def untimed_here(cand: Candidate, verdict: Verdict, device_kind: str) -> str | None:
    """Why a verified candidate cannot be timed on this device, or None. On a CPU, what it launched decides: Triton
    ran in the interpreter (a timing of that says nothing), whatever its source spells; C++ is timed. On a GPU, C++
    is no GPU kernel."""
    if device_kind == "cpu":
        if verdict.triton_launches:
            return "its Triton kernels ran in the interpreter (no GPU here), so it cannot join this cpu pack"
        return "a cuda kernel does not run on this cpu device" if cand.backend == "cuda" else None
    return f"a cpp kernel does not run on this {device_kind} device" if cand.backend == "cpp" else None


DUEL = """

# --- the incumbent kernel, standing in as this duel's reference (same inputs, same weights, same rounds); its source
# is carried here, since the benchmark's runner may read its own module only ---
def _incumbent():
    import sys
    import types

    module = types.ModuleType("kb_incumbent")
    sys.modules[module.__name__] = module
    exec(compile({source!r}, {path!r}, "exec"), module.__dict__)
    return module.ModelNew


Model = _incumbent()
"""


def duel(task: Task, task_dir: Path, incumbent: Accepted, challenger: Accepted, *, seed: int, timeout: float,
         rounds: int, device: str) -> Bench:
    """The challenger against the incumbent kernel in one benchmark on the run's `device`: the incumbent takes the
    reference's place, so `significant` means the challenger beat it beyond the noise."""
    where = task_dir / "duels" / f"{challenger.candidate.id}-vs-{incumbent.candidate.id}"
    where.mkdir(parents=True, exist_ok=True)
    reference = where / "reference.py"
    reference.write_text((task_dir / "reference.py").read_text() + DUEL.format(
        source=incumbent.source.read_text(), path=str(incumbent.source.resolve())))
    try:
        result = bench(task, reference, challenger.source, where, rounds=rounds, seed=seed, timeout=timeout,
                       device=device)
    finally:
        drop_tensors(where)
    write_record(where / "bench.json", result)
    return result
