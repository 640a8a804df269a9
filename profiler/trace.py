"""Read a Kineto (torch.profiler) Chrome trace: one pass over its events into columns, or pandas frames."""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import simdjson

from kernelbot import KernelbotError
from kernelbot.profiler import cscan
from kernelbot.records import KERNEL_LABEL

if TYPE_CHECKING:
    import pandas as pd

MODULE_PREFIX = "nn.Module: "


GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
OP_COLUMNS = ("name", "ts", "dur", "pid", "tid", "external_id")
KERNEL_COLUMNS = ("cat", "name", "ts", "dur", "device", "stream", "correlation")
LAUNCH_COLUMNS = ("name", "ts", "dur", "pid", "tid", "correlation", "external_id")
MODULE_COLUMNS = ("python_id", "label", "ts", "dur", "tid")


@dataclass
class Trace:
    ops: pd.DataFrame  # cpu_op events: name, ts, dur, pid, tid, external_id, input_dims, input_types
    modules: pd.DataFrame  # nn.Module python_function events: label, cls, path, ts, dur, tid
    kernels: pd.DataFrame  # GPU activity: cat, name, ts, dur, device, stream, correlation
    launches: pd.DataFrame  # runtime/driver API calls: name, ts, dur, pid, tid, correlation, external_id
    device_properties: list[dict]


@dataclass
class Scan:
    """The fields kernelbot reads, as one list per column (names as in Trace's frames), in event order.

    Ops' shapes stay in the parsed document until asked for (`shapes`, `shape_text`): most ops launch no
    kernel, and converting every op's Input Dims costs more than the rest of the scan. `release()` drops
    the document."""

    ops: dict[str, list]
    kernels: dict[str, list]
    launches: dict[str, list]
    modules: dict[str, list]
    pyfuncs: dict  # Python id -> (parent Python id, name)
    device_properties: list[dict]
    op_args: list  # per op: its args (simdjson.Object or None), (dims, types) of a pack kernel, or a row of op_text
    document: Any  # simdjson's document, or the trace's bytes (compiled scan)
    op_text: np.ndarray | None  # compiled scan: per op, (offset, length) of its Input Dims and Input type, or -1

    def _texts(self, row: int) -> tuple[bytes | None, bytes | None]:
        dims_at, dims_len, types_at, types_len = self.op_text[row].tolist()
        raw = self.document
        return (raw[dims_at:dims_at + dims_len] if dims_at >= 0 else None,
                raw[types_at:types_at + types_len] if types_at >= 0 else None)

    def shapes(self, i: int) -> tuple[list, list]:
        """(Input Dims, Input type) of op i, as lists."""
        args = self.op_args[i]
        if isinstance(args, int):
            return tuple(json.loads(t) if t is not None else [] for t in self._texts(args))  # type: ignore[return-value]
        if args is None or isinstance(args, tuple):
            return args or ([], [])
        return _plain(args.get("Input Dims", [])), _plain(args.get("Input type", []))

    def shape_text(self, i: int) -> tuple[bytes, bytes]:
        """(Input Dims, Input type) of op i as compact JSON: a cheap key for ops seen many times."""
        args = self.op_args[i]
        if isinstance(args, int):
            return tuple(b"[]" if t is None else t for t in self._texts(args))  # type: ignore[return-value]
        if args is None or isinstance(args, tuple):
            dims, types = args or ([], [])
            return json.dumps(dims, separators=(",", ":")).encode(), json.dumps(types, separators=(",", ":")).encode()
        return _mini(args.get("Input Dims")), _mini(args.get("Input type"))

    def module_paths(self) -> list[str]:
        return [_module_path(pid, self.pyfuncs) for pid in self.modules["python_id"]]

    def release(self) -> None:
        self.op_args, self.document, self.op_text = [], None, None


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise KernelbotError(f"{path}: cannot read the trace ({exc})") from None
    return raw


def _parse(raw: bytes, path: Path) -> simdjson.Object | simdjson.Array:
    try:
        return simdjson.Parser().parse(raw)  # the document keeps its parser (and its buffers) alive
    except ValueError as exc:
        raise KernelbotError(f"{path}: not valid JSON ({exc})") from None


def read_events(path: Path) -> simdjson.Object | simdjson.Array:
    """Parse a (gzipped) JSON trace into simdjson's lazy document: fields are read on access, so the many
    events kernelbot does not use are never turned into Python objects."""
    return _parse(_read_bytes(path), path)


def _plain(value: Any) -> Any:
    return value.as_list() if isinstance(value, simdjson.Array) else value


def _mini(value: Any) -> bytes:
    if isinstance(value, simdjson.Array | simdjson.Object):
        return value.mini
    return json.dumps([] if value is None else value, separators=(",", ":")).encode()


def scan_trace(path: Path) -> Scan:
    """Every field kernelbot uses, in one pass: with the compiled scanner where it can be built and the trace
    has the usual shape, else in Python over simdjson's document (the same columns either way)."""
    raw = _read_bytes(path)
    lib = cscan.library()
    if lib is not None:
        scan = _scan_compiled(raw, lib)
        if scan is not None:
            return scan
    return _scan_python(_parse(raw, path), path)


def _scan_compiled(raw: bytes, lib: Any) -> Scan | None:
    found = cscan.Scanned(raw, lib)
    if not found.ok:
        return None
    kind, name_ids = found.kind, found.name
    names = np.array(found.names + [""], dtype=object)[name_ids]
    is_label = np.array([n.startswith(KERNEL_LABEL) for n in found.names] + [False])[name_ids]

    def table(rows: np.ndarray, columns: tuple[str, ...], fields: dict[str, int]) -> dict[str, Any]:
        """Columns of the given rows, in the order the pure-Python scan gives them."""
        out: dict[str, Any] = {"name": names[rows].tolist(), "ts": found.ts[rows], "dur": found.dur[rows]}
        out.update({c: found.column(rows, f) for c, f in fields.items()})
        return {c: out.get(c) for c in columns}  # the caller fills the rest

    op_rows = np.flatnonzero((kind == cscan.CPU_OP) | ((kind == cscan.ANNOTATION) & is_label))
    ops = table(op_rows, OP_COLUMNS, {"pid": cscan.PID, "tid": cscan.TID, "external_id": cscan.EXT})
    op_args: list = list(range(len(op_rows)))  # an int: the row of op_text with the op's shapes
    for j in np.flatnonzero(kind[op_rows] == cscan.ANNOTATION).tolist():
        try:  # a kernelbot pack kernel, as in _scan_python
            ops["name"][j], dtype, dims = ops["name"][j].split(" ", 2)
            op_args[j] = (json.loads(dims), [dtype])
        except ValueError:
            return None  # the pure-Python scan reports it
        ops["external_id"][j] = None
    k_rows = np.flatnonzero((kind == cscan.KERNEL) | (kind == cscan.MEMCPY) | (kind == cscan.MEMSET))
    kernels = table(k_rows, KERNEL_COLUMNS, {"correlation": cscan.CORR})
    kernels["cat"] = [cscan.CATS[k] for k in kind[k_rows].tolist()]
    for column, field, default in (("device", cscan.DEVICE, cscan.PID), ("stream", cscan.STREAM, cscan.TID)):
        given, missing = found.column(k_rows, field), found.state[k_rows, field] == 0  # args.get(key, e.get(..))
        fallback = found.column(k_rows, default)
        kernels[column] = [f if m else g for g, f, m in zip(given, fallback, missing.tolist(), strict=True)]
    l_rows = np.flatnonzero((kind == cscan.RUNTIME) | (kind == cscan.DRIVER))
    launches = table(l_rows, LAUNCH_COLUMNS, {"pid": cscan.PID, "tid": cscan.TID, "correlation": cscan.CORR,
                                              "external_id": cscan.EXT})
    modules: list[tuple] = []
    pyfuncs: dict = {}
    p_rows = np.flatnonzero(kind == cscan.PYFUNC)
    funcs = table(p_rows, ("name", "ts", "dur", "tid", "python_id", "parent"),
                  {"tid": cscan.TID, "python_id": cscan.PY_ID, "parent": cscan.PY_PARENT})
    for i, (pid, parent, name) in enumerate(zip(funcs["python_id"], funcs["parent"], funcs["name"], strict=True)):
        pyfuncs[pid] = (parent, name)
        if name.startswith(MODULE_PREFIX):
            modules.append((pid, name[len(MODULE_PREFIX):], float(funcs["ts"][i]), float(funcs["dur"][i]),
                            funcs["tid"][i]))
    start, length = found.props_span
    try:
        props = json.loads(raw[start:start + length]) if start >= 0 else None
    except ValueError:
        return None
    props = list(props) if props else []
    return Scan(ops, kernels, launches, _columns(MODULE_COLUMNS, modules), pyfuncs, props, op_args, raw,
                found.shape[op_rows])


def _scan_python(data: simdjson.Object | simdjson.Array, path: Path) -> Scan:
    events = data.get("traceEvents") if isinstance(data, simdjson.Object) else data
    if not isinstance(events, simdjson.Array):
        raise KernelbotError(f"{path}: no traceEvents list; is this a Kineto/Chrome trace?")
    # a tuple a row, made into columns at the end (the compiled scanner is the fast path; this one reads the traces
    # it hands on, and every trace where no C compiler is found)
    ops: list[tuple] = []
    kernels: list[tuple] = []
    launches: list[tuple] = []
    modules: list[tuple] = []
    op_args: list = []
    pyfuncs: dict = {}
    obj = simdjson.Object
    empty: dict = {}
    e = None
    try:
        for e in events:
            if not isinstance(e, obj) or e.get("ph") != "X":
                continue
            cat = e.get("cat")
            if cat == "cpu_op":
                args = e.get("args") or empty
                ops.append((e["name"], float(e["ts"]), float(e.get("dur", 0)), e.get("pid"), e.get("tid"),
                            args.get("External id")))
                op_args.append(args or None)
            elif cat in GPU_CATS:
                args = e.get("args") or empty
                kernels.append((cat, e["name"], float(e["ts"]), float(e.get("dur", 0)),
                                args.get("device", e.get("pid")), args.get("stream", e.get("tid")),
                                args.get("correlation")))
            elif cat in LAUNCH_CATS:
                args = e.get("args") or empty
                launches.append((e["name"], float(e["ts"]), float(e.get("dur", 0)), e.get("pid"), e.get("tid"),
                                 args.get("correlation"), args.get("External id")))
            elif cat == "user_annotation" and e["name"].startswith(KERNEL_LABEL):
                # a kernelbot pack kernel: "kernelbot::<id> <dtype> <dims json>" stands in for the op it replaced
                name, dtype, dims = e["name"].split(" ", 2)
                ops.append((name, float(e["ts"]), float(e.get("dur", 0)), e.get("pid"), e.get("tid"), None))
                op_args.append((json.loads(dims), [dtype]))
            elif cat == "python_function":
                args = e.get("args") or empty
                pid = args.get("Python id")
                pyfuncs[pid] = (args.get("Python parent id"), e["name"])
                if e["name"].startswith(MODULE_PREFIX):
                    modules.append((pid, e["name"][len(MODULE_PREFIX):], float(e["ts"]), float(e.get("dur", 0)),
                                    e.get("tid")))
    except (KeyError, TypeError, ValueError) as exc:
        raise KernelbotError(f"{path}: malformed event ({type(exc).__name__}: {exc})") from None
    props = data.get("deviceProperties") if isinstance(data, simdjson.Object) else None
    props = [p.as_dict() if isinstance(p, simdjson.Object) else p for p in props] if props else []
    del e, events
    return Scan(_columns(OP_COLUMNS, ops), _columns(KERNEL_COLUMNS, kernels), _columns(LAUNCH_COLUMNS, launches),
                _columns(MODULE_COLUMNS, modules), pyfuncs, props, op_args, data, None)


def _columns(names: tuple[str, ...], rows: list[tuple]) -> dict[str, list]:
    """Rows of a table as its columns, by name."""
    return {name: list(map(itemgetter(i), rows)) for i, name in enumerate(names)}


def load_trace(path: Path) -> Trace:
    import pandas as pd  # not needed by `kernelbot rank`, which works on the scan's columns

    scan = scan_trace(path)
    shapes = [scan.shapes(i) for i in range(len(scan.op_args))]
    scan.release()
    rows = zip(*scan.ops.values(), (d for d, _ in shapes), (t for _, t in shapes), strict=True)
    op_frame = pd.DataFrame(list(rows), columns=[*OP_COLUMNS, "input_dims", "input_types"])
    mod_frame = pd.DataFrame(list(zip(*scan.modules.values(), strict=True)), columns=list(MODULE_COLUMNS))
    mod_frame["cls"] = mod_frame["label"].str.replace(r"_\d+$", "", regex=True)
    mod_frame["path"] = scan.module_paths()
    return Trace(
        ops=op_frame.sort_values("ts", ignore_index=True), modules=mod_frame,
        kernels=pd.DataFrame(list(zip(*scan.kernels.values(), strict=True)), columns=list(KERNEL_COLUMNS)),
        launches=pd.DataFrame(list(zip(*scan.launches.values(), strict=True)), columns=list(LAUNCH_COLUMNS)),
        device_properties=scan.device_properties)


def _module_path(python_id: Any, pyfuncs: dict) -> str:
    """'LlamaForCausalLM_0/LlamaModel_0/LlamaDecoderLayer_1/LlamaMLP_1' from the Python parent chain."""
    parts, seen = [], set()
    while python_id in pyfuncs and python_id not in seen:
        seen.add(python_id)
        parent, name = pyfuncs[python_id]
        if name.startswith(MODULE_PREFIX):
            parts.append(name[len(MODULE_PREFIX):])
        python_id = parent
    return "/".join(reversed(parts))
