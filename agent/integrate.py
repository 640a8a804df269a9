"""Put the pack into the engine and measure what it changed: calls, fidelity, end-to-end time."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from kernelbot.engine import TorchEngine
from kernelbot.records import Fidelity, Pack


def count_calls(engine: TorchEngine, pack: Pack, pack_dir: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Run the workload once with the pack; return calls into each kernel and fallbacks per module class."""
    engine.apply_pack(pack, pack_dir)
    engine.patcher.reset_counts()
    try:
        engine.run_workload()
        return ({k: c.calls for k, c in engine.patcher.counts.items()},
                {k: c.fallback_calls for k, c in engine.patcher.fallbacks.items()})
    finally:
        engine.remove_pack()


# Two implementations with equally good rounding each sit about the dtype's error from float64, in different
# directions; a pack is held to twice eager's distance, far below what a wrong kernel moves (tests/test_engine.py).
NOISE_SLACK = 2.0


def fidelity(engine: TorchEngine, pack: Pack, pack_dir: Path) -> Fidelity:
    """Greedy outputs without and with the pack, and logits compared in the same contexts (all fed eager's
    tokens). In a low-precision model a kernel that rounds once differently can flip a near tie and change every
    token after it; so eager and the pack are both measured against the same weights in float64, and changed
    tokens pass only when the pack is at most NOISE_SLACK times as far from float64 as eager is."""
    tokens_ref, logits_ref = engine.generate(record_logits=True)
    engine.apply_pack(pack, pack_dir)
    try:
        tokens_new, _ = engine.generate()
        _, logits_new = engine.generate(record_logits=True, forced=tokens_ref)
    finally:
        engine.remove_pack()
    _, logits_exact = engine.in_float64().generate(record_logits=True, forced=tokens_ref)
    noise, pack_error = _max_diff(logits_ref, logits_exact), _max_diff(logits_new, logits_exact)
    d_before, d_after = distinct_ngrams(tokens_ref.tolist()), distinct_ngrams(tokens_new.tolist())
    return Fidelity(max_abs_logit_diff=_max_diff(logits_ref, logits_new),
                    greedy_match=bool(torch.equal(tokens_ref, tokens_new)),
                    token_agreement=float((tokens_ref == tokens_new).float().mean()),
                    distinct_3grams_before=d_before, distinct_3grams_after=d_after,
                    repetition_collapse=d_after < 0.5 * d_before, dtype_noise=noise, pack_error=pack_error,
                    within_noise=pack_error <= NOISE_SLACK * noise)


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def distinct_ngrams(sequences: list[list[int]], n: int = 3) -> float:
    """Distinct n-grams over all n-grams in the sequences: near 0 when outputs loop on a few tokens."""
    grams = [tuple(s[i:i + n]) for s in sequences for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def time_end_to_end(engine: TorchEngine, pack: Pack, pack_dir: Path, rounds: int,
                    compiled: TorchEngine | None) -> dict[str, list[float]]:
    """Workload wall time for eager, kernelbot-patched and torch.compile, interleaved round by round so
    that drift on a noisy machine hits all of them alike."""

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    times: dict[str, list[float]] = {"eager": [], "kernelbot": [], "compiled": []}
    for _ in range(rounds):
        times["eager"].append(timed(engine.run_workload))
        engine.apply_pack(pack, pack_dir)
        try:
            times["kernelbot"].append(timed(engine.run_workload))
        finally:
            engine.remove_pack()
        if compiled is not None:
            times["compiled"].append(timed(compiled.run_workload))
    return times


def median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 2) if xs else None


def served_fidelity(before: list[dict[str, list]], after: list[dict[str, list]]) -> Fidelity:
    """Greedy parity, token agreement, |Δ logprob| of the chosen tokens up to each output's first divergence,
    and whether the outputs with the pack collapsed into repetition."""
    agree = total = 0
    worst = 0.0
    for b, a in zip(before, after, strict=True):
        total += len(b["ids"])
        for tb, ta, lb, la in zip(b["ids"], a["ids"], b["logprobs"], a["logprobs"], strict=False):
            if tb != ta:
                break
            agree += 1
            worst = max(worst, abs(lb - la))
    d_before = distinct_ngrams([b["ids"] for b in before])
    d_after = distinct_ngrams([a["ids"] for a in after])
    return Fidelity(max_abs_logit_diff=worst, greedy_match=agree == total and
                    all(len(a["ids"]) == len(b["ids"]) for a, b in zip(after, before, strict=True)),
                    token_agreement=agree / max(total, 1), distinct_3grams_before=d_before,
                    distinct_3grams_after=d_after, repetition_collapse=d_after < 0.5 * d_before)
