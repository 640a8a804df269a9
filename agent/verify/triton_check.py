"""Race and bounds checking for Triton kernels on any machine, through Triton's CPU interpreter.

Installed in the sandboxed child before the candidate is imported. Every load, store and atomic the
interpreter executes is recorded per program of the launch, as addresses; the launch's tensor arguments
give the address ranges it may touch. After the launch:
- `out_of_bounds`: an access (masked-off lanes excluded) outside every argument tensor's extent. Such lanes
  are masked off before the interpreter performs them, so the run goes on instead of reading wild memory.
- `race`: an address that one program writes and another program reads or writes, unless both accesses are
  atomics.
The grid can also be run in reversed or shuffled program order (`set_order`), so results that depend on the
order programs run in show up as differing bits. Float atomic adds (`tl.atomic_add` on floats, split
reductions) are counted per launch: they make results depend on program order legitimately (fp32 sums are
not associative), which the verifier reports as a property instead of a race.

`triton.language.extra.libdevice` is only stubs until a GPU backend compiles the kernel, so the interpreter
cannot run kernels that import from it (Liger-Kernel's RMSNorm takes `rsqrt` from there): install() gives the
common ones numpy implementations, elementwise, in the kernel's dtype.

With a `sink` (the runner's channel to the harness), every launch and every finding is handed over the
moment it is made, so a candidate that clears REPORT afterwards takes nothing back; each launch also says
which program order it actually ran in.
"""

from __future__ import annotations

import random
from collections.abc import Callable
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


@dataclass
class _Launch:
    kernel: str
    grid: tuple[int, int, int]
    args: list[tuple[str, int, int]]  # (name, first byte, end byte), sorted by first byte
    program: int = 0
    accesses: dict[str, list[tuple[np.ndarray, int]]] = field(
        default_factory=lambda: {"read": [], "write": [], "atomic": []})
    float_atomic_adds: int = 0


@dataclass
class TritonReport:
    launches: int = 0
    programs: int = 0
    kernels: set[str] = field(default_factory=set)
    out_of_bounds: list[str] = field(default_factory=list)
    races: list[str] = field(default_factory=list)
    float_atomic_kernels: set[str] = field(default_factory=set)  # kernels whose results may depend on order

    def as_dict(self) -> dict[str, Any]:
        return {"launches": self.launches, "programs": self.programs, "kernels": sorted(self.kernels),
                "out_of_bounds": self.out_of_bounds, "races": self.races,
                "float_atomic_kernels": sorted(self.float_atomic_kernels)}


REPORT = TritonReport()
_state: dict[str, Any] = {"launch": None, "order": "natural", "seed": 0}
Sink = Callable[[str, dict[str, Any]], None]
_sink: Sink | None = None  # a module-level callable: the runner's seal notices if it is swapped out


def set_order(order: str, seed: int = 0) -> None:
    """Program order for the following launches: natural, reversed or shuffled."""
    _state["order"], _state["seed"] = order, seed


def _program_order(grid: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    programs = [(x, y, z) for x in range(grid[0]) for y in range(grid[1]) for z in range(grid[2])]
    if _state["order"] == "reversed":
        programs.reverse()
    elif _state["order"] == "shuffled":
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
    (REPORT.out_of_bounds if kind == "out_of_bounds" else REPORT.races).append(text)
    if _sink is not None:
        _sink("triton_finding", {"kind": kind, "text": text})


def _record(ptrs: Any, mask: Any, kind: str) -> Any:
    """Check and record one memory operation; returns the mask with out-of-bounds lanes switched off."""
    launch: _Launch | None = _state["launch"]
    if launch is None:
        return mask
    addrs = np.asarray(ptrs.data, dtype=np.uint64)
    active = np.ones(addrs.shape, dtype=bool) if mask is None else np.broadcast_to(mask.data, addrs.shape)
    nbytes = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
    live = addrs[active]
    inside = _check_bounds(launch, live, nbytes, kind)
    byte_addrs = (live[inside][:, None] + np.arange(nbytes, dtype=np.uint64)).ravel()
    launch.accesses[kind].append((byte_addrs, launch.program))
    if inside.all():
        return mask
    safe = active.copy()
    safe[active] = inside
    return type(mask)(safe, mask.dtype) if mask is not None else safe


def _pairs(entries: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Unique (address, program) pairs, sorted by address."""
    if not entries:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    addrs = np.concatenate([a for a, _ in entries])
    progs = np.concatenate([np.full(a.size, p, np.int64) for a, p in entries])
    order = np.lexsort((progs, addrs))
    addrs, progs = addrs[order], progs[order]
    keep = np.ones(addrs.size, dtype=bool)
    keep[1:] = (addrs[1:] != addrs[:-1]) | (progs[1:] != progs[:-1])
    return addrs[keep], progs[keep]


def _owners(addrs: np.ndarray, progs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct address: lowest and highest program touching it."""
    if addrs.size == 0:
        return addrs, progs, progs
    starts = np.flatnonzero(np.r_[True, addrs[1:] != addrs[:-1]])
    return addrs[starts], np.minimum.reduceat(progs, starts), np.maximum.reduceat(progs, starts)


def _conflict(launch: _Launch, what: str, owners: tuple, addrs: np.ndarray, progs: np.ndarray) -> None:
    """Accesses (addrs, progs) to addresses that `owners` touched from another program."""
    keys, lo, hi = owners
    if keys.size == 0 or addrs.size == 0 or len(REPORT.races) >= MAX_FINDINGS:
        return
    idx = np.clip(np.searchsorted(keys, addrs), 0, keys.size - 1)
    hit = (keys[idx] == addrs) & ((lo[idx] != progs) | (hi[idx] != progs))
    if hit.any():
        first = int(np.flatnonzero(hit)[0])
        other = int(lo[idx[first]] if lo[idx[first]] != progs[first] else hi[idx[first]])
        _found("race", f"{launch.kernel}: {what} at {int(hit.sum())} byte(s); e.g. "
                       f"{_where(launch, int(addrs[first]))} by programs {_program_name(launch, other)} and "
                       f"{_program_name(launch, int(progs[first]))}")


def _check_races(launch: _Launch) -> None:
    reads, writes, atomics = (_pairs(launch.accesses[k]) for k in ("read", "write", "atomic"))
    write_owners = _owners(*writes)
    keys, lo, hi = write_owners
    multi = lo != hi
    if multi.any() and len(REPORT.races) < MAX_FINDINGS:
        i = int(np.flatnonzero(multi)[0])
        _found("race", f"{launch.kernel}: write-write at {int(multi.sum())} byte(s); e.g. "
                       f"{_where(launch, int(keys[i]))} by programs {_program_name(launch, int(lo[i]))} "
                       f"and {_program_name(launch, int(hi[i]))}")
    _conflict(launch, "read-write", write_owners, *reads)
    atomic_owners = _owners(*atomics)
    _conflict(launch, "atomic vs plain write", atomic_owners, *writes)
    _conflict(launch, "atomic vs plain read", atomic_owners, *reads)


def _bf16_as_fp32(handle: Any) -> Any:
    """The interpreter keeps bfloat16 as its uint16 bits; widening them is exact."""
    import triton.language as tl

    return type(handle)((handle.data.astype(np.uint32) << 16).view(np.float32), tl.float32)


def _dot_with_bf16(dot: Callable[..., Any]) -> Callable[..., Any]:
    """Triton's interpreter multiplies the raw bits of bfloat16 operands in tl.dot (triton-lang/triton#11584,
    unsupported upstream), so every bf16 matmul kernel would fail verification here. Products of bf16 values are
    exact in fp32 and a GPU accumulates them in fp32, which is what this computes."""

    def create_dot(self, a, b, d, *rest):
        if str(a.dtype) == str(b.dtype) == "bf16":
            a, b = _bf16_as_fp32(a), _bf16_as_fp32(b)
        return dot(self, a, b, d, *rest)

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
            setattr(libdevice, name, _elementwise(op))


def install(sink: Sink | None = None) -> None:
    """Instrument the interpreter. Call before any candidate code is imported; TRITON_INTERPRET must be 1.
    `sink(kind, data)` receives each launch and finding as it happens.

    Refused without the interpreter: on a GPU the compiler must find libdevice's own builtins, which
    install() replaces with numpy functions (there compute-sanitizer checks bounds and races)."""
    import inspect
    import os

    from kernelbot import KernelbotError

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise KernelbotError("triton_check.install: TRITON_INTERPRET is not 1; the interpreter checks are for CPU "
                             "verification (a GPU's Triton kernels are checked with compute-sanitizer)")

    from triton._C.libtriton import ir
    from triton.runtime import interpreter as interp

    global _sink
    _sink = sink
    float_add = ir.ATOMIC_OP.FADD
    _interpretable_libdevice()

    builder_cls = interp.InterpreterBuilder
    load, store = builder_cls.create_masked_load, builder_cls.create_masked_store
    rmw, cas = builder_cls.create_atomic_rmw, builder_cls.create_atomic_cas

    def masked_load(self, ptrs, mask, other, *rest):
        return load(self, ptrs, _record(ptrs, mask, "read"), other, *rest)

    def masked_store(self, ptrs, value, mask, *rest):
        return store(self, ptrs, value, _record(ptrs, mask, "write"), *rest)

    def atomic_rmw(self, op, ptr, val, mask, *rest):
        launch = _state["launch"]
        if launch is not None and op == float_add:
            launch.float_atomic_adds += 1
        return rmw(self, op, ptr, val, _record(ptr, mask, "atomic"), *rest)

    def atomic_cas(self, ptr, cmp, val, *rest):
        mask = _record(ptr, None, "atomic")
        if not np.all(mask):
            raise RuntimeError("atomic_cas outside every argument (recorded as out_of_bounds)")
        return cas(self, ptr, cmp, val, *rest)

    builder_cls.create_masked_load, builder_cls.create_masked_store = masked_load, masked_store
    builder_cls.create_atomic_rmw, builder_cls.create_atomic_cas = atomic_rmw, atomic_cas
    builder_cls.create_dot = _dot_with_bf16(builder_cls.create_dot)

    def call(self, *args_dev, **kwargs):
        # Mirrors GridExecutor.__call__ of the pinned Triton, with a recorded launch and a chosen program order.
        argspec = inspect.getfullargspec(self.fn)
        kwargs = {k: v for k, v in kwargs.items() if k in argspec.args}
        args_hst, kwargs_hst = self._init_args_hst(args_dev, kwargs)
        for hook in self.pre_run_hooks:
            hook(*args_hst, **kwargs_hst)
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
            _state["launch"] = launch
            try:
                for x, y, z in _program_order(grid):
                    launch.program = (x * grid[1] + y) * grid[2] + z
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
            if launch.float_atomic_adds:
                REPORT.float_atomic_kernels.add(launch.kernel)
            if sink is not None:
                sink("triton_launch", {"kernel": launch.kernel, "programs": grid[0] * grid[1] * grid[2],
                                       "order": _state["order"], "float_atomic_adds": launch.float_atomic_adds})
        finally:
            patch_scope.restore()
        self._restore_args_dev(args_dev, args_hst, kwargs, kwargs_hst)

    interp.GridExecutor.__call__ = call


def sealed_attributes() -> dict[str, tuple[Any, str]]:
    """The interpreter attributes install() replaced: the harness checks they stay replaced."""
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    names = ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas", "create_dot")
    return {"triton.GridExecutor.__call__": (interp.GridExecutor, "__call__"),
            **{f"triton.InterpreterBuilder.{n}": (builder, n) for n in names}}
