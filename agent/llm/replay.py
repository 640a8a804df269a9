"""LLM calls through the journal: every answer is recorded before it is used, keyed by a hash of (model, prompt)
and the how-manieth time that prompt was asked, so a resumed run replays paid answers instead of paying again."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from kernelbot.agent.journal.db import Journal
from kernelbot.agent.llm.client import Answer, LLMClient


def call_key(model: str, messages: list[dict[str, str]], occurrence: int) -> str:
    digest = hashlib.sha256(json.dumps([model, messages], sort_keys=True).encode()).hexdigest()[:32]
    return f"llm:{digest}:{occurrence}"


class JournaledClient:
    """Wraps an LLMClient: replays recorded answers, records new ones durably the moment they arrive."""

    def __init__(self, inner: LLMClient, journal: Journal) -> None:
        self.inner, self.journal = inner, journal
        self.model = inner.model
        self._seen: dict[str, int] = {}
        self.replayed = 0
        self.paid = 0

    def price_known(self) -> bool:
        return self.inner.price_known()

    def cost(self, prompt_tokens: int, completion_tokens: int) -> tuple[float, bool]:
        return self.inner.cost(prompt_tokens, completion_tokens)

    def complete(self, messages: list[dict[str, str]], max_tokens: int) -> Answer:
        base = call_key(self.model, messages, 0).rsplit(":", 1)[0]
        n = self._seen.get(base, 0)
        self._seen[base] = n + 1
        key = f"{base}:{n}"
        recorded = self.journal.get(key)
        if recorded is not None:
            self.replayed += 1
            return Answer(**recorded["answer"])
        answer = self.inner.complete(messages, max_tokens)  # EndpointDown propagates: nothing was paid for
        self.paid += 1
        data: dict[str, Any] = {"model": self.model, "answer": dataclasses.asdict(answer),
                                "prompt_chars": sum(len(m["content"]) for m in messages)}
        self.journal.put(key, "llm", data)
        return answer
