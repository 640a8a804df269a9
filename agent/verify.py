"""Verification: the one entry point `verify()`, used by `kernelbot verify` and by `kernelbot optimize`.

The candidate runs only in the sandbox, on inputs made here from a seed it never sees. The reference, the
comparison and the verdict are computed here, in a process the candidate never runs in. Check ids (stable):

  compile             the candidate imports, builds (CUDA: nvcc -Xptxas -v report) and constructs
  correctness         every input set within the dtype's tolerance of a float64 reference (agent/numerics.py)
  unwritten_output    outputs are NaN-poisoned before each run; no poison may remain
  out_of_bounds       guard regions around every input buffer intact; Triton: every access inside an argument
                      (interpreter instrumentation); CUDA on a GPU: compute-sanitizer memcheck
  race                Triton: no address written by one program and touched by another, same bits in reversed
                      and shuffled program order; CUDA on a GPU: racecheck and synccheck
  nondeterminism      two runs on the same inputs are bit-identical
  input_mutation      inputs unchanged afterwards
  output_aliasing     outputs share memory neither with inputs nor with the previous call's outputs
  reference_fallback  the candidate launches a kernel of its own, and PyTorch ops do under half the
                      reference's work
  result_caching      new values in the same tensors (same pointers, ids, version counters) give new results
  precision_downcast  float32 results not at bfloat16/float16 accuracy
  side_stream         no output changes after the call returns; no thread left running
  timing_tamper       clocks, synchronisation and comparison functions unpatched; no lazy tensor subclasses
  timeout, crash, sandbox_violation   from the sandbox
"""

from __future__ import annotations

import copy
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from kernelbot import KernelbotError
from kernelbot.agent import cases as casemod
from kernelbot.agent.numerics import LOWER_PRECISIONS, compare, downcast_finding, rel_l2, same_bits
from kernelbot.kernel_library.cpp_build import prebuild_library
from kernelbot.loading import load_module
from kernelbot.records import Check, Task, Verdict
from kernelbot.sandbox import run_job
from kernelbot.sandbox.gpu import assigned_gpu
from kernelbot.sandbox.probes import OpLog

CHECK_IDS = ("compile", "correctness", "unwritten_output", "out_of_bounds", "race", "nondeterminism",
             "input_mutation", "output_aliasing", "reference_fallback", "result_caching", "precision_downcast",
             "side_stream", "timing_tamper", "timeout", "crash", "sandbox_violation")
GUARD_BYTES = 256
FALLBACK_SHARE = 0.5  # PyTorch ops doing this share of the reference's work or more: the candidate fell back
SANITIZER_TOOLS = {"memcheck": "out_of_bounds", "racecheck": "race", "synccheck": "race",
                   "initcheck": "unwritten_output"}
shape_sets = casemod.shape_sets  # re-exported: optimize's tasks fuzz their free dims


def load_reference(path: Path):
    return load_module(path, f"kb_reference_{abs(hash(str(path)))}")


def task_from_reference(path: Path) -> Task:
    """A task for a standalone KernelBench reference; sizes come from its module constants."""
    if not path.is_file():
        raise KernelbotError(f"{path}: no such reference file")
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
    return Task(id=path.stem, hotspot_id="", family="", module_class="Model", dtype=str(dtype).removeprefix("torch."),
                input_shapes=[list(x.shape) for x in tensors], free_dims=[], init_args=init_args, share=0.0,
                floor_us=0.0)


def guard(x: Any) -> Any:
    """The same values in a buffer with canary regions before and after (a NaN payload for floats)."""
    if not isinstance(x, torch.Tensor) or not x.is_contiguous() or x.numel() == 0:
        return x
    pad = max(1, GUARD_BYTES // x.element_size())
    base = torch.empty(x.numel() + 2 * pad, dtype=x.dtype)
    base.view(torch.uint8).fill_(0xA5)
    if x.is_floating_point():  # 0x7FA5..: NaN whatever the width, so a kernel reading past its input poisons
        base.view(torch.uint8).view(-1, x.element_size())[:, -1] = 0x7F
    return base[pad:pad + x.numel()].view(x.shape).copy_(x)


def _guards_intact(after: torch.Tensor, sent: torch.Tensor) -> bool:
    full = torch.empty(0, dtype=after.dtype).set_(after.untyped_storage()).view(torch.uint8)
    fresh = torch.empty(0, dtype=sent.dtype).set_(sent.untyped_storage()).view(torch.uint8)
    if full.numel() != fresh.numel():
        return False
    item = after.element_size()
    lo, hi = after.storage_offset() * item, (after.storage_offset() + after.numel()) * item
    return torch.equal(full[:lo], fresh[:lo]) and torch.equal(full[hi:], fresh[hi:])


def _outs(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _check(cid: str, problems: list[str], ok: str) -> Check:
    if not problems:
        return Check(id=cid, status="pass", detail=ok)
    more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
    return Check(id=cid, status="fail", detail="; ".join(problems[:3])[:1500] + more)


def _not_run(cid: str, why: str) -> Check:
    return Check(id=cid, status="not_run", detail=why)


def verify(task: Task, reference_path: Path, candidate_path: Path, workdir: Path, *, seed: int | None = None,
           timeout: float = 300.0, env: dict[str, str] | None = None, device: str = "cpu", trials: int = 1) -> Verdict:
    """Verify `candidate_path` (ModelNew) against `reference_path` (Model). Raises KernelbotError for a
    reference that cannot be used (it does not run, or is a weak task); every candidate gets a Verdict."""
    t0 = time.perf_counter()
    if device == "cuda" and not torch.cuda.is_available():
        raise KernelbotError("--device cuda: no CUDA device here (verify on a GPU node, or use --device cpu)")
    seed = secrets.randbits(31) if seed is None else seed
    workdir.mkdir(parents=True, exist_ok=True)
    module = load_reference(reference_path)
    plan = casemod.plan(module, task, seed, trials)
    init_seed = seed + 1
    casemod.check_strength(module, plan, init_seed)
    references = []
    for i, init in enumerate(plan.init_args):
        torch.manual_seed(init_seed)
        references.append(module.Model(*init).eval())
        torch.save(references[-1].state_dict(), workdir / f"state_dict_{i}.pt")
    sent = [[guard(x) for x in case.inputs] for case in plan.cases]
    torch.save({"init_args": plan.init_args, "fresh": plan.fresh,
                "cases": [(c.label, c.model, inputs) for c, inputs in zip(plan.cases, sent, strict=True)]},
               workdir / "plan.pt")
    source = candidate_path.read_text(errors="replace")
    triton = "triton" in source
    job = {"kind": "verify", "candidate": str(candidate_path.resolve()), "plan": str((workdir / "plan.pt").resolve()),
           "state_dicts": [str((workdir / f"state_dict_{i}.pt").resolve()) for i in range(len(plan.init_args))],
           "init_seed": init_seed, "triton": triton, "device": device}
    job_env = {**prebuild_library(), **({"TRITON_INTERPRET": "1"} if triton and device == "cpu" else {}), **(env or {})}
    gpu = assigned_gpu() if device == "cuda" else None
    result = run_job(job, workdir, timeout=timeout, env=job_env, gpu=gpu)

    checks = _sandbox_checks(result)
    if result.status == "ok":
        try:
            outputs = torch.load(workdir / "outputs.pt", weights_only=True)  # written by the candidate: no code
        except Exception as exc:
            checks.append(Check(id="crash", status="fail", detail=f"outputs not readable safely: {exc}"[:500]))
        else:
            judge = _Judge(task, plan, references, sent, result.payload or {}, outputs, triton, device)
            checks += judge.checks()
            if device == "cuda":
                sanitized = {c.id: c for c in _sanitize(job, workdir, timeout, job_env)}
                checks = [_merge(c, sanitized.pop(c.id)) if c.id in sanitized else c for c in checks]
                checks += list(sanitized.values())
    elif result.payload and result.payload.get("stage") == "needs_gpu":
        why = "not run: the CUDA code compiled, but there is no GPU here to run it"
        checks += [_not_run(cid, why) for cid in CHECK_IDS if cid not in {c.id for c in checks}]
    seen = {c.id for c in checks}
    for cid in CHECK_IDS:
        if cid not in seen:
            checks.append(_not_run(cid, "not reached: the candidate did not get that far"))
    checks.sort(key=lambda c: CHECK_IDS.index(c.id) if c.id in CHECK_IDS else len(CHECK_IDS))
    failed = [c.id for c in checks if c.status == "fail"]
    correct = any(c.id == "correctness" and c.status == "pass" for c in checks)
    return Verdict(candidate_id=candidate_path.parent.name, verdict="pass" if correct and not failed else "fail",
                   failed=failed, checks=checks, not_run=[c.id for c in checks if c.status == "not_run"],
                   shapes=[[list(x.shape) for x in case.inputs if isinstance(x, torch.Tensor)] for case in plan.cases],
                   cases=[c.label for c in plan.cases], seconds=round(time.perf_counter() - t0, 2),
                   protections=result.protections, seed=seed,
                   notes=plan.notes + list((result.payload or {}).get("facts", {}).get("notes", [])))


def _merge(a: Check, b: Check) -> Check:
    """Two findings for one check id: failing wins; a check that ran beats one that did not."""
    if a.status == "not_run" or b.status == "not_run":
        return b if a.status == "not_run" else a
    status = "fail" if "fail" in (a.status, b.status) else "pass"
    return Check(id=a.id, status=status, detail=f"{a.detail}; {b.detail}"[:1500])


def _sandbox_checks(result) -> list[Check]:
    checks: list[Check] = []
    if result.violations:
        tried = "; ".join(f"{v.get('kind')}: {v.get('detail')}" for v in result.violations[:5])
        checks.append(Check(id="sandbox_violation", status="fail", detail=tried[:1000]))
    else:
        checks.append(Check(id="sandbox_violation", status="pass", detail="nothing refused was attempted"))
    payload = result.payload or {}
    ptxas = payload.get("ptxas") or []
    built = "; ".join(_ptxas_summary(r) for r in ptxas)
    if result.status == "timeout":
        checks.append(Check(id="timeout", status="fail", detail=result.detail))
    elif result.status == "crash":
        checks.append(Check(id="crash", status="fail", detail=result.detail[-800:]))
    elif result.status == "error" and payload.get("stage") == "compile":
        checks.append(Check(id="compile", status="fail", detail=result.detail))
    elif result.status == "error" and payload.get("stage") == "needs_gpu":
        checks.append(Check(id="compile", status="pass", detail=built or result.detail))
    elif result.status == "error":
        checks += [Check(id="compile", status="pass", detail=built), Check(id="crash", status="fail",
                                                                             detail=result.detail)]
    else:
        checks += [Check(id="compile", status="pass", detail=built or "imported, built and constructed"),
                   Check(id="timeout", status="pass", detail=f"finished in {result.seconds:.1f} s")]
    return checks


def _ptxas_summary(report: dict[str, Any]) -> str:
    if not report.get("ok"):
        return "nvcc failed"
    parts = [f"{k['kernel']}: {k['registers']} registers, {k['smem_bytes']} B smem, "
             f"{k['spill_store_bytes'] + k['spill_load_bytes']} B spilled" for k in report.get("kernels", [])]
    return "nvcc -arch=sm_90 -Xptxas -v: " + ("; ".join(parts) or "no kernels")


class _Judge:
    """Turns what the child returned into checks, against references computed here."""

    def __init__(self, task: Task, plan: casemod.Plan, references: list[torch.nn.Module], sent: list[list[Any]],
                 payload: dict[str, Any], outputs: dict[str, Any], triton: bool, device: str) -> None:
        self.task, self.plan, self.sent, self.payload = task, plan, sent, payload
        self.runs, self.outputs, self.triton, self.device = outputs["runs"], outputs, triton, device
        self.facts: dict[str, list[str]] = payload.get("facts", {})
        self.native = references
        self.exact = []
        for ref in references:
            try:
                self.exact.append(copy.deepcopy(ref).double())
            except Exception:
                self.exact.append(None)

    def reference(self, model: int, inputs: list[Any]) -> tuple[list[Any], list[Any]]:
        """(in the task's dtype, in float64) outputs of the reference."""
        with torch.inference_mode():
            native = _outs(self.native[model](*inputs))
            exact_model = self.exact[model]
            if exact_model is None:
                return native, native
            try:
                up = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
                exact = [e.to(n.dtype) if isinstance(e, torch.Tensor) and isinstance(n, torch.Tensor) else e
                         for e, n in zip(_outs(exact_model(*up)), native, strict=True)]
            except Exception:
                exact = native
        return native, exact

    def checks(self) -> list[Check]:
        wrong, unwritten, nondet, mutated, guards, crashed = [], [], [], [], [], []
        compared = 0
        for case, sent, run in zip(self.plan.cases, self.sent, self.runs, strict=True):
            where = f"{case.label} {[list(x.shape) for x in case.inputs if isinstance(x, torch.Tensor)]}"
            if "error" in run:
                crashed.append(f"{where}: raised {run['error']}")
                continue
            native, exact = self.reference(case.model, case.inputs)
            if len(run["out"]) != len(native):
                wrong.append(f"{where}: {len(run['out'])} outputs, expected {len(native)}")
                continue
            compared += 1
            for out, n, e in zip(run["out"], native, exact, strict=True):
                if out is None:
                    wrong.append(f"{where}: output is a tensor subclass (refused)")
                    continue
                problem = compare(out, n, e) if isinstance(n, torch.Tensor) else (None if out == n else "differs")
                if problem:
                    wrong.append(f"{where}: {problem}")
                    # On ordinary values a NaN where the reference is finite is the poison left in place.
                    if "inputs at" not in case.label and isinstance(out, torch.Tensor) and out.shape == n.shape \
                            and out.is_floating_point():
                        holes = int((torch.isnan(out) & torch.isfinite(n)).sum())
                        if holes:
                            unwritten.append(f"{where}: {holes} elements never written (still NaN)")
            if not all(same_bits(a, b) for a, b in zip(run["out"], run["again"], strict=True)):
                nondet.append(where)
            for after, before, original in zip(run["inputs_after"], sent, case.inputs, strict=True):
                if isinstance(after, torch.Tensor):
                    if not same_bits(after, original):
                        mutated.append(where)
                    if after.storage_offset() and not _guards_intact(after, before):
                        guards.append(f"{where}: a write landed in the guard region around an input")
        n_inputs = sum(isinstance(x, torch.Tensor) for x in self.plan.cases[0].inputs)
        checks = [
            _check("crash", crashed, "no exception on any input set"),
            _check("correctness", wrong, f"{compared} input sets within {self.task.dtype} tolerance of a float64 "
                                         "reference") if compared else
            _not_run("correctness", "no input set ran to completion"),
            _check("unwritten_output", unwritten, "outputs poisoned with NaN before each run; all written"),
            _check("nondeterminism", sorted(set(nondet)), "two runs on the same inputs bit-identical"),
            _check("input_mutation", sorted(set(mutated)), "inputs unchanged"),
            self.bounds(guards, n_inputs),
            self.race(),
            _check("output_aliasing", self.facts.get("aliasing", []), "outputs share no memory with inputs or with "
                                                                      "earlier outputs"),
            self.caching(),
            self.precision(),
            _check("side_stream", self.facts.get("late", []) + self.facts.get("threads", []),
                   "outputs final when the call returns; no thread left running"),
            _check("timing_tamper", self.payload.get("timing_tamper", []) + self.facts.get("subclass", []),
                   "clocks, synchronisation and comparisons unpatched; plain tensors returned"),
            self.fallback(),
        ]
        return checks

    def bounds(self, guards: list[str], n_inputs: int) -> Check:
        report = self.payload.get("triton") or {}
        problems = guards + report.get("out_of_bounds", [])
        scope = f"guard regions around {n_inputs} input buffer(s) intact on every input set"
        if self.triton and report.get("launches"):
            scope += f"; every load/store of {report['launches']} Triton launches inside its arguments (interpreter)"
        elif self.device == "cpu":
            scope += "; reads and output bounds of non-Triton kernels need compute-sanitizer on a GPU"
        return _check("out_of_bounds", problems, scope)

    def race(self) -> Check:
        report = self.payload.get("triton") or {}
        if not (self.triton and report.get("launches")):
            if self.device == "cuda":
                return _not_run("race", "pending compute-sanitizer racecheck/synccheck")
            return _not_run("race", "no race detector for this backend on a CPU (Triton kernels are checked in the "
                                    "interpreter; CUDA kernels with compute-sanitizer on a GPU)")
        problems = list(report.get("races", []))
        for case, run in zip(self.plan.cases, self.runs, strict=True):
            for order in ("reversed", "shuffled"):
                if order in run and not all(same_bits(a, b) for a, b in zip(run["out"], run[order], strict=True)):
                    problems.append(f"{case.label}: results differ when the grid runs in {order} program order")
        return _check("race", problems, f"{report['launches']} launches, {report['programs']} programs: no address "
                                        "shared between programs unless atomic; same bits in reversed and shuffled "
                                        "program order")

    def caching(self) -> Check:
        if "caching_error" in self.outputs:
            return _check("result_caching", [f"raised on new values in the same tensors: "
                                             f"{self.outputs['caching_error']}"], "")
        main = self.plan.cases[0]
        native, exact = self.reference(main.model, self.plan.fresh)
        outs = self.outputs.get("caching_out", [])
        problems = [p for o, n, e in zip(outs, native, exact, strict=False) if isinstance(n, torch.Tensor)
                    for p in [compare(o, n, e) if o is not None else "tensor subclass"] if p]
        if len(outs) != len(native):
            problems.append("different number of outputs")
        return _check("result_caching", [f"new values in the same tensors (same pointers, ids and version "
                                         f"counters) gave stale or wrong results: {p}" for p in problems],
                      "new values in the same tensors gave the new results")

    def precision(self) -> Check:
        lower = LOWER_PRECISIONS.get(self.task.dtype)
        if not lower:
            return _not_run("precision_downcast", f"no lower precision is checked for {self.task.dtype} tasks")
        main, run = self.plan.cases[0], self.runs[0]
        if "error" in run or run["out"][0] is None or not isinstance(run["out"][0], torch.Tensor) \
                or not run["out"][0].is_floating_point():
            return _not_run("precision_downcast", "no floating-point output on the main input set")
        native, exact = self.reference(main.model, main.inputs)
        if not isinstance(native[0], torch.Tensor) or run["out"][0].shape != native[0].shape:
            return _not_run("precision_downcast", "output shape differs from the reference")
        errs = {}
        for dtype in lower:
            try:
                with torch.inference_mode():
                    model = copy.deepcopy(self.native[main.model]).to(dtype)
                    low = _outs(model(*[x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                                        for x in main.inputs]))[0]
                errs[str(dtype).removeprefix("torch.")] = rel_l2(low.to(exact[0].dtype), exact[0])
            except Exception:
                continue
        finding = downcast_finding(rel_l2(run["out"][0], exact[0]), rel_l2(native[0], exact[0]), errs)
        return _check("precision_downcast", [finding] if finding else [],
                      "accuracy of " + self.task.dtype + " compute, not " + " or ".join(errs) if errs else
                      "lower-precision references could not run; accuracy judged by correctness only")

    def fallback(self) -> Check:
        profile = self.payload.get("profile") or {}
        if "error" in profile:
            return _not_run("reference_fallback", f"the profiled call failed: {profile['error']}")
        own = profile.get("own_kernels", [])
        log = OpLog()
        main = self.plan.cases[0]
        with torch.inference_mode(), log:
            self.native[main.model](*self.plan.fresh)
        ref_work = sum(log.compute.values())
        cand = profile.get("compute", {})
        cand_work = sum(cand.values())
        top = ", ".join(f"aten.{k}" for k, _ in sorted(cand.items(), key=lambda kv: -kv[1])[:4])
        problems = []
        if not own:
            problems.append("launches no kernel of its own (no Triton launch, native extension call or custom op): "
                            f"the work is done by PyTorch ({top or 'no aten compute ops either'})")
        elif ref_work and cand_work >= FALLBACK_SHARE * ref_work:
            problems.append(f"PyTorch ops ({top}) do {cand_work / ref_work:.0%} of the reference's work beside its "
                            f"own kernels ({', '.join(own[:3])})")
        share = f"{cand_work / ref_work:.0%}" if ref_work else "none"
        return _check("reference_fallback", problems, f"own kernels: {', '.join(own[:4])}; PyTorch ops do {share} "
                                                      "of the reference's work")


def _sanitize(job: dict[str, Any], workdir: Path, timeout: float, env: dict[str, str]) -> list[Check]:
    """On a GPU: the main case once under each compute-sanitizer tool; its report becomes checks."""
    from kernelbot.agent.sanitizer import parse_summary

    if not shutil.which("compute-sanitizer"):
        return [_not_run(cid, "compute-sanitizer not found") for cid in sorted(set(SANITIZER_TOOLS.values()))]
    found: dict[str, list[str]] = {cid: [] for cid in SANITIZER_TOOLS.values()}
    for tool, cid in SANITIZER_TOOLS.items():
        result = run_job({**job, "kind": "sanitize"}, workdir / f"sanitize_{tool}", timeout=timeout * 4,
                         env={**env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, gpu=assigned_gpu(),
                         wrapper=["compute-sanitizer", "--tool", tool, "--print-limit", "20"])
        errors, first = parse_summary(result.detail)
        if errors is None:
            found[cid].append(f"{tool}: no report ({result.status})")
        elif errors:
            found[cid].append(f"{tool}: {errors} error(s), first: {first}")
    return [_check(cid, problems, "compute-sanitizer " + "/".join(t for t, c in SANITIZER_TOOLS.items() if c == cid)
                   + ": no errors") for cid, problems in found.items()]
