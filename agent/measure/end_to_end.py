"""Put the pack into the engine and measure what it changed: calls, fidelity, end-to-end time."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field

from kernelbot.agent.measure.timing import time_once
from kernelbot.engine import TorchEngine
from kernelbot.engine.graph_decode import StaticDecode
from kernelbot.engine.serving.fidelity import distinct_ngrams
from kernelbot.hardware import host
from kernelbot.records import (
    EndToEndTimes,
    Fidelity,
    KernelOutcome,
    KernelResult,
    KLCheck,
    Pack,
    PluginReport,
    ServedComparison,
    WorkloadFloor,
)


class Measured(BaseModel):
    """What the final pack changed, as measured: calls into each kernel and fallbacks per layer class, the model's
    outputs, the workload's time and its roofline floor, the served A/B (served engines), what the in-process router
    saw over the rounds (engine/router.py; a served engine's are each process's, in `serving`), notes for the
    report."""

    calls: dict[str, int]
    fallbacks: dict[str, int]
    fidelity: Fidelity
    times: EndToEndTimes
    floor: WorkloadFloor | None = None
    serving: ServedComparison | None = None
    router: PluginReport | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def routers(self) -> list[PluginReport]:
        """What the router saw in every process that ran the pack: each kernel's calls, timings and switch-off."""
        if self.serving is not None:
            return self.serving.processes
        return [self.router] if self.router is not None else []



def count_calls(engine: TorchEngine, pack: Pack, pack_dir: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Run the workload once with the pack; return calls into each kernel and fallbacks per module class."""
    engine.apply_pack(pack, pack_dir)
    engine.patcher.reset_counts()
    try:
        engine.run_workload()
        return engine.patcher.counts, engine.patcher.fallbacks
    finally:
        engine.remove_pack()


def router_report(engine: TorchEngine, pack: Pack) -> PluginReport:
    """The in-process router's counters for the pack's kernels, as they stand (its first-call checks, in-model
    timings and switch-offs last as long as the model)."""
    report = engine.patcher.router.report()
    ids = {e.candidate_id for e in pack.entries}
    return report.model_copy(update={"custom": {cid: c for cid, c in report.custom.items() if cid in ids}})


def layer_routes_note(engine: TorchEngine, pack: Pack, pack_dir: Path) -> str | None:
    """Which decoder layers the pack runs part to part (engine/layer_route.py), in one line for the report."""
    engine.apply_pack(pack, pack_dir)
    try:
        layers = list(engine.patcher.lean_layers)
    finally:
        engine.remove_pack()
    if not layers:
        return None
    named = ", ".join(layers) if len(layers) <= 4 else f"{layers[0]} … {layers[-1]}"
    return (f"{len(layers)} decoder layer(s) run part to part, their parts' kernels called directly ({named}): each "
            "gave exactly its own forward's output and cache on probe calls at the attention kernel's shapes")


# Two implementations with equally good rounding each sit about the dtype's error from float64, in different
# directions; a pack is held to twice eager's distance, far below what a wrong kernel moves (tests/test_engine.py).
NOISE_SLACK = 2.0
# The same rule for the next-token distributions: the pack's KL from float64 (mean and max over positions) within
# KL_SLACK times eager's, or under KL_FLOOR nats. fp32 rounding alone gives about 1e-15 nats on the built-in models,
# bf16 about 1e-6; an RMSNorm 1% off gives about 1e-6 in fp32 (tests/test_fidelity_kl.py) while every greedy token
# still agrees. The floor only spares a pack whose error is float32's last bits when eager happens to be closer.
KL_SLACK = 2.0
KL_FLOOR = 1e-9
TOP_K = 5


def fidelity(engine: TorchEngine, pack: Pack, pack_dir: Path) -> Fidelity:
    """Greedy outputs without and with the pack, and logits compared in the same contexts (all fed eager's
    tokens). In a low-precision model a kernel that rounds once differently can flip a near tie and change every
    token after it; so eager and the pack are both measured against the same weights in float64, and changed
    tokens pass only when the pack is at most NOISE_SLACK times as far from float64 as eager is. The next-token
    distributions of the same runs are compared position by position (KL, top-1 and top-5 agreement), under the
    same rule: a pack that moves them beyond its dtype's noise fails even when every greedy token agrees."""
    tokens_ref, logits_ref = engine.generate(record_logits=True)
    engine.apply_pack(pack, pack_dir)
    try:
        tokens_new, _ = engine.generate()
        _, logits_new = engine.generate(record_logits=True, forced=tokens_ref)
    finally:
        engine.remove_pack()
    _, logits_exact = engine.in_float64().generate(record_logits=True, forced=tokens_ref)
    # compared on the host: the float64 twin may live there while the model is on a GPU
    logits_ref, logits_new, logits_exact = ([t.cpu() for t in ls] for ls in (logits_ref, logits_new, logits_exact))
    noise, pack_error = _max_diff(logits_ref, logits_exact), _max_diff(logits_new, logits_exact)
    d_before, d_after = distinct_ngrams(tokens_ref.tolist()), distinct_ngrams(tokens_new.tolist())
    return Fidelity(max_abs_logit_diff=_max_diff(logits_ref, logits_new),
                    greedy_match=bool(torch.equal(tokens_ref, tokens_new)),
                    token_agreement=float((tokens_ref == tokens_new).float().mean()),
                    distinct_3grams_before=d_before, distinct_3grams_after=d_after,
                    repetition_collapse=d_after < 0.5 * d_before, dtype_noise=noise, pack_error=pack_error,
                    within_noise=pack_error <= NOISE_SLACK * noise,
                    kl=kl_check(torch.cat(logits_ref), torch.cat(logits_new), torch.cat(logits_exact)))


def next_token_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(P ‖ Q) in nats per row, P and Q the softmax of each row's logits, computed in float64."""
    log_p, log_q = torch.log_softmax(p_logits.double(), -1), torch.log_softmax(q_logits.double(), -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0.0)  # rounding can leave -1e-17 for equal rows


def top_k_agreement(a_logits: torch.Tensor, b_logits: torch.Tensor, k: int) -> float:
    """Mean over rows of the share of a's k most likely tokens that are among b's k most likely."""
    k = min(k, a_logits.shape[-1])
    a, b = a_logits.topk(k, dim=-1).indices, b_logits.topk(k, dim=-1).indices
    shared = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(-1).sum(-1)
    return float(shared.double().mean() / k)


def kl_check(eager: torch.Tensor, pack: torch.Tensor, exact: torch.Tensor) -> KLCheck:
    """Next-token distributions at every position ([positions, vocab] logits of the same contexts): eager against
    the pack, and each against float64."""
    kl, eager_kl, pack_kl = next_token_kl(eager, pack), next_token_kl(exact, eager), next_token_kl(exact, pack)
    return KLCheck(positions=eager.shape[0], mean=float(kl.mean()), max=float(kl.max()),
                   top1_agreement=float((eager.argmax(-1) == pack.argmax(-1)).double().mean()),
                   top5_agreement=top_k_agreement(eager, pack, TOP_K),
                   eager_mean=float(eager_kl.mean()), eager_max=float(eager_kl.max()),
                   pack_mean=float(pack_kl.mean()), pack_max=float(pack_kl.max()), slack=KL_SLACK, floor=KL_FLOOR)


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def time_end_to_end(engine: TorchEngine, pack: Pack, pack_dir: Path, rounds: int, compiled: TorchEngine | None,
                    graphed: StaticDecode | None = None) -> EndToEndTimes:
    """Workload time in ms for eager, kernelbot-patched, torch.compile and graph-replayed decode (where given),
    interleaved round by round so that drift on a noisy machine hits all of them alike; each round from an idle device
    until the device is done. The host's load over the rounds comes with them: other processes' CPU time makes every
    ratio doubtful. Each round's tokens are held and compared once all ran: the pack's rounds that decoded other
    tokens than its first (a kernel right only for its first calls) are named."""
    times = EndToEndTimes(eager=[], kernelbot=[])
    decoded: dict[str, list[torch.Tensor]] = {"eager": [], "kernelbot": []}
    since = host.sample()
    for _ in range(rounds):
        times.eager.append(time_once(lambda: decoded["eager"].append(engine.run_workload()), engine.device))
        engine.apply_pack(pack, pack_dir)
        try:
            times.kernelbot.append(time_once(lambda: decoded["kernelbot"].append(engine.run_workload()),
                                             engine.device))
        finally:
            engine.remove_pack()
        if compiled is not None:
            times.compiled.append(time_once(compiled.run_workload, engine.device))
        if graphed is not None:
            times.graph_decode.append(time_once(graphed.run_workload, engine.device))
    times.host = host.host_load(since)
    times.eager_rounds_differ, times.pack_rounds_differ = (_rounds_apart(decoded[k]) for k in ("eager", "kernelbot"))
    return times


def _rounds_apart(decoded: list[torch.Tensor]) -> list[int]:
    """The rounds (from 0) whose tokens differ from the first round's."""
    return [k for k, tokens in enumerate(decoded) if not torch.equal(tokens.cpu(), decoded[0].cpu())]


def calls_of(row: KernelResult, measured: Measured) -> int:
    """The calls the measured engine made into the row's pack kernel (pack files name a candidate `__` for `/`)."""
    return measured.calls.get(row.candidate_id.replace("/", "__"), 0)


def final_rows(rows: list[KernelResult], measured: Measured | None, region_speedups: dict[str, float | None],
               dropped: dict[str, str], outpaced: dict[str, str]) -> list[KernelResult]:
    """The report's rows, built once: each candidate's row as its generate step made it, with what was learnt of it
    later from records of their own: a duel it lost (candidate id → why), its calls in the measured engine (and, in
    the pack then, its module's calls that fell back), torch.compile's gain on its task's region (task id →), and the
    gate's reason when it left the pack (candidate id →)."""
    out = []
    for row in rows:
        update: dict[str, Any] = {"region_compile_speedup": region_speedups.get(row.candidate_id.split("/", 1)[0])}
        if row.candidate_id in outpaced:
            update.update(outcome=KernelOutcome.OUTPACED, reason=outpaced[row.candidate_id])
        # in the pack when the engine was measured: accepted and no duel lost (a kernel the gate dropped was in it)
        in_pack = row.accepted and row.candidate_id not in outpaced
        if row.candidate_id in dropped:
            update.update(outcome=KernelOutcome.SLOWER_IN_MODEL, reason=dropped[row.candidate_id])
        if measured is not None:
            update["calls"] = calls_of(row, measured)
            if in_pack:
                update["fallback_calls"] = measured.fallbacks.get(row.module, 0)
        out.append(row.model_copy(update=update))
    return out


def median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 2) if xs else None
