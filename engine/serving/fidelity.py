"""Did the pack change what the served model says? Measured through the engine's own answers.

Greedy parity and repetition: the stock and the packed server each decode the same fixed prompts greedily. KL: both
are then fed the same contexts (each prompt followed by the stock server's own tokens) and asked for their top-k
logprobs at every position (the engines' prompt logprobs: one prefill), and the top-k of their own decode steps are
added wherever the contexts were still the same (a pack's decode-sized kernels run only there), so the distributions
compare in identical contexts at prefill and at decode. The
model's own float64 twin (the same weights in transformers, float64, in kernelbot's process) scores those contexts
too, and the in-process rule applies: the pack passes when its KL from float64 is within `KL_SLACK` times the stock
engine's own (or under `KL_FLOOR`), mean and max over positions, and its greedy tokens agree or stay within twice
the stock engine's distance from float64. An engine returns only its top-k, so each KL is taken over the tokens both
servers returned at that position, renormalised there: a truncated KL, the same for every pair compared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from kernelbot.engine.serving.apis import Generated
from kernelbot.records import Fidelity, KLCheck

KL_SLACK = 2.0
KL_FLOOR = 1e-9
NOISE_SLACK = 2.0
TOP_K = 20  # logprobs asked per position (vLLM's default cap)

Top = dict[int, float]  # token id → logprob, as an engine returns its top-k


def _renormalised(top: Top, ids: Sequence[int]) -> list[float]:
    logps = [top[i] for i in ids]
    m = max(logps)
    total = m + math.log(sum(math.exp(lp - m) for lp in logps))
    return [lp - total for lp in logps]


def truncated_kl(p: Top, q: Top, ids: Sequence[int]) -> float:
    """KL(P ‖ Q) in nats over `ids` (tokens both give), each renormalised there."""
    lp, lq = _renormalised(p, ids), _renormalised(q, ids)
    return max(sum(math.exp(a) * (a - b) for a, b in zip(lp, lq, strict=True)), 0.0)


def exact_top(log_probs: torch.Tensor) -> Top:
    """A float64 twin's full next-token distribution at one position, as a top map of every token."""
    return dict(enumerate(log_probs.tolist()))


def _argmax(top: Top, ids: Sequence[int]) -> int:
    return max(ids, key=lambda i: top[i])


def same_context_steps(stock: Generated, pack: Generated) -> int:
    """How many decode steps of one prompt both servers took in the same context, with top-k logprobs from both: every
    step up to and including the first where their greedy tokens part (the context before it is still shared)."""
    n = min(len(stock.top), len(pack.top), len(stock.tokens), len(pack.tokens))
    parted = next((i for i in range(n) if stock.tokens[i] != pack.tokens[i]), None)
    return n if parted is None else parted + 1


def kl_check(stock: list[Top], pack: list[Top], exact: list[Top]) -> KLCheck | None:
    """Position by position over the tokens both servers returned: stock against the pack, and each against the
    float64 twin; None where no position has two tokens both returned."""
    kl, stock_err, pack_err, top1, top5 = [], [], [], [], []
    for s, p, e in zip(stock, pack, exact, strict=True):
        ids = sorted(set(s) & set(p))
        if len(ids) < 2:
            continue
        kl.append(truncated_kl(s, p, ids))
        stock_err.append(truncated_kl(e, s, ids))
        pack_err.append(truncated_kl(e, p, ids))
        top1.append(float(_argmax(s, list(s)) == _argmax(p, list(p))))
        best_s = sorted(s, key=lambda i: -s[i])[:5]
        best_p = set(sorted(p, key=lambda i: -p[i])[:5])
        top5.append(sum(i in best_p for i in best_s) / max(len(best_s), 1))
    if not kl:
        return None
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return KLCheck(positions=len(kl), mean=mean(kl), max=max(kl), top1_agreement=mean(top1),
                   top5_agreement=mean(top5), eager_mean=mean(stock_err), eager_max=max(stock_err),
                   pack_mean=mean(pack_err), pack_max=max(pack_err), slack=KL_SLACK, floor=KL_FLOOR)


def max_logprob_error(served: list[Top], exact: list[Top]) -> float:
    """max |logprob − float64 logprob| over the tokens a server returned."""
    return max((abs(lp - e[i]) for s, e in zip(served, exact, strict=True) for i, lp in s.items()), default=0.0)


def distinct_ngrams(sequences: list[list[int]], n: int = 3) -> float:
    """Distinct n-grams over all n-grams in the sequences: near 0 when outputs loop on a few tokens."""
    grams = [tuple(s[i:i + n]) for s in sequences for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def served_fidelity(stock_tokens: list[list[int]], pack_tokens: list[list[int]], stock: list[Top], pack: list[Top],
                    exact: list[Top] | None) -> Fidelity:
    """The verdict from both servers' greedy tokens and their top-k logprobs in the same contexts (`exact`: the
    float64 twin's, or None where no twin could be built: then only greedy parity and repetition are judged)."""
    total = sum(len(t) for t in stock_tokens)
    agree = sum(a == b for s, p in zip(stock_tokens, pack_tokens, strict=True) for a, b in zip(s, p, strict=False))
    d_before, d_after = distinct_ngrams(stock_tokens), distinct_ngrams(pack_tokens)
    shared = [(s, p) for s, p in zip(stock, pack, strict=True)]
    worst = max((abs(s[i] - p[i]) for s, p in shared for i in set(s) & set(p)), default=0.0)
    fid = Fidelity(max_abs_logit_diff=worst, greedy_match=stock_tokens == pack_tokens,
                   token_agreement=agree / max(total, 1), distinct_3grams_before=d_before,
                   distinct_3grams_after=d_after, repetition_collapse=d_after < 0.5 * d_before)
    fid.kl = kl_check(stock, pack, exact) if exact is not None else None
    if fid.kl is not None and exact is not None:
        noise, error = max_logprob_error(stock, exact), max_logprob_error(pack, exact)
        fid.dtype_noise, fid.pack_error = noise, error
        fid.within_noise = error <= NOISE_SLACK * noise
    return fid
