"""The one place kernelbot talks to an LLM: litellm, imported lazily, with retries, backoff and redaction.

Keys come from the environment by litellm's conventions (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...); kernelbot
never reads, prints or stores them. Every answer is redacted the moment it arrives.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kernelbot import KernelbotError
from kernelbot.agent.llm.redact import redact

RETRY = "retry"  # rate limits, 5xx, timeouts, connection failures: try again after a wait
DOWN = "down"  # the endpoint cannot serve us at all (auth, unknown model or route)
FAIL = "fail"  # this request failed (bad request, malformed answer): a failed attempt, nothing more


class EndpointDown(Exception):
    """The endpoint stayed down (or refused us) through every retry; the run falls back to the built-in proposer."""


@dataclass
class Answer:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    cost_known: bool
    latency_s: float
    attempts: int
    error: str = ""  # set when the request failed without taking the endpoint down


def safe_url(url: str | None) -> str | None:
    """The api base without user info, query or fragment (where a key could hide)."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def import_litellm() -> Any:
    # The cost map ships with litellm; without this it is fetched from the network at import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_TELEMETRY", "False")
    try:
        import litellm
    except ImportError:
        raise KernelbotError("--llm needs litellm: pip install 'kernelbot[llm]'") from None

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    litellm.set_verbose = False
    return litellm


def classify(exc: Exception) -> str:
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    if "[200 OK]" in str(exc):  # litellm reports a 200 whose body is no chat completion as a server error
        return FAIL
    if name in ("RateLimitError", "Timeout", "APIConnectionError", "InternalServerError", "ServiceUnavailableError",
                "BadGatewayError", "APITimeoutError"):
        return RETRY
    if name in ("AuthenticationError", "PermissionDeniedError", "NotFoundError"):
        return DOWN
    if isinstance(status, int) and (status == 429 or status >= 500):
        return RETRY
    if isinstance(status, int) and status in (401, 403, 404):
        return DOWN
    return FAIL


def retry_after(exc: Exception) -> float | None:
    """The server's Retry-After, in seconds, when it sent one."""
    for source in (getattr(exc, "response", None), exc):
        headers = getattr(source, "headers", None) or getattr(source, "litellm_response_headers", None)
        try:
            value = headers.get("retry-after") if headers is not None else None
            if value is not None:
                return max(0.0, float(value))
        except (TypeError, ValueError, AttributeError):
            continue
    return None


def short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return redact(f"{type(exc).__name__}: {text}"[:500])


class LLMClient:
    def __init__(self, model: str, api_base: str | None = None, *, timeout: float = 180.0, max_retries: int = 4,
                 backoff: float = 2.0, backoff_cap: float = 30.0, temperature: float = 0.7,
                 price: tuple[float, float] | None = None) -> None:
        self.model, self.api_base, self.timeout = model, api_base, timeout
        self.max_retries, self.backoff, self.backoff_cap = max_retries, backoff, backoff_cap
        self.temperature = temperature
        self.price = price  # $ per million (input, output) tokens, for models litellm has no price for
        self.litellm = import_litellm()
        self._extra: dict[str, Any] = {}
        if api_base:
            self._extra["api_base"] = api_base
            # A self-hosted OpenAI-compatible server usually wants no key, but the client insists on one;
            # a real key in the environment (litellm's conventions) is still used when there is one.
            try:
                keys_present = self.litellm.validate_environment(model=model).get("keys_in_environment", False)
            except Exception:
                keys_present = False
            if not keys_present:
                self._extra["api_key"] = "no-key"

    def price_known(self) -> bool:
        return self.price is not None or self.cost(1000, 1000)[1]

    def cost(self, prompt_tokens: int, completion_tokens: int) -> tuple[float, bool]:
        """Dollars for a call of this size, and whether the price is known (litellm's table, or --llm-price)."""
        if self.price is not None:
            return (prompt_tokens * self.price[0] + completion_tokens * self.price[1]) / 1e6, True
        try:
            p, c = self.litellm.cost_per_token(model=self.model, prompt_tokens=prompt_tokens,
                                               completion_tokens=completion_tokens)
            return float(p) + float(c), True
        except Exception:  # litellm knows no price for this model (self-hosted, new): cost 0, marked unknown
            return 0.0, False

    def complete(self, messages: list[dict[str, str]], max_tokens: int) -> Answer:
        """One answer; retries RETRY-class failures with exponential backoff; raises EndpointDown when the
        endpoint stays down; returns an Answer with `error` set for a failed request."""
        t0 = time.perf_counter()
        last = ""
        for attempt in range(1, self.max_retries + 2):
            try:
                response = self.litellm.completion(
                    model=self.model, messages=messages, timeout=self.timeout, max_tokens=max_tokens,
                    temperature=self.temperature, num_retries=0, max_retries=0, **self._extra)
            except Exception as exc:  # litellm maps provider errors to its own classes; anything else is FAIL
                kind, last = classify(exc), short(exc)
                if kind == DOWN:
                    raise EndpointDown(last) from None
                if kind == RETRY and attempt <= self.max_retries:
                    wait = min(self.backoff_cap, self.backoff * 2 ** (attempt - 1))
                    time.sleep(min(self.backoff_cap, max(wait, retry_after(exc) or 0.0)))
                    continue
                if kind == RETRY:
                    raise EndpointDown(f"{attempt} tries; last: {last}") from None
                return Answer("", 0, 0, 0.0, self.price is not None, time.perf_counter() - t0, attempt, last)
            return self._answer(response, time.perf_counter() - t0, attempt)
        raise EndpointDown(last)  # not reached: the loop returns or raises

    def _answer(self, response: Any, latency: float, attempts: int) -> Answer:
        try:
            text = response.choices[0].message.content or ""
            usage = getattr(response, "usage", None)
            prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
            completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        except (AttributeError, IndexError, TypeError, ValueError) as exc:
            return Answer("", 0, 0, 0.0, False, latency, attempts, f"malformed response: {short(exc)}")
        cost, known = self.cost(prompt_tokens, completion_tokens)
        return Answer(redact(text), prompt_tokens, completion_tokens, cost, known, latency, attempts)
