"""The load generator: seeded random prompts of token ids, a fixed number of requests in flight, each streamed, so
time to first token and the gaps between tokens are measured per request (threads over urllib: nothing beyond the
standard library, and light beside the server on a small host)."""

from __future__ import annotations

import json
import math
import random
import statistics
import threading
import time
import urllib.request
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kernelbot import KernelbotError
from kernelbot.engine.serving.apis import EngineAPI, Generated
from kernelbot.engine.serving.serve_options import Lengths
from kernelbot.records import ServingMetrics

FIRST_ID = 10  # ids below this are left out of prompts: special tokens in most vocabularies


class Workload(BaseModel):
    """A serving workload: `num_prompts` requests of up to `input_len` prompt tokens and `output_len` greedy tokens
    (`lengths` says how each request's are drawn), `concurrency` in flight."""

    model_config = ConfigDict(frozen=True)

    num_prompts: int = Field(32, ge=1)
    input_len: int = Field(32, ge=1)
    output_len: int = Field(32, ge=1)
    concurrency: int = Field(8, ge=1)
    seed: int = 0
    lengths: Lengths = Lengths.FIXED

    def requests(self, vocab: int) -> list[tuple[list[int], int]]:
        """Each request's prompt (seeded token ids) and output tokens."""
        shape = request_lengths(self.lengths, self.num_prompts, self.input_len, self.output_len, self.seed)
        rng = random.Random(self.seed)
        return [([rng.randrange(FIRST_ID, vocab) for _ in range(p)], o) for p, o in shape]


def request_lengths(kind: Lengths, n: int, max_prompt: int, max_output: int, seed: int) -> list[tuple[int, int]]:
    """n (prompt, output) lengths drawn from `kind`, each within [1, max_prompt] and [1, max_output]."""
    rng = random.Random(seed * 7919 + 17)

    def draw(top: int) -> int:
        if kind is Lengths.FIXED:
            return top
        low = max(1, top // 4)
        if kind is Lengths.UNIFORM:
            return rng.randint(low, top)
        return max(1, min(top, round(rng.lognormvariate(math.log(low), 0.8))))

    return [(draw(max_prompt), draw(max_output)) for _ in range(n)]


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(FIRST_ID, vocab) for _ in range(length)] for _ in range(n)]


def post(url: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw.strip() else {}


def generate(api: EngineAPI, url: str, prompt: list[int], max_tokens: int, *, top_logprobs: int = 0,
             prompt_logprobs: int = 0) -> Generated:
    """One request, not streamed: its tokens and, when asked, the top-k logprobs."""
    path, body = api.request(prompt, max_tokens, stream=False, top_logprobs=top_logprobs,
                             prompt_logprobs=prompt_logprobs)
    return api.answer(post(url + path, body))


def _streamed(api: EngineAPI, url: str, prompt: list[int], output_len: int) -> tuple[float, list[float], int]:
    """(time to first token s, gaps between later tokens s, tokens) of one streamed request."""
    path, body = api.request(prompt, output_len, stream=True)
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = last = time.perf_counter()
    ttft, gaps, tokens = None, [], 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            done = api.progress(json.loads(line[5:]), tokens)
            new = done - tokens
            if new <= 0:
                continue
            if ttft is None:
                ttft, new = now - start, new - 1
            if new:
                gaps.extend([(now - last) / new] * new)
            tokens, last = done, now
    return ttft or 0.0, gaps, tokens


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def run_load(api: EngineAPI, url: str, workload: Workload, vocab: int) -> ServingMetrics:
    """The workload against a running server; every request must come back whole."""
    requests = workload.requests(vocab)
    results: list[tuple[float, list[float], int]] = []
    short: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not requests:
                    return
                prompt, output_len = requests.pop()
            try:
                res = _streamed(api, url, prompt, output_len)
            except (OSError, ValueError) as exc:
                with lock:
                    errors.append(repr(exc))
                continue
            with lock:
                results.append(res)
                if res[2] != output_len:
                    short.append(res[2])

    from kernelbot.hardware.telemetry import snapshot

    before = snapshot()  # GPU clocks, temperature and throttling where NVML sees a GPU; absent (said so) elsewhere
    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(workload.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.perf_counter() - start
    if errors or short or not results:
        why = errors[0] if errors else f"{len(short)} answers were cut short"
        raise KernelbotError(f"{len(errors) + len(short)} of {workload.num_prompts} requests failed: {why}")
    ttfts = [r[0] * 1e3 for r in results]
    itls = [g * 1e3 for r in results for g in r[1]] or [0.0]
    tokens = sum(r[2] for r in results)
    return ServingMetrics(source="kernelbot generator", requests=len(results), output_tokens=tokens,
                          duration_s=duration, output_throughput=tokens / duration,
                          mean_ttft_ms=statistics.fmean(ttfts), median_ttft_ms=statistics.median(ttfts),
                          p99_ttft_ms=percentile(ttfts, 0.99), mean_itl_ms=statistics.fmean(itls),
                          median_itl_ms=statistics.median(itls), p99_itl_ms=percentile(itls, 0.99),
                          telemetry={"before": before, "after": snapshot()})
