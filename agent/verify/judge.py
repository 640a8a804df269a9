"""Turning what the sandboxed child returned into checks, against references computed in this process.

The check ids and what each means are listed in run.py. Text that came from the candidate (exception
messages, names it chose) reaches a verdict only as a short excerpt, scrubbed of anything secret-looking.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Iterator
from typing import Any

import torch

from kernelbot.agent.verify import cases as casemod
from kernelbot.agent.verify.messages import (
    FACT_KINDS,
    SCHEDULE_RUNS,
    Facts,
    TritonReport,
    VerifyOutputs,
    VerifyResult,
)
from kernelbot.agent.verify.numerics import (
    LOWER_PRECISIONS,
    compare,
    downcast_finding,
    jittered_outputs,
    outs,
    reference_outputs,
    rel_l2,
    same_bits,
)
from kernelbot.agent.verify.probes import POISON_BYTE, measure_work
from kernelbot.agent.verify.sampling import per_call_ns, sampled_calls
from kernelbot.kernel_library.base import dtype_name
from kernelbot.records import Check, Task
from kernelbot.sandbox.confine import SECRET_NAME

GUARD_BYTES = 256
FALLBACK_SHARE = 0.5  # PyTorch ops doing this share of the reference's work or more: the candidate fell back
# The least of several passes: the reference's OpenMP threads spin between its ops, CPU time that is not its work
# (15 to 51 µs a call for the same RMSNorm from run to run), and a reference read high let a numpy fallback pass.
REFERENCE_PASSES = 3
MIN_LIBRARY_SAMPLES = 20  # library CPU time is judged only where a candidate at FALLBACK_SHARE would show this many
# Library samples are counts (Poisson): a share is judged by its count less this many standard deviations, so a
# kernel whose wrapper's allocations are a third of a 3 µs reference is not failed by one run's sampling noise.
NOISE_SIGMAS = 2.0
EXCERPT_CHARS = 200  # of any one piece of candidate-chosen text in a verdict
# Secret-looking tokens: known key prefixes, or long runs mixing letters and digits.
SECRET_TOKEN = re.compile(r"(?:sk-|hf_|ghp_|gho_|ghs_|github_pat_|xox[abprs]-|AKIA|AIza)[A-Za-z0-9_\-]{12,}|"
                          r"(?=[A-Za-z0-9_\-+=]*[0-9])(?=[A-Za-z0-9_\-+=]*[A-Za-z])[A-Za-z0-9_\-+=]{32,}")


def excerpt(text: object, limit: int = EXCERPT_CHARS) -> str:
    """Candidate-chosen text as it may appear in a verdict: one line of printable characters, at most `limit`
    of them, secret-looking tokens redacted."""
    line = " ".join(str(text).split())
    line = "".join(c if c.isprintable() else "?" for c in line)
    line = SECRET_TOKEN.sub("<redacted>", line)
    return line if len(line) <= limit else line[:limit - 1] + "…"


def handover_ns(inputs: list[Any], reference: torch.nn.Module) -> float:
    """Library CPU time per call that any kernel's wrapper spends handing tensors over, sampled as the reference is:
    each input made contiguous, each parameter detached, each output allocated. A kernel whose reference costs a
    microsecond or two spends about as much in torch just doing that, which is no fallback."""
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    params = list(reference.parameters())
    with torch.inference_mode():
        outputs = [o for o in outs(reference(*inputs)) if isinstance(o, torch.Tensor)]

        def handover() -> None:
            for x in tensors:
                x.contiguous()
            for w in params:
                w.detach()
            for o in outputs:
                torch.empty_like(o)

        passes = [sampled_calls(handover, (), ()) for _ in range(REFERENCE_PASSES)]
    return min((per_call_ns(p, ("torch", "other")) for p in passes if "problem" not in p), default=0.0)


def scrub(text: str) -> str:
    """No value of this process's secret-named environment variables, and no secret-looking token, survives."""
    for name, value in os.environ.items():
        if SECRET_NAME.search(name) and len(value) >= 6 and value in text:
            text = text.replace(value, "<redacted>")
    return SECRET_TOKEN.sub("<redacted>", text)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """PyTorch's profiler prints a line to fd 2 when it starts and stops; not on the user's terminal."""
    try:
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:
        yield
        return
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def poisoned(out: torch.Tensor) -> int:
    """Elements still holding the runner's allocation poison (every byte POISON_BYTE): never written."""
    if out.numel() == 0 or not out.is_contiguous():
        return 0
    lanes = out.reshape(-1).view(torch.uint8).view(-1, out.element_size())
    return int((lanes == POISON_BYTE).all(dim=1).sum())


def guard(x: Any, front: bool = True) -> Any:
    """The same values, in the same layout (strides), in a buffer with canary regions after it, before it (`front`:
    the tensor then has a storage offset, which a production tensor rarely has, so not every input gets one) and in
    every gap a strided view leaves (a NaN payload for floats)."""
    if not isinstance(x, torch.Tensor) or x.numel() == 0 or any(st < 0 for st in x.stride()):
        return x
    pad = max(1, GUARD_BYTES // x.element_size())
    span = 1 + sum((size - 1) * st for size, st in zip(x.shape, x.stride(), strict=True))
    base = torch.empty(span + (2 if front else 1) * pad, dtype=x.dtype)
    base.view(torch.uint8).fill_(0xA5)
    if x.is_floating_point():  # a NaN (0x7FA5.., 0x7FF5.. for float64): a kernel reading past its input poisons
        lanes = base.view(torch.uint8).view(-1, x.element_size())
        lanes[:, -1] = 0x7F
        if x.element_size() == 8:
            lanes[:, -2] = 0xF5
    return base.as_strided(x.shape, x.stride(), pad if front else 0).copy_(x)


def guards_intact(after: torch.Tensor, sent: torch.Tensor) -> bool:
    """Every byte of the storage outside the tensor's own elements as it was sent."""
    if after.untyped_storage().nbytes() != sent.untyped_storage().nbytes() or after.stride() != sent.stride() or \
            after.storage_offset() != sent.storage_offset():
        return False
    item = sent.element_size()
    stored = []
    for t in (after, sent):
        raw = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).clone()
        raw.as_strided((*sent.shape, item), (*(st * item for st in sent.stride()), 1),
                       sent.storage_offset() * item).zero_()  # the elements themselves: judged by input_mutation
        stored.append(raw)
    return torch.equal(*stored)


def _same_outputs(a: list[Any] | None, b: list[Any] | None) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(same_bits(x, y)
                                                                       for x, y in zip(a, b, strict=True))


def check(cid: str, problems: list[str], ok: str) -> Check:
    if not problems:
        return Check(id=cid, status="pass", detail=ok)
    more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
    return Check(id=cid, status="fail", detail="; ".join(problems[:3])[:1500] + more)


def not_run(cid: str, why: str) -> Check:
    return Check(id=cid, status="not_run", detail=why)


def merge(a: Check, b: Check) -> Check:
    """Two findings for one check id: failing wins; a check that ran beats one that did not, and says why the other
    did not run (a verdict on a GPU names the sanitizer tool that could not run)."""
    if a.status == "not_run" or b.status == "not_run":
        ran, other = (b, a) if a.status == "not_run" else (a, b)
        if ran.status == "not_run":
            return ran
        return Check(id=ran.id, status=ran.status, detail=f"{ran.detail}; {other.detail}"[:1500])
    status = "fail" if "fail" in (a.status, b.status) else "pass"
    return Check(id=a.id, status=status, detail=f"{a.detail}; {b.detail}"[:1500])


class Judge:
    """Turns what the child returned into checks, against references computed here."""

    def __init__(self, task: Task, plan: casemod.Plan, references: casemod.References, sent: list[list[Any]],
                 result: VerifyResult, outputs: VerifyOutputs, device: str,
                 alternates: list[tuple[str, dict[str, Any]]] = (), require_deterministic: bool = False) -> None:
        self.task, self.plan, self.sent, self.result = task, plan, sent, result
        self.runs, self.outputs, self.device = outputs.runs, outputs, device
        self.report = result.triton or TritonReport()  # Triton's launches, where the interpreter ran them
        self.facts = Facts(**{k: [excerpt(t, 300) for t in getattr(result.facts, k)] for k in FACT_KINDS})
        self.require_deterministic = require_deterministic
        self.properties: list[str] = []  # what the verdict reports about the kernel without failing it
        self.thread_races: list[str] = []  # wrong only with another thread count (checks() fills it)
        self.references = references
        models = range(len(plan.init_args))
        self.native = [references.build(i) for i in models]
        self.exact = [references.twin(i) for i in models]
        main = plan.cases[0].model
        self.alternates = {label: (references.build(main, weights), references.twin(main, weights))
                           for label, weights in alternates}  # the main model with new weights, by what changed

    def reference(self, model: int | str, inputs: list[Any]) -> tuple[list[Any], list[Any]]:
        """(in the task's dtype, in float64) outputs of the reference: model `model`, or the main one with new weights
        (an alternate's label)."""
        native, exact = self._models(model)
        return reference_outputs(native, exact, inputs)

    def _models(self, model: int | str) -> tuple[torch.nn.Module, torch.nn.Module | None]:
        if isinstance(model, str):
            return self.alternates[model]
        return self.native[model], self.exact[model]

    def jittered(self, model: int | str, inputs: list[Any], native: list[Any], rescaled: bool,
                 ) -> list[list[torch.Tensor]]:
        """For inputs scaled far from the reference's draws: per output, its float64 outputs on inputs moved by their
        dtype's rounding (numerics.compare's floor for ill-conditioned problems); none otherwise."""
        if not rescaled:
            return [[] for _ in native]
        return jittered_outputs(self._models(model)[1], inputs, native)

    def wrong(self, model: int | str, inputs: list[Any], got: Any, rescaled: bool = False) -> list[str]:
        """What is wrong with outputs `got` for `inputs` (empty: within tolerance)."""
        native, exact = self.reference(model, inputs)
        got = got if isinstance(got, list) else []
        if len(got) != len(native):
            return [f"{len(got)} outputs, expected {len(native)}"]
        problems = []
        for o, n, e, j in zip(got, native, exact, self.jittered(model, inputs, native, rescaled), strict=True):
            if o is None:
                problems.append("a tensor subclass or unsupported object (refused)")
            elif isinstance(n, torch.Tensor):
                problem = compare(o, n, e, j)
                if problem:
                    problems.append(problem)
            elif o != n:
                problems.append("differs")
        return problems

    def checks(self) -> list[Check]:
        wrong, unwritten, nondet, mutated, guards, crashed = [], [], [], [], [], []
        self.thread_races = []
        compared = 0
        for case, sent, run in zip(self.plan.cases, self.sent, self.runs, strict=True):
            where = f"{case.label} {[list(x.shape) for x in case.inputs if isinstance(x, torch.Tensor)]}"
            if run.error is not None:
                crashed.append(f"{where}: raised {excerpt(run.error)}")
                continue
            native, exact = self.reference(case.model, case.inputs)
            if len(run.out) != len(native):
                wrong.append(f"{where}: {len(run.out)} outputs, expected {len(native)}")
                continue
            compared += 1
            jittered = self.jittered(case.model, case.inputs, native, case.rescaled)
            for out, n, e, j in zip(run.out, native, exact, jittered, strict=True):
                if out is None:
                    wrong.append(f"{where}: output is a tensor subclass or unsupported object (refused)")
                    continue
                problem = compare(out, n, e, j) if isinstance(n, torch.Tensor) else (None if out == n else "differs")
                if problem:
                    wrong.append(f"{where}: {problem}")
                    unwritten += self.holes(case, where, out, n)
            for order in ("reversed", "shuffled"):  # every schedule must be right, not only the usual one
                if run.in_order(order) is not None and not any(where in w for w in wrong):
                    found = [f"{where} ({SCHEDULE_RUNS[run.schedule or 'program order'][order]}): {p}"
                             for p in self.wrong(case.model, case.inputs, run.in_order(order), case.rescaled)]
                    # wrong with another thread count only: chunks that race or depend on the chunking
                    (self.thread_races if run.schedule == "thread count" else wrong).extend(found)
            again = run.again
            if again is None or len(again) != len(run.out) or \
                    not all(same_bits(a, b) for a, b in zip(run.out, again, strict=True)):
                nondet.append(where)
            for after, before, original in zip(run.inputs_after, sent, case.inputs, strict=True):
                if isinstance(after, torch.Tensor):
                    if not same_bits(after, original):
                        mutated.append(where)
                    if isinstance(before, torch.Tensor) and not guards_intact(after, before):
                        guards.append(f"{where}: a write landed in the guard region around an input")
        contention_races, contention_bits = self.contention()
        nondet += self.fresh_nondeterminism() + contention_bits
        n_inputs = sum(isinstance(x, torch.Tensor) for x in self.plan.cases[0].inputs)
        race = self.race(contention_races)
        checks = [
            check("crash", crashed, "no exception on any input set"),
            check("correctness", wrong, f"{compared} input sets within {self.task.dtype} tolerance of a float64 "
                                         "reference") if compared else
            not_run("correctness", "no input set ran to completion"),
            check("unwritten_output", unwritten, "outputs poisoned before each run (CPU allocations filled with a "
                                                 "pattern); all written"),
            self.nondeterminism(list(dict.fromkeys(nondet))),
            check("input_mutation", sorted(set(mutated)) + self.facts.weights,
                  "inputs, parameters and buffers unchanged"),
            self.bounds(guards, n_inputs),
            race,
            check("output_aliasing", self.facts.aliasing, "outputs share no memory with inputs, "
                                                                      "parameters or any earlier output"),
            self.caching(),
            self.precision(),
            check("side_stream", self.facts.late + self.facts.threads,
                  "outputs final when the call returns and when the job ends; no thread (OS-level) left running"),
            check("timing_tamper", self.facts.timing + self.facts.subclass,
                  "clocks, synchronisation and comparisons unpatched; plain tensors returned"),
            check("harness_tamper", self.facts.tamper + self.report.order_mismatch,
                  "the harness's modules, functions, patched attributes and channel untouched"),
            self.fallback(),
        ]
        return checks

    def fresh_nondeterminism(self) -> list[str]:
        """Bits that changed between calls on the same values with other calls between them (not only right after each
        other: a memo of the previous call's input hides that): the main input set once more at the end, and the fresh
        values' calls (in the same tensors, profiled, sampled, the first repeated under contention)."""
        found = []
        main, first = self.plan.cases[0], self.runs[0]
        again = self.outputs.main_again
        if first.error is None and again is not None and again.out is not None and not _same_outputs(first.out,
                                                                                                    again.out):
            found.append(f"{main.label}: run again after other calls, other bits")
        fresh = self.outputs.caching_out
        repeated = self.outputs.repeated
        later = [("the profiled call" if k == 0 else f"sampled call {k}", out)
                 for k, out in enumerate(self.outputs.later_outs)]
        if repeated is not None and repeated.outs:
            later.append(("the first call repeated under contention", repeated.outs[0]))
        if fresh is not None:
            found += [f"new values: {who} on the same values gave other bits than the first call on them"
                      for who, out in later if not _same_outputs(fresh, out)][:2]
        return found

    def contention(self) -> tuple[list[str], list[str]]:
        """(race problems, nondeterminism problems) of the fresh values' call repeated under contention: repeats that
        gave other bits and are wrong are a race; other bits within tolerance are nondeterminism."""
        repeated = self.outputs.repeated
        if repeated is None or not repeated.differing:
            return [], []
        what = (f"{repeated.differing} of {repeated.calls} calls on the same values, repeated while other processes "
                "loaded the cores, gave other bits than the first")
        wrong = [p for out in repeated.outs[1:] for p in self.wrong(self.plan.cases[0].model, self.plan.fresh, out)]
        return ([f"{what}: {wrong[0]}"], []) if wrong else ([], [what])

    def holes(self, case: casemod.Case, where: str, out: Any, native: Any) -> list[str]:
        """Output elements never written: still the allocation poison, or NaN where the reference is finite."""
        if case.special or case.rescaled or not isinstance(out, torch.Tensor) \
                or not isinstance(native, torch.Tensor) or out.shape != native.shape or not out.is_floating_point():
            return []
        holes = poisoned(out) + int((torch.isnan(out) & torch.isfinite(native)).sum())
        return [f"{where}: {holes} elements never written (still the allocation poison or NaN)"] if holes else []

    def differs(self, run: Any, order: str) -> bool:
        return run.in_order(order) is not None and \
            not all(same_bits(a, b) for a, b in zip(run.out, run.in_order(order), strict=True))

    def order_dependent(self) -> bool:
        """Results differ in reversed program order only because of kernels with float atomic adds or writes inside a
        lock; the shuffled run keeps those kernels in natural order, so it cannot differ for that reason."""
        if not self.report.order_dependent_kernels or self.report.races:
            return False
        return any(self.differs(run, "reversed") for run in self.runs)

    def nondeterminism(self, nondet: list[str]) -> Check:
        problems = list(nondet)
        if self.order_dependent():
            kernels = ", ".join(excerpt(k, 60) for k in self.report.order_dependent_kernels)
            what = (f"results depend on program order (float atomic adds or writes inside a lock in {kernels}): each "
                    "order is within tolerance, the bits are not reproducible")
            if self.require_deterministic:
                problems.append(what + "; --require-deterministic")
            else:
                self.properties.append(f"property: {what}")
        return check("nondeterminism", problems, "two runs on the same inputs bit-identical" +
                     ("" if self.require_deterministic or not self.order_dependent() else
                      "; order-dependent float atomics or locked sections reported as a property"))

    def bounds(self, guards: list[str], n_inputs: int) -> Check:
        report = self.report
        problems = guards + [excerpt(r, 400) for r in report.out_of_bounds]
        scope = f"guard regions around {n_inputs} input buffer(s) intact on every input set"
        if report.launches:
            scope += f"; every load/store of {report.launches} Triton launches inside its arguments (interpreter)"
        elif self.device == "cpu":
            scope += ("; reads by non-Triton code: AddressSanitizer for generated C++ (below, where it ran), "
                      "compute-sanitizer on a GPU")
        return check("out_of_bounds", problems, scope)

    def race(self, contention: list[str]) -> Check:
        """Other program orders (Triton) or thread counts (anything else on a CPU), and the `contention` problems of
        the fresh values' call repeated under contention."""
        found = self.schedule_race()
        if not contention:
            return found
        return check("race", contention + ([found.detail] if found.status == "fail" else []), "")

    def schedule_race(self) -> Check:
        report = self.report
        threaded = [run for run in self.runs if run.schedule == "thread count"]
        if not report.launches and threaded:
            differ = any(self.differs(run, order) for run in threaded for order in ("reversed", "shuffled"))
            if differ:
                self.properties.append("property: results depend on torch's thread count (each count within "
                                       "tolerance, the bits are not reproducible across counts)")
            return check("race", self.thread_races, f"no Triton launch: {len(threaded)} input sets right with one "
                                                    "thread and with four times as many threads as cores (other "
                                                    "chunkings), " +
                         ("not bit-identical (reported as a property)" if differ else "bit-identical") +
                         f"; {self.contention_done()}; no sanitizer build (ThreadSanitizer) on a CPU")
        if not report.launches:
            if self.device == "cuda":
                return not_run("race", "pending compute-sanitizer racecheck/synccheck")
            return not_run("race", "no race detector for this backend on a CPU (Triton kernels are checked in the "
                                    "interpreter; CUDA kernels with compute-sanitizer on a GPU)")
        problems = [excerpt(r, 400) for r in report.races]
        excused = self.order_dependent()
        pinned = ", ".join(excerpt(k, 60) for k in report.order_dependent_kernels)
        for case, run in zip(self.plan.cases, self.runs, strict=True):
            if self.differs(run, "reversed") and not excused:
                problems.append(f"{case.label}: results differ when the grid runs in reversed program order")
            if self.differs(run, "shuffled"):
                problems.append(f"{case.label}: results differ when the grid runs in shuffled program order" +
                                (f" ({pinned} kept in natural order: the difference is another kernel's)"
                                 if pinned else ""))
        why = (f" (reversed: within tolerance, not bit-identical, from float atomic adds or writes inside a lock in "
               f"{pinned}; shuffled with those kept in natural order: bit-identical)") if excused else ""
        return check("race", problems, f"{report.launches} launches, {report.programs} programs: no address "
                                        "shared between programs unless under one lock or by commuting atomics; same "
                                        f"bits in reversed and shuffled program order{why}; {self.contention_done()}")

    def contention_done(self) -> str:
        repeated = self.outputs.repeated
        if repeated is None:
            return "not repeated under contention (Triton's interpreter runs one program at a time; on a GPU the " \
                   "cores' load is not the kernel's)"
        return f"the same bits in {repeated.calls} repeated calls while other processes loaded the cores"

    def caching(self) -> Check:
        """New values in the same tensors (same pointers, ids, version counters): all of them, then one element at
        a time; then new weights copied into the same parameters."""
        problems = []
        outputs = self.outputs
        if outputs.caching_error is not None:
            problems.append(f"raised on new values in the same tensors: {excerpt(outputs.caching_error)}")
        else:
            problems += [f"new values in the same tensors (same pointers, ids and version counters) gave stale or "
                         f"wrong results: {p}" for p in self.wrong(self.plan.cases[0].model, self.plan.fresh,
                                                                   outputs.caching_out)]
        main = self.plan.cases[0].model
        for k, (inputs, got) in enumerate(zip(self.plan.changed, outputs.element_outs, strict=False)):
            if got.error is not None:
                problems.append(f"raised when one element changed: {excerpt(got.error)}")
                continue
            problems += [f"one input element changed in place (call {k + 1}): stale or wrong result: {p}"
                         for p in self.wrong(main, inputs, got.out)]
        if len(outputs.element_outs) != len(self.plan.changed):
            problems.append("not every one-element change was run")
        problems += self.later_calls_wrong()
        done = f"new values in the same tensors, and {len(self.plan.changed)} single-element changes, gave the " \
               "new results" + (f", as did the profiled call and {len(outputs.later_outs) - 1} sampled call(s) "
                                "checked at the end" if outputs.later_outs else "")
        for (label, _), got in zip(self.alternates.items(), outputs.reweight_outs, strict=False):
            what = f"new weights drawn afresh for its {label}, copied into the same tensors,"
            if got.error is not None:
                problems.append(f"{what} raised: {excerpt(got.error)}")
            else:
                problems += [f"{what} gave stale or wrong results: {p}"
                             for p in self.wrong(label, self.plan.fresh, got.out)]
        if len(outputs.reweight_outs) != len(self.alternates):
            problems.append("not every set of new weights was tried")
        if self.alternates:
            done += f"; so did new weights drawn afresh for its {', then its '.join(self.alternates)}"
        return check("result_caching", problems, done)

    def later_calls_wrong(self) -> list[str]:
        """The profiled call's outputs and some sampled calls' (on the fresh values), checked once the job ended:
        a candidate must not be right only while nothing profiles or samples it, nor only while something does."""
        later = self.outputs.later_outs
        if not later:
            return [] if self.result.profile.error is not None else ["the profiled call's outputs did not come back"]
        main = self.plan.cases[0].model
        return [f"{'the profiled call' if k == 0 else f'sampled call {k}'} gave stale or wrong results: {p}"
                for k, got in enumerate(later) for p in self.wrong(main, self.plan.fresh, got)][:3]

    def precision(self) -> Check:
        lower = LOWER_PRECISIONS.get(self.task.dtype)
        if not lower:
            return not_run("precision_downcast", f"no lower precision is checked for {self.task.dtype} tasks")
        main, run = self.plan.cases[0], self.runs[0]
        if run.error is not None or not run.out or not isinstance(run.out[0], torch.Tensor) \
                or not run.out[0].is_floating_point():
            return not_run("precision_downcast", "no floating-point output on the main input set")
        native, exact = self.reference(main.model, main.inputs)
        if not isinstance(native[0], torch.Tensor) or run.out[0].shape != native[0].shape:
            return not_run("precision_downcast", "output shape differs from the reference")
        errs = {}
        for dtype in lower:
            try:
                with torch.inference_mode():
                    model = self.references.build(main.model, dtype=dtype)
                    low = outs(model(*[x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                                        for x in main.inputs]))[0]
                errs[dtype_name(dtype)] = rel_l2(low.to(exact[0].dtype), exact[0])
            except Exception:
                continue
        finding = downcast_finding(rel_l2(run.out[0], exact[0]), rel_l2(native[0], exact[0]), errs)
        return check("precision_downcast", [finding] if finding else [],
                      "accuracy of " + self.task.dtype + " compute, not " + " or ".join(errs) if errs else
                      "lower-precision references could not run; accuracy judged by correctness only")

    def fallback(self) -> Check:
        """The candidate's own kernels do the work. Anything that stops this being judged fails it: a candidate
        must not be able to switch a check off."""
        profile = self.result.profile
        if profile.error is not None:
            return check("reference_fallback", [f"the profiled call could not be judged: {excerpt(profile.error)}"], "")
        if not profile.intact:
            return check("reference_fallback", ["the op log was disturbed during the profiled call (the profiler "
                                                "was stopped or replaced, or RecordFunction switched)"], "")
        main = self.plan.cases[0]
        reference = self.native[main.model]
        try:
            with torch.inference_mode(), _quiet_stderr():
                ref_work = sum(measure_work(lambda: reference(*self.plan.fresh), all_threads=False).compute.values())
        except Exception:
            ref_work = 0.0  # the reference could not be profiled here: only "a kernel of its own" is judged
        own = [excerpt(k, 80) for k in profile.own_kernels]
        if profile.places.get("own"):
            own.append(f"{profile.places['own']} CPU samples in its own code")
        cand = dict(profile.compute)
        cand_work = sum(cand.values())
        top = ", ".join(f"aten.{excerpt(k, 40)}" for k, _ in sorted(cand.items(), key=lambda kv: -kv[1])[:4])
        problems = []
        if not own:
            problems.append("runs no code of its own (no Triton launch, no call into native code it built, no CPU "
                            f"time in it): the work is done by PyTorch ({top or 'no aten compute ops either'}) or "
                            "other libraries")
        elif ref_work and cand_work >= FALLBACK_SHARE * ref_work:
            problems.append(f"PyTorch ops ({top}) do {cand_work / ref_work:.0%} of the reference's work beside its "
                            f"own kernels ({', '.join(own[:3])})")
        share = f"{cand_work / ref_work:.0%}" if ref_work else "none"
        # libraries' time beyond the ops the log shows (work hidden from it), and those ops' share of the work
        timed, detail = self.library_time(profile, reference)
        shown = cand_work / ref_work if ref_work else 0.0
        if timed is not None and own and timed + shown >= FALLBACK_SHARE:
            problems.append(f"torch, numpy and other libraries take {timed:.0%} or more of the reference's CPU time "
                            f"per call beyond the PyTorch ops the op log shows, which do {shown:.0%} of its work: "
                            f"{timed + shown:.0%} of the reference done beside its own code ({detail})")
        return check("reference_fallback", problems, f"own kernels: {', '.join(own[:4])}; PyTorch ops do {share} "
                                                      f"of the reference's work (profiler, every thread); {detail}")

    def library_time(self, profile: Any, reference: torch.nn.Module) -> tuple[float | None, str]:
        """(CPU time per call the candidate spent in libraries (torch, numpy, any other) beyond handing its tensors over
        and the PyTorch ops its op log shows (judged by their work), as a share of the reference's, both sampled where
        the time was spent; a description), or (None, why not) where either was not sampled."""
        if profile.problem is not None or not profile.calls:
            return None, f"CPU time by place not sampled ({excerpt(profile.problem or 'not on this device')})"
        with torch.inference_mode():
            passes = [sampled_calls(lambda: reference(*self.plan.fresh), (), ()) for _ in range(REFERENCE_PASSES)]
        problem = next((p["problem"] for p in passes if "problem" in p), None)
        if problem is not None:
            return None, f"the reference's CPU time not sampled ({problem})"
        # a pass with no sample where the reference's code runs measured nothing (seen on a host with two CPU-bound
        # processes beside the verifier): it is no lower bound
        ref_ns = min((ns for ns in (per_call_ns(p, ("own", "torch", "other")) for p in passes) if ns > 0), default=0.0)
        if not ref_ns:
            return None, f"the reference's CPU time not sampled (no sample in {REFERENCE_PASSES} passes)"
        handover = handover_ns(self.plan.fresh, reference)
        cand = {"places": profile.places, "calls": profile.calls, "period_ns": profile.period_ns}
        lib_ns, own_ns = per_call_ns(cand, ("torch", "other")), per_call_ns(cand, ("own",))
        described = (f"CPU time per call, sampled by where it ran: own code {own_ns / 1e3:.1f} µs, libraries "
                     f"{lib_ns / 1e3:.1f} µs, the reference {ref_ns / 1e3:.1f} µs, handing over its tensors "
                     f"{handover / 1e3:.1f} µs")
        # a candidate at the limit would show this many library samples: too few, and one stray sample decides (unless
        # this one showed many: 221 library samples in 107 calls of a numpy fallback are no stray sample)
        seen = sum(profile.places.get(p, 0) for p in ("torch", "other"))
        if seen < MIN_LIBRARY_SAMPLES and \
                profile.calls * FALLBACK_SHARE * ref_ns / profile.period_ns < MIN_LIBRARY_SAMPLES:
            return None, f"{described}; too few calls sampled ({profile.calls}) to judge the libraries' share"
        low_ns = max(0.0, seen - NOISE_SIGMAS * math.sqrt(seen)) * profile.period_ns / profile.calls
        # what any wrapper spends, and the ops the op log shows (judged by their work); the log is the runner's, so
        # what it can take off is capped: a forged log hides at most half the reference's time of library work
        shown_ns = min(float(profile.compute_ns), FALLBACK_SHARE * ref_ns)
        explained = handover + shown_ns
        return max(0.0, low_ns - explained) / ref_ns, (
            f"{described}; libraries at least {low_ns / 1e3:.1f} µs by their {seen} samples, less the handing over and "
            f"{shown_ns / 1e3:.1f} µs of the PyTorch ops in the op log")
