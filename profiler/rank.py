"""`kernelbot rank`: GPU kernels of a trace (or a directory of per-rank traces) ranked by headroom."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from kernelbot import KernelbotError
from kernelbot.profiler.kernels import kernel_table, most_time
from kernelbot.profiler.peaks import Peaks, lookup
from kernelbot.profiler.trace import load_trace
from kernelbot.records import KernelStat, OpStat, RankReport, RankStat

TRACE_SUFFIXES = (".json", ".json.gz")
STRAGGLER = 1.10  # a rank whose GPU busy time is this much above the median is flagged


def choose_peaks(device_properties: list[dict], tflops: float | None, gbps: float | None) -> tuple[Peaks | None, str]:
    table = lookup(device_properties)
    name = str(device_properties[0].get("name", "unknown")) if device_properties else "unknown (no deviceProperties)"
    if tflops is not None and gbps is not None:
        return Peaks(name, tflops, tflops, gbps, "--peak-tflops/--peak-gbps"), name
    if table is None:
        return None, name
    if tflops is not None or gbps is not None:
        table = Peaks(table.name, tflops or table.tflops_half, tflops or table.tflops_fp32, gbps or table.gbps,
                      f"{table.source}, overridden on the command line")
    return table, name


def _trace_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir()
                       if p.name.endswith(TRACE_SUFFIXES) or p.suffix in (".csv", ".sqlite"))
        if not files:
            raise KernelbotError(f"{path}: no trace files (*.json, *.json.gz, nsys *.csv or *.sqlite) in it")
        return files
    if not path.exists():
        raise KernelbotError(f"{path}: no such file or directory")
    return [path]


def _load_kernels(path: Path, tflops: float | None, gbps: float | None):
    """(kernel rows, linking, busy, span, launches, device name, peaks description) of one file."""
    if path.suffix == ".csv":
        from kernelbot.profiler.nsys import load_nsys_csv

        return (*load_nsys_csv(path), "unknown (nsys summary)", "none: an nsys summary has no shapes")
    if path.suffix == ".sqlite":
        from kernelbot.profiler.nsys import load_nsys_sqlite

        frame, linking, busy, span, launches, device = load_nsys_sqlite(path)
        return frame, linking, busy, span, launches, device, "none: nsys exports carry no shapes"
    trace = load_trace(path)
    if trace.kernels.empty:
        raise KernelbotError(f"{path}: no GPU kernel events (a CPU-only trace?); record with ProfilerActivity.CUDA")
    peaks, device = choose_peaks(trace.device_properties, tflops, gbps)
    frame, linking, busy, span = kernel_table(trace, peaks)
    launches = int(trace.launches["name"].str.contains("Launch").sum())
    described = f"{peaks.name}: {peaks.tflops_half:g} TFLOP/s (16-bit), {peaks.tflops_fp32:g} (fp32), " \
                f"{peaks.gbps:g} GB/s ({peaks.source})" if peaks else \
        f"device {device!r} not in the peaks table: no floors; pass --peak-tflops and --peak-gbps"
    return frame, linking, busy, span, launches, device, described


def rank(path: Path, *, tflops: float | None = None, gbps: float | None = None, sort: str = "score") -> RankReport:
    files = _trace_files(path)
    frames, ranks, notes = [], [], []
    total_busy = total_span = 0.0
    launches = 0
    linking, device, peaks_text = "", "", ""
    for f in files:
        frame, linking, busy, span, n_launch, device, peaks_text = _load_kernels(f, tflops, gbps)
        frames.append(frame.assign(rank=f.name))
        ranks.append(RankStat(rank=f.name, gpu_busy_us=round(busy, 1), span_us=round(span, 1),
                              kernels=int((frame["cat"] == "kernel").sum()), straggler=False))
        total_busy, total_span, launches = total_busy + busy, total_span + span, launches + n_launch
    if len(ranks) > 1:
        median = float(pd.Series([r.gpu_busy_us for r in ranks]).median())
        for r in ranks:
            r.straggler = r.gpu_busy_us > STRAGGLER * median
        slow = [r.rank for r in ranks if r.straggler]
        if slow:
            notes.append(f"stragglers (GPU busy > {STRAGGLER:.2f}x the median rank): {', '.join(slow)}")
    allk = pd.concat(frames, ignore_index=True)
    return RankReport(source=str(path), device=device, peaks=peaks_text, gpu_busy_us=round(total_busy, 1),
                      gpu_idle_share=round(1 - total_busy / total_span, 4) if total_span else 0.0,
                      launches=launches, linking=linking, kernels=kernel_stats(allk, total_busy, sort),
                      ops=op_stats(allk, total_busy), ranks=ranks if len(ranks) > 1 else [], notes=notes)


def kernel_stats(k: pd.DataFrame, busy: float, sort: str = "score") -> list[KernelStat]:
    k = k.assign(shape_key=k["shapes"].map(lambda v: None if v is None else json.dumps(v)),
                 is_kernel=k["cat"] == "kernel")
    per = k.groupby("name", sort=False).agg(total=("dur", "sum"), count=("calls", "sum"), floor=("floor_us", "sum"),
                                            known=("floor_known", "any"), comm=("communication", "any"),
                                            kernel=("is_kernel", "all"))
    op, shapes, dtype, module = (most_time(k, c) for c in ("op", "shape_key", "dtype", "module"))
    stats = []
    for name, r in per.iterrows():
        target = r.kernel and not r.comm  # copies, memsets and collectives are reported, not rewrite targets
        stats.append(KernelStat(
            name=str(name), total_us=round(r.total, 3), count=int(r["count"]), mean_us=round(r.total / r["count"], 3),
            share=r.total / busy if busy else 0.0, op=op.get(name),
            shapes=json.loads(shapes[name]) if name in shapes else None, dtype=dtype.get(name),
            module=module.get(name), floor_us=round(r.floor, 3), floor_known=bool(r.known),
            score=round(max(r.total - r.floor, 0.0), 3) if target else 0.0, communication=bool(r.comm)))
    key = (lambda s: s.score) if sort == "score" else (lambda s: s.total_us)
    return sorted(stats, key=key, reverse=True)


def op_stats(k: pd.DataFrame, busy: float) -> list[OpStat]:
    launched = k[k["op"].notna()]
    if launched.empty:
        return []
    launched = launched.assign(shape_key=launched["shapes"].map(json.dumps),
                               call=launched["rank"].astype(str) + ":" + launched["op_index"].astype(str))
    groups = launched.groupby(["op", "shape_key"], sort=False)
    per = groups.agg(total=("dur", "sum"), floor=("floor_us", "sum"), calls=("call", "nunique"),
                     comm=("communication", "all"), data_type=("dtype", "first"))
    kernels = groups["name"].agg(lambda names: sorted(set(names))[:5])
    stats = [OpStat(op=str(op), shapes=json.loads(shape_key), dtype=r.data_type, kernels=kernels[(op, shape_key)],
                    total_us=round(r.total, 3), calls=int(r.calls), share=r.total / busy if busy else 0.0,
                    floor_us=round(r.floor, 3), score=0.0 if r.comm else round(max(r.total - r.floor, 0.0), 3))
             for (op, shape_key), r in per.iterrows()]
    return sorted(stats, key=lambda s: s.score, reverse=True)
