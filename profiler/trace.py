"""Load a Kineto (torch.profiler) Chrome trace into pandas frames."""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import simdjson

from kernelbot import KernelbotError

MODULE_PREFIX = "nn.Module: "
KERNEL_LABEL = "kernelbot::"  # names pack kernels in traces (engine/patching.py)


GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


@dataclass
class Trace:
    ops: pd.DataFrame  # cpu_op events: name, ts, dur, pid, tid, external_id, input_dims, input_types
    modules: pd.DataFrame  # nn.Module python_function events: label, cls, path, ts, dur, tid
    kernels: pd.DataFrame  # GPU activity: cat, name, ts, dur, device, stream, correlation
    launches: pd.DataFrame  # runtime/driver API calls: name, ts, dur, pid, tid, correlation, external_id
    device_properties: list[dict]


def read_events(path: Path) -> simdjson.Object | simdjson.Array:
    """Parse a (gzipped) JSON trace into simdjson's lazy document: fields are read on access, so the many
    events kernelbot does not use are never turned into Python objects."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise KernelbotError(f"{path}: cannot read the trace ({exc})") from None
    try:
        return simdjson.Parser().parse(raw)  # the document keeps its parser (and its buffers) alive
    except ValueError as exc:
        raise KernelbotError(f"{path}: not valid JSON ({exc})") from None


def _plain(value):
    return value.as_list() if isinstance(value, simdjson.Array) else value


def load_trace(path: Path) -> Trace:
    data = read_events(path)
    events = data.get("traceEvents") if isinstance(data, simdjson.Object) else data
    if not isinstance(events, simdjson.Array):
        raise KernelbotError(f"{path}: no traceEvents list; is this a Kineto/Chrome trace?")
    ops, mods, pyfuncs, kernels, launches = [], [], {}, [], []
    try:
        for e in events:
            if not isinstance(e, simdjson.Object) or e.get("ph") != "X":
                continue
            cat = e.get("cat")
            if cat == "cpu_op":
                args = e.get("args") or {}
                ops.append((e["name"], float(e["ts"]), float(e.get("dur", 0)), e.get("pid"), e.get("tid"),
                            args.get("External id"), _plain(args.get("Input Dims", [])),
                            _plain(args.get("Input type", []))))
            elif cat in GPU_CATS:
                args = e.get("args") or {}
                kernels.append((cat, e["name"], float(e["ts"]), float(e.get("dur", 0)),
                                args.get("device", e.get("pid")), args.get("stream", e.get("tid")),
                                args.get("correlation")))
            elif cat in LAUNCH_CATS:
                args = e.get("args") or {}
                launches.append((e["name"], float(e["ts"]), float(e.get("dur", 0)), e.get("pid"), e.get("tid"),
                                 args.get("correlation"), args.get("External id")))
            elif cat == "user_annotation" and e["name"].startswith(KERNEL_LABEL):
                # a kernelbot pack kernel: "kernelbot::<id> <dtype> <dims json>" stands in for the op it replaced
                name, dtype, dims = e["name"].split(" ", 2)
                ops.append((name, float(e["ts"]), float(e.get("dur", 0)), e.get("pid"), e.get("tid"), None,
                            json.loads(dims), [dtype]))
            elif cat == "python_function":
                args = e.get("args") or {}
                pid = args.get("Python id")
                pyfuncs[pid] = (args.get("Python parent id"), e["name"])
                if e["name"].startswith(MODULE_PREFIX):
                    mods.append((pid, e["name"][len(MODULE_PREFIX):], float(e["ts"]), float(e.get("dur", 0)),
                                 e.get("tid")))
    except (KeyError, TypeError, ValueError) as exc:
        raise KernelbotError(f"{path}: malformed event ({type(exc).__name__}: {exc})") from None
    props = data.get("deviceProperties") if isinstance(data, simdjson.Object) else None
    props = [p.as_dict() if isinstance(p, simdjson.Object) else p for p in props] if props else []
    del data, events, e  # release the parsed document (every element holds it) before the frames are built
    op_frame = pd.DataFrame(ops, columns=["name", "ts", "dur", "pid", "tid", "external_id", "input_dims",
                                          "input_types"])
    mod_frame = pd.DataFrame(mods, columns=["python_id", "label", "ts", "dur", "tid"])
    mod_frame["cls"] = mod_frame["label"].str.replace(r"_\d+$", "", regex=True)
    mod_frame["path"] = [_module_path(pid, pyfuncs) for pid in mod_frame["python_id"]]
    return Trace(
        ops=op_frame.sort_values("ts", ignore_index=True), modules=mod_frame,
        kernels=pd.DataFrame(kernels, columns=["cat", "name", "ts", "dur", "device", "stream", "correlation"]),
        launches=pd.DataFrame(launches, columns=["name", "ts", "dur", "pid", "tid", "correlation", "external_id"]),
        device_properties=props)


def _module_path(python_id, pyfuncs: dict) -> str:
    """'LlamaForCausalLM_0/LlamaModel_0/LlamaDecoderLayer_1/LlamaMLP_1' from the Python parent chain."""
    parts, seen = [], set()
    while python_id in pyfuncs and python_id not in seen:
        seen.add(python_id)
        parent, name = pyfuncs[python_id]
        if name.startswith(MODULE_PREFIX):
            parts.append(name[len(MODULE_PREFIX):])
        python_id = parent
    return "/".join(reversed(parts))
