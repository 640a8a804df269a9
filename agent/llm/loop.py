"""Generate → verify → repair, per task: N samples a round, up to R repair rounds in which every candidate's
verifier and benchmark report goes back to the model; the best verified candidate is kept; budgets stop it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from kernelbot.agent.llm.budget import CHARS_PER_TOKEN, Ledger
from kernelbot.agent.llm.client import EndpointDown, LLMClient, safe_url
from kernelbot.agent.llm.extract import extract_code
from kernelbot.agent.llm.llm_options import LLMOptions
from kernelbot.agent.llm.prompt import Attempt, PromptContext, build_messages
from kernelbot.agent.llm.redact import redact
from kernelbot.agent.propose.proposer import write_candidate
from kernelbot.kernel_library.identity import source_identity
from kernelbot.outcomes import Accepted, Outcome, new_row, pick_best
from kernelbot.records import Candidate, KernelResult, LLMCall, LLMUsage, Origin, Task


def detect_backend(code: str, default: str) -> str:
    if re.search(r"@triton\.jit|^\s*import triton|^\s*from triton", code, re.M):
        return "triton"
    if "cuda_sources" in code:
        return "cuda"
    if re.search(r"load_inline|cpp_extension|ctypes|cpp_sources", code):
        return "cpp"
    return default


class LLMSession:
    """One per run: the client, the ledger of what was spent, and the provenance written under the run directory."""

    def __init__(self, opts: LLMOptions, run_dir: Path, say: Callable[[str], None],
                 client: LLMClient | None = None) -> None:
        self.opts, self.run_dir, self.say = opts, run_dir, say
        self.client = client or LLMClient(opts.model, opts.api_base, timeout=opts.timeout,
                                          max_retries=opts.max_retries, backoff=opts.backoff,
                                          temperature=opts.temperature, price=opts.price)
        self.ledger = Ledger(opts.budget)
        b = opts.budget
        self.usage = LLMUsage(model=opts.model, api_base=safe_url(opts.api_base), budgets={
            "samples": opts.samples, "repair_rounds": opts.repair_rounds, "max_seconds": b.max_seconds,
            "max_tokens": b.max_tokens, "max_cost": b.max_cost, "max_calls_per_task": b.max_calls_per_task,
            "max_answer_tokens": b.max_answer_tokens})
        self.stopped = ""  # the budget that ended the stage
        self.down = ""  # why the endpoint is treated as down
        self._count = 0
        (run_dir / "llm").mkdir(parents=True, exist_ok=True)
        if not self.client.price_known():
            self.usage.cost_known = False
            self.say(f"note: litellm has no price for {opts.model}; costs are recorded as $0"
                     + (" and --max-cost cannot bind (give --llm-price IN,OUT per million tokens)"
                        if b.max_cost is not None else ""))

    @property
    def active(self) -> bool:
        return not (self.stopped or self.down)

    def call(self, task_id: str, rnd: int, sample: int, messages: list[dict[str, str]]) -> LLMCall | None:
        """Ask once. None when a budget forbids the call (self.stopped says which); a call record otherwise, with
        `error` set when the request failed (self.down set too when the endpoint is gone)."""
        chars = sum(len(m["content"]) for m in messages)
        answer_tokens = self.ledger.answer_tokens(chars)
        worst, _ = self.client.cost(chars // CHARS_PER_TOKEN, answer_tokens)
        reason = self.ledger.stop_reason(chars, worst)
        if reason:
            self.stopped = reason
            return None
        self._count += 1
        call = LLMCall(id=f"c{self._count:04d}", task_id=task_id, round=rnd, sample=sample, model=self.opts.model,
                       api_base=safe_url(self.opts.api_base), messages=redact(messages))
        try:
            answer = self.client.complete(messages, answer_tokens)
        except EndpointDown as exc:
            self.down = redact(str(exc))
            call.error, call.outcome = f"endpoint down: {self.down}", "endpoint down"
            self.usage.failed_calls += 1
            self.usage.calls += 1
            self.ledger.charge(task_id, 0, 0.0)
            return call
        call.answer, call.latency_s, call.attempts = answer.text, round(answer.latency_s, 3), answer.attempts
        call.prompt_tokens, call.completion_tokens = answer.prompt_tokens, answer.completion_tokens
        call.cost_usd, call.cost_known, call.error = answer.cost_usd, answer.cost_known, answer.error
        self.ledger.charge(task_id, answer.prompt_tokens + answer.completion_tokens, answer.cost_usd)
        u = self.usage
        u.calls += 1
        u.failed_calls += bool(answer.error)
        u.prompt_tokens += answer.prompt_tokens
        u.completion_tokens += answer.completion_tokens
        u.cost_usd = round(self.ledger.cost, 6)
        if not answer.error:
            u.cost_known = u.cost_known and answer.cost_known
        return call

    def record(self, call: LLMCall, task_dir: Path) -> None:
        """The full call under the task; one line without prompt and answer in llm/calls.jsonl."""
        data = redact(call.model_dump())
        (task_dir / "llm").mkdir(parents=True, exist_ok=True)
        (task_dir / "llm" / f"{call.id}.json").write_text(json.dumps(data, indent=2))
        brief = {k: v for k, v in data.items() if k not in ("messages", "answer")}
        with open(self.run_dir / "llm" / "calls.jsonl", "a") as f:
            f.write(json.dumps(brief) + "\n")

    def finish(self) -> LLMUsage:
        self.usage.seconds = round(self.ledger.elapsed(), 1)
        self.usage.stop_reason, self.usage.fallback = self.stopped, self.down and f"endpoint down: {self.down}"
        (self.run_dir / "llm" / "usage.json").write_text(self.usage.model_dump_json(indent=2))
        return self.usage


@dataclass
class TaskRun:
    rows: list[KernelResult]
    best: Accepted | None
    verified: list[str] = field(default_factory=list)  # candidate ids that passed the verifier
    note: str = ""  # why the task ended early (cap), when it did


Evaluator = Callable[[Candidate, Path], Outcome]


def run_task(session: LLMSession, task: Task, task_dir: Path, ctx: PromptContext, evaluate: Evaluator) -> TaskRun:
    opts = session.opts
    reference = (task_dir / "reference.py").read_text()
    attempts: list[Attempt] = []
    run = TaskRun([], None)
    winners: list[Accepted] = []
    for rnd in range(1 + opts.repair_rounds):
        history = list(attempts)  # the samples of one round see the same prompt
        for sample in range(opts.samples):
            capped = session.ledger.task_capped(task.id)
            if capped:
                run.note = capped
                break
            call = session.call(task.id, rnd, sample, build_messages(task, reference, ctx, history))
            if call is None or session.down:
                if call is not None:
                    session.record(call, task_dir)
                return _finish(session, task, run, winners)
            if call.error:
                call.outcome = "request failed"
                session.record(call, task_dir)
                session.say(f"  {task.id} {call.id}: request failed: {call.error[:200]}")
                continue
            _use_answer(session, task, task_dir, ctx, evaluate, call, rnd, sample, attempts, run, winners)
        if winners or run.note:
            break
    return _finish(session, task, run, winners)


def _finish(session: LLMSession, task: Task, run: TaskRun, winners: list[Accepted]) -> TaskRun:
    rows, best = pick_best(task, run.rows, winners)
    session.usage.accepted += best is not None
    return replace(run, rows=rows, best=best)


def _use_answer(session: LLMSession, task: Task, task_dir: Path, ctx: PromptContext, evaluate: Evaluator,
                call: LLMCall, rnd: int, sample: int, attempts: list[Attempt], run: TaskRun,
                winners: list[Accepted]) -> None:
    cid = f"llm-r{rnd}-s{sample}"
    extraction = extract_code(call.answer)
    code = extraction.code
    cand = Candidate(id=cid, task_id=task.id, backend=detect_backend(code, ctx.backend) if code else ctx.backend,
                     proposer=f"llm:{session.opts.model}", origin=Origin.LLM,
                     config={"call": call.id, "round": rnd, "sample": sample},
                     source_hash=source_identity(code or ""))
    call.candidate_id = f"{task.id}/{cid}"
    if code is None:
        row = new_row(task, cand, reason=f"LLM answer unusable: {extraction.problem}")
        run.rows.append(row)
        attempts.append(Attempt(cid, None, f"no candidate: {extraction.problem}. Answer with one ```python block "
                                           "holding the whole file, including class ModelNew."))
        call.outcome = row.reason
    else:
        path = write_candidate(cand, code, task_dir)
        outcome = evaluate(cand, path)
        run.rows.append(outcome.row)
        session.usage.candidates += 1
        if outcome.verdict is not None and outcome.verdict.verdict == "pass":
            run.verified.append(cid)
            session.usage.verified += 1
        if outcome.accepted:
            winners.append(outcome.accepted)
        attempts.append(Attempt(cid, code, outcome.report or outcome.row.reason))
        call.outcome = outcome.row.reason[:300]
    session.record(call, task_dir)
    outcome = " ".join(call.outcome.split())[:200]
    session.say(f"  {task.id} {cid} ← {call.id} ({call.prompt_tokens}+{call.completion_tokens} tokens, "
                f"${call.cost_usd:.4f}, {call.latency_s:.1f} s, {call.attempts} tries): {outcome}")
