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


@dataclass
class Trace:
    ops: pd.DataFrame  # cpu_op events: name, ts, dur, tid, input_dims, input_types
    modules: pd.DataFrame  # nn.Module python_function events: label, cls, path, ts, dur, tid
    device_properties: list[dict]


def read_events(path: Path) -> dict:
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            return json.load(f)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise KernelbotError(f"{path}: cannot read the trace ({exc})") from None
    except json.JSONDecodeError as exc:
        raise KernelbotError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None


def load_trace(path: Path) -> Trace:
    data = read_events(path)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise KernelbotError(f"{path}: no traceEvents list; is this a Kineto/Chrome trace?")
    ops, mods, pyfuncs = [], [], {}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat, args = e.get("cat"), e.get("args") or {}
        if cat == "cpu_op":
            ops.append((e["name"], float(e["ts"]), float(e.get("dur", 0)), e.get("tid"),
                        args.get("Input Dims", []), args.get("Input type", [])))
        elif cat == "user_annotation" and e["name"].startswith(KERNEL_LABEL):
            # a kernelbot pack kernel: "kernelbot::<id> <dtype> <dims json>" stands in for the op it replaced
            name, dtype, dims = e["name"].split(" ", 2)
            ops.append((name, float(e["ts"]), float(e.get("dur", 0)), e.get("tid"), json.loads(dims), [dtype]))
        elif cat == "python_function":
            pid = args.get("Python id")
            pyfuncs[pid] = (args.get("Python parent id"), e["name"])
            if e["name"].startswith(MODULE_PREFIX):
                mods.append((pid, e["name"][len(MODULE_PREFIX):], float(e["ts"]), float(e.get("dur", 0)), e.get("tid")))
    op_frame = pd.DataFrame(ops, columns=["name", "ts", "dur", "tid", "input_dims", "input_types"])
    mod_frame = pd.DataFrame(mods, columns=["python_id", "label", "ts", "dur", "tid"])
    mod_frame["cls"] = mod_frame["label"].str.replace(r"_\d+$", "", regex=True)
    mod_frame["path"] = [_module_path(pid, pyfuncs) for pid in mod_frame["python_id"]]
    return Trace(ops=op_frame.sort_values("ts", ignore_index=True), modules=mod_frame,
                 device_properties=data.get("deviceProperties", []) if isinstance(data, dict) else [])


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
