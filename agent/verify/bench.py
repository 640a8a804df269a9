"""Candidate vs the op it replaces on the task's shapes: warm-up, interleaved rounds, medians, noise.

The reference and the candidate run in separate processes (neither can patch or slow the other, nor pick up
memory the other freed), call by call. Every timed call sees inputs no earlier call saw (a few elements of each
float input change in place before it, among a few independent draws), so a cache of earlier results is
stale, and some calls' outputs — picked at random, fetched only after the call returned — are checked against
the reference here: a candidate that is right only while verified, or only for its first calls, is refused.

What verification looks like is here too, at random and apart from the checked calls: some calls run with
allocations poisoned or after a pause like verification's (those are not timed), and the checked calls' outputs are
held to the end, where each must still hold its bytes and none may share memory with another. The candidate's own
threads may not use the CPU while the reference is timed.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch

from kernelbot.agent.verify import clocks
from kernelbot.agent.verify.cases import References, inputs_at
from kernelbot.agent.verify.messages import BenchJob, BenchOutputs, BenchResult, read_result
from kernelbot.agent.verify.numerics import compare, reference_outputs
from kernelbot.agent.verify.run import load_reference
from kernelbot.hardware import host
from kernelbot.hardware.device import DeviceChoice
from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.cpp_build import library_env
from kernelbot.records import Bench, GpuState, Task
from kernelbot.sandbox import run_job
from kernelbot.sandbox.gpu import device_kind, job_gpu

POOL = 3  # independent input draws the timed calls rotate through (more where the inputs hold a model's state)


MAX_COPIES = 64
COPIES_BYTES = 2 << 30  # what the copies may take together, per runner
PERIODIC_SHARE = 0.05  # a candidate's slow calls that add this much of the reference's time beyond twice the stalls


def weight_copies(weights: int, device: str) -> int:
    """How many copies of a module's weights the timed calls cycle over on a CPU: enough to fill twice the last-level
    cache, so each call reads its weights from memory as a model's layers do (a benchmark on one copy times them warm
    in the cache, and a kernel that only wins warm loses in the model), within MAX_COPIES and COPIES_BYTES. One on a
    GPU, whose benchmark flushes its L2 between calls."""
    if device.startswith("cuda") or weights <= 0:
        return 1
    wanted = -(-2 * host.last_level_cache_bytes() // weights)
    return max(1, min(MAX_COPIES, wanted, COPIES_BYTES // weights))


def state_bytes(task: Task, inputs: list[Any]) -> int:
    """The bytes of the inputs that hold state a model reads from memory on each call (the family's state_inputs:
    a KV cache), in one draw."""
    state = FAMILIES[task.family].state_inputs if task.family in FAMILIES else ()
    return sum(t.numel() * t.element_size() for i, t in enumerate(inputs) if i in state and isinstance(t, torch.Tensor))


def input_draws(state: int, device: str) -> int:
    """How many input draws the timed calls rotate through: POOL; on a CPU, where the inputs hold `state` bytes of a
    model's state (a KV cache), enough draws for it to fill twice the last-level cache as weight_copies does for
    weights (an attention timed over one warm cache hid a loss in the engine)."""
    return max(POOL, weight_copies(state, device)) if state else POOL


def per_round(report: BenchResult) -> tuple[list[float], list[float], bool]:
    """Each round's figure for the reference and the candidate, and whether it is the round's mean call.

    The median call, as a rule: on a CPU the harness's round trip between calls leaves a third thread runnable
    beside a runner's two, and one call in twenty or so waits out a scheduler tick (4 ms) that a model's forward,
    running op after op in one process, does not (a 105 µs kernel's rounds averaged 266 µs). The mean, where the
    candidate's slow calls cost clearly more than the host's stalls cost the reference's: work done once every few
    calls (a cache rebuilt, or deferred) is part of what each call costs."""
    def excess(means: list[float], medians: list[float]) -> float:
        return statistics.median(m - d for m, d in zip(means, medians, strict=True))

    ref_excess = excess(report.reference_mean_us, report.reference_us)
    cand_excess = excess(report.candidate_mean_us, report.candidate_us)
    if cand_excess > 2 * max(ref_excess, 0.0) + PERIODIC_SHARE * statistics.median(report.reference_us):
        return report.reference_mean_us, report.candidate_mean_us, True
    return report.reference_us, report.candidate_us, False



def _quantile(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q * 100) - 1] if len(xs) > 1 else xs[0]


def bench(task: Task, reference_path: Path, candidate_path: Path, workdir: Path, *, rounds: int = 15,
          seed: int = 0, timeout: float = 300.0, device: str) -> Bench:
    """Accept only what is faster beyond the noise: at least 3 in 4 paired rounds faster, median gain over 3%.
    `device`: the run's, "cpu", "cuda" (the assigned GPU) or "cuda:N"; always given, so no GPU run times on the CPU.
    Raises RuntimeError when the benchmark cannot be trusted: tampering, or a timed call's output is wrong."""
    workdir.mkdir(parents=True, exist_ok=True)
    gpu, device = job_gpu(device), device_kind(device)
    # built afresh, float64 twin too: a deepcopy keeps what a compiled method of the original closes over
    references = References(load_reference(reference_path), [list(task.init_args)], seed)
    model, exact_model = references.build(0), references.twin(0)
    torch.save(model.state_dict(), workdir / "state_dict.pt")
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    copies = weight_copies(weights, device)
    first = inputs_at(references.module, task, seed)
    state = state_bytes(task, first)
    draws = [first, *(inputs_at(references.module, task, seed + k) for k in range(1, input_draws(state, device)))]
    torch.save(draws, workdir / "inputs.pt")
    job = BenchJob(reference=str(reference_path.resolve()), candidate=str(candidate_path.resolve()),
                   init_args=task.init_args, state_dict=str((workdir / "state_dict.pt").resolve()),
                   inputs=str((workdir / "inputs.pt").resolve()), rounds=rounds, device=device, copies=copies,
                   threads=task.threads)
    since = host.sample()
    gpu_before = gpu_state(gpu)
    env = {**library_env(device).env, **clocks.job_env(device)}
    result = run_job(job.model_dump(mode="json"), workdir, timeout=timeout, env=env, gpu=gpu)
    load, gpu_after = host.host_load(since), gpu_state(gpu)
    report = read_result(result.payload)
    if result.status != "ok" or not isinstance(report, BenchResult):
        raise RuntimeError(f"benchmark {result.status}: {result.detail[-300:]}")
    facts = report.facts
    refused = facts.timing + facts.subclass + facts.tamper + facts.aliasing + facts.late + facts.threads
    if refused:
        raise RuntimeError(f"benchmark refused: {'; '.join(str(r)[:200] for r in refused[:3])}")
    wrong = _wrong_timed_outputs(model, exact_model, workdir / "outputs.pt")
    if wrong:
        raise RuntimeError(f"benchmark refused: a timed call's output is wrong ({wrong})")
    ref, cand, by_mean = per_round(report)
    ratios = [r / c for r, c in zip(ref, cand, strict=True)]
    ref_med, cand_med = statistics.median(ref), statistics.median(cand)

    def spread(xs: list[float]) -> float:
        return (_quantile(xs, 0.75) - _quantile(xs, 0.25)) / statistics.median(xs)

    speedup = ref_med / cand_med
    return Bench(candidate_id=candidate_path.parent.name, rounds=rounds, reference_us=round(ref_med, 2),
                 candidate_us=round(cand_med, 2), reference_spread=round(spread(ref), 3),
                 candidate_spread=round(spread(cand), 3), speedup=round(speedup, 3),
                 significant=_quantile(ratios, 0.25) > 1.0 and speedup > 1.03, host=load, gpu_before=gpu_before,
                 gpu_after=gpu_after, weight_copies=copies, input_draws=len(draws), by_mean=by_mean,
                 cache_resident=not device.startswith("cuda") and (weights + state) > 0
                 and copies * weights + len(draws) * state < 2 * host.last_level_cache_bytes())


def gpu_state(index: int | None) -> GpuState | None:
    """NVML's reading of the benchmark's GPU (None without one): its clocks and throttling beside the timings."""
    if index is None:
        return None
    return DeviceChoice(kind="cuda", index=index, name=f"GPU {index}", reason="benchmark").gpu_state()


def _wrong_timed_outputs(model: torch.nn.Module, exact_model: torch.nn.Module | None, path: Path) -> str | None:
    """The first problem with the timed calls' outputs the sandbox brought back, against the reference."""
    try:
        # written in the box: no code, and only what BenchOutputs admits
        checked = BenchOutputs.model_validate(torch.load(path, weights_only=True)).checked
    except Exception as exc:
        return f"the checked outputs are not readable safely: {type(exc).__name__}"
    if not checked:
        return "no timed call's output came back"
    for k, item in enumerate(checked):
        inputs, got = item.inputs, item.out
        native, exact = reference_outputs(model, exact_model, inputs)
        if not isinstance(got, list) or len(got) != len(native):
            return f"checked call {k + 1}: {len(got) if isinstance(got, list) else 0} outputs, expected {len(native)}"
        for o, n, e in zip(got, native, exact, strict=True):
            problem = compare(o, n, e) if isinstance(n, torch.Tensor) else (None if o == n else "differs")
            if problem:
                return f"checked call {k + 1} of {len(checked)}: {problem}"
    return None

