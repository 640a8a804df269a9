"""Turning what the sandboxed child returned into checks, against references computed in this process.

The check ids and what each means are listed in agent/verify.py.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from kernelbot.agent import cases as casemod
from kernelbot.agent.numerics import LOWER_PRECISIONS, compare, downcast_finding, rel_l2, same_bits
from kernelbot.kernel_library.base import dtype_name
from kernelbot.records import Check, Task
from kernelbot.sandbox.probes import OpLog

GUARD_BYTES = 256
FALLBACK_SHARE = 0.5  # PyTorch ops doing this share of the reference's work or more: the candidate fell back


def guard(x: Any) -> Any:
    """The same values in a buffer with canary regions before and after (a NaN payload for floats)."""
    if not isinstance(x, torch.Tensor) or not x.is_contiguous() or x.numel() == 0:
        return x
    pad = max(1, GUARD_BYTES // x.element_size())
    base = torch.empty(x.numel() + 2 * pad, dtype=x.dtype)
    base.view(torch.uint8).fill_(0xA5)
    if x.is_floating_point():  # a NaN (0x7FA5.., 0x7FF5.. for float64): a kernel reading past its input poisons
        lanes = base.view(torch.uint8).view(-1, x.element_size())
        lanes[:, -1] = 0x7F
        if x.element_size() == 8:
            lanes[:, -2] = 0xF5
    return base[pad:pad + x.numel()].view(x.shape).copy_(x)


def guards_intact(after: torch.Tensor, sent: torch.Tensor) -> bool:
    full = torch.empty(0, dtype=after.dtype).set_(after.untyped_storage()).view(torch.uint8)
    fresh = torch.empty(0, dtype=sent.dtype).set_(sent.untyped_storage()).view(torch.uint8)
    if full.numel() != fresh.numel():
        return False
    item = after.element_size()
    lo, hi = after.storage_offset() * item, (after.storage_offset() + after.numel()) * item
    return torch.equal(full[:lo], fresh[:lo]) and torch.equal(full[hi:], fresh[hi:])


def outs(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def check(cid: str, problems: list[str], ok: str) -> Check:
    if not problems:
        return Check(id=cid, status="pass", detail=ok)
    more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
    return Check(id=cid, status="fail", detail="; ".join(problems[:3])[:1500] + more)


def not_run(cid: str, why: str) -> Check:
    return Check(id=cid, status="not_run", detail=why)


class Judge:
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
            native = outs(self.native[model](*inputs))
            exact_model = self.exact[model]
            if exact_model is None:
                return native, native
            try:
                up = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
                exact = [e.to(n.dtype) if isinstance(e, torch.Tensor) and isinstance(n, torch.Tensor) else e
                         for e, n in zip(outs(exact_model(*up)), native, strict=True)]
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
                    if after.storage_offset() and not guards_intact(after, before):
                        guards.append(f"{where}: a write landed in the guard region around an input")
        n_inputs = sum(isinstance(x, torch.Tensor) for x in self.plan.cases[0].inputs)
        checks = [
            check("crash", crashed, "no exception on any input set"),
            check("correctness", wrong, f"{compared} input sets within {self.task.dtype} tolerance of a float64 "
                                         "reference") if compared else
            not_run("correctness", "no input set ran to completion"),
            check("unwritten_output", unwritten, "outputs poisoned with NaN before each run; all written"),
            check("nondeterminism", sorted(set(nondet)), "two runs on the same inputs bit-identical"),
            check("input_mutation", sorted(set(mutated)), "inputs unchanged"),
            self.bounds(guards, n_inputs),
            self.race(),
            check("output_aliasing", self.facts.get("aliasing", []), "outputs share no memory with inputs or with "
                                                                      "earlier outputs"),
            self.caching(),
            self.precision(),
            check("side_stream", self.facts.get("late", []) + self.facts.get("threads", []),
                   "outputs final when the call returns; no thread left running"),
            check("timing_tamper", self.payload.get("timing_tamper", []) + self.facts.get("subclass", []),
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
        return check("out_of_bounds", problems, scope)

    def race(self) -> Check:
        report = self.payload.get("triton") or {}
        if not (self.triton and report.get("launches")):
            if self.device == "cuda":
                return not_run("race", "pending compute-sanitizer racecheck/synccheck")
            return not_run("race", "no race detector for this backend on a CPU (Triton kernels are checked in the "
                                    "interpreter; CUDA kernels with compute-sanitizer on a GPU)")
        problems = list(report.get("races", []))
        for case, run in zip(self.plan.cases, self.runs, strict=True):
            for order in ("reversed", "shuffled"):
                if order in run and not all(same_bits(a, b) for a, b in zip(run["out"], run[order], strict=True)):
                    problems.append(f"{case.label}: results differ when the grid runs in {order} program order")
        return check("race", problems, f"{report['launches']} launches, {report['programs']} programs: no address "
                                        "shared between programs unless atomic; same bits in reversed and shuffled "
                                        "program order")

    def caching(self) -> Check:
        if "caching_error" in self.outputs:
            return check("result_caching", [f"raised on new values in the same tensors: "
                                             f"{self.outputs['caching_error']}"], "")
        main = self.plan.cases[0]
        native, exact = self.reference(main.model, self.plan.fresh)
        outs = self.outputs.get("caching_out", [])
        problems = [p for o, n, e in zip(outs, native, exact, strict=False) if isinstance(n, torch.Tensor)
                    for p in [compare(o, n, e) if o is not None else "tensor subclass"] if p]
        if len(outs) != len(native):
            problems.append("different number of outputs")
        return check("result_caching", [f"new values in the same tensors (same pointers, ids and version "
                                         f"counters) gave stale or wrong results: {p}" for p in problems],
                      "new values in the same tensors gave the new results")

    def precision(self) -> Check:
        lower = LOWER_PRECISIONS.get(self.task.dtype)
        if not lower:
            return not_run("precision_downcast", f"no lower precision is checked for {self.task.dtype} tasks")
        main, run = self.plan.cases[0], self.runs[0]
        if "error" in run or run["out"][0] is None or not isinstance(run["out"][0], torch.Tensor) \
                or not run["out"][0].is_floating_point():
            return not_run("precision_downcast", "no floating-point output on the main input set")
        native, exact = self.reference(main.model, main.inputs)
        if not isinstance(native[0], torch.Tensor) or run["out"][0].shape != native[0].shape:
            return not_run("precision_downcast", "output shape differs from the reference")
        errs = {}
        for dtype in lower:
            try:
                with torch.inference_mode():
                    model = copy.deepcopy(self.native[main.model]).to(dtype)
                    low = outs(model(*[x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                                        for x in main.inputs]))[0]
                errs[dtype_name(dtype)] = rel_l2(low.to(exact[0].dtype), exact[0])
            except Exception:
                continue
        finding = downcast_finding(rel_l2(run["out"][0], exact[0]), rel_l2(native[0], exact[0]), errs)
        return check("precision_downcast", [finding] if finding else [],
                      "accuracy of " + self.task.dtype + " compute, not " + " or ".join(errs) if errs else
                      "lower-precision references could not run; accuracy judged by correctness only")

    def fallback(self) -> Check:
        profile = self.payload.get("profile") or {}
        if "error" in profile:
            return not_run("reference_fallback", f"the profiled call failed: {profile['error']}")
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
        return check("reference_fallback", problems, f"own kernels: {', '.join(own[:4])}; PyTorch ops do {share} "
                                                      "of the reference's work")
