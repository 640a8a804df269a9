"""Verification: the one entry point `verify()`, used by `kernelbot verify` and by `kernelbot optimize`.

The candidate runs only in the sandbox, in a runner process the sandbox's harness forks and feeds one call at a
time, on inputs made here from a seed it never sees. The reference, the comparison and the verdict are computed
here, in a process the candidate never runs in. Check ids (stable):

  compile             the candidate imports, builds (CUDA: nvcc -Xptxas -v report) and constructs; every Triton
                      kernel it launches (each specialization) and CUDA kernel it builds compiles for the GPU target
                      (sm_90 on a CPU host, the GPU's own on a node) within its shared memory (compile_gate.py)
  correctness         every input set within the dtype's tolerance of a float64 reference (numerics.py),
                      special values (±inf, NaN, masked rows), non-contiguous and transposed layouts, a large mean
                      offset, values past float16's range and near the largest the reference keeps finite, rows
                      permuted and sizes well past the scaled ones included, every Triton program order included
  unwritten_output    CPU allocations are poisoned (GPU: NaN-filled); no poison may remain in an output
  out_of_bounds       guard regions around every input buffer (and in a strided one's gaps) intact; Triton: every
                      access inside an argument (interpreter instrumentation); generated C++ on a CPU: its
                      AddressSanitizer build on the main input set, unguarded (asan.py); CUDA on a GPU: memcheck
  race                Triton: no address written by one program and touched by another unless under one lock or by
                      commuting atomics, same bits in shuffled program order (kernels with float atomic adds or
                      locked writes kept in natural order) and in reversed order unless those kernels explain it;
                      no Triton launch on a CPU: right with one thread and with 4x the cores' threads; on a GPU:
                      racecheck and synccheck, and for Triton the same in the interpreter on the node's CPU at small
                      sizes (interpreter_race.py); every candidate: right in every call repeated while other processes
                      load the cores
  nondeterminism      runs on the same inputs are bit-identical, right after each other and with other calls between
                      them (with require_deterministic, also in every program order)
  input_mutation      inputs, parameters and buffers unchanged afterwards
  output_aliasing     outputs' bytes overlap no input's, parameter's or held earlier output's
  reference_fallback  the candidate runs code of its own (where the code lives and what it is decide: a copy of an
                      installed library is that library, provenance.py; names decide nothing), PyTorch ops
                      (profiled on every thread) do under half the reference's work, and on a CPU the libraries'
                      sampled CPU time per call is under half the reference's; a disturbed or switched-off op log fails
  result_caching      new values in the same tensors, one element at a time too, and new weights drawn afresh for
                      the parameters, the buffers and both, copied into the same ones (by name, else in order), give
                      new results
  precision_downcast  float32 results not at bfloat16/float16 accuracy
  side_stream         no output changes after the call returns or before the job ends; the candidate's threads use
                      no CPU after a call returns or between calls
  timing_tamper       clocks, synchronisation and comparison functions unpatched; no lazy tensor subclasses
  harness_tamper      the harness's modules, functions, patched attributes, channel and audit channel untouched; the
                      runner's own state as the harness reads it in the runner's memory, and its seccomp filter
  timeout, crash, sandbox_violation   from the sandbox, and from the harness: a process the candidate started still
                      running once it loaded, or a system call its seccomp filter refuses (seccomp.py)
"""

from __future__ import annotations

import importlib.util
import random
import secrets
import time
from pathlib import Path
from typing import Any

import torch

from kernelbot import KernelbotError
from kernelbot.agent.verify import cases as casemod
from kernelbot.agent.verify import clocks, interpreter_race, provenance
from kernelbot.agent.verify.asan import asan_check
from kernelbot.agent.verify.compile_gate import (
    DEFAULT_TARGET,
    TARGET_ENV,
    checked_target,
    cuda_builds,
    device_target,
    gate,
)
from kernelbot.agent.verify.judge import Judge, excerpt, guard, merge, not_run, scrub
from kernelbot.agent.verify.messages import (
    BuildJob,
    Builds,
    Failure,
    PtxasReport,
    Result,
    SanitizeJob,
    SentCase,
    SentPlan,
    VerifyJob,
    VerifyOutputs,
    VerifyResult,
    read_result,
)
from kernelbot.agent.verify.sanitizer import sanitize
from kernelbot.hardware.device import gpu_missing_reason
from kernelbot.kernel_library.base import dtype_name
from kernelbot.kernel_library.cpp_build import library_env
from kernelbot.loading import load_module
from kernelbot.records import Check, InterpreterCoverage, KernelBuild, SanitizerRun, Task, Verdict
from kernelbot.sandbox import SandboxResult, run_job
from kernelbot.sandbox.gpu import device_kind, job_gpu

CHECK_IDS = ("compile", "correctness", "unwritten_output", "out_of_bounds", "race", "nondeterminism",
             "input_mutation", "output_aliasing", "reference_fallback", "result_caching", "precision_downcast",
             "side_stream", "timing_tamper", "harness_tamper", "timeout", "crash", "sandbox_violation")
shape_sets = casemod.shape_sets  # re-exported: optimize's tasks fuzz their free dims


def load_reference(path: Path):
    return load_module(path, f"kb_reference_{abs(hash(str(path)))}")


def task_from_reference(path: Path) -> Task:
    """The task of a reference in a run's task directory (its task.json: the free dims and cases the run verified
    with, so a verdict's seed replays it); for a standalone KernelBench reference, sizes from its module constants."""
    if not path.is_file():
        raise KernelbotError(f"{path}: no such reference file")
    recorded = path.with_name("task.json")
    if recorded.is_file():
        try:
            return Task.model_validate_json(recorded.read_text())
        except ValueError as exc:
            raise KernelbotError(f"{recorded}: not a task record ({type(exc).__name__}); move the reference out of "
                                 "that directory to verify it on its own") from None
    try:
        module = load_reference(path)
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(module, name):
                raise KernelbotError(f"{path}: not a KernelBench reference (no `{name}`)")
        with torch.device("meta"):
            inputs, init_args = module.get_inputs(), list(module.get_init_inputs())
    except KernelbotError:
        raise
    except Exception as exc:
        raise KernelbotError(f"{path}: cannot load the reference ({type(exc).__name__}: {exc})") from None
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if not tensors:
        raise KernelbotError(f"{path}: get_inputs() returns no tensors")
    dtype = next((x.dtype for x in tensors if x.is_floating_point()), tensors[0].dtype)
    return Task(id=path.stem, hotspot_id="", family="", module_class="Model", dtype=dtype_name(dtype),
                input_shapes=[list(x.shape) for x in tensors], free_dims=[], init_args=init_args, share=0.0,
                floor_us=0.0)


def interpreted_triton(device: str) -> bool:
    """Whether a job's runner runs Triton in its interpreter, with the interpreter's checks: on a CPU wherever Triton
    is installed, whatever the candidate's source says (a kernel defined in an imported package, Liger-Kernel's, is
    a Triton kernel too; there is no other way Triton runs on a CPU). The verdict then judges the launches it saw."""
    return device == "cpu" and importlib.util.find_spec("triton") is not None


def verify(task: Task, reference_path: Path, candidate_path: Path, workdir: Path, *, seed: int | None = None,
           timeout: float = 300.0, env: dict[str, str] | None = None, device: str = "cpu", trials: int = 1,
           require_deterministic: bool = False, budget: casemod.SizeBudget = casemod.FULL,
           runs_cpp: bool = True, target: str | None = None) -> Verdict:
    """Verify `candidate_path` (ModelNew) against `reference_path` (Model). Raises KernelbotError for a
    reference that cannot be used (it does not run, or is a weak task); every candidate gets a Verdict. `device`:
    "cpu", "cuda" (the assigned GPU, sandbox.gpu.assigned_gpu) or "cuda:N".
    `require_deterministic`: results that depend on program order (float atomics) fail `nondeterminism`
    instead of being reported as a property. `budget`: the sizes verified at (cases.SizeBudget). On a GPU, a candidate
    is verified once more on the node's CPU, in Triton's interpreter at small sizes, for its races between programs
    (interpreter_race.py); that job (`runs_cpp` False) needs no C++ library, so none is built for it. `target`: the
    GPU architecture the candidate's kernels are compiled for ahead of time (compile_gate; sm_90 on a CPU host, the
    device's own on a GPU)."""
    t0 = time.perf_counter()
    gpu = job_gpu(device)
    device = device_kind(device)
    if device == "cuda" and not torch.cuda.is_available():
        raise KernelbotError(f"--device cuda: no CUDA device here ({gpu_missing_reason()}); verify on a GPU node, or "
                             "use --device cpu")
    target = checked_target(target) if target else device_target(gpu) if gpu is not None else DEFAULT_TARGET
    seed = secrets.randbits(31) if seed is None else seed
    workdir.mkdir(parents=True, exist_ok=True)
    module = load_reference(reference_path)
    plan = casemod.plan(module, task, seed, trials, budget)
    init_seed = seed + 1
    casemod.check_strength(module, plan, init_seed)
    references = casemod.References(module, plan.init_args, init_seed)
    for i in range(len(plan.init_args)):
        references.build(i)
        torch.save(references.state_dicts[i], workdir / f"state_dict_{i}.pt")
    main = plan.cases[0].model
    alternates = references.alternates(main, seed)
    for k, (_, state_dict) in enumerate(alternates):
        torch.save(state_dict, workdir / f"alt_state_dict_{k}.pt")
    fronts = random.Random(seed).choices((True, False), k=sum(len(case.inputs) for case in plan.cases))
    sent = [[guard(x, fronts.pop()) for x in case.inputs] for case in plan.cases]
    torch.save(SentPlan(init_args=plan.init_args, fresh=plan.fresh, changed=plan.changed,
                        cases=[SentCase(label=c.label, model=c.model, inputs=inputs)
                               for c, inputs in zip(plan.cases, sent, strict=True)]).model_dump(), workdir / "plan.pt")
    triton = interpreted_triton(device)
    reference = references.build(main)
    job = VerifyJob(candidate=str(candidate_path.resolve()), plan=str((workdir / "plan.pt").resolve()),
                    state_dicts=[str((workdir / f"state_dict_{i}.pt").resolve()) for i in range(len(plan.init_args))],
                    alternates=[str((workdir / f"alt_state_dict_{k}.pt").resolve()) for k in range(len(alternates))],
                    param_names=[n for n, _ in reference.named_parameters()],
                    buffer_names=[n for n, b in reference.named_buffers() if b.is_floating_point()
                                  and n in references.state_dicts[main]], init_seed=init_seed,
                    triton=triton, device=device,
                    foreign_builds=sorted(provenance.installed_libraries()) if device == "cpu" else [])
    library = library_env(device, runs_cpp)
    job_env = {**library.env, **clocks.job_env(device), **({"TRITON_INTERPRET": "1"} if triton else {}), **(env or {})}
    # a CPU runner's process filter refuses Triton's ptxas: there the compile gate is a job of its own (_cpu_builds)
    job_env = job_env if device == "cpu" else {**job_env, TARGET_ENV: target}
    result = run_job(job.model_dump(mode="json"), workdir, timeout=timeout, env=job_env, gpu=gpu)
    report = read_result(result.payload)

    checks = _sandbox_checks(result, report)
    properties: list[str] = []
    launches = report.triton.launches if isinstance(report, VerifyResult) and report.triton else 0
    sanitizer_runs: list[SanitizerRun] = []
    coverage: InterpreterCoverage | None = None
    builds = _builds(report)
    if result.status == "ok" and not isinstance(report, VerifyResult):
        checks.append(Check(id="crash", status="fail", detail="the box's result.json is not a verify job's result"))
    elif result.status == "ok":
        try:  # written in the box: no code, and only what VerifyOutputs admits
            outputs = VerifyOutputs.model_validate(torch.load(workdir / "outputs.pt", weights_only=True))
        except Exception as exc:
            checks.append(Check(id="crash", status="fail", detail=f"outputs not readable safely: {exc}"[:500]))
        else:
            judge = Judge(task, plan, references, sent, report, outputs, device, alternates=alternates,
                          require_deterministic=require_deterministic)
            checks += [_with_precision(c, report) for c in judge.checks()]
            properties = judge.properties
            if device == "cuda":
                checked, sanitizer_runs = sanitize(_sanitize_job(job, plan, sent[0], workdir), workdir, timeout,
                                                   job_env, gpu)
                sanitized = {c.id: c for c in checked}
                checks = [merge(c, sanitized.pop(c.id)) if c.id in sanitized else c for c in checks]
                checks += list(sanitized.values())
                interpreted = _interpreted_race(task, reference_path, candidate_path, workdir, seed, timeout, env,
                                                report, target)
                if interpreted is not None:
                    coverage, builds = interpreted.coverage, builds + interpreted.builds
                    checks, launches = interpreter_race.merged(checks, interpreted), interpreted.launches
            elif launches:
                cpu_builds, gate_problem = _cpu_builds(job, workdir, timeout, {**job_env, TARGET_ENV: target})
                builds += cpu_builds
                properties += [gate_problem] if gate_problem else []
            elif report.profile is not None:  # unguarded inputs: ASan's redzones lie right past them
                unguarded = [x.clone() if isinstance(x, torch.Tensor) else x for x in plan.cases[0].inputs]
                found = asan_check(lambda: _sanitize_job(job, plan, unguarded, workdir), report.profile.own_kernels,
                                   workdir, timeout, job_env)
                checks = [merge(c, found) if found is not None and c.id == found.id else c for c in checks]
    elif isinstance(report, Failure) and report.stage == "needs_gpu":
        why = "not run: the CUDA code compiled, but there is no GPU here to run it"
        checks += [not_run(cid, why) for cid in CHECK_IDS if cid not in {c.id for c in checks}]
    built, gate_notes = gate(builds)
    checks = [merge(c, built) if built is not None and c.id == "compile" else c for c in checks]
    seen = {c.id for c in checks}
    for cid in CHECK_IDS:
        if cid not in seen:
            checks.append(not_run(cid, "not reached: the candidate did not get that far"))
    checks.sort(key=lambda c: CHECK_IDS.index(c.id) if c.id in CHECK_IDS else len(CHECK_IDS))
    checks = [Check(id=c.id, status=c.status, detail=scrub(c.detail)) for c in checks]
    failed = [c.id for c in checks if c.status == "fail"]
    correct = any(c.id == "correctness" and c.status == "pass" for c in checks)
    child_notes = [*report.facts.unloadable_weights, *report.facts.notes] \
        if isinstance(report, (VerifyResult, Failure)) else []
    notes = plan.notes + ([library.problem] if library.problem else []) + [excerpt(n) for n in child_notes[:5]] + \
        properties + gate_notes
    return Verdict(candidate_id=candidate_path.parent.name, verdict="pass" if correct and not failed else "fail",
                   failed=failed, checks=checks, not_run=[c.id for c in checks if c.status == "not_run"],
                   shapes=[[list(x.shape) for x in case.inputs if isinstance(x, torch.Tensor)] for case in plan.cases],
                   cases=[c.label for c in plan.cases], seconds=round(time.perf_counter() - t0, 2),
                   protections=[excerpt(p) for p in result.protections], seed=seed, notes=[scrub(n) for n in notes],
                   triton_launches=launches, sanitizer_runs=sanitizer_runs, interpreter_race=coverage, builds=builds)


def _cpu_builds(job: VerifyJob, workdir: Path, timeout: float, env: dict[str, str]
                ) -> tuple[list[KernelBuild], str | None]:
    """A CPU candidate's Triton kernels compiled for the target (compile_gate) in a job of their own, without the
    verified runner's process filter: one call on the main case in the interpreter. The builds, or why there are
    none."""
    build = BuildJob(candidate=job.candidate, plan=job.plan, state_dicts=job.state_dicts[:1], init_seed=job.init_seed)
    result = run_job(build.model_dump(mode="json"), workdir / "compile_gate", timeout=timeout, env=env)
    report = read_result(result.payload)
    if isinstance(report, Builds):
        return report.builds, None
    why = report.error if isinstance(report, Failure) else result.detail
    return [], excerpt(f"compile gate not run: its job ended {result.status} ({why})", 300)


def _interpreted_race(task: Task, reference_path: Path, candidate_path: Path, workdir: Path, seed: int, timeout: float,
                      env: dict[str, str] | None, report: VerifyResult,
                      target: str) -> interpreter_race.InterpreterRace | None:
    """A GPU job's candidate verified again on the node's CPU in Triton's interpreter, for its race findings (and its
    Triton kernels compiled for the GPU's `target` there)."""
    planned = interpreter_race.plan_for("cuda", report, interpreted_triton("cpu"))
    return None if planned is None else interpreter_race.run(planned, lambda budget: verify(
        task, reference_path, candidate_path, workdir / "interpreter", seed=seed, timeout=timeout, env=env,
        device="cpu", budget=budget, runs_cpp=False, target=target))


def _builds(report: Result | None) -> list[KernelBuild]:
    """The job's kernels compiled for the GPU target: its Triton launches' (in the interpreter), its CUDA sources'."""
    if not isinstance(report, (VerifyResult, Failure)):
        return []
    triton = report.triton.builds if isinstance(report, VerifyResult) and report.triton else []
    return [*triton, *cuda_builds([k for r in report.ptxas for k in r.kernels])]


def _with_precision(check: Check, report: VerifyResult) -> Check:
    """precision_downcast failed as well where the interpreter saw a float32 tl.dot that a GPU computes in TF32."""
    found = report.triton.precision if report.triton else []
    if check.id != "precision_downcast" or not found:
        return check
    return merge(check, Check(id=check.id, status="fail", detail="; ".join(excerpt(f, 400) for f in found[:3])))


def _sanitize_job(job: VerifyJob, plan: casemod.Plan, inputs: list[Any], workdir: Path) -> SanitizeJob:
    """The sanitizer's job sees only the main input set, `inputs` as sent (it runs the candidate in one process)."""
    torch.save(SentPlan(init_args=plan.init_args[:1], cases=[SentCase(label=plan.cases[0].label, model=0,
                                                                      inputs=inputs)]).model_dump(),
               workdir / "sanitize_plan.pt")
    main = plan.cases[0].model
    return SanitizeJob(candidate=job.candidate, plan=str((workdir / "sanitize_plan.pt").resolve()),
                       state_dicts=job.state_dicts[main:main + 1], init_seed=job.init_seed, device=job.device)


def _sandbox_checks(result: SandboxResult, report: Result | None) -> list[Check]:
    checks: list[Check] = []
    if result.violations:
        tried = "; ".join(f"{excerpt(v.get('kind'), 40)}: {excerpt(v.get('detail'), 150)}"
                          for v in result.violations[:5])
        checks.append(Check(id="sandbox_violation", status="fail", detail=tried[:1000]))
    else:
        checks.append(Check(id="sandbox_violation", status="pass", detail="nothing refused was attempted"))
    stage = report.stage if isinstance(report, Failure) else None
    built = "; ".join(_ptxas_summary(r) for r in (report.ptxas if report is not None else []))
    detail = _last_lines(result.detail)  # the child's own error message or stderr: candidate text
    if result.status == "timeout":
        checks.append(Check(id="timeout", status="fail", detail=result.detail))
    elif result.status == "crash":
        checks.append(Check(id="crash", status="fail", detail=detail))
    elif result.status == "error" and stage == "compile":
        checks.append(Check(id="compile", status="fail", detail=detail))
    elif result.status == "error" and stage == "needs_gpu":
        checks.append(Check(id="compile", status="pass", detail=built or detail))
    elif result.status == "error":
        checks += [Check(id="compile", status="pass", detail=built), Check(id="crash", status="fail",
                                                                             detail=detail)]
    else:
        checks += [Check(id="compile", status="pass", detail=built or "imported, built and constructed"),
                   Check(id="timeout", status="pass", detail=f"finished in {result.seconds:.1f} s")]
    return checks


def _last_lines(text: str) -> str:
    """The child's report, as candidate text: its first line, its first line that names an error, and its last,
    each a short excerpt."""
    lines = [line for line in str(text).splitlines() if line.strip()]
    errors = [line for line in lines[1:-1] if "error" in line.lower()][:1]
    picked = list(dict.fromkeys(lines[:1] + errors + lines[-1:]))
    return " … ".join(excerpt(line, 160) for line in picked)


def _ptxas_summary(report: PtxasReport) -> str:
    if not report.ok:
        return "nvcc failed"
    parts = [f"{excerpt(k.kernel, 80)}: {k.registers} registers, {k.smem_bytes} B smem, "
             f"{k.spill_store_bytes + k.spill_load_bytes} B spilled" for k in report.kernels]
    arches = ",".join(sorted({k.arch for k in report.kernels})) or "?"
    return f"nvcc -arch={arches} -Xptxas -v: " + ("; ".join(parts) or "no kernels")


