"""Observations made in the runner (the process that runs the candidate) around its calls; the parent turns
them into checks.

They run in the candidate's process, so each is built to be hard to blind and to leave a trace when
attacked: the runner binds what it uses before the candidate is imported, and a seal over the harness's
own modules, functions and patched attributes is compared after every call (`seal`, `seal_changes`), and the
pointers of the runner's own state are read by the harness, from outside this process, after every reply (`pins`).
What
they guard against: patched timers, work left running after the call returns (any OS thread, native ones
included), outputs aliasing inputs, parameters or earlier outputs, parameters changed in place, and
PyTorch doing the work behind a decorative kernel (the op log is PyTorch's profiler on every thread, under
the dispatcher, so ops on other threads or outside Python dispatch modes are seen). Correctness itself
never depends on them: the parent compares the outputs against references the runner never sees.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import FunctionType, ModuleType
from typing import Any

import torch
from torch._C._profiler import ProfilerActivity, _ExperimentalConfig
from torch.autograd.profiler import (
    ProfilerConfig,
    ProfilerState,
    _disable_profiler,
    _enable_profiler,
    _prepare_profiler,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from kernelbot.agent.verify import sampling
from kernelbot.agent.verify.disguise import like

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
    "alias", "contiguous", "to", "fill_", "zero_", "zeros", "zeros_like", "ones",
    "ones_like", "full", "full_like", "lift_fresh", "resize_", "set_", "split", "split_with_sizes", "chunk",
    "narrow", "unbind", "view_as", "flatten", "unflatten", "_reshape_alias", "is_same_size",
    "scalar_tensor", "arange", "_local_scalar_dense", "item", "sym_size", "sym_stride", "sym_numel", "size", "stride",
    "lift_fresh_copy", "new_zeros", "new_ones", "new_full", "diagonal", "movedim",
    "resolve_conj", "resolve_neg", "result_type", "randn", "rand", "randint", "normal", "uniform",
}  # copies, gathers and concatenations move every element: work (a table looked up per call is not free)
# the copies Triton's interpreter makes of every argument of a launch, in and out: not the candidate's work inside one
# (the interpreter's other ops there, allocations and views, are in NO_COMPUTE and count for nothing anyway)
INTERPRETER_COPIES = {"copy_", "_to_copy", "clone", "_copy_from", "_copy_from_and_resize"}
# FLOPs of matmul-like leaves from their input shapes (the profiler knows formulas for a few names only; mv, addmm_,
# the convolution leaves and attention kernels would count as the elements of one input)
_MATMULS = {"mm": (0, 1), "addmm": (1, 2), "addmm_": (1, 2), "_addmm_activation": (1, 2), "bmm": (0, 1),
            "baddbmm": (1, 2), "baddbmm_": (1, 2), "addbmm": (1, 2), "addbmm_": (1, 2), "mv": (0, 1), "addmv": (1, 2),
            "addmv_": (1, 2), "dot": (0, 1), "vdot": (0, 1), "matmul": (0, 1), "mkldnn_linear": (0, 1)}
# PyTorch's own op namespaces: their ops are PyTorch's work whatever calls them (torch.compile's CPU linear is
# mkldnn::_linear_pointwise); a candidate's own namespace is judged by where its time goes (sampling)
TORCH_NAMESPACES = ("aten", "prim", "prims", "mkldnn", "onednn", "quantized", "_quantized", "inductor")
M_PERTURB = -6  # glibc mallopt: fill allocations with ~byte and freed memory with byte
POISON_BYTE = 0x7F  # what poisoned allocations hold: float32 3.4e38, float16 NaN, bfloat16 3.4e38
SENTINEL_SHAPE = [5, 3]  # a profiled op of the harness's own, run after the candidate's call
_SENTINEL = torch.ops.aten.bitwise_xor.Tensor
# Switches RecordFunction, under which the op log sees every op, on or off for the calling thread: bound before the
# candidate loads, so the profiled call's profile function knows the builtin itself when the candidate calls it
_RECORD_FUNCTION_SWITCH = torch.autograd._enable_record_function
_T = torch._C.TensorBase  # its methods cannot be replaced (an immutable type): bound here, used below
_clone, _equal, _reshape, _view, _detach, _data_ptr = _T.clone, torch.equal, _T.reshape, _T.view, _T.detach, \
    _T.data_ptr


def timing_snapshot() -> dict[str, int]:
    return {name: id(getattr(owner, attr, None)) for name, (owner, attr) in _TIMING.items()}


def timing_changes(before: dict[str, int]) -> list[str]:
    now = timing_snapshot()
    return [f"{name} was replaced" for name in before if now[name] != before[name]]


def os_threads() -> dict[int, int]:
    """Every thread of this process, native ones included: thread id -> nanoseconds it has run on a CPU."""
    found = {}
    for name in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{name}/schedstat") as f:
                found[int(name)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # it ended meanwhile
    return found


def thread_names(known: Iterable[int]) -> list[tuple[str, int]]:
    """(name, nanoseconds on a CPU) of this process's live threads other than `known`, busiest first."""
    named = []
    for tid, ns in os_threads().items():
        if tid in known:
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                named.append((f.read().strip() or f"thread {tid}", ns))
        except OSError:
            continue
    return sorted(named, key=lambda pair: -pair[1])


def poison_allocations(on: bool = True) -> bool:
    """From now on every CPU allocation of this process (torch's included) comes back filled with POISON_BYTE:
    an output element a kernel never writes keeps that pattern (`on` False: allocations are left as malloc gives
    them again). No global torch flag changes."""
    try:
        return bool(ctypes.CDLL(None).mallopt(M_PERTURB, POISON_BYTE ^ 0xFF if on else 0))
    except (OSError, AttributeError):
        return False


def pins(tuples: Iterable[tuple]) -> list[tuple[int, int]]:
    """(address, the pointer it holds) that must not change while the candidate runs, for the harness to read from
    outside this process (a raw write through ctypes changes no identity the seal compares): every slot of each tuple,
    of the tuples directly inside it, and the code pointer of every function among them."""
    found: list[tuple[int, int]] = []
    for outer in tuples:
        for t in [outer, *(item for item in outer if type(item) is tuple and len(item) < 64)]:
            base = id(t) + tuple.__basicsize__
            found += [(base + k * tuple.__itemsize__, id(item)) for k, item in enumerate(t)]
            found += [pin for fn in t if isinstance(fn, FunctionType) for pin in _code_pin(fn)]
    return list(dict.fromkeys(found))


def _code_pin(fn: FunctionType) -> list[tuple[int, int]]:
    """Where in the function object its code pointer lies (found by its value, so no layout is assumed)."""
    raw = ctypes.string_at(id(fn), FunctionType.__basicsize__)
    code = id(fn.__code__).to_bytes(8, sys.byteorder)
    return [(id(fn) + k, id(fn.__code__)) for k in range(0, len(raw) - 7, 8) if raw[k:k + 8] == code][:1]


def seal(modules: Iterable[ModuleType], attributes: dict[str, tuple[Any, str]],
         classes: Iterable[type] = (torch.Tensor, torch.UntypedStorage)) -> tuple[tuple[str, int], ...]:
    """Identities of everything the harness relies on: each module's functions, classes and their methods (with
    their code, defaults and closure contents), `attributes` (patched library attributes, clocks), and every
    attribute of `classes` (torch.Tensor: a method added or replaced there changes every tensor)."""
    found: list[tuple[str, int]] = []
    for module in modules:
        for name, value in list(vars(module).items()):
            if isinstance(value, (ModuleType, type)) or callable(value):
                found += _identities(f"{module.__name__}.{name}", value, module.__name__)
    for cls in classes:
        found += [(f"{cls.__qualname__}.{name}", id(value)) for name, value in list(vars(cls).items())]
    for label, (owner, attr) in attributes.items():
        found += _identities(label, getattr(owner, attr, None), None)
    return tuple(sorted(found))


def _identities(label: str, value: Any, home: str | None) -> list[tuple[str, int]]:
    out = [(label, id(value))]
    fn = getattr(value, "__func__", value)
    if isinstance(fn, FunctionType):
        out += [(f"{label}.__code__", id(fn.__code__)), (f"{label}.__defaults__", id(fn.__defaults__)),
                (f"{label}.__kwdefaults__", id(fn.__kwdefaults__))]
        for i, cell in enumerate(fn.__closure__ or ()):
            try:
                out.append((f"{label}.<closure {i}>", id(cell.cell_contents)))
            except ValueError:
                continue  # an empty cell
    elif isinstance(value, type) and home is not None and value.__module__ == home:
        for name, member in list(vars(value).items()):
            if isinstance(member, (FunctionType, staticmethod, classmethod, property)):
                out += _identities(f"{label}.{name}", member, None)
    return out


def seal_changes(before: tuple[tuple[str, int], ...], after: tuple[tuple[str, int], ...]) -> list[str]:
    """What was replaced, removed or added since `before`."""
    old, new = dict(before), dict(after)
    changed = [name for name in old if new.get(name) != old[name]]
    added = [name for name in new if name not in old]
    return [f"{name} was replaced" for name in changed] + [f"{name} was added" for name in added]


def weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Parameters and buffers: inputs of every call, like the tensors passed to it."""
    return [(n, t) for n, t in [*model.named_parameters(), *model.named_buffers()] if isinstance(t, torch.Tensor)]


def weight_snapshot(model: torch.nn.Module) -> tuple[tuple[str, torch.Tensor, torch.Tensor], ...]:
    """(name, the tensor itself, a copy of its values) per parameter and buffer."""
    with torch.no_grad():
        return tuple((n, t, _clone(_detach(t))) for n, t in weights(model))


def weight_changes(snapshot: tuple[tuple[str, torch.Tensor, torch.Tensor], ...], model: torch.nn.Module) -> list[str]:
    """Parameters or buffers whose values changed in place, or that were replaced or removed."""
    now = dict(weights(model))
    problems = []
    for name, tensor, values in snapshot:
        current = now.get(name)
        if current is None or current is not tensor:
            problems.append(f"{name} was replaced or removed")
        elif not same_bytes(_detach(current), values):
            problems.append(f"{name} changed in place")
    return problems


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same shape, dtype and bytes (NaN payloads included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return _equal(_view(_reshape(a, (-1,)), torch.uint8), _view(_reshape(b, (-1,)), torch.uint8)) if a.numel() else True


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes a tensor's elements lie in, [first, past the last): not its whole storage, so two halves of one
    allocation (two outputs a kernel writes side by side) do not overlap."""
    first = _data_ptr(t)
    return first, first + (1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride(), strict=True))) * \
        t.element_size()


def aliasing(outs: list[Any], inputs: list[Any], earlier: Iterable[tuple[int, int]],
             params: Iterable[torch.Tensor] = ()) -> list[str]:
    """Outputs whose bytes overlap an input's, a parameter's or buffer's, another output's of the same call, or those
    of any output an earlier call returned (all of which the runner still holds, so their memory cannot have been
    freed and reused). Byte ranges, not storages: disjoint views of one allocation share no memory."""
    found = []
    earlier, params = list(earlier), list(params)
    seen: list[tuple[int, int]] = []
    for i, o in enumerate(outs):
        if not isinstance(o, torch.Tensor) or o.numel() == 0:
            continue
        lo, hi = _span(o)
        for j, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and x.numel() and lo < _span(x)[1] and _span(x)[0] < hi:
                found.append(f"output {i} shares memory with input {j}")
        if any(p.numel() and lo < _span(p)[1] and _span(p)[0] < hi for p in params):
            found.append(f"output {i} shares memory with a parameter or buffer")
        if any(lo < s_hi and s_lo < hi for s_lo, s_hi in seen):
            found.append(f"output {i} shares memory with another output of the same call")
        if any(lo < p_hi and p_lo < hi for p_lo, p_hi in earlier):
            found.append(f"output {i} reuses the memory of an earlier call's output (a caller holding that "
                         "result would see it overwritten)")
        seen.append((lo, hi))
    return found


def spans(outs: list[Any]) -> list[tuple[int, int]]:
    """The byte ranges of the outputs' elements (`_span`)."""
    return [_span(o) for o in outs if isinstance(o, torch.Tensor) and o.numel()]


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


# (the candidate's own code, torch's generated code, installed libraries' identities): sampling.place_of_file
Places = tuple[tuple[str, ...], tuple[str, ...], frozenset[str]]


def _own_file(path: str, places: Places) -> bool:
    return sampling.place_of_file(os.path.realpath(path), *places) == "own"


def own_native(fn: Any, places: Places, own_libraries: dict[str, str]) -> str | None:
    """`module.function` when `fn` is native code of a library the candidate built (sampling.place_of_file: under its
    box, the kernel library's build cache or its module's folder, not torch.compile's cache), else None: where the
    code lives decides, not what it is called. `own_libraries` (file stem -> path of every such library mapped in
    this process) finds the file of an extension torch's cpp_extension loaded without registering it."""
    owner = getattr(fn, "__self__", None)
    name = owner.__name__ if isinstance(owner, ModuleType) else str(getattr(fn, "__module__", "") or "")
    module = owner if isinstance(owner, ModuleType) else sys.modules.get(name)
    path = getattr(module, "__file__", None) if module is not None else own_libraries.get(name)
    if not isinstance(path, str) or not path.endswith((".so", ".pyd")) or not _own_file(path, places):
        return None
    return f"{name}.{getattr(fn, '__name__', '?')}"


def own_libraries(places: Places) -> dict[str, str]:
    """File stem -> path of every shared library of the candidate's own this process has mapped."""
    found = {}
    for _, _, path in sampling.mappings():
        if (path.endswith(".so") or ".so." in path) and _own_file(path, places):
            found[os.path.basename(path).split(".")[0]] = os.path.realpath(path)
    return found


_counting = False
_ctypes_calls = 0


def _audit(event: str, args: tuple) -> None:
    global _ctypes_calls
    if _counting and event == "ctypes.call_function":  # ctypes' older call path
        _ctypes_calls += 1


def install(places: Places) -> None:
    """Count calls into libraries the candidate built (`places`) and loads with ctypes (a way to launch one's own
    kernel) while a call is profiled; Python audits ctypes' loading, not its calls, so CDLL's function type is
    wrapped."""
    import ctypes

    sys.addaudithook(_audit)
    original = ctypes.CDLL.__init__

    def init(self, name, *args, **kwargs):
        original(self, name, *args, **kwargs)
        if name is None or not _own_file(os.fsdecode(name), places):
            return
        base = self._FuncPtr

        class Counted(base):  # type: ignore[misc, valid-type]
            # ctypes' function-pointer type reads these from the class's own namespace (Python 3.11: "class must
            # define _flags_"), not from its base
            _flags_, _restype_ = base._flags_, base._restype_

            def __call__(self, *call_args):
                global _ctypes_calls
                if _counting:
                    _ctypes_calls += 1
                return base.__call__(self, *call_args)

        Counted.__module__, Counted.__qualname__ = base.__module__, base.__qualname__
        self._FuncPtr = Counted

    ctypes.CDLL.__init__ = like(init, original)


@dataclass
class WorkLog:
    """Aten compute work per op (leaf ops only, so composites are not counted twice), custom ops, whether the
    harness's own sentinel op after the call was seen (if not, the log was disturbed), and the wall time of the
    outermost compute ops (what torch's libraries spent on work the log shows)."""
    compute: dict[str, float] = field(default_factory=dict)
    custom: set[str] = field(default_factory=set)
    sentinel_seen: bool = False
    compute_ns: int = 0


def measure_work(run: Callable[[], Any], all_threads: bool,
                 launches: Callable[[], Iterable[tuple[int, int, int, int, int]]] = tuple) -> WorkLog:
    """Run `run` under PyTorch's profiler: RecordFunction, beneath the dispatcher, so ops run with Python
    dispatch modes disabled or excluded are seen, and with `all_threads` also ops on any other thread. `launches`:
    the Triton launches' windows (triton_check.WINDOWS): ops inside one on this thread are the interpreter's own
    (it copies every argument in and out), not work of PyTorch's."""
    config = ProfilerConfig(ProfilerState.KINETO, True, False, False, True, False,
                            _ExperimentalConfig(profile_all_threads=all_threads))
    activities = {ProfilerActivity.CPU}
    sentinel = torch.zeros(SENTINEL_SHAPE, dtype=torch.int16)
    _prepare_profiler(config, activities)
    _enable_profiler(config, activities)
    try:
        run()
        _SENTINEL(sentinel, sentinel)
    finally:
        result = _disable_profiler()  # raises if the candidate stopped the profiler
    events = [(e.start_thread_id(), e.start_ns(), e.end_ns(), e.name(), e.shapes(), e.flops())
              for e in result.events()]
    return work_from_events(_outside_launches(events, threading.get_native_id(), launches()))


def _outside_launches(events: list[tuple[int, int, int, str, list, int]], tid: int,
                      launches: Iterable[tuple[int, int, int, int, int]]) -> list[tuple[int, int, int, str, list, int]]:
    """The events but the interpreter's argument copies: copies on this thread inside one of its Triton launches
    (wall-clock windows, as the profiler's times are). Any other op inside a launch stays: a window is the runner's
    word, and the parent counts torch's time inside launches as nobody's (sampling.places). The profiler numbers
    threads itself: this one is the thread the harness's sentinel op ran on."""
    windows = [(start, end) for thread, _, _, start, end in launches if thread == tid]
    mine = next((e[0] for e in events if e[3].endswith("::bitwise_xor") and e[4][:1] == [SENTINEL_SHAPE]), None)
    if not windows or mine is None:
        return events

    def interpreters(e: tuple[int, int, int, str, list, int]) -> bool:
        return e[0] == mine and e[3].partition("::")[2] in INTERPRETER_COPIES and \
            any(start <= e[1] and e[2] <= end for start, end in windows)
    return [e for e in events if not interpreters(e)]


def work_from_events(events: list[tuple[int, int, int, str, list, int]]) -> WorkLog:
    """(thread, start, end, name, input shapes, flops) per profiled op -> the work of compute ops: an op whose FLOPs
    are known (from the profiler or its shapes) counts them whole, and nothing nested in it counts again (addmm
    copies its bias into the output first: that copy is part of the GEMM, not a leaf that hides it); any other
    compute op counts the elements of its largest input where nothing nested in it computes."""
    rows = sorted((e for e in events if "::" in e[3]), key=lambda e: (e[0], e[1], -e[2]))
    parents = _parents(rows)
    has_compute_child = [False] * len(rows)
    for i, parent in enumerate(parents):
        if parent is not None and _computes(rows[i][3]):
            has_compute_child[parent] = True
    log = WorkLog()
    inside_counted = [False] * len(rows)
    inside_compute = [False] * len(rows)
    for i, (_tid, start, end, name, shapes, _flops) in enumerate(rows):
        parent = parents[i]
        inside_counted[i] = parent is not None and (inside_counted[parent] or _flop_count(rows[parent]) > 0
                                                    and _computes(rows[parent][3]))
        inside_compute[i] = parent is not None and (inside_compute[parent] or _computes(rows[parent][3]))
        if _computes(name) and not inside_compute[i] and not (name.endswith("::bitwise_xor")
                                                              and shapes[:1] == [SENTINEL_SHAPE]):
            log.compute_ns += max(0, end - start)
        namespace, op = name.split("::", 1)
        if op == "bitwise_xor" and shapes[:1] == [SENTINEL_SHAPE]:
            log.sentinel_seen = True
        elif namespace not in TORCH_NAMESPACES:
            log.custom.add(name)
        elif _computes(name) and not inside_counted[i]:
            counted = _flop_count(rows[i])
            if counted == 0 and not has_compute_child[i]:
                counted = float(max((_numel(s) for s in shapes if isinstance(s, list)), default=0))
            if counted > 0:
                log.compute[op] = log.compute.get(op, 0.0) + counted
    return log


def _parents(rows: list[tuple[int, int, int, str, list, int]]) -> list[int | None]:
    """Each op's innermost enclosing op on its thread (rows sorted by thread, start, longest first), or None."""
    parents: list[int | None] = []
    stack: list[int] = []
    thread = None
    for i, (tid, start, _end, _name, _shapes, _flops) in enumerate(rows):
        if tid != thread:
            stack, thread = [], tid
        while stack and rows[stack[-1]][2] <= start:
            stack.pop()
        parents.append(stack[-1] if stack else None)
        stack.append(i)
    return parents


def _flop_count(row: tuple[int, int, int, str, list, int]) -> float:
    name, shapes, flops = row[3], row[4], row[5]
    return max(float(flops or 0), shape_flops(name.split("::", 1)[-1], shapes))


def shape_flops(op: str, shapes: list) -> float:
    """2·(product of the output's dims and the reduced one) for matmul-like ops, 2·out·(in/groups)·kernel for
    convolutions (stride ignored: an upper bound), 4·B·H·L·S·E for attention kernels; 0 where none applies."""
    dims = [s if isinstance(s, list) and all(isinstance(d, int) for d in s) else [] for s in shapes]
    if op in _MATMULS:
        a, b = (dims[i] if i < len(dims) else [] for i in _MATMULS[op])
        if a and b:
            batch = _numel(a[:-2]) if len(a) > 2 else 1
            rows = a[-2] if len(a) >= 2 else 1
            cols = b[-1] if len(b) >= 2 else 1
            return 2.0 * batch * rows * a[-1] * cols
    elif "conv" in op and len(dims) >= 2 and len(dims[0]) >= 3 and len(dims[1]) == len(dims[0]):
        image, weight = dims[0], dims[1]
        return 2.0 * image[0] * weight[0] * _numel(image[2:]) * weight[1] * _numel(weight[2:])
    elif "attention" in op and len(dims) >= 2 and len(dims[0]) == 4 and len(dims[1]) == 4:
        q, k = dims[0], dims[1]
        return 4.0 * q[0] * q[1] * q[2] * k[2] * q[3]
    return 0.0


def _computes(name: str) -> bool:
    namespace, _, op = name.partition("::")
    return namespace in TORCH_NAMESPACES and op not in NO_COMPUTE and op.rstrip("_") not in NO_COMPUTE


def _numel(shape: list) -> int:
    n = 1
    for d in shape:
        n *= int(d) if isinstance(d, int) else 1
    return n


def profile_call(model: Any, inputs: list[Any], places: Places,
                 launches: Callable[[], Iterable[tuple[int, int, int, int, int]]] = tuple) -> dict[str, Any]:
    """Run once under the op log: aten compute work on every thread, calls into native code and ctypes libraries the
    candidate built, and whether the log stayed intact (its sentinel op seen, RecordFunction never switched by the
    call: ops run with it off leave no trace in the log, so the log is then no evidence). Custom op names and
    record_function labels are not evidence of anything: a candidate chooses them. The call's outputs come back under
    "outputs" (checked like any call's)."""
    global _counting, _ctypes_calls
    native: set[str] = set()
    libraries = own_libraries(places)
    outputs: list[Any] = []
    switched: list[str] = []

    def profiler(frame, event, arg):
        if event == "c_call":
            if arg is _RECORD_FUNCTION_SWITCH:
                switched.append("RecordFunction switched")
            name = own_native(arg, places, libraries)
            if name:
                native.add(name)

    def run() -> None:
        global _counting, _ctypes_calls
        _counting, _ctypes_calls = True, 0
        sys.setprofile(profiler)
        try:
            outputs.append(model(*inputs))
        finally:
            sys.setprofile(None)
            _counting = False

    log = measure_work(run, all_threads=True, launches=launches)
    own = sorted(native)
    if _ctypes_calls:
        own.append(f"{_ctypes_calls} ctypes call(s)")
    return {"compute": log.compute, "compute_ns": log.compute_ns, "own_kernels": own,
            "intact": log.sentinel_seen and not switched, "outputs": outputs[:1]}
