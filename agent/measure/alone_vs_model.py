"""Each pack kernel's gain alone (its benchmark) beside its gain in the model (the gate's leave-one-out trial), and,
where they disagree by more than 2x, what the measurements say of why: the kernel's time a call in the packed
model's profile against its benchmark's. A kernel benchmark that does not predict the model is a measurement defect
to explain, not noise to average away.
"""

from __future__ import annotations

import statistics

from kernelbot.records import AloneVsModel, EndToEndTimes, Hotspot, KernelResult

NOISE = 0.02  # of the pack's median round: savings smaller than this are within the rounds' noise
APART = 2.0  # savings further apart than this factor disagree


def alone_vs_model(rows: list[KernelResult], trials: dict[str, tuple[EndToEndTimes, EndToEndTimes]],
                   after: list[Hotspot]) -> list[AloneVsModel]:
    """One record per kernel the gate took out once (`trials`: candidate key → the pack's rounds with it, and
    without); `after` is the packed model's profile (its pack kernels' hotspots name them)."""
    by_id = {r.candidate_id: r for r in rows}
    in_model = {h.kernel.replace("__", "/", 1): h for h in after if h.kernel}
    out = []
    for key, (with_it, without) in trials.items():
        row = by_id.get(key)
        if row is None or row.speedup is None or row.reference_us is None or row.time_us is None:
            continue
        pack_ms = statistics.median(with_it.kernelbot)
        measured = statistics.median(without.kernelbot) - pack_ms
        predicted = row.calls * (row.reference_us - row.time_us) / 1e3
        hotspot = in_model.get(key)
        model_us = hotspot.total_us / hotspot.calls if hotspot is not None and hotspot.calls else None
        judged = max(abs(predicted), abs(measured)) > NOISE * pack_ms
        disagrees = judged and not (predicted > 0 and measured > 0 and 1 / APART <= measured / predicted <= APART)
        out.append(AloneVsModel(
            candidate_id=key, speedup_alone=row.speedup, calls=row.calls, predicted_ms=round(predicted, 2),
            measured_ms=round(measured, 2), bench_call_us=row.time_us,
            model_call_us=None if model_us is None else round(model_us, 2), judged=judged, disagrees=disagrees,
            cause=_cause(row.time_us, model_us, predicted, measured) if disagrees else ""))
    return out


def _cause(bench_us: float, model_us: float | None, predicted: float, measured: float) -> str:
    """What the measured times a call say of a disagreement."""
    gap = f"it saved {measured:.1f} ms a workload in the model where its benchmark predicted {predicted:.1f} ms"
    if model_us is None:
        return f"{gap}; its calls were not found in the packed model's profile, so where the time went is not known"
    if model_us > APART * bench_us:
        return (f"{gap}: its calls take {model_us:.1f} us each in the model against {bench_us:.1f} us in its "
                "benchmark (the router's work on each call, caches the rest of the model evicted, or shapes other "
                "than the benchmark's)")
    if bench_us > APART * model_us:
        return (f"{gap}: its calls take {model_us:.1f} us each in the model against {bench_us:.1f} us in its "
                "benchmark, which timed it slower than the model runs it (a warmer cache in the model, or the "
                "benchmark's own stalls)")
    return (f"{gap}, while its calls take {model_us:.1f} us each in the model as in its benchmark ({bench_us:.1f} "
            "us): the rest of the model ran slower beside it (its neighbours' caches, threads handed between it and "
            "eager's ops)")
