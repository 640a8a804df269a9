"""GPU kernels from a Kineto trace: link each to the op that launched it, total them, rank by headroom."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kernelbot.profiler.peaks import Peaks
from kernelbot.profiler.roofline import dtype_of, op_cost
from kernelbot.profiler.trace import Trace

COMMUNICATION = ("nccl", "rccl")
LAUNCH_NAMES = ("LaunchKernel", "LaunchCooperativeKernel", "ModuleLaunchKernel", "GraphLaunch")


def innermost_active(starts: np.ndarray, ends: np.ndarray, tids: np.ndarray,
                     at: np.ndarray, at_tids: np.ndarray) -> np.ndarray:
    """For each point (time, thread): the index of the innermost interval on that thread active at that time,
    or -1. Intervals nest (a call stack), so one sweep with a stack per thread answers all points."""
    result = np.full(len(at), -1, dtype=np.int64)
    # intervals first at equal times (and longer before shorter), so a point at an op's start is inside it
    keys = np.concatenate([starts, at])
    kind = np.concatenate([np.zeros(len(starts)), np.ones(len(at))])
    length = np.concatenate([-(ends - starts), np.zeros(len(at))])
    order = np.lexsort((length, kind, keys))
    all_tids = np.concatenate([tids, at_tids])
    stacks: dict = {}
    n = len(starts)
    for i in order:
        stack = stacks.setdefault(all_tids[i], [])
        t = keys[i]
        while stack and ends[stack[-1]] < t:
            stack.pop()
        if i < n:
            stack.append(i)
        elif stack:
            result[i - n] = stack[-1]
    return result


def thread_keys(values: pd.Series) -> np.ndarray:
    """Thread ids as strings, the same whether pandas holds them as int, float (after a merge) or str."""
    return values.map(lambda v: str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)).to_numpy()


def link(trace: Trace) -> tuple[pd.DataFrame, str]:
    """Kernels with the launch that issued them and the op (row of trace.ops) that issued the launch.

    correlation ties a kernel to its runtime launch; the launch's External id ties it to an op when those ids
    are consistent (the op exists and encloses the launch on its thread); otherwise the innermost op active
    on the launching thread at launch time is taken."""
    kernels = trace.kernels.copy()
    launches = trace.launches.dropna(subset=["correlation"]).drop_duplicates("correlation")
    kernels = kernels.merge(launches.rename(columns={"name": "launch", "ts": "launch_ts", "dur": "launch_dur",
                                                     "pid": "launch_pid", "tid": "launch_tid"}),
                            on="correlation", how="left")
    ops = trace.ops
    starts, ends = ops["ts"].to_numpy(), (ops["ts"] + ops["dur"]).to_numpy()
    tids = thread_keys(ops["tid"])
    has_launch = kernels["launch_ts"].notna().to_numpy()
    by_time = np.full(len(kernels), -1, dtype=np.int64)
    if has_launch.any() and len(ops):
        by_time[has_launch] = innermost_active(starts, ends, tids, kernels.loc[has_launch, "launch_ts"].to_numpy(),
                                               thread_keys(kernels.loc[has_launch, "launch_tid"]))
    # External id: consistent when the op it names encloses the launch on the launching thread.
    ext_index = pd.Series(ops.index, index=ops["external_id"]).dropna()
    ext_index = ext_index[~ext_index.index.duplicated()]
    by_ext = kernels["external_id"].map(ext_index).fillna(-1).astype(np.int64).to_numpy()
    named = has_launch & (by_ext >= 0)
    consistent = 0.0
    if named.any():
        idx = by_ext[named]
        lt = kernels.loc[named, "launch_ts"].to_numpy()
        ok = (starts[idx] <= lt) & (ends[idx] >= lt) & (tids[idx] == thread_keys(kernels.loc[named, "launch_tid"]))
        consistent = float(np.mean(ok))
    use_ext = consistent >= 0.95 and named.sum() >= 0.5 * has_launch.sum()
    kernels["op_index"] = np.where(by_ext >= 0, by_ext, by_time) if use_ext else by_time
    return kernels, ("external id" if use_ext else
                     f"time containment (External ids consistent for {consistent:.0%} of launches)")


def busy_and_span(kernels: pd.DataFrame) -> tuple[float, float]:
    """GPU busy time (union of activity intervals, per device) and the span those devices were observed."""
    busy = span = 0.0
    for _, k in kernels.groupby("device", dropna=False):
        s = np.sort(k["ts"].to_numpy())
        order = np.argsort(k["ts"].to_numpy())
        e = (k["ts"] + k["dur"]).to_numpy()[order]
        reach = np.maximum.accumulate(e)
        gaps = np.clip(s[1:] - reach[:-1], 0, None)
        span_d = reach[-1] - s[0]
        busy += span_d - gaps.sum()
        span += span_d
    return float(busy), float(span)


def _module_paths(trace: Trace, op_index: np.ndarray) -> list[str | None]:
    mods = trace.modules
    if mods.empty or not len(trace.ops):
        return [None] * len(op_index)
    ops = trace.ops
    inner = innermost_active(mods["ts"].to_numpy(), (mods["ts"] + mods["dur"]).to_numpy(), thread_keys(mods["tid"]),
                             ops["ts"].to_numpy(), thread_keys(ops["tid"]))
    paths = mods["path"].to_numpy()
    return [paths[inner[i]] if i >= 0 and inner[i] >= 0 else None for i in op_index]


def kernel_table(trace: Trace, peaks: Peaks | None) -> tuple[pd.DataFrame, str, float, float]:
    """One row per GPU activity with its op, shapes, dtype, module and roofline floor."""
    k, linking = link(trace)
    ops = trace.ops
    idx = k["op_index"].to_numpy()
    names, dims, types = (ops[c].to_numpy() for c in ("name", "input_dims", "input_types"))
    k["op"] = [names[i] if i >= 0 else None for i in idx]
    k["shapes"] = [dims[i] if i >= 0 else None for i in idx]
    dtypes = {i: dtype_of(types[i]) for i in set(idx.tolist()) if i >= 0}
    k["dtype"] = [dtypes.get(i) for i in idx]
    k["module"] = _module_paths(trace, idx)
    k["calls"] = 1
    k["communication"] = k["name"].str.lower().str.contains("|".join(COMMUNICATION))
    # An op's floor is shared by the kernels it launched, in proportion to their time.
    floors = {}
    if peaks is not None:
        for i in dtypes:
            cost = op_cost(names[i], dims[i], types[i])
            if cost is not None:
                floors[i] = max(cost[0] / (peaks.tflops(dtypes[i]) * 1e6), cost[1] / (peaks.gbps * 1e3))
    is_kernel = (k["cat"] == "kernel").to_numpy()
    op_time = k[is_kernel & (idx >= 0)].groupby("op_index")["dur"].sum().to_dict()
    known = np.array([i in floors for i in idx]) & is_kernel
    k["floor_known"] = known
    k["floor_us"] = [floors[i] * d / op_time[i] if ok and op_time.get(i, 0) > 0 else 0.0
                     for i, d, ok in zip(idx, k["dur"].to_numpy(), known, strict=True)]
    busy, span = busy_and_span(k) if len(k) else (0.0, 0.0)
    return k, linking, busy, span


def most_time(k: pd.DataFrame, column: str) -> dict:
    """For each kernel name, the value of `column` under which it spent the most time."""
    valid = k[k[column].notna()]
    if valid.empty:
        return {}
    totals = valid.groupby(["name", column], sort=False)["dur"].sum().reset_index()
    return totals.sort_values("dur").drop_duplicates("name", keep="last").set_index("name")[column].to_dict()
