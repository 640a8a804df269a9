"""Observations made in the child around the candidate's calls; the parent turns them into checks.

They run in the candidate's process, so a candidate that attacks them deliberately could blind them; what
they guard against is the known ways of fooling a harness (patched timers, work left running after the
call returns, outputs aliasing inputs, PyTorch doing the work behind a decorative kernel). Correctness
itself never depends on them: the parent compares the outputs against references the child never sees.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

# What a benchmark's clock is made of: replacing any of these is timing tampering.
_TIMING = {
    "time.perf_counter": (time, "perf_counter"), "time.perf_counter_ns": (time, "perf_counter_ns"),
    "time.monotonic": (time, "monotonic"), "time.time": (time, "time"), "time.process_time": (time, "process_time"),
    "torch.cuda.synchronize": (torch.cuda, "synchronize"), "torch.cuda.Event": (torch.cuda, "Event"),
    "torch.cuda.Event.record": (torch.cuda.Event, "record"),
    "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
    "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize"),
    "torch.cuda.Stream.synchronize": (torch.cuda.Stream, "synchronize"),
    "torch.cuda.current_stream": (torch.cuda, "current_stream"),
    "torch.Tensor.__eq__": (torch.Tensor, "__eq__"), "torch.allclose": (torch, "allclose"),
    "torch.equal": (torch, "equal"),
}

# aten ops that move, view, allocate or fill memory but compute nothing.
NO_COMPUTE = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "view", "_unsafe_view", "reshape",
    "as_strided", "t", "transpose", "permute", "expand", "squeeze", "unsqueeze", "slice", "select", "detach",
    "alias", "contiguous", "clone", "copy_", "_to_copy", "to", "fill_", "zero_", "zeros", "zeros_like", "ones",
    "ones_like", "full", "full_like", "lift_fresh", "resize_", "set_", "split", "split_with_sizes", "chunk",
    "narrow", "unbind", "cat", "stack", "view_as", "flatten", "unflatten", "_reshape_alias", "is_same_size",
    "scalar_tensor", "arange", "_local_scalar_dense", "item", "sym_size", "sym_stride", "sym_numel", "size", "stride",
    "lift_fresh_copy", "new_zeros", "new_ones", "new_full", "diagonal", "movedim", "index_select", "gather",
}
_FOREIGN_OK = ("torch", "numpy", "triton")  # and Python's own modules (sys.stdlib_module_names)


def timing_snapshot() -> dict[str, int]:
    return {name: id(getattr(owner, attr, None)) for name, (owner, attr) in _TIMING.items()}


def timing_changes(before: dict[str, int]) -> list[str]:
    now = timing_snapshot()
    return [f"{name} was replaced" for name in before if now[name] != before[name]]


def busy_threads(before: set[int]) -> list[str]:
    """Python threads the candidate started that are still running."""
    return [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def aliasing(outs: list[Any], inputs: list[Any], previous: list[tuple[int, int]]) -> list[str]:
    """Outputs that share memory with an input, or with the outputs the previous call returned."""
    found = []
    for i, o in enumerate(outs):
        if not isinstance(o, torch.Tensor) or o.numel() == 0:
            continue
        lo, hi = _storage(o)
        for j, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and x.numel() and lo < _storage(x)[1] and _storage(x)[0] < hi:
                found.append(f"output {i} shares memory with input {j}")
        if any(lo < p_hi and p_lo < hi for p_lo, p_hi in previous):
            found.append(f"output {i} reuses the memory of the previous call's output (a caller holding that "
                         "result would see it overwritten)")
    return found


def storages(outs: list[Any]) -> list[tuple[int, int]]:
    return [_storage(o) for o in outs if isinstance(o, torch.Tensor) and o.numel()]


def op_work(func: Any, args: tuple, kwargs: dict, out: Any) -> float:
    """FLOPs where torch knows a formula (matmuls, convolutions, attention), else elements produced."""
    packet = func._overloadpacket
    if packet in flop_registry:
        try:
            return float(flop_registry[packet](*args, **kwargs, out_val=out))
        except Exception:
            pass
    outs = out if isinstance(out, (tuple, list)) else [out]
    return float(sum(o.numel() for o in outs if isinstance(o, torch.Tensor)))


class OpLog(TorchDispatchMode):
    """Every aten op a call runs (the C++ a candidate calls included), with the work it does."""

    def __init__(self) -> None:
        super().__init__()
        self.compute: dict[str, float] = {}
        self.custom: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        namespace, name = func.namespace, func._overloadpacket.__name__
        if namespace not in ("aten", "prim", "prims"):
            self.custom.add(f"{namespace}::{name}")
        elif name.rstrip("_") not in NO_COMPUTE and name not in NO_COMPUTE:
            self.compute[name] = self.compute.get(name, 0.0) + op_work(func, args, kwargs, out)
        return out


def _foreign(fn: Any) -> str | None:
    """The name of a native extension module `fn` belongs to, unless it is part of torch, numpy, triton or
    Python itself."""
    owner = getattr(fn, "__self__", None)
    name = getattr(owner, "__name__", None) if isinstance(owner, type(sys)) else getattr(fn, "__module__", None)
    if not isinstance(name, str) or name.split(".")[0] in _FOREIGN_OK or name.split(".")[0] in sys.stdlib_module_names:
        return None
    mod = sys.modules.get(name)  # torch's cpp_extension loads its builds without registering them here
    path = getattr(mod, "__file__", "") or ""
    if mod is not None and (not path.endswith((".so", ".pyd")) or f"{os.sep}torch{os.sep}" in path):
        return None
    return f"{name}.{getattr(fn, '__name__', '?')}"


_counting = False
_ctypes_calls = 0


def _audit(event: str, args: tuple) -> None:
    global _ctypes_calls
    if _counting and event == "ctypes.call_function":  # ctypes' older call path
        _ctypes_calls += 1


def install() -> None:
    """Count calls into libraries the candidate loads with ctypes (a way to launch one's own kernel) while a
    call is profiled; Python audits ctypes' loading, not its calls, so CDLL's function type is wrapped."""
    import ctypes

    sys.addaudithook(_audit)
    original = ctypes.CDLL.__init__

    def init(self, name, *args, **kwargs):
        original(self, name, *args, **kwargs)
        if name is None or str(name).startswith(("/lib", "/usr/lib")) or "libc." in str(name):
            return
        base = self._FuncPtr

        class Counted(base):  # type: ignore[misc, valid-type]
            def __call__(self, *call_args):
                global _ctypes_calls
                if _counting:
                    _ctypes_calls += 1
                return base.__call__(self, *call_args)

        self._FuncPtr = Counted

    ctypes.CDLL.__init__ = init


def profile_call(model: Any, inputs: list[Any]) -> dict[str, Any]:
    """Run once under the op log: aten compute work, custom ops, native extension and ctypes calls."""
    global _counting, _ctypes_calls
    native: set[str] = set()

    def profiler(frame, event, arg):
        if event == "c_call":
            name = _foreign(arg)
            if name:
                native.add(name)

    log = OpLog()
    _counting, _ctypes_calls = True, 0
    sys.setprofile(profiler)
    try:
        with log:
            model(*inputs)
    finally:
        sys.setprofile(None)
        _counting = False
    own = sorted(native) + sorted(log.custom)
    if _ctypes_calls:
        own.append(f"{_ctypes_calls} ctypes call(s)")
    return {"compute": log.compute, "own_kernels": own}
