"""Load a Kineto (torch.profiler) Chrome trace into pandas frames."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

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


def read_events(path: Path) -> dict | list:
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            return json.load(f)
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
        raise KernelbotError(f"{path}: cannot read the trace ({exc})") from None
    except json.JSONDecodeError as exc:
        raise KernelbotError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None


def load_trace(path: Path) -> Trace:
    data = read_events(path)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise KernelbotError(f"{path}: no traceEvents list; is this a Kineto/Chrome trace?")
    ops, mods, pyfuncs, kernels, launches = [], [], {}, [], []
    try:
        for e in events:
            if not isinstance(e, dict) or e.get("ph") != "X":
                continue
            cat, args = e.get("cat"), e.get("args") or {}
            if cat == "cpu_op":
                ops.append((e["name"], float(e["ts"]), float(e.get("dur", 0)), e.get("pid"), e.get("tid"),
                            args.get("External id"), args.get("Input Dims", []), args.get("Input type", [])))
            elif cat in GPU_CATS:
                kernels.append((cat, e["name"], float(e["ts"]), float(e.get("dur", 0)),
                                args.get("device", e.get("pid")), args.get("stream", e.get("tid")),
                                args.get("correlation")))
            elif cat in LAUNCH_CATS:
                launches.append((e["name"], float(e["ts"]), float(e.get("dur", 0)), e.get("pid"), e.get("tid"),
                                 args.get("correlation"), args.get("External id")))
            elif cat == "user_annotation" and e["name"].startswith(KERNEL_LABEL):
                # a kernelbot pack kernel: "kernelbot::<id> <dtype> <dims json>" stands in for the op it replaced
                name, dtype, dims = e["name"].split(" ", 2)
                ops.append((name, float(e["ts"]), float(e.get("dur", 0)), e.get("pid"), e.get("tid"), None,
                            json.loads(dims), [dtype]))
            elif cat == "python_function":
                pid = args.get("Python id")
                pyfuncs[pid] = (args.get("Python parent id"), e["name"])
                if e["name"].startswith(MODULE_PREFIX):
                    mods.append((pid, e["name"][len(MODULE_PREFIX):], float(e["ts"]), float(e.get("dur", 0)),
                                 e.get("tid")))
    except (KeyError, TypeError, ValueError) as exc:
        raise KernelbotError(f"{path}: malformed event ({type(exc).__name__}: {exc})") from None
    op_frame = pd.DataFrame(ops, columns=["name", "ts", "dur", "pid", "tid", "external_id", "input_dims",
                                          "input_types"])
    mod_frame = pd.DataFrame(mods, columns=["python_id", "label", "ts", "dur", "tid"])
    mod_frame["cls"] = mod_frame["label"].str.replace(r"_\d+$", "", regex=True)
    mod_frame["path"] = [_module_path(pid, pyfuncs) for pid in mod_frame["python_id"]]
    return Trace(
        ops=op_frame.sort_values("ts", ignore_index=True), modules=mod_frame,
        kernels=pd.DataFrame(kernels, columns=["cat", "name", "ts", "dur", "device", "stream", "correlation"]),
        launches=pd.DataFrame(launches, columns=["name", "ts", "dur", "pid", "tid", "correlation", "external_id"]),
        device_properties=(data.get("deviceProperties") or []) if isinstance(data, dict) else [])


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
