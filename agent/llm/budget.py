"""What the LLM stage may spend, and what it has spent: wall time, tokens, dollars, calls per task."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

CHARS_PER_TOKEN = 3  # a deliberately low estimate, so prompt sizes are over- rather than under-counted
MIN_ANSWER_TOKENS = 512  # a call that could not afford this much of an answer is not worth making


class Budget(BaseModel):
    model_config = ConfigDict(frozen=True)

    # wall time of the whole generate stage, verification included
    max_seconds: float | None = Field(None, gt=0, json_schema_extra={"flag": "--max-llm-seconds"})
    max_tokens: int | None = Field(None, gt=0)  # prompt + completion tokens, all calls
    max_cost: float | None = Field(None, gt=0)  # dollars, by litellm's price table (or --llm-price)
    max_calls_per_task: int | None = Field(None, gt=0)
    max_answer_tokens: int = Field(4096, gt=0)  # per call


@dataclass
class Ledger:
    budget: Budget
    t0: float = field(default_factory=time.perf_counter)
    tokens: int = 0
    cost: float = 0.0
    calls_per_task: dict[str, int] = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def answer_tokens(self, prompt_chars: int) -> int:
        """How many answer tokens the next call may ask for (0: the token budget cannot afford it)."""
        b = self.budget
        if b.max_tokens is None:
            return b.max_answer_tokens
        left = b.max_tokens - self.tokens - prompt_chars // CHARS_PER_TOKEN
        return min(b.max_answer_tokens, left) if left >= MIN_ANSWER_TOKENS else 0

    def stop_reason(self, prompt_chars: int, worst_cost: float) -> str | None:
        """Why no further call may be made in this run, or None. `worst_cost`: the most the next call can cost."""
        b = self.budget
        if b.max_seconds is not None and self.elapsed() >= b.max_seconds:
            return f"wall-time budget: {self.elapsed():.0f} s of {b.max_seconds:.0f} s spent"
        if b.max_tokens is not None and self.answer_tokens(prompt_chars) == 0:
            return f"token budget: {self.tokens} of {b.max_tokens} tokens spent, too few left for another call"
        if b.max_cost is not None and self.cost + worst_cost > b.max_cost:
            return (f"cost budget: ${self.cost:.4f} of ${b.max_cost:.4f} spent, "
                    f"the next call could cost ${worst_cost:.4f}")
        return None

    def task_capped(self, task_id: str) -> str | None:
        cap = self.budget.max_calls_per_task
        if cap is not None and self.calls_per_task.get(task_id, 0) >= cap:
            return f"per-task cap: {cap} calls for {task_id}"
        return None

    def charge(self, task_id: str, tokens: int, cost: float) -> None:
        self.tokens += tokens
        self.cost += cost
        self.calls_per_task[task_id] = self.calls_per_task.get(task_id, 0) + 1
