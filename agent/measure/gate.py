"""Never ship a slower model. Kernels each win their own benchmark and can still lose together in the model (the
caches they share, the calls they add); the end-to-end rounds decide. A pack that is not faster than the baseline
is taken apart once, leave-one-out (each subset timed the way the pack was); then the kernels whose absence helped
leave it one at a time, most helpful absence first, each smaller pack timed again in rounds of its own (the best of
several noisy trials is biased upward: the winner's curse), and only those rounds decide and are reported. A pack
that is faster is taken apart the same way where trials are cheap (in-process: a few workload rounds each), and
loses a kernel only where leaving it out gained `HELPS` more both in its trial and timed again: a pack slower than
one of its subsets does not ship either. At most two trials a kernel: a served trial starts two servers (about
100 s on a 2-core host; a faster served pack is left whole), and re-running the whole leave-one-out after every
drop took an hour for nine kernels. A served pack that is not faster first loses the kernels the engine itself timed
as no faster than its own op (`engine_losers`: the plugin times each kernel beside the engine's path on the same calls,
inside the engine), then is timed once without them, before any leave-one-out: each served trial is two servers
and minutes of load. A pack that still is not faster ships no kernel."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernelbot.records import EndToEndTimes, PluginReport

if TYPE_CHECKING:
    from kernelbot.agent.measure.end_to_end import Measured
    from kernelbot.outcomes import Accepted


TAKE_APART_S = 300.0  # a faster pack is taken apart kernel by kernel only where the trials fit this


def leave_one_out_s(times: EndToEndTimes, kernels: int, rounds: int) -> float:
    """About how long leaving each of `kernels` out once takes: a trial's rounds of the baseline and the pack each
    (a few seconds for a toy model; at real scale minutes a kernel, which a pack already faster does not need)."""
    if not times.eager or not times.kernelbot:
        return 0.0
    return kernels * rounds * (statistics.median(times.eager) + statistics.median(times.kernelbot)) / 1e3


def ratio(times: EndToEndTimes) -> float:
    """The baseline's median round over the pack's: above 1, the pack is faster."""
    if not times.eager or not times.kernelbot:
        return 1.0
    return statistics.median(times.eager) / statistics.median(times.kernelbot)


def faster(times: EndToEndTimes) -> bool:
    """Faster beyond the rounds' noise: a median ratio above 1 and the pack ahead in at least three quarters of the
    interleaved rounds (each round times the baseline and the pack back to back, so drift hits both alike)."""
    wins = sum(k < e for e, k in zip(times.eager, times.kernelbot, strict=False))
    return ratio(times) > 1.0 and wins * 4 >= 3 * len(times.kernelbot)


@dataclass
class Gated:
    kept: list[Accepted]
    measured: Measured  # the kept pack's measurement (the baseline's own rounds when nothing is kept)
    dropped: list[tuple[Accepted, str]] = field(default_factory=list)  # each with why, for the report
    # each kernel's leave-one-out trial: (the kernel, the whole pack's rounds, the rounds without it)
    trials: list[tuple[Accepted, EndToEndTimes, EndToEndTimes]] = field(default_factory=list)


HELPS = 1.03  # a faster pack loses a kernel only where its absence gains 3% more, in its trial and timed again


def never_slower(accepted: list[Accepted], measured: Measured,
                 trial: Callable[[list[Accepted], bool], Measured], *, take_apart_faster: bool = False) -> Gated:
    """The pack as the rounds allow it: `trial(subset, again)` measures the model with a subset of the kernels
    (`again`: in fresh rounds, not the ones a leave-one-out trial of the same subset recorded);
    `take_apart_faster`: look for kernels that hurt a pack faster than the baseline too."""
    kept, current, dropped = list(accepted), measured, []
    trials = []
    if len(kept) > 1 and (take_apart_faster or not faster(current.times)):  # (one kernel's subset: the baseline)
        trials = [(a, current.times, trial([x for x in kept if x is not a], False).times) for a in kept]
        without = {id(a): ratio(times) for a, _, times in trials}
        for worst in sorted(kept, key=lambda a: -without[id(a)]):
            won = faster(current.times)
            bar = ratio(current.times) * (HELPS if won else 1.0)
            if len(kept) == 1 or (won and not take_apart_faster) or without[id(worst)] <= bar:
                break
            confirmed = trial([x for x in kept if x is not worst], True)
            if won and ratio(confirmed.times) <= bar:
                break  # its absence did not help again: a faster pack keeps it
            kept = [x for x in kept if x is not worst]
            dropped.append((worst, f"faster alone ({worst.bench.speedup:.2f}x), slower in the model: the pack was "
                                   f"{ratio(current.times):.2f}x of the baseline with it, {without[id(worst)]:.2f}x "
                                   f"without ({ratio(confirmed.times):.2f}x timed again)"))
            current = confirmed
    if kept and not faster(current.times):
        dropped += [(a, f"the pack as a whole was not faster than the baseline ({ratio(current.times):.2f}x): no "
                        "pack ships") for a in kept]
        kept = []
    if not kept:  # nothing ships: the model runs as the baseline did
        current = current.model_copy(update={"times": current.times.model_copy(
            update={"kernelbot": list(current.times.eager)})})
    return Gated(kept, current, dropped, trials)


def engine_losers(accepted: list[Accepted], processes: list[PluginReport]) -> list[tuple[Accepted, str]]:
    """The pack's kernels that the router timed in the model as no faster than the op they replace (median of the timed
    calls, in the process that timed the most: this one in-process, each engine process served), or that a process
    switched off, each with why."""
    out = []
    for a in accepted:
        counted = [p.custom[a.entry_id] for p in processes if a.entry_id in p.custom]
        off = next((c.disabled for c in counted if c.disabled), "")
        timed = max(counted, key=lambda c: (c.timed, c.calls), default=None)
        if off:
            out.append((a, f"faster alone ({a.bench.speedup:.2f}x), switched off in the engine: {off}"))
        elif timed is not None and timed.timed and timed.kernel_us is not None and timed.engine_us is not None \
                and timed.kernel_us >= timed.engine_us:
            out.append((a, f"faster alone ({a.bench.speedup:.2f}x), no faster in the engine: {timed.kernel_us:.1f} "
                           f"against the engine's own {timed.engine_us:.1f} us a call (per-row medians of "
                           f"{timed.timed} calls timed side by side, at the median call's rows)"))
    return out


def with_baselines_of(final: Measured, first: Measured) -> Measured:
    """The gate's last measurement with the first one's torch.compile and graph-decode rounds where it has none of its
    own (a trial neither recompiles nor captures the model: the baselines do not depend on the pack), said in a note."""
    missing = {k: getattr(first.times, k) for k in ("compiled", "graph_decode")
               if getattr(first.times, k) and not getattr(final.times, k)}
    if final is first or not missing:
        return final
    note = ("the baselines' rounds in the end-to-end table (torch.compile's, graph decode's) are those interleaved "
            "with the whole pack's, before the gate: its trials time eager and the pack only, so those ratios to "
            "eager span two measurements")
    return final.model_copy(update={"times": final.times.model_copy(update=missing), "notes": [*final.notes, note]})
