"""Nsight Systems inputs: `nsys stats --format csv` kernel summaries and the SQLite export."""

from __future__ import annotations

import csv
import re
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from kernelbot import KernelbotError
from kernelbot.profiler.kernels import KernelRows, busy_and_span, innermost_active, thread_keys

UNIT_US = {"ns": 1e-3, "us": 1.0, "μs": 1.0, "ms": 1e3, "s": 1e6}


def _rows(names: list[str], dur: list[float] | np.ndarray, calls: list[int], ops: list[str | None]) -> KernelRows:
    """Kernel rows without shapes, dtypes, modules or floors (nsys records none of them)."""
    n = len(names)
    return KernelRows(cat=["kernel"] * n, name=names, dur=np.asarray(dur, dtype=float),
                      calls=np.asarray(calls, dtype=np.int64), op=ops, op_index=np.full(n, -1, dtype=np.int64),
                      shapes=[None] * n, shape_key=[None] * n, dtype=[None] * n, module=[None] * n,
                      floor_us=np.zeros(n), floor_known=np.zeros(n, dtype=bool))


def load_nsys_csv(path: Path):
    """cuda_gpu_kern_sum as CSV. Column names differ across nsys versions, so they are found from the header."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        raise KernelbotError(f"{path}: cannot read ({exc.strerror})") from None
    start = next((i for i, line in enumerate(lines) if "Name" in line and "Time" in line), None)
    if start is None:
        raise KernelbotError(f"{path}: no kernel summary header (expected nsys stats --report cuda_gpu_kern_sum)")
    reader = csv.reader(lines[start:])
    header = [h.strip() for h in next(reader)]

    def column(*patterns: str) -> int | None:
        return next((i for i, h in enumerate(header) for p in patterns if re.fullmatch(p, h, re.IGNORECASE)), None)

    name_col = column(r"name")
    total_col = column(r"total time.*")
    count_col = column(r"instances", r"num calls", r"calls", r"count")
    if None in (name_col, total_col, count_col):
        raise KernelbotError(f"{path}: cannot find Name, Total Time and Instances columns in {header}")
    unit = re.search(r"\((\w+)\)", header[total_col])
    scale = UNIT_US.get(unit.group(1) if unit else "ns", 1e-3)
    names, totals, counts = [], [], []
    for rec in reader:
        if len(rec) <= max(name_col, total_col, count_col) or not rec[name_col].strip():
            continue
        try:
            total, calls = float(rec[total_col].replace(",", "")) * scale, int(float(rec[count_col].replace(",", "")))
        except ValueError:
            raise KernelbotError(f"{path}: unreadable number in row {rec[:3]}") from None
        names.append(rec[name_col].strip())
        totals.append(total)
        counts.append(calls)
    busy = float(sum(totals))
    return _rows(names, totals, counts, [None] * len(names)), "none: a summary has no launches", busy, busy, sum(counts)


def load_nsys_sqlite(path: Path):
    """CUPTI_ACTIVITY_KIND_KERNEL joined to StringIds and, on correlationId, to the runtime launch; the op is
    the innermost NVTX range around the launch on its thread (PyTorch emits them under emit_nvtx)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
    except sqlite3.DatabaseError as exc:
        raise KernelbotError(f"{path}: not an nsys SQLite export ({exc})") from None
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables or "StringIds" not in tables:
        raise KernelbotError(f"{path}: no CUPTI_ACTIVITY_KIND_KERNEL/StringIds tables (a CPU-only capture?)")
    k = pd.read_sql_query(
        "select k.start, k.end, k.deviceId as device, k.correlationId as correlation, s.value as name "
        "from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds s on s.id = coalesce(k.demangledName, k.shortName)", db)
    launches = pd.DataFrame(columns=["correlation", "lstart", "tid", "api"])
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        launches = pd.read_sql_query(
            "select r.correlationId as correlation, r.start as lstart, r.globalTid as tid, s.value as api "
            "from CUPTI_ACTIVITY_KIND_RUNTIME r join StringIds s on s.id = r.nameId", db)
    k = k.merge(launches, on="correlation", how="left")
    k["op"] = k["api"]
    linking = "correlationId → runtime launch"
    if "NVTX_EVENTS" in tables and k["lstart"].notna().any():
        nvtx = pd.read_sql_query(
            "select n.start, n.end, n.globalTid as tid, coalesce(n.text, s.value) as text from NVTX_EVENTS n "
            "left join StringIds s on s.id = n.textId where n.end is not null", db)
        if len(nvtx):
            has = k["lstart"].notna().to_numpy()
            inner = innermost_active(nvtx["start"].to_numpy(float), nvtx["end"].to_numpy(float),
                                     thread_keys(nvtx["tid"]), k.loc[has, "lstart"].to_numpy(float),
                                     thread_keys(k.loc[has, "tid"]))
            texts = nvtx["text"].to_numpy()
            k.loc[has, "op"] = [texts[i] if i >= 0 else api for i, api in zip(inner, k.loc[has, "api"], strict=True)]
            linking += " → innermost NVTX range on the launching thread"
    device = "unknown"
    if "TARGET_INFO_GPU" in tables:
        row = db.execute("select name from TARGET_INFO_GPU limit 1").fetchone()
        device = row[0] if row else device
    db.close()
    start, dur = k["start"].to_numpy(float) / 1e3, (k["end"] - k["start"]).to_numpy(float) / 1e3
    ops = [o if isinstance(o, str) else None for o in k["op"]]  # NaN where the kernel had no launch
    rows = _rows(k["name"].tolist(), dur, [1] * len(k), ops)
    busy, span = busy_and_span(k["device"].tolist(), start, dur) if len(k) else (0.0, 0.0)
    return rows, linking, busy, span, int(launches["api"].str.contains("Launch").sum()), device
