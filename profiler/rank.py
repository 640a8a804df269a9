"""`kernelbot rank`: GPU kernels of a trace (or a directory of per-rank traces) ranked by headroom."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kernelbot import KernelbotError
from kernelbot.hardware.datasheet import Peaks, lookup
from kernelbot.profiler.kernels import KernelRows, is_communication, kernel_table, most_time
from kernelbot.profiler.trace import scan_trace
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

        rows, linking, busy, span, launches, device = load_nsys_sqlite(path)
        return rows, linking, busy, span, launches, device, "none: nsys exports carry no shapes"
    scan = scan_trace(path)
    if not scan.kernels["name"]:
        raise KernelbotError(f"{path}: no GPU kernel events (a CPU-only trace?); record with ProfilerActivity.CUDA")
    peaks, device = choose_peaks(scan.device_properties, tflops, gbps)
    launch_names = Counter(scan.launches["name"])
    rows, linking, busy, span = kernel_table(scan, peaks)
    launches = sum(n for name, n in launch_names.items() if "Launch" in name)
    described = f"{peaks.name}: {peaks.tflops_half:g} TFLOP/s (16-bit), {peaks.tflops_fp32:g} (fp32), " \
                f"{peaks.gbps:g} GB/s ({peaks.source})" if peaks else \
        f"device {device!r} not in the peaks table: no floors; pass --peak-tflops and --peak-gbps"
    return rows, linking, busy, span, launches, device, described


def rank(path: Path, *, tflops: float | None = None, gbps: float | None = None, sort: str = "score") -> RankReport:
    files = _trace_files(path)
    per_file, ranks, notes = [], [], []
    total_busy = total_span = 0.0
    launches = 0
    linking, device, peaks_text = "", "", ""
    for f in files:
        rows, linking, busy, span, n_launch, device, peaks_text = _load_kernels(f, tflops, gbps)
        per_file.append((f.name, rows))
        ranks.append(RankStat(rank=f.name, gpu_busy_us=round(busy, 1), span_us=round(span, 1),
                              kernels=sum(c == "kernel" for c in rows.cat), straggler=False))
        total_busy, total_span, launches = total_busy + busy, total_span + span, launches + n_launch
    if len(ranks) > 1:
        median = statistics.median(r.gpu_busy_us for r in ranks)
        for r in ranks:
            r.straggler = r.gpu_busy_us > STRAGGLER * median
        slow = [r.rank for r in ranks if r.straggler]
        if slow:
            notes.append(f"stragglers (GPU busy > {STRAGGLER:.2f}x the median rank): {', '.join(slow)}")
    return RankReport(source=str(path), device=device, peaks=peaks_text, gpu_busy_us=round(total_busy, 1),
                      gpu_idle_share=round(1 - total_busy / total_span, 4) if total_span else 0.0,
                      launches=launches, linking=linking, kernels=kernel_stats(per_file, total_busy, sort),
                      ops=op_stats(per_file, total_busy), ranks=ranks if len(ranks) > 1 else [], notes=notes)


@dataclass
class _Totals:
    total: float = 0.0
    count: int = 0
    floor: float = 0.0
    known: bool = False
    comm: bool = False
    kernel: bool = True


def kernel_stats(per_file: list[tuple[str, KernelRows]], busy: float, sort: str = "score") -> list[KernelStat]:
    per: dict[str, _Totals] = {}  # in order of first appearance
    for _, k in per_file:
        for name, cat, d, n, fl, kn in zip(k.name, k.cat, k.dur.tolist(), k.calls.tolist(), k.floor_us.tolist(),
                                           k.floor_known.tolist(), strict=True):
            t = per.get(name)
            if t is None:
                t = per[name] = _Totals(comm=is_communication(name))
            t.total += d
            t.count += n
            t.floor += fl
            t.known |= kn
            t.kernel &= cat == "kernel"
    names = [n for _, k in per_file for n in k.name]
    dur = np.concatenate([k.dur for _, k in per_file])
    op, shapes, dtype, module = (most_time(names, [v for _, k in per_file for v in getattr(k, c)], dur)
                                 for c in ("op", "shape_key", "dtype", "module"))
    stats = []
    for name, r in per.items():
        target = r.kernel and not r.comm  # copies, memsets and collectives are reported, not rewrite targets
        stats.append(KernelStat(
            name=str(name), total_us=round(r.total, 3), count=r.count, mean_us=round(r.total / r.count, 3),
            share=r.total / busy if busy else 0.0, op=op.get(name),
            shapes=json.loads(shapes[name]) if name in shapes else None, dtype=dtype.get(name),
            module=module.get(name), floor_us=round(r.floor, 3), floor_known=r.known,
            score=round(max(r.total - r.floor, 0.0), 3) if target else 0.0, communication=r.comm))
    key = (lambda s: s.score) if sort == "score" else (lambda s: s.total_us)
    return sorted(stats, key=key, reverse=True)


def op_stats(per_file: list[tuple[str, KernelRows]], busy: float) -> list[OpStat]:
    groups: dict[tuple, dict] = {}  # (op, shapes) -> totals, in order of first appearance
    for rank_name, k in per_file:
        for name, op, key, shapes, dtype, d, fl, i in zip(
                k.name, k.op, k.shape_key, k.shapes, k.dtype, k.dur.tolist(), k.floor_us.tolist(),
                k.op_index.tolist(), strict=True):
            if op is None:
                continue
            g = groups.get((op, key))
            if g is None:
                g = groups[(op, key)] = dict(total=0.0, floor=0.0, calls=set(), comm=True, dtype=None, names=set(),
                                             shapes=shapes)
            g["total"] += d
            g["floor"] += fl
            g["calls"].add((rank_name, i))
            g["comm"] = g["comm"] and is_communication(name)
            g["dtype"] = g["dtype"] or dtype
            g["names"].add(name)
    stats = [OpStat(op=str(op), shapes=g["shapes"], dtype=g["dtype"], kernels=sorted(g["names"])[:5],
                    total_us=round(g["total"], 3), calls=len(g["calls"]), share=g["total"] / busy if busy else 0.0,
                    floor_us=round(g["floor"], 3),
                    score=0.0 if g["comm"] else round(max(g["total"] - g["floor"], 0.0), 3))
             for (op, _), g in groups.items()]
    return sorted(stats, key=lambda s: s.score, reverse=True)
