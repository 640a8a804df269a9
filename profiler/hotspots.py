"""Rank fusion units: whole modules a kernel family can replace, with their share and roofline headroom."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from kernelbot.dtypes import DTYPE_BYTES, DTYPE_NAMES
from kernelbot.kernel_library import family_for
from kernelbot.kernel_library.base import Family, OpCall
from kernelbot.profiler.trace import Trace
from kernelbot.records import KERNEL_LABEL, Device, Hotspot


def _class_of(label: str) -> str:
    return label.rsplit("_", 1)[0] if label.rsplit("_", 1)[-1].isdigit() else label


def _is_unit(path: str, has_children: set[str], family: Callable[[str], Family | None]) -> bool:
    """A fusion unit is the outermost module a family can replace, or a leaf no family covers."""
    labels = path.split("/")
    if any(family(_class_of(a)) for a in labels[:-1]):
        return False  # an enclosing module is replaced whole
    return family(_class_of(labels[-1])) is not None or path not in has_children


def _ops_within(ops: pd.DataFrame, ts: np.ndarray, start: float, end: float, tid, limit: int) -> list[OpCall]:
    """The first `limit` ops a module ran (same thread, inside its time span), in order."""
    found: list[OpCall] = []
    i = int(np.searchsorted(ts, start, "left"))
    while i < len(ts) and ts[i] <= end and len(found) < limit:
        if ops.at[i, "tid"] == tid:
            found.append(OpCall(ops.at[i, "name"], [list(d) for d in ops.at[i, "input_dims"]],
                                list(ops.at[i, "input_types"])))
        i += 1
    return found


def _describe(ops: pd.DataFrame, ts: np.ndarray, row, family) -> tuple[str, list, list]:
    """(first op's name, the call's dims, their type names): from the module's first op (or the pack kernel's
    label standing in for it), or from the ops its family reads the call from."""
    first = _ops_within(ops, ts, row.ts, row.ts + row.dur, row.tid, 1)
    if not first:
        return "", [], []
    name, dims, types = first[0]
    if family is not None and family.call_dims is not None and not name.startswith(KERNEL_LABEL):
        found = family.call_dims(_ops_within(ops, ts, row.ts, row.ts + row.dur, row.tid, family.call_ops))
        if found is not None:
            dims, types = found
    return name, [d for d in dims if d], [t for t in types if t]


def _fits(family, dims: list[list[int]]) -> bool:
    """Do these dims look like the family's first op (e.g. not a reshape inside an already-replaced module)?"""
    try:
        family.cost(dims, 4)
        return True
    except (IndexError, ValueError, TypeError):
        return False


def rank_hotspots(trace: Trace, device: Device, covered: Mapping[str, str] | None = None,
                  by_name: bool = True) -> list[Hotspot]:
    """`covered`: class name → family for classes a family covers structurally in the live model; `by_name`: also
    the families' known class names (not for a served engine's classes: see family_for)."""
    family_of = functools.partial(family_for, covered=covered, by_name=by_name)
    mods, ops = trace.modules, trace.ops
    if mods.empty:
        return []
    roots = mods[~mods["path"].str.contains("/")]
    total_us = float(roots["dur"].sum()) or float(mods["dur"].max())
    has_children = {p.rsplit("/", 1)[0] for p in mods["path"] if "/" in p}
    units = mods[[_is_unit(p, has_children, family_of) for p in mods["path"]]]
    ts = ops["ts"].to_numpy()
    groups: dict[tuple, dict] = {}

    def add(cls: str, dims: list, dtype: str, us: float, path: str, kernel: str | None = None) -> None:
        family = family_of(cls)
        key = family.group_dims(dims) if family and family.group_dims and dims else dims
        g = groups.setdefault((cls, json.dumps(key), dtype, kernel), {"calls": 0, "us": 0.0, "paths": [],
                                                                       "dims": dims})
        g["calls"] += 1
        g["us"] += us
        if path not in g["paths"]:
            g["paths"].append(path)

    for row in units.itertuples():
        name, dims, types = _describe(ops, ts, row, family_of(row.cls))
        kernel = name.removeprefix(KERNEL_LABEL) if name.startswith(KERNEL_LABEL) else None
        dtype = next((DTYPE_NAMES[t] for t in types if t in DTYPE_NAMES), types[0] if types else "unknown")
        add(row.cls, dims, dtype, row.dur, row.path, kernel)
    # Glue: what enclosing modules (attention, decoder layer) spend outside their child modules.
    own = self_time(mods)
    for row in mods[mods["path"].isin(has_children) & ~mods["path"].isin(units["path"])].itertuples():
        if "/" in row.path and not any(family_of(_class_of(a)) for a in row.path.split("/")):
            add(f"{row.cls} (own ops)", [], "", float(own[row.Index]), row.path)
    hotspots = []
    for (cls, _key, dtype, kernel), g in groups.items():
        dims = g["dims"]  # the group's first call's: a task's observed shapes
        family = family_of(cls)
        flops = nbytes = floor = 0.0
        if family and _fits(family, dims):
            flops, nbytes = family.cost(dims, DTYPE_BYTES.get(dtype, 4))
            floor = g["calls"] * device.floor_us(flops, nbytes)
        hotspots.append(Hotspot(
            id="", module_class=cls, module_paths=g["paths"], family=family.name if family else None,
            input_dims=dims, dtype=dtype, calls=g["calls"], total_us=round(g["us"], 1),
            share=g["us"] / total_us, flops=flops, bytes=nbytes, floor_us=round(floor, 1), kernel=kernel))
    return ranked(hotspots)


def ranked(hotspots: list[Hotspot]) -> list[Hotspot]:
    """The one ranking, in process and served: each hotspot scored by its time above its roofline floor, highest
    first, ids in that order."""
    scored = [h.model_copy(update={"score_us": round(max(h.total_us - h.floor_us, 0.0), 1)}) for h in hotspots]
    scored.sort(key=lambda h: h.score_us, reverse=True)
    return [h.model_copy(update={"id": f"h{i:02d}"}) for i, h in enumerate(scored)]


def self_time(events: pd.DataFrame) -> np.ndarray:
    """Each event's duration minus that of the events nested directly inside it (same thread)."""
    order = np.argsort(events["ts"].to_numpy(), kind="stable")
    ts, dur, tid = events["ts"].to_numpy()[order], events["dur"].to_numpy()[order], events["tid"].to_numpy()[order]
    child = np.zeros(len(events))
    stacks: dict = {}
    for i in range(len(order)):
        stack = stacks.setdefault(tid[i], [])
        while stack and stack[-1][0] <= ts[i]:
            stack.pop()
        if stack:
            child[stack[-1][1]] += dur[i]
        stack.append((ts[i] + dur[i], i))
    own = np.empty(len(events))
    own[order] = dur - child
    return own


def op_breakdown(trace: Trace) -> pd.DataFrame:
    """Self time per operator name (time not spent in nested ops), largest first."""
    ops = trace.ops
    frame = ops.assign(self_us=self_time(ops))
    out = frame.groupby("name").agg(self_us=("self_us", "sum"), calls=("self_us", "size")).reset_index()
    out["share"] = out["self_us"] / out["self_us"].sum()
    return out.sort_values("self_us", ascending=False, ignore_index=True)
