"""GPU kernels from a Kineto trace: link each to the op that launched it, total them, rank by headroom.

Works on the columns of a trace scan with numpy and plain Python (no pandas): `kernelbot rank` spends
most of its time here and in the scan, and pandas' import alone costs more than the linking."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernelbot.hardware.datasheet import Peaks
from kernelbot.profiler.roofline import dtype_of, op_cost
from kernelbot.profiler.trace import Scan

COMMUNICATION = ("nccl", "rccl")
LAUNCH_NAMES = ("LaunchKernel", "LaunchCooperativeKernel", "ModuleLaunchKernel", "GraphLaunch")


@dataclass
class KernelRows:
    """One row per GPU activity (or per kernel name, for a summary without timestamps), column by column."""

    cat: list[str]
    name: list[str]
    dur: np.ndarray
    calls: np.ndarray
    op: list[str | None]
    op_index: np.ndarray  # row of the ops (sorted by start) that launched it, -1 if none
    shapes: list[list | None]
    shape_key: list[Any]  # hashable stand-in for shapes: rows with equal shapes have equal keys
    dtype: list[str | None]
    module: list[str | None]
    floor_us: np.ndarray
    floor_known: np.ndarray

    def __len__(self) -> int:
        return len(self.name)


@functools.cache
def is_communication(name: str) -> bool:
    low = name.lower()
    return any(c in low for c in COMMUNICATION)


def innermost_active(starts: np.ndarray, ends: np.ndarray, tids: np.ndarray,
                     at: np.ndarray, at_tids: np.ndarray) -> np.ndarray:
    """For each point (time, thread): the index of the innermost interval on that thread active at that time,
    or -1. Intervals nest (a call stack). Sweeping the points and intervals by time with a stack per thread
    (intervals first at equal times, longer before shorter, so a point at an op's start is inside it) leaves
    on top the last interval, in that order, that started by the point and has not ended before it; that
    is found for all points at once by binary lifting over a table of running maxima of the ends."""
    result = np.full(len(at), -1, dtype=np.int64)
    if not len(starts) or not len(at):
        return result
    _, thread = np.unique(np.concatenate([tids, at_tids]), return_inverse=True)
    thread = thread.ravel()
    iv_thread, at_thread = thread[:len(starts)], thread[len(starts):]
    order = np.lexsort((-(ends - starts), starts, iv_thread))  # the sweep's order, thread by thread
    bounds = np.searchsorted(iv_thread[order], np.arange(thread.max() + 2))
    for th in np.unique(at_thread).tolist():
        rows = order[bounds[th]:bounds[th + 1]]
        if len(rows):
            points = np.flatnonzero(at_thread == th)
            result[points] = _last_reaching(starts[rows], ends[rows], at[points], rows)
    return result


def _last_reaching(start: np.ndarray, end: np.ndarray, t: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each t: rows[k] for the largest k with start[k] <= t and end[k] >= t (start sorted), or -1."""
    pos = np.searchsorted(start, t, side="right")  # intervals [0, pos) started by t
    levels = [end]  # levels[j][i] = max(end[i : i + 2**j])
    while (1 << len(levels)) <= len(end):
        half = 1 << (len(levels) - 1)
        levels.append(np.maximum(levels[-1][:-half], levels[-1][half:]))
    for j in range(len(levels) - 1, -1, -1):  # skip the longest run just before pos that ended before t
        size = 1 << j
        fits = pos >= size
        skip = fits & (levels[j][np.where(fits, pos - size, 0)] < t)
        pos = np.where(skip, pos - size, pos)
    k = np.maximum(pos - 1, 0)
    return np.where((pos > 0) & (end[k] >= t), rows[k], -1)


def thread_keys(values: Any) -> np.ndarray:
    """Thread ids as strings, the same whether they are held as int, float (after a merge) or str."""
    return np.array([str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in values])


def thread_codes(*columns: list) -> list[np.ndarray]:
    """Thread ids of several columns as ints, equal exactly where thread_keys' strings are equal."""
    codes: dict[str, int] = {}
    out = []
    for column in columns:
        distinct = list(dict.fromkeys(column))
        lookup = {v: codes.setdefault(str(k), len(codes)) for v, k in zip(distinct, thread_keys(distinct), strict=True)}
        out.append(np.fromiter(map(lookup.__getitem__, column), dtype=np.int64, count=len(column)))
    return out


def busy_and_span(device: list, ts: np.ndarray, dur: np.ndarray) -> tuple[float, float]:
    """GPU busy time (union of activity intervals, per device) and the span those devices were observed."""
    busy = span = 0.0
    groups: dict = {}
    for i, d in enumerate(device):
        groups.setdefault(d, []).append(i)
    for rows in groups.values():
        t, e = ts[rows], ts[rows] + dur[rows]
        order = np.argsort(t)
        s, reach = t[order], np.maximum.accumulate(e[order])
        gaps = np.clip(s[1:] - reach[:-1], 0, None)
        span_d = reach[-1] - s[0]
        busy += span_d - gaps.sum()
        span += span_d
    return float(busy), float(span)


@dataclass
class Linked:
    """Kernels tied to ops: the op (row of the start-sorted ops) per kernel, and how it was found."""

    op_index: np.ndarray
    linking: str
    op_order: np.ndarray  # sorted op row -> event-order op row
    op_starts: np.ndarray
    op_tids: np.ndarray  # thread codes of the sorted ops; module_tids uses the same codes
    module_tids: np.ndarray


def link(scan: Scan) -> Linked:
    """The op behind each kernel: its correlation ties it to the runtime launch, and the launch's External id
    ties it to an op when those ids are consistent (the op exists and encloses the launch on its thread);
    otherwise the innermost op active on the launching thread at launch time is taken."""
    ops, kernels, launches = scan.ops, scan.kernels, scan.launches
    first_launch: dict = {}
    for i, c in enumerate(launches["correlation"]):
        if c is not None and c not in first_launch:
            first_launch[c] = i
    li = np.fromiter((first_launch.get(c, -1) if c is not None else -1 for c in kernels["correlation"]),
                     dtype=np.int64, count=len(kernels["correlation"]))
    has_launch = li >= 0
    hit = li[has_launch]
    launch_ts = np.asarray(launches["ts"], dtype=float)[hit]
    ext_of_launch = launches["external_id"]
    order = np.argsort(np.asarray(ops["ts"], dtype=float), kind="quicksort")  # as pandas' sort_values("ts")
    starts = np.asarray(ops["ts"], dtype=float)[order]
    ends = starts + np.asarray(ops["dur"], dtype=float)[order]
    op_tids, launch_tids, module_tids = thread_codes(ops["tid"], launches["tid"], scan.modules["tid"])
    op_tids, launch_tids = op_tids[order], launch_tids[hit]
    by_time = np.full(len(li), -1, dtype=np.int64)
    if has_launch.any() and len(starts):
        by_time[has_launch] = innermost_active(starts, ends, op_tids, launch_ts, launch_tids)
    # External id: consistent when the op it names encloses the launch on the launching thread.
    ext_index: dict = {}
    op_ext = ops["external_id"]
    for row, j in enumerate(order.tolist()):
        if op_ext[j] is not None and op_ext[j] not in ext_index:
            ext_index[op_ext[j]] = row
    by_ext = np.full(len(li), -1, dtype=np.int64)
    by_ext[has_launch] = [ext_index.get(ext_of_launch[j], -1) for j in hit.tolist()]
    named = by_ext >= 0
    consistent = 0.0
    if named.any():
        idx = by_ext[named]
        lt = launch_ts[named[has_launch]]
        ok = (starts[idx] <= lt) & (ends[idx] >= lt) & (op_tids[idx] == launch_tids[named[has_launch]])
        consistent = float(np.mean(ok))
    use_ext = consistent >= 0.95 and named.sum() >= 0.5 * has_launch.sum()
    op_index = np.where(named, by_ext, by_time) if use_ext else by_time
    return Linked(op_index, "external id" if use_ext else
                  f"time containment (External ids consistent for {consistent:.0%} of launches)",
                  order, starts, op_tids, module_tids)


def _module_paths(scan: Scan, linked: Linked, used: np.ndarray) -> dict[int, str | None]:
    """The nn.Module path around each used op (rows of the sorted ops): the innermost module active at its start."""
    mods = scan.modules
    if not mods["ts"] or not len(used):
        return {}
    starts = np.asarray(mods["ts"], dtype=float)
    ends = starts + np.asarray(mods["dur"], dtype=float)
    inner = innermost_active(starts, ends, linked.module_tids, linked.op_starts[used], linked.op_tids[used])
    paths = scan.module_paths()
    return {i: paths[m] if m >= 0 else None for i, m in zip(used.tolist(), inner.tolist(), strict=True)}


@dataclass
class OpFacts:
    """What the report needs of one op call: its shapes, dtype and roofline floor (microseconds, or None)."""

    shapes: list
    shape_key: str
    dtype: str
    floor: float | None


def _op_facts(scan: Scan, names: list[str], rows: list[int], peaks: Peaks | None) -> list[OpFacts]:
    """Facts of the given ops (event-order rows). Training steps repeat the same calls, so each distinct
    (name, shapes, types) is worked out once."""
    seen: dict[tuple, OpFacts] = {}
    out = []
    for j in rows:
        dims_text, types_text = scan.shape_text(j)
        key = (names[j], dims_text, types_text)
        facts = seen.get(key)
        if facts is None:
            dims, types = json.loads(dims_text), json.loads(types_text)
            dtype, floor = dtype_of(types), None
            cost = op_cost(names[j], dims, types) if peaks is not None else None
            if cost is not None:
                floor = max(cost[0] / (peaks.tflops(dtype) * 1e6), cost[1] / (peaks.gbps * 1e3))
            # the key is canonical JSON: raw texts of equal shapes may differ in spacing
            facts = seen[key] = OpFacts(dims, json.dumps(dims, separators=(",", ":")), dtype, floor)
        out.append(facts)
    return out


def kernel_table(scan: Scan, peaks: Peaks | None) -> tuple[KernelRows, str, float, float]:
    """One row per GPU activity with its op, shapes, dtype, module and roofline floor; GPU busy time and span.
    Releases the scan's document once the shapes are read."""
    linked = link(scan)
    kernels = scan.kernels
    idx = linked.op_index
    used = np.unique(idx[idx >= 0])
    names = scan.ops["name"]
    facts = dict(zip(used.tolist(), _op_facts(scan, names, linked.op_order[used].tolist(), peaks), strict=True))
    modules = _module_paths(scan, linked, used)
    scan.release()
    dur = np.asarray(kernels["dur"], dtype=float)
    is_kernel = np.fromiter((c == "kernel" for c in kernels["cat"]), dtype=bool, count=len(dur))
    # An op's floor is shared by the kernels it launched, in proportion to their time.
    counted = is_kernel & (idx >= 0)
    op_time = np.bincount(idx[counted], weights=dur[counted], minlength=len(names))
    idx_l = idx.tolist()
    op_names = [names[j] for j in linked.op_order.tolist()]
    row_facts = [facts.get(i) for i in idx_l]
    known = np.fromiter((f is not None and f.floor is not None for f in row_facts), dtype=bool, count=len(idx_l))
    known &= is_kernel
    floor_us = np.zeros(len(idx_l))
    for r in np.flatnonzero(known).tolist():
        total = op_time[idx_l[r]]
        floor_us[r] = row_facts[r].floor * dur[r] / total if total > 0 else 0.0
    rows = KernelRows(
        cat=kernels["cat"], name=kernels["name"], dur=dur, calls=np.ones(len(dur), dtype=np.int64),
        op=[op_names[i] if i >= 0 else None for i in idx_l], op_index=idx,
        shapes=[f and f.shapes for f in row_facts], shape_key=[f and f.shape_key for f in row_facts],
        dtype=[f and f.dtype for f in row_facts], module=[modules.get(i) for i in idx_l],
        floor_us=floor_us, floor_known=known)
    busy, span = busy_and_span(kernels["device"], np.asarray(kernels["ts"], dtype=float), dur) if len(dur) \
        else (0.0, 0.0)
    return rows, linked.linking, busy, span


def most_time(names: list[str], values: list, dur: np.ndarray) -> dict:
    """For each kernel name, the value (not None) under which it spent the most time; on a tie, the value
    seen first."""
    totals: dict = {}
    for name, value, d in zip(names, values, dur.tolist(), strict=True):
        if value is not None:
            totals[(name, value)] = totals.get((name, value), 0.0) + d
    best: dict = {}
    for (name, value), total in totals.items():
        if name not in best or total > best[name][1]:
            best[name] = (value, total)
    return {name: value for name, (value, _) in best.items()}
