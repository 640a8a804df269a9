"""Each pack kernel's gain alone (its benchmark) beside its gain in the model — in-process the gate's leave-one-out
trial, served the plugin's timing of the kernel beside the engine's own op inside the engine — and, where they
disagree by more than 2x, what the measurements say of why: the kernel's time a call in the model against its
benchmark's, and (served) the engine's own op against the reference the benchmark timed. A kernel benchmark that does
not predict the model is a measurement defect to explain, not noise to average away.
"""

from __future__ import annotations

import statistics

from kernelbot.records import (
    IN_PROCESS,
    AloneVsModel,
    EndToEndTimes,
    Hotspot,
    InModelSource,
    KernelResult,
    PluginReport,
)

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


def alone_vs_engine(rows: list[KernelResult], processes: list[PluginReport]) -> list[AloneVsModel]:
    """One record per pack kernel the router timed beside the op it replaces (`processes`: the router's counters in
    each process that ran the pack: this one in-process, each engine process served); the process that timed the
    most calls speaks for the kernel."""
    by_id = {r.candidate_id.replace("/", "__", 1): r for r in rows}
    out = []
    for cid in sorted({c for p in processes for c in p.custom}):
        row = by_id.get(cid)
        counted = [p.custom[cid] for p in processes if cid in p.custom]
        timed = max(counted, key=lambda c: (c.timed, c.calls))
        if (row is None or row.speedup is None or row.reference_us is None or row.time_us is None
                or not timed.timed or timed.kernel_us is None or timed.engine_us is None):
            continue
        calls = sum(c.calls for c in counted)
        where = "model" if all(p.engine == IN_PROCESS for p in processes) else "engine"
        predicted = calls * (row.reference_us - row.time_us) / 1e3
        measured = calls * (timed.engine_us - timed.kernel_us) / 1e3
        in_engine = timed.engine_us / timed.kernel_us if timed.kernel_us else float("inf")
        disagrees = not 1 / APART <= in_engine / row.speedup <= APART
        out.append(AloneVsModel(
            candidate_id=cid.replace("__", "/", 1), speedup_alone=row.speedup, calls=calls,
            predicted_ms=round(predicted, 2), measured_ms=round(measured, 2), bench_call_us=row.time_us,
            model_call_us=timed.kernel_us, judged=True, disagrees=disagrees,
            cause=_per_call_cause(f"{in_engine:.2f}x in the {where} against {row.speedup:.2f}x in its benchmark", row,
                                  timed.engine_us, timed.kernel_us, f"the {where}") if disagrees else "",
            source=InModelSource.ENGINE_TIMING,
            model_op_us=timed.engine_us))
    return out


def _per_call_cause(gap: str, row: KernelResult, op_us: float, kernel_us: float, where: str) -> str:
    """What the per-call times say of a kernel whose gain in the model (`where`: "the engine", "the model") is not
    its benchmark's: the op it replaced there against the benchmark's reference, the kernel there against its
    benchmark."""
    assert row.reference_us is not None and row.time_us is not None
    causes = []
    if row.reference_us > APART * op_us:
        causes.append(f"the op takes {op_us:.1f} us a call in {where} where the reference its benchmark timed took "
                      f"{row.reference_us:.1f} us: {where} runs a faster op than the family's reference, and that op "
                      "is the one to beat")
    elif op_us > APART * row.reference_us:
        causes.append(f"the op takes {op_us:.1f} us a call in {where} against the reference's {row.reference_us:.1f} "
                      f"us in the benchmark (other shapes, or a colder cache, in {where})")
    if kernel_us > APART * row.time_us:
        causes.append(f"the kernel takes {kernel_us:.1f} us a call in {where} against {row.time_us:.1f} us in its "
                      "benchmark (the router's work on each call, larger batches than the benchmark's, or caches the "
                      "rest of the model evicted)")
    elif row.time_us > APART * kernel_us:
        causes.append(f"its benchmark timed it at {row.time_us:.1f} us a call where {where} runs it in "
                      f"{kernel_us:.1f} us (the benchmark's own stalls or colder weights)")
    return f"{gap}: " + ("; ".join(causes) if causes else
                         f"each time a call is within 2x of its counterpart ({row.reference_us:.1f} -> {op_us:.1f} us "
                         f"for the op, {row.time_us:.1f} -> {kernel_us:.1f} us for the kernel), and their ratios "
                         "compound")

def alone_vs_profiles(rows: list[KernelResult], before: list[Hotspot], after: list[Hotspot],
                      skip: set[str]) -> list[AloneVsModel]:
    """One record per accepted kernel of the first iteration not in `skip` (those the gate measured) whose op the
    first profile (`before`, which its task's hotspot id names) and whose calls the packed model's profile both show:
    the op's time a call in the model before the pack against the kernel's after it (both under the profiler, the
    router's work included after), per workload run."""
    by_id = {h.id: h for h in before}
    in_model = {h.kernel.replace("__", "/", 1): h for h in after if h.kernel}
    out = []
    for row in rows:
        op, kernel = by_id.get(row.hotspot_id), in_model.get(row.candidate_id)
        if (not row.accepted or row.iteration or row.candidate_id in skip or op is None or kernel is None
                or not op.calls or not kernel.calls or row.speedup is None or row.reference_us is None
                or row.time_us is None):
            continue
        op_us, kernel_us = op.total_us / op.calls, kernel.total_us / kernel.calls
        in_model_gain = op_us / kernel_us if kernel_us else float("inf")
        disagrees = not 1 / APART <= in_model_gain / row.speedup <= APART
        out.append(AloneVsModel(
            candidate_id=row.candidate_id, speedup_alone=row.speedup, calls=row.calls,
            predicted_ms=round(row.calls * (row.reference_us - row.time_us) / 1e3, 2),
            measured_ms=round(row.calls * (op_us - kernel_us) / 1e3, 2), bench_call_us=row.time_us,
            model_call_us=round(kernel_us, 2), judged=True, disagrees=disagrees,
            cause=_per_call_cause(f"{in_model_gain:.2f}x in the model's profiles against {row.speedup:.2f}x in its "
                                  "benchmark", row, op_us, kernel_us, "the model") if disagrees else "",
            source=InModelSource.PROFILES, model_op_us=round(op_us, 2)))
    return out
