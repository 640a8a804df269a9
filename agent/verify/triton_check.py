"""Race and bounds checking for Triton kernels on any machine, through Triton's CPU interpreter.

Installed in the sandboxed child before the candidate is imported. Every load, store and atomic the
interpreter executes is recorded per program of the launch, as addresses, with the locks the program held
and, for atomics, their operation; the launch's tensor arguments give the address ranges it may touch. After
the launch:
- `out_of_bounds`: an access (masked-off lanes excluded) outside every argument tensor's extent. Such lanes
  are masked off before the interpreter performs them, so the run goes on instead of reading wild memory.
- `precision`: a `tl.dot` on float32 operands at a precision other than IEEE (Triton's default on an NVIDIA GPU is
  TF32, which rounds the inputs to 10 mantissa bits): the interpreter multiplies in full float32, so its results
  would not be the GPU's.
- `race`: an address that one program writes and another program reads or writes, unless every access to it
  was made under one common lock (Eraser's lockset rule: a lock is a word a program took with
  `tl.atomic_cas(lock, 0, 1)` and gives back with an atomic exchange, as Triton's layer-norm tutorial does), or
  all of them are atomics of one order-independent operation (add, max, min, and, or, xor). Exchanges and
  compare-and-swaps by several programs at one address outside a lock are races: the last one wins.
The grid can also be run in reversed or shuffled program order (`set_order`), so results that depend on the
order programs run in show up as differing bits. Float atomic adds (`tl.atomic_add` on floats, split
reductions) and writes made inside a lock make a kernel's results depend on program order legitimately (fp32
sums are not associative): such launches report it, and the harness keeps those kernels in natural order when
it asks for a shuffled one, so that every other kernel must still give the same bits.

`triton.language.extra.libdevice` is only stubs until a GPU backend compiles the kernel, so the interpreter
cannot run kernels that import from it (Liger-Kernel's RMSNorm takes `rsqrt` from there): install() gives the
common ones numpy implementations, elementwise, in the kernel's dtype.

With a `sink` (the runner's channel to the harness), every launch and every finding is handed over the
moment it is made, so a candidate that clears REPORT afterwards takes nothing back; each launch also says
which program order it actually ran in, and its window (thread, start and end), when it has returned.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_FINDINGS = 20  # per kind, per child: enough to explain, bounded in size
# libdevice functions the interpreter runs elementwise with numpy (a GPU compiles the real ones).
LIBDEVICE = {
    "rsqrt": lambda x: 1 / np.sqrt(x), "sqrt": np.sqrt, "sqrt_rn": np.sqrt, "exp": np.exp, "exp2": np.exp2,
    "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "expm1": np.expm1, "tanh": np.tanh,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "abs": np.abs, "fabs": np.abs, "floor": np.floor, "ceil": np.ceil,
    "trunc": np.trunc, "round": np.round, "rint": np.rint, "pow": np.power, "fast_powf": np.power,
    "fast_expf": np.exp, "fast_logf": np.log, "fast_log2f": np.log2, "fast_dividef": np.divide,
    "div_rn": np.divide, "fmax": np.fmax, "fmin": np.fmin, "fma": lambda a, b, c: a * b + c,
    "isnan": np.isnan, "isinf": np.isinf, "signbit": np.signbit, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


READ, WRITE, ATOMIC = 0, 1, 2
NO_OP, CAS = -1, 100  # an access that is no atomic; a compare-and-swap (the others are ir.ATOMIC_OP's values)
ORDERED_OPS = (10, CAS)  # exchange, compare-and-swap: the result depends on which program comes last


@dataclass
class _Launch:
    kernel: str
    grid: tuple[int, int, int]
    args: list[tuple[str, int, int]]  # (name, first byte, end byte), sorted by first byte
    program: int = 0
    # (byte addresses, program, READ/WRITE/ATOMIC, id of the set of locks held, atomic operation or NO_OP)
    entries: list[tuple[np.ndarray, int, int, int, int]] = field(default_factory=list)
    held: set[int] = field(default_factory=set)  # lock words (first byte) the running program holds
    locksets: dict[frozenset[int], int] = field(default_factory=lambda: {frozenset(): 0})
    lock_bytes: set[int] = field(default_factory=set)  # every byte of every word used as a lock
    float_atomic_adds: int = 0
    locked_writes: int = 0  # plain writes made while holding a lock: their order is the lock's

    def lockset(self) -> int:
        return self.locksets.setdefault(frozenset(self.held), len(self.locksets))

    def order_dependent(self) -> bool:
        return bool(self.float_atomic_adds or self.locked_writes)


@dataclass
class TritonReport:
    launches: int = 0
    programs: int = 0
    kernels: set[str] = field(default_factory=set)
    out_of_bounds: list[str] = field(default_factory=list)
    races: list[str] = field(default_factory=list)
    precision: list[str] = field(default_factory=list)  # float32 tl.dot at a precision the interpreter does not use
    order_dependent_kernels: set[str] = field(default_factory=set)  # float atomic adds, or writes inside a lock
    builds: list[dict[str, Any]] = field(default_factory=list)  # compile_gate's KernelBuild records

    def as_dict(self) -> dict[str, Any]:
        return {"launches": self.launches, "programs": self.programs, "kernels": sorted(self.kernels),
                "out_of_bounds": self.out_of_bounds, "races": self.races, "precision": self.precision,
                "order_dependent_kernels": sorted(self.order_dependent_kernels), "builds": self.builds}


REPORT = TritonReport()
MAX_WINDOWS = 4096
# (thread, start, end on CLOCK_MONOTONIC, start, end on the wall clock) of the latest launches: probes.measure_work
# leaves the interpreter's own copies of the arguments out of PyTorch's work. The harness's sampler reads each launch's
# window from its launch event instead, and checks it (sampling.checked_windows)
WINDOWS: list[tuple[int, int, int, int, int]] = []
_state: dict[str, Any] = {"launch": None, "order": "natural", "seed": 0, "pinned": frozenset(), "imprecise": set(),
                          "built": {}}
_STAND_INS: dict[int, Any] = {}  # id of a libdevice stand-in -> Triton's function
_PRISTINE: list[tuple[Any, dict[str, Any]]] = []  # Triton's language namespaces before the interpreter patched them
_MISSING = object()
Sink = Callable[[str, dict[str, Any]], None]
_sink: Sink | None = None  # a module-level callable: the runner's seal notices if it is swapped out


def recent_windows() -> tuple[tuple[int, int, int, int, int], ...]:
    return tuple(WINDOWS)


def set_order(order: str, seed: int = 0, pinned: frozenset[str] = frozenset()) -> None:
    """Program order for the following launches: natural, reversed or shuffled; kernels in `pinned` (those whose
    results depend on program order legitimately) keep the natural order."""
    _state["order"], _state["seed"], _state["pinned"] = order, seed, frozenset(pinned)


def order_dependent() -> frozenset[str]:
    """The kernels seen so far whose results depend on program order legitimately."""
    return frozenset(REPORT.order_dependent_kernels)


def order_for(kernel: str) -> str:
    return "natural" if kernel in _state["pinned"] else _state["order"]


def _program_order(grid: tuple[int, int, int], order: str) -> list[tuple[int, int, int]]:
    programs = [(x, y, z) for x in range(grid[0]) for y in range(grid[1]) for z in range(grid[2])]
    if order == "reversed":
        programs.reverse()
    elif order == "shuffled":
        random.Random(_state["seed"]).shuffle(programs)
    return programs


def _tensor_span(t: Any) -> tuple[int, int] | None:
    """First and end byte a tensor's sizes and strides can reach (its extent, not its whole storage)."""
    if not hasattr(t, "data_ptr") or not hasattr(t, "stride"):
        return None
    if t.numel() == 0:
        return None
    lo = hi = 0
    for size, stride in zip(t.shape, t.stride(), strict=True):
        reach = (size - 1) * stride
        lo, hi = (lo + reach, hi) if stride < 0 else (lo, hi + reach)
    item = t.element_size()
    start = t.data_ptr()
    return start + lo * item, start + (hi + 1) * item


def _where(launch: _Launch, addr: int) -> str:
    """An address as argument + offset, or as the distance to the nearest argument."""
    best = None
    for name, lo, hi in launch.args:
        if lo <= addr < hi:
            return f"{name}+{addr - lo}"
        dist = lo - addr if addr < lo else addr - hi + 1
        if best is None or dist < best[0]:
            best = (dist, f"{name}{'-' if addr < lo else '+'}{dist if addr < lo else addr - lo} (outside)")
    return best[1] if best else hex(addr)


def _program_name(launch: _Launch, index: int) -> str:
    _, gy, gz = launch.grid
    return f"({index // (gy * gz)},{index // gz % gy},{index % gz})"


def _check_bounds(launch: _Launch, addrs: np.ndarray, nbytes: int, kind: str) -> np.ndarray:
    """Mask of lanes inside some argument's extent; the others are recorded as out of bounds."""
    inside = np.zeros(addrs.shape, dtype=bool)
    for _, lo, hi in launch.args:
        inside |= (addrs >= lo) & (addrs + nbytes <= hi)
    if not inside.all() and len(REPORT.out_of_bounds) < MAX_FINDINGS:
        bad = addrs[~inside]
        _found("out_of_bounds", f"{launch.kernel}: program {_program_name(launch, launch.program)} {kind}s "
                                f"{bad.size} element(s) outside every argument, first at {_where(launch, int(bad[0]))}")
    return inside


def _found(kind: str, text: str) -> None:
    {"out_of_bounds": REPORT.out_of_bounds, "race": REPORT.races, "precision": REPORT.precision}[kind].append(text)
    if _sink is not None:
        _sink("triton_finding", {"kind": kind, "text": text})


def _record(ptrs: Any, mask: Any, kind: int, op: int = NO_OP) -> Any:
    """Check and record one memory operation; returns the mask with out-of-bounds lanes switched off (None stays
    None where every lane is inside)."""
    launch: _Launch | None = _state["launch"]
    if launch is None:
        return mask
    addrs = np.atleast_1d(np.asarray(ptrs.data, dtype=np.uint64))
    # a mask may come as 0/1 integers (`a & (row < n)` with a scalar): as an index array it would pick element 0
    active = np.ones(addrs.shape, dtype=bool) if mask is None else \
        np.broadcast_to(np.asarray(mask.data).astype(bool), addrs.shape)
    nbytes = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
    live = addrs[active]
    inside = _check_bounds(launch, live, nbytes, ("read", "write", "atomic")[kind])
    byte_addrs = (live[inside][:, None] + np.arange(nbytes, dtype=np.uint64)).ravel()
    launch.entries.append((byte_addrs, launch.program, kind, launch.lockset(), op))
    if kind == WRITE and launch.held:
        launch.locked_writes += 1
    if inside.all():
        return mask
    safe = active.copy()
    safe[active] = inside
    return type(mask)(safe.astype(np.asarray(mask.data).dtype), mask.dtype) if mask is not None else safe


def _words(ptrs: Any, lanes: np.ndarray) -> list[int]:
    return [int(a) for a in np.atleast_1d(np.asarray(ptrs.data, dtype=np.uint64))[lanes]]


def _took(launch: _Launch, ptr: Any, cmp: Any, old: Any) -> None:
    """A compare-and-swap that found the value it compared with took a lock: the program holds that word."""
    acquired = np.atleast_1d(np.asarray(old.data) == np.asarray(cmp.data))
    nbytes = max(1, ptr.get_element_ty().primitive_bitwidth // 8)
    for word in _words(ptr, acquired):
        launch.held.add(word)
        launch.lock_bytes.update(range(word, word + nbytes))


def _gave_back(launch: _Launch, ptr: Any) -> None:
    """An atomic exchange on a word the program holds releases it."""
    for word in _words(ptr, np.ones(np.atleast_1d(np.asarray(ptr.data)).shape, dtype=bool)):
        launch.held.discard(word)


def _pairs(launch: _Launch) -> dict[str, np.ndarray]:
    """Every distinct (address, program, kind, lockset, operation), sorted by address; atomics on lock words (the
    locking itself) left out."""
    entries = [e for e in launch.entries if e[0].size]
    if not entries:
        return {}
    cols = {"addr": np.concatenate([e[0] for e in entries])}
    for i, name in enumerate(("prog", "kind", "lock", "op"), start=1):
        cols[name] = np.concatenate([np.full(e[0].size, e[i], np.int64) for e in entries])
    if launch.lock_bytes:
        keep = ~((cols["kind"] == ATOMIC) & np.isin(cols["addr"], np.fromiter(launch.lock_bytes, np.uint64)))
        cols = {k: v[keep] for k, v in cols.items()}
    order = np.lexsort((cols["op"], cols["lock"], cols["kind"], cols["prog"], cols["addr"]))
    cols = {k: v[order] for k, v in cols.items()}
    first = np.ones(cols["addr"].size, dtype=bool)
    first[1:] = np.any([v[1:] != v[:-1] for v in cols.values()], axis=0) if cols["addr"].size > 1 else True
    return {k: v[first] for k, v in cols.items()}


def _groups(addr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first index of each address's run, the run each element belongs to)."""
    new = np.r_[True, addr[1:] != addr[:-1]]
    return np.flatnonzero(new), np.cumsum(new) - 1


def _protected(launch: _Launch, c: dict[str, np.ndarray], starts: np.ndarray, gid: np.ndarray) -> np.ndarray:
    """Per address: every access to it was made holding one common lock."""
    lo, hi = np.minimum.reduceat(c["lock"], starts), np.maximum.reduceat(c["lock"], starts)
    protected = (lo == hi) & (lo > 0)
    mixed = np.flatnonzero((lo > 0) & (lo != hi))
    if mixed.size:
        sets = {i: s for s, i in launch.locksets.items()}
        for g in mixed[:4096]:  # held locks that differ but overlap (nested locks): rare
            ids = np.unique(c["lock"][gid == g])
            protected[g] = bool(frozenset.intersection(*(sets[int(i)] for i in ids)))
    return protected


def _check_races(launch: _Launch) -> None:
    c = _pairs(launch)
    if not c:
        return
    starts, gid = _groups(c["addr"])
    shared = np.minimum.reduceat(c["prog"], starts) != np.maximum.reduceat(c["prog"], starts)
    if not shared.any():
        return
    c = {k: v[shared[gid]] for k, v in c.items()}
    starts, gid = _groups(c["addr"])
    open_ = ~_protected(launch, c, starts, gid)
    prog, kind, big = c["prog"], c["kind"], np.iinfo(np.int64).max

    def span(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.minimum.reduceat(np.where(mask, prog, big), starts), np.maximum.reduceat(np.where(mask, prog, -1),
                                                                                            starts)

    def other_than(mask: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Per address: an access of `mask` by a program other than the ones in [lo, hi] (hi >= 0: any at all)."""
        hit = mask & (hi[gid] >= 0) & ((prog != lo[gid]) | (prog != hi[gid]))
        return np.maximum.reduceat(hit.astype(np.int8), starts) > 0

    reads, writes, atomics = kind == READ, kind == WRITE, kind == ATOMIC
    wlo, whi = span(writes)
    alo, ahi = span(atomics)
    ops = np.where(atomics, c["op"], big)
    olo, ohi = np.minimum.reduceat(ops, starts), np.maximum.reduceat(np.where(atomics, c["op"], -1), starts)
    findings = {
        "write-write": (whi >= 0) & (wlo != whi),
        "read-write": other_than(reads, wlo, whi),
        "atomic vs plain write": other_than(atomics, wlo, whi),
        "atomic vs plain read": other_than(reads, alo, ahi),
        "atomics that do not commute (exchange, compare-and-swap, or different operations)":
            (ahi >= 0) & (alo != ahi) & ((olo != ohi) | np.isin(olo, ORDERED_OPS)),
    }
    lo, hi = np.minimum.reduceat(prog, starts), np.maximum.reduceat(prog, starts)
    for what, found in findings.items():
        hit = found & open_
        if hit.any() and len(REPORT.races) < MAX_FINDINGS:
            g = int(np.flatnonzero(hit)[0])
            _found("race", f"{launch.kernel}: {what} at {int(hit.sum())} byte(s); e.g. "
                           f"{_where(launch, int(c['addr'][starts[g]]))} by programs "
                           f"{_program_name(launch, int(lo[g]))} and {_program_name(launch, int(hi[g]))}")


def _bf16_as_fp32(handle: Any) -> Any:
    """The interpreter keeps bfloat16 as its uint16 bits; widening them is exact."""
    import triton.language as tl

    return type(handle)((handle.data.astype(np.uint32) << 16).view(np.float32), tl.float32)


def _checked_dot(dot: Callable[..., Any], ieee: Any) -> Callable[..., Any]:
    """tl.dot as a GPU computes it, where the interpreter can, and flagged where it cannot.

    Triton's interpreter multiplies the raw bits of bfloat16 operands (triton-lang/triton#11584, unsupported
    upstream), so every bf16 matmul kernel would fail verification here. Products of bf16 values are exact in fp32
    and a GPU accumulates them in fp32, which is what this computes. Float32 operands it multiplies in full float32
    whatever `input_precision` says; a GPU rounds them to TF32 unless it is IEEE, so such a dot is a `precision`
    finding (once per kernel)."""

    def create_dot(self, a, b, d, input_precision, *rest):
        launch = _state["launch"]
        if str(a.dtype) == str(b.dtype) == "fp32" and input_precision != ieee and launch is not None \
                and launch.kernel not in _state["imprecise"] and len(REPORT.precision) < MAX_FINDINGS:
            _state["imprecise"].add(launch.kernel)
            name = str(getattr(input_precision, "name", input_precision)).upper()
            _found("precision", f"{launch.kernel}: tl.dot on float32 operands at {name} precision, which a GPU "
                                "computes with inputs rounded to 10 mantissa bits (this interpreter multiplies in "
                                "full float32): its float32 results there miss float32's tolerance; pass "
                                "input_precision=\"ieee\" to tl.dot")
        if str(a.dtype) == str(b.dtype) == "bf16":
            a, b = _bf16_as_fp32(a), _bf16_as_fp32(b)
        return dot(self, a, b, d, input_precision, *rest)

    return create_dot


def _elementwise(op: Callable[..., Any]) -> Callable[..., Any]:
    """A libdevice function for the interpreter: numpy on the arguments' data, in the first tensor's dtype."""

    def fn(*args: Any, **_: Any) -> Any:
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        first = next(a for a in args if isinstance(a, tl.tensor))
        data = [a.handle.data if isinstance(a, tl.tensor) else a for a in args]
        with np.errstate(all="ignore"):
            out = np.asarray(op(*data))
        if out.dtype != np.bool_:
            out = out.astype(first.handle.data.dtype)
            return tl.tensor(TensorHandle(out, first.handle.dtype.scalar), first.type)
        return tl.tensor(TensorHandle(out, tl.int1), tl.block_type(tl.int1, first.shape) if first.shape else tl.int1)

    return fn


def _interpretable_libdevice() -> None:
    import triton.language.extra.libdevice as libdevice

    for name, op in LIBDEVICE.items():
        if hasattr(libdevice, name):
            stand_in = _elementwise(op)
            _STAND_INS[id(stand_in)] = getattr(libdevice, name)
            setattr(libdevice, name, stand_in)


def _snapshot_language() -> None:
    """What Triton's language namespaces hold before the interpreter patches them: its launches restore what they
    patch, but a @triton.jit helper of the language's own (tl.zeros, called from a kernel) patches triton.language.core
    for good, and libdevice holds stand-ins here. Triton's compiler needs the originals (_pristine_language)."""
    import triton.language as tl
    import triton.language.extra.libdevice as libdevice

    for namespace in (tl, tl.core, tl.math, tl.core.tensor, tl.core.dtype, tl.core.tensor_descriptor_base, libdevice):
        _PRISTINE.append((namespace, dict(vars(namespace))))


@contextlib.contextmanager
def _pristine_language() -> Iterator[None]:
    """Triton's language as it was before the interpreter patched it, for as long as the block runs."""
    changed = [(ns, name, vars(ns).get(name, _MISSING), value) for ns, attrs in _PRISTINE
               for name, value in attrs.items() if vars(ns).get(name, _MISSING) is not value]
    for ns, name, _, value in changed:
        setattr(ns, name, value)
    try:
        yield
    finally:
        for ns, name, now, _ in changed:
            if now is _MISSING:
                delattr(ns, name)
            else:
                setattr(ns, name, now)


def _gate(executor: Any, named: dict[str, Any], options: dict[str, Any], target: str, sink: Sink | None) -> None:
    """The launched kernel compiled for `target` (compile_gate), once per specialization and at most
    MAX_SPECIALIZATIONS times per kernel, with Triton's language as it was before the interpreter patched it."""
    from triton.runtime import interpreter as interp

    from kernelbot.agent.verify import compile_gate

    fn = next((orig for orig, done in interp.InterpretedFunction.rewritten_fn.items() if done is executor.fn), None)
    if fn is None:
        return
    key = (id(fn), tuple((n, v if n in executor.constexprs or v is None else str(getattr(v, "dtype", type(v))))
                         for n, v in named.items()), tuple(sorted(options.items())))
    built = _state["built"].setdefault(id(fn), set())
    if key in built or len(built) >= compile_gate.MAX_SPECIALIZATIONS:
        return
    built.add(key)
    with _pristine_language():
        build = compile_gate.compile_launch(fn, named, options, target, _STAND_INS)
    REPORT.builds.append(build.model_dump(mode="json"))
    if sink is not None:
        sink("triton_build", {"build": build.model_dump(mode="json")})


def install(sink: Sink | None = None) -> None:
    """Instrument the interpreter. Call before any candidate code is imported; TRITON_INTERPRET must be 1.
    `sink(kind, data)` receives each launch and finding as it happens.

    Refused without the interpreter: on a GPU the compiler must find libdevice's own builtins, which
    install() replaces with numpy functions (there compute-sanitizer checks bounds and races)."""
    import inspect
    import os

    from kernelbot import KernelbotError
    from kernelbot.agent.verify.compile_gate import TARGET_ENV

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise KernelbotError("triton_check.install: TRITON_INTERPRET is not 1; the interpreter checks are for CPU "
                             "verification (a GPU's Triton kernels are checked with compute-sanitizer)")

    from triton._C.libtriton import ir
    from triton.runtime import interpreter as interp

    global _sink
    _sink = sink
    float_add, exchange = ir.ATOMIC_OP.FADD, ir.ATOMIC_OP.XCHG
    target = os.environ.get(TARGET_ENV)  # each launch is compiled for this GPU target too (compile_gate)
    if target:
        _snapshot_language()
    _interpretable_libdevice()

    builder_cls = interp.InterpreterBuilder
    load, store = builder_cls.create_masked_load, builder_cls.create_masked_store
    rmw, cas = builder_cls.create_atomic_rmw, builder_cls.create_atomic_cas

    def masked_load(self, ptrs, mask, other, *rest):
        return load(self, ptrs, _record(ptrs, mask, READ), other, *rest)

    def masked_store(self, ptrs, value, mask, *rest):
        return store(self, ptrs, value, _record(ptrs, mask, WRITE), *rest)

    def atomic_rmw(self, op, ptr, val, mask, *rest):
        launch = _state["launch"]
        if launch is not None and op == float_add:
            launch.float_atomic_adds += 1
        out = rmw(self, op, ptr, val, _record(ptr, mask, ATOMIC, int(op)), *rest)
        if launch is not None and op == exchange and launch.held:
            _gave_back(launch, ptr)
        return out

    def atomic_cas(self, ptr, cmp, val, *rest):
        safe = _record(ptr, None, ATOMIC, CAS)  # no mask: every lane takes part
        if safe is not None and not np.all(safe):
            raise RuntimeError("atomic_cas outside every argument (recorded as out_of_bounds)")
        old = cas(self, ptr, cmp, val, *rest)
        launch = _state["launch"]
        if launch is not None:
            _took(launch, ptr, cmp, old)
        return old

    builder_cls.create_masked_load, builder_cls.create_masked_store = masked_load, masked_store
    builder_cls.create_atomic_rmw, builder_cls.create_atomic_cas = atomic_rmw, atomic_cas
    builder_cls.create_dot = _checked_dot(builder_cls.create_dot, ir.INPUT_PRECISION.IEEE)

    def call(self, *args_dev, **kwargs):
        started, wall = time.monotonic_ns(), time.time_ns()
        launched = None
        try:
            launched = run_grid(self, *args_dev, **kwargs)
        finally:
            window = (threading.get_native_id(), started, time.monotonic_ns(), wall, time.time_ns())
            del WINDOWS[:-MAX_WINDOWS]
            WINDOWS.append(window)
            if sink is not None and launched is not None:  # with its window, which the harness checks
                sink("triton_launch", {**launched, "thread": window[0], "start_ns": started, "end_ns": window[2]})

    def run_grid(self, *args_dev, **kwargs):
        # Mirrors GridExecutor.__call__ of the pinned Triton, with a recorded launch and a chosen program order.
        argspec = inspect.getfullargspec(self.fn)
        options = {k: v for k, v in kwargs.items() if k not in argspec.args}  # num_warps, num_stages...
        kwargs = {k: v for k, v in kwargs.items() if k in argspec.args}
        args_hst, kwargs_hst = self._init_args_hst(args_dev, kwargs)
        for hook in self.pre_run_hooks:
            hook(*args_hst, **kwargs_hst)
        if target:
            _gate(self, inspect.getcallargs(self.fn, *args_hst, **kwargs_hst), options, target, sink)
        patch_scope = interp._patch_lang(self.fn)
        try:
            named = inspect.getcallargs(self.fn, *args_hst, **kwargs_hst)
            spans = []
            for name, value in named.items():
                span = _tensor_span(getattr(value, "base", value))
                if span:
                    spans.append((name, *span))
            args = {n: a if n in self.constexprs else interp._implicit_cvt(a) for n, a in named.items()}
            grid = self.grid(args) if callable(self.grid) else self.grid
            grid = tuple(grid) + (1,) * (3 - len(grid))
            interp.interpreter_builder.set_grid_dim(*grid)
            launch = _Launch(kernel=self.fn.__name__, grid=grid, args=sorted(spans, key=lambda s: s[1]))
            order = order_for(launch.kernel)
            _state["launch"] = launch
            try:
                for x, y, z in _program_order(grid, order):
                    launch.program = (x * grid[1] + y) * grid[2] + z
                    launch.held.clear()
                    interp.interpreter_builder.set_grid_idx(x, y, z)
                    self.fn(**args)
            except Exception as e:
                raise interp.InterpreterError(repr(e)) from e
            finally:
                _state["launch"] = None
            _check_races(launch)
            REPORT.launches += 1
            REPORT.programs += grid[0] * grid[1] * grid[2]
            REPORT.kernels.add(launch.kernel)
            if launch.order_dependent():
                REPORT.order_dependent_kernels.add(launch.kernel)
        finally:
            patch_scope.restore()
        self._restore_args_dev(args_dev, args_hst, kwargs, kwargs_hst)
        return {"kernel": launch.kernel, "programs": grid[0] * grid[1] * grid[2], "order": order,
                "float_atomic_adds": launch.float_atomic_adds, "locked_writes": launch.locked_writes}

    interp.GridExecutor.__call__ = call


def sealed_attributes() -> dict[str, tuple[Any, str]]:
    """The interpreter attributes install() replaced: the harness checks they stay replaced."""
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    names = ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas", "create_dot")
    return {"triton.GridExecutor.__call__": (interp.GridExecutor, "__call__"),
            **{f"triton.InterpreterBuilder.{n}": (builder, n) for n in names}}
