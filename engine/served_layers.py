"""A served engine's layers and a kernel pack, inside the engine's own processes: shared by the vLLM and SGLang
plugins, each of which installs it through its engine's seams (engine/vllm_plugin.py, engine/sglang_plugin.py).

Two jobs, per call of a layer the engine's table names (`LayerSpec`: which family's kernel stands in for which
layer class, and how a call maps onto the kernel's inputs):
- capture (KERNELBOT_CAPTURE_DIR): what the engine really runs — each layer variant's family, constructor arguments,
  dtype and the row counts continuous batching produced — and whether the family's reference gives the layer's own
  outputs on a live call (the engine's own forward is the judge). kernelbot makes its tasks from these records.
- route (KERNELBOT_PACK_DIR): a call goes to a pack kernel only for a layer variant, shape, dtype and device the
  kernel was verified on; everything else runs the engine's own path and is counted as a fallback, with the reason.
Layers no family covers (`generic_spec`) are captured and routed the same way by engine/served_generic.py.

Every process writes what it saw to `<counts dir>/counts-pid<P>.json` (a `PluginReport`), read back by
`read_reports`. Nothing here imports the profiler or pandas: it runs in every worker of the engine.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import statistics
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernelbot.engine.served_generic import GenericLayers, native_params, plain_call
from kernelbot.kernel_library.base import GENERIC, dtype_name, hot_path
from kernelbot.records import KERNEL_LABEL, KernelCalls, LayerCapture, Pack, PackEntry, PluginReport

PACK_ENV = "KERNELBOT_PACK_DIR"
COUNTS_ENV = "KERNELBOT_COUNTS_DIR"
CAPTURE_ENV = "KERNELBOT_CAPTURE_DIR"
MAX_ROW_BUCKETS = 32  # distinct row counts kept per captured variant
PROBE_CALLS = 16  # timed calls of a kernel, and as many of the engine's own path, in a process
PROBE_AFTER = 64  # ... once it has taken this many (an engine's first calls of a shape build and cache its kernels)
PROBE_EVERY = 8  # ... one call in this many, so the samples span the batches continuous batching makes
FLUSH_S = 0.5  # the counters reach their file within this long of changing (kernelbot waits more before a stop)


def _default_state(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(layer.named_parameters()), **dict(layer.named_buffers())}


@dataclass(frozen=True)
class LayerSpec:
    """How one family's kernel stands in for one variant of an engine layer class."""

    family: str
    params: tuple[str, ...]  # the hooked method's parameters in order (the call is matched by these names)
    inputs: Callable[[dict[str, Any]], list[torch.Tensor]]  # the kernel's inputs, from the call
    run: Callable[[Callable[..., Any], dict[str, Any]], Any]  # the call through the kernel's forward
    variant: Callable[[torch.nn.Module, dict[str, Any], str], str] = lambda layer, call, dtype: ""  # why not ("")
    accepts: Callable[[dict[str, Any]], bool] = lambda call: True  # is the call this variant (e.g. a residual given)?
    main: int = 0  # the input whose rows (leading dims) change with the batch
    init_args: Callable[[torch.nn.Module], list[Any]] | None = None  # default: the family's own
    state: Callable[[torch.nn.Module], dict[str, torch.Tensor]] = _default_state  # the tensors a kernel loads
    # outputs of the engine's own call to compare with the family's reference (default: the call's result)
    outputs: Callable[[Any, dict[str, Any]], list[torch.Tensor]] | None = None
    # the module a trace shows around the call, when it is not the hooked layer (an attention backend's impl)
    traced_as: Callable[[torch.nn.Module, dict[str, Any]], str] | None = None
    # the call's tensors the engine's own path may write (None: any of them); a check of the engine's output runs it
    # on copies of these
    written: tuple[str, ...] | None = None
    # what of a layer's own state can change its route between calls (SGLang toggles torch.compile on its layers)
    mutable: Callable[[torch.nn.Module], Any] = lambda layer: None
    # whether the arguments' shapes and dtypes settle a call's route (not so for an attention, whose rows and context
    # are in its metadata): then a settled route is reused by signature (Router.handle's fast path)
    settles: bool = True

    def layer_args(self, layer: torch.nn.Module) -> list[Any]:
        if self.init_args is not None:
            return self.init_args(layer)
        from kernelbot.kernel_library import FAMILIES

        return FAMILIES[self.family].init_args(layer)


def generic_spec(cls: type, **engine: Any) -> LayerSpec | None:
    """How a generic kernel stands in for a layer class no family covers (engine/served_generic.py): any call of
    tensors and None, matched to a kernel by the layer's attributes and the call's exact signature; None for a
    class whose native forward takes *args or **kwargs. `engine`: the engine's own LayerSpec fields (variant,
    mutable)."""
    params = native_params(cls)
    if params is None:
        return None
    return LayerSpec(GENERIC, params, inputs=lambda c: [v for p in params if isinstance(v := c.get(p), torch.Tensor)],
                     run=lambda k, c: k(c), accepts=plain_call, **engine)


def named(params: tuple[str, ...], args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """The call's arguments by name, or None for a call that does not fit the signature."""
    if len(args) > len(params) or set(kwargs) - set(params[len(args):]):
        return None
    return dict(zip(params, args, strict=False)) | kwargs


def call_rows(family: str, shapes: list[list[int]], main: int) -> int:
    """A call's rows: the product of its main input's free dims (tokens, or batch × tokens), which change with the
    batch; a kernel takes calls of at most the rows it was verified at."""
    from kernelbot.kernel_library import FAMILIES

    n = 1
    for d in FAMILIES[family].free_dims(shapes)[main]:
        n *= shapes[main][d]
    return n


def widest(a: list[list[int]], b: list[list[int]]) -> list[list[int]]:
    """Each input's dims, the larger of two calls' (a block table as wide as the longest context seen)."""
    return [[max(x, y) for x, y in zip(sa, sb, strict=True)] for sa, sb in zip(a, b, strict=True)]


def fixed_dims(family: str, shapes: list[list[int]]) -> list[list[int]]:
    """Each input's dims with those that change between calls (the family's free dims: tokens, batch) left out: a
    [batch, tokens, hidden] call and a [tokens, hidden] one are the same call to a kernel that takes rows."""
    from kernelbot.kernel_library import FAMILIES

    free = FAMILIES[family].free_dims(shapes)
    return [[d for i, d in enumerate(s) if i not in f] for s, f in zip(shapes, free, strict=True)]


def device_ok(backend: str, x: torch.Tensor) -> bool:
    if backend == "cpp":
        return x.device.type == "cpu"
    if backend == "triton":
        return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    return x.is_cuda


@dataclass
class _Calls:
    """A kernel's counters in this process (KernelCalls when written: plain fields here, on the hot path)."""

    calls: int = 0
    timed: int = 0
    kernel_us: float | None = None
    engine_us: float | None = None
    disabled: str = ""

    def record(self) -> KernelCalls:
        return KernelCalls(calls=self.calls, timed=self.timed, kernel_us=self.kernel_us, engine_us=self.engine_us,
                           disabled=self.disabled)


@dataclass
class _Fast:
    """A layer's settled route for one call signature: the kernel's run and its counters."""

    spec: LayerSpec
    run: Callable[..., Any]
    calls: _Calls


@dataclass
class _LayerState:
    """What the router keeps per live layer (a layer's variant is fixed once built)."""

    decisions: dict[tuple, tuple[PackEntry | None, str]] = field(default_factory=dict)  # call key → route
    args: dict[str, list[Any]] = field(default_factory=dict)  # family → the layer's constructor arguments
    kernels: dict[str, Callable[..., Any]] = field(default_factory=dict)  # candidate id → its hot path here
    probed: dict[str, str] = field(default_factory=dict)  # candidate id → why its output differs here, or ""
    fast: dict[tuple, _Fast] = field(default_factory=dict)  # call signature → its settled route (handle's fast path)


@dataclass
class _Variant:
    """What capture gathers for one (layer class, family, arguments, dtype, fixed dims)."""

    record: LayerCapture
    checked: bool = False


@dataclass
class Router:
    """One engine process's view of the pack and of what its layers run."""

    engine: str
    pack_dir: Path | None
    counts_dir: Path | None
    capturing: bool
    run_id: str = ""
    routes: dict[tuple[str, str], list[PackEntry]] = field(default_factory=dict)  # (layer class, family) → entries
    custom: dict[str, _Calls] = field(default_factory=dict)  # candidate id → calls
    fallback: dict[str, dict[str, int]] = field(default_factory=dict)  # layer class → reason → calls
    unrouted: list[dict[str, str]] = field(default_factory=list)
    hooked: list[str] = field(default_factory=list)
    layers: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)  # layer → _LayerState
    variants: dict[str, _Variant] = field(default_factory=dict)
    timings: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)  # candidate → (engine, kernel)
    generic: GenericLayers = field(default_factory=lambda: GenericLayers(""))  # layers no family covers
    dirty: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def report(self) -> PluginReport:
        return PluginReport(pid=os.getpid(), rank=_rank(), engine=self.engine, run_id=self.run_id,
                            pack_dir=str(self.pack_dir or ""), hooked=self.hooked,
                            custom={cid: c.record() for cid, c in self.custom.items()},
                            fallback=self.fallback, unrouted=self.unrouted,
                            captures=[v.record for v in self.variants.values()], generic=self.generic.records())

    def write(self, force: bool = False) -> None:
        """The counters to this process's file: now when `force`, else by the flusher within FLUSH_S (an engine may
        end its workers without running exit handlers, so nothing waits for the end)."""
        if self.counts_dir is None:
            return
        if not force:
            self.dirty = True
            return
        with self.lock:
            self.dirty = False
            self.counts_dir.mkdir(parents=True, exist_ok=True)
            path = self.counts_dir / f"counts-pid{os.getpid()}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(self.report().model_dump_json(indent=1))
            os.replace(tmp, path)

    def flusher(self) -> None:
        """Writes the counters every FLUSH_S while they change (a daemon thread of the engine's process)."""
        while True:
            time.sleep(FLUSH_S)
            if self.dirty:
                try:
                    self.write(force=True)
                except RuntimeError:  # a counter dict grew while it was copied: the next tick writes it
                    self.dirty = True

    # -- routing -----------------------------------------------------------------------------------------------
    def handle(self, specs: list[LayerSpec], layer: torch.nn.Module, original: Callable[..., Any], args: tuple,
               kwargs: dict) -> Any:
        """One call of a hooked layer: to a pack kernel when one was verified for it, else the engine's own path;
        captured on the way when capturing. A call whose signature this layer has settled (routed, probed and timed)
        takes the fast path: one lookup, then the kernel."""
        state = self.layers.get(layer)
        if state is not None and state.fast and not self.capturing and not torch.autograd._profiler_enabled():
            fast = state.fast.get(_signature(specs[0], layer, args, kwargs))
            if fast is not None and not fast.calls.disabled:
                fast.calls.calls += 1
                self.dirty = True
                return fast.spec.run(fast.run, named(fast.spec.params, args, kwargs))
        spec, call = _spec_for(specs, args, kwargs)
        if spec is None or call is None:
            self._fallback(layer, "signature")
            return original(*args, **kwargs)
        x = spec.inputs(call)[spec.main] if self.routes or self.capturing else None
        entry, reason = self._decide(spec, layer, call, x) if self.routes else (None, "")
        if entry is None:
            if self.routes:
                self._fallback(layer, reason)
            if self.capturing:
                return self._capture(spec, layer, call, original, args, kwargs)
            return original(*args, **kwargs)
        run = self._kernel(entry, spec, layer)
        counts = self.custom[entry.candidate_id]
        if counts.disabled:
            self._fallback(layer, counts.disabled)
            return original(*args, **kwargs)
        if entry.candidate_id not in self._of(layer).probed:
            return self._probe(spec, layer, call, entry, run, original, args, kwargs, timed=False)
        timing = counts.timed < PROBE_CALLS
        if timing and counts.calls >= PROBE_AFTER and counts.calls % PROBE_EVERY == 0:
            return self._probe(spec, layer, call, entry, run, original, args, kwargs, timed=True)
        self._counted(entry)
        if spec.settles and not timing:
            self._of(layer).fast[_signature(specs[0], layer, args, kwargs)] = _Fast(spec, run, counts)
        if self.capturing and spec.family != GENERIC:
            self._count(spec, layer, call, reason="")
        if not torch.autograd._profiler_enabled():
            return spec.run(run, call)
        shapes = [list(t.shape) for t in spec.inputs(call)]
        with torch.profiler.record_function(f"{KERNEL_LABEL}{entry.candidate_id} {entry.dtype} {json.dumps(shapes)}"):
            return spec.run(run, call)

    def _counted(self, entry: PackEntry) -> None:
        counts = self.custom[entry.candidate_id]
        counts.calls += 1
        self.write(force=counts.calls == 1)

    def _probe(self, spec: LayerSpec, layer: torch.nn.Module, call: dict[str, Any], entry: PackEntry,
               run: Callable[..., Any], original: Callable[..., Any], args: tuple, kwargs: dict, *,
               timed: bool) -> Any:
        """The engine's own path beside the kernel, on copies of what it writes. On a layer's first call: a layer
        whose own output the kernel does not give (numerics its class and arguments do not show) keeps the engine's
        path. `timed` (PROBE_CALLS calls of each path spread out once the kernel has warmed, PROBE_EVERY apart): the
        op the kernel replaces benchmarked where it runs. Only the path that runs first is timed, in the cache the
        model's previous ops left (the second would find the weights the first just read), the order alternating
        between calls; a kernel slower there than the engine's own path stops taking calls."""
        copies = {k: v.clone() for k, v in call.items() if isinstance(v, torch.Tensor)
                  and (spec.written is None or k in spec.written)}
        own_call = {**call, **copies}
        engine_times, kernel_times = self.timings.setdefault(entry.candidate_id, ([], []))
        kernel_first = len(kernel_times) < len(engine_times)

        def engine_path() -> Any:
            return original(*[own_call[p] for p in spec.params[:len(args)]], **{k: own_call[k] for k in kwargs})

        if not kernel_first:
            own, engine_s = _timed("engine", engine_path)
        result, kernel_s = _timed("kernel", lambda: spec.run(run, call))
        if kernel_first:
            own, engine_s = _timed("engine", engine_path)
        state = self._of(layer)
        if entry.candidate_id not in state.probed:
            want = spec.outputs(own, own_call) if spec.outputs is not None else _tensors(own)
            got = spec.outputs(result, call) if spec.outputs is not None else _tensors(result)
            state.probed[entry.candidate_id] = why = _differs(want, got)
            if why:
                state.decisions.clear()
                self._fallback(layer, f"the kernel's output differs from this layer's own on its first call ({why})")
                return original(*args, **kwargs)
        if timed:
            (kernel_times if kernel_first else engine_times).append((kernel_s if kernel_first else engine_s) * 1e6)
            self._timed_call(entry)
        self._counted(entry)
        return result

    def _timed_call(self, entry: PackEntry) -> None:
        counts = self.custom[entry.candidate_id]
        engine, kernel = self.timings[entry.candidate_id]
        counts.timed = min(len(engine), len(kernel))
        if not counts.timed:
            return
        counts.engine_us, counts.kernel_us = round(statistics.median(engine), 2), round(statistics.median(kernel), 2)
        if counts.timed >= PROBE_CALLS and counts.kernel_us > counts.engine_us:
            counts.disabled = (f"slower in the engine than its own path ({counts.kernel_us:.1f} vs "
                               f"{counts.engine_us:.1f} µs a call, medians of {counts.timed})")
            self.write(force=True)

    def _decide(self, spec: LayerSpec, layer: torch.nn.Module, call: dict[str, Any],
                x: torch.Tensor | None) -> tuple[PackEntry | None, str]:
        if not isinstance(x, torch.Tensor):
            return None, "signature"
        # a layer's variant is fixed once built, so the decision depends only on what changes between calls
        state = self._of(layer)
        key = (spec.family, x.dtype, x.device, spec.mutable(layer),
               *((v.shape, v.dtype) if isinstance(v := call.get(k), torch.Tensor) else v is not None
                 for k in spec.params))
        decision = state.decisions.get(key)
        if decision is None:
            decision = state.decisions[key] = self._route(spec, layer, call, x)
            entry = decision[0]
            if entry is not None and state.probed.get(entry.candidate_id):
                decision = state.decisions[key] = (None, "the kernel's output differs from this layer's own")
        return decision

    def _route(self, spec: LayerSpec, layer: torch.nn.Module, call: dict[str, Any],
               x: torch.Tensor) -> tuple[PackEntry | None, str]:
        """(the pack entry for this call, "") or (None, why it falls back). Row counts change with every batch: a
        kernel takes calls with at most the rows it was verified at (that shape, and fuzzed rows below it)."""
        dtype = dtype_name(x.dtype)
        reason = spec.variant(layer, call, dtype)
        if reason:
            return None, reason
        entries = self.routes.get((type(layer).__name__, spec.family))
        if not entries:
            return None, f"no {spec.family} kernel in the pack"
        if spec.family == GENERIC:
            entry, why = self.generic.route(entries, layer, spec.params, call)
            if entry is not None and not device_ok(entry.backend, x):
                return None, f"device ({entry.backend} kernel, {x.device.type} tensor)"
            return entry, why
        shapes = [list(t.shape) for t in spec.inputs(call)]
        fixed = fixed_dims(spec.family, shapes)
        args = self._args(spec, layer)
        fits = [e for e in entries if e.dtype == dtype and e.init_args == args
                and fixed_dims(spec.family, e.input_shapes) == fixed]
        if not fits:
            return None, "layer arguments, widths or dtype not in the pack"
        n = call_rows(spec.family, shapes, spec.main)
        fits = sorted((e for e in fits if call_rows(spec.family, e.input_shapes, spec.main) >= n),
                      key=lambda e: call_rows(spec.family, e.input_shapes, spec.main))
        if not fits:
            return None, "more rows than the pack's kernels were verified on"
        if not device_ok(fits[0].backend, x):
            return None, f"device ({fits[0].backend} kernel, {x.device.type} tensor)"
        return fits[0], ""

    def _args(self, spec: LayerSpec, layer: torch.nn.Module) -> list[Any]:
        args = self._of(layer).args
        if spec.family not in args:
            args[spec.family] = spec.layer_args(layer)
        return args[spec.family]

    def _kernel(self, entry: PackEntry, spec: LayerSpec, layer: torch.nn.Module) -> Callable[..., Any]:
        kernels = self._of(layer).kernels
        if entry.candidate_id not in kernels:
            from kernelbot.loading import load_module

            assert self.pack_dir is not None
            module = load_module(self.pack_dir / entry.source_file, f"kb_served_{entry.candidate_id}")
            state = spec.state(layer)
            place = next(iter(state.values()), None)
            # engines run their models in inference mode: the kernel's own weights (copies of the layer's, packed
            # once) are ordinary tensors, made outside it
            with torch.inference_mode(False):
                kernel = module.ModelNew(*entry.init_args)
                kernel.load_state_dict({name: state[name].detach().clone() for name in kernel.state_dict()})
                kernel = kernel.to(place.device if place is not None else "cpu").eval()
                run = hot_path(kernel, entry.dtype) or kernel.forward
                kernels[entry.candidate_id] = self.generic.runner(entry, spec.params, run) \
                    if entry.family == GENERIC else run
        return kernels[entry.candidate_id]

    def _of(self, layer: torch.nn.Module) -> _LayerState:
        state = self.layers.get(layer)
        if state is None:
            state = self.layers[layer] = _LayerState()
        return state

    def _fallback(self, layer: torch.nn.Module, reason: str) -> None:
        reasons = self.fallback.setdefault(type(layer).__name__, {})
        reasons[reason] = reasons.get(reason, 0) + 1
        self.write(force=reasons[reason] == 1)

    # -- capture -----------------------------------------------------------------------------------------------
    def _capture(self, spec: LayerSpec, layer: torch.nn.Module, call: dict[str, Any], original: Callable[..., Any],
                 args: tuple, kwargs: dict) -> Any:
        if spec.family == GENERIC:
            result, changed = self.generic.capture(spec.params, layer, call, lambda: original(*args, **kwargs))
            self.write(force=changed)
            return result
        variant, reason = self._count(spec, layer, call, reason=spec.variant(layer, call, _dtype_of(spec, call)))
        if variant is None or variant.checked or reason:
            return original(*args, **kwargs)
        variant.checked = True
        copies = {k: v.clone() for k, v in call.items() if isinstance(v, torch.Tensor)
                  and (spec.written is None or k in spec.written)}
        inputs = spec.inputs({**call, **copies})  # as they were before the engine's path wrote any in place
        result = original(*args, **kwargs)
        got = spec.outputs(result, call) if spec.outputs is not None else _tensors(result)
        variant.record.agrees, variant.record.why = _agrees(spec, layer, self._args(spec, layer), inputs, got)
        self.write(force=True)
        return result

    def _count(self, spec: LayerSpec, layer: torch.nn.Module, call: dict[str, Any],
               reason: str) -> tuple[_Variant | None, str]:
        inputs = spec.inputs(call)
        if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
            return None, "signature"
        x = inputs[spec.main]
        args = self._args(spec, layer)
        fixed = fixed_dims(spec.family, [list(t.shape) for t in inputs])
        key = json.dumps([type(layer).__name__, spec.family, args, dtype_name(x.dtype), fixed, reason], default=str)
        variant = self.variants.get(key)
        if variant is None:
            traced = spec.traced_as(layer, call) if spec.traced_as is not None else ""
            variant = self.variants[key] = _Variant(LayerCapture(
                engine_class=type(layer).__name__, module_class=traced, family=spec.family, init_args=args,
                dtype=dtype_name(x.dtype),
                input_shapes=[list(t.shape) for t in inputs], calls=0, rows={}, why=reason))
            self.write(force=True)
        record = variant.record
        record.calls += 1
        shapes = [list(t.shape) for t in inputs]
        n = call_rows(spec.family, shapes, spec.main)
        if n > call_rows(spec.family, record.input_shapes, spec.main):
            record.input_shapes = shapes
        if str(n) in record.rows or len(record.rows) < MAX_ROW_BUCKETS:
            record.rows[str(n)] = record.rows.get(str(n), 0) + 1
            record.shapes[str(n)] = widest(record.shapes.get(str(n), shapes), shapes)
        self.write()
        return variant, reason


def _signature(spec: LayerSpec, layer: torch.nn.Module, args: tuple, kwargs: dict) -> tuple:
    """What a call's route depends on when its arguments settle it: their shapes, dtypes and presence, and the
    layer's mutable state."""
    shapes = tuple((a.shape, a.dtype) if isinstance(a, torch.Tensor) else a is None for a in args)
    return (spec.mutable(layer), shapes,
            *((k, (v.shape, v.dtype) if isinstance(v, torch.Tensor) else v is None) for k, v in kwargs.items()))


def _timed(path: str, run: Callable[[], Any]) -> tuple[Any, float]:
    """(result, seconds) of one call of `path` ("engine" or "kernel")."""
    start = time.perf_counter()
    out = run()
    return out, time.perf_counter() - start


def _spec_for(specs: list[LayerSpec], args: tuple, kwargs: dict) -> tuple[LayerSpec | None, dict[str, Any] | None]:
    for spec in specs:
        call = named(spec.params, args, kwargs)
        if call is not None and spec.accepts(call):
            return spec, call
    return None, None


def _dtype_of(spec: LayerSpec, call: dict[str, Any]) -> str:
    x = spec.inputs(call)[spec.main]
    return dtype_name(x.dtype) if isinstance(x, torch.Tensor) else ""


def _tensors(result: Any) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    return [r for r in result if isinstance(r, torch.Tensor)] if isinstance(result, tuple | list) else []


def _agrees(spec: LayerSpec, layer: torch.nn.Module, args: list[Any], inputs: list[torch.Tensor],
            got: list[torch.Tensor]) -> tuple[bool, str]:
    """Does the family's reference, built with the layer's arguments and loaded with its tensors, give the engine's
    own outputs on this live call? Within the dtype's rounding: the engine's path may round apart from the
    reference's ops."""
    from kernelbot.kernel_library import FAMILIES
    from kernelbot.loading import load_module

    family = FAMILIES[spec.family]
    try:
        reference = load_module(family.reference_path, f"kb_served_ref_{family.name}").Model(*args)
        state = spec.state(layer)
        reference.load_state_dict({name: state[name].detach() for name in reference.state_dict()})
        with torch.no_grad():
            want = _tensors(reference.to(inputs[0].device)(*inputs))
    except Exception as exc:  # another signature or state layout: not this family's op
        return False, f"the {family.name} reference does not run on this layer's call ({type(exc).__name__}: {exc})"
    why = _differs(want, got)
    return not why, f"the {family.name} reference {why}" if why else ""


def _differs(want: list[torch.Tensor], got: list[torch.Tensor]) -> str:
    """Why `got` is not `want` within the dtype's rounding (the engine's path may round apart from another's ops), or
    "" when it is."""
    if len(want) != len(got) or any(w.shape != g.shape or w.dtype != g.dtype for w, g in zip(want, got, strict=True)):
        return "gives other outputs (shapes or dtypes) than the layer"
    for w, g in zip(want, got, strict=True):
        tol = 1e-5 if w.dtype == torch.float32 else 2e-2
        if not torch.allclose(w.double(), g.double(), rtol=tol, atol=tol):
            return f"differs from the layer's own output by up to {float((w.double() - g.double()).abs().max()):.3g}"
    return ""


def _rank() -> int | None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return None


def router_from_env(engine: str, targets: dict[str, list[LayerSpec]],
                    native: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> Router | None:
    """The process's router from its environment (pack to route, counters' and captures' directory), or None when
    kernelbot asked for neither. Pack entries no table layer takes are listed as unrouted, with the reason."""
    pack_env, counts_env = os.environ.get(PACK_ENV), os.environ.get(COUNTS_ENV)
    capturing = bool(os.environ.get(CAPTURE_ENV))
    if not pack_env and not capturing:
        print(f"kernelbot plugin: neither {PACK_ENV} nor {CAPTURE_ENV} is set; nothing to do", file=sys.stderr)
        return None
    counts_to = counts_env or os.environ.get(CAPTURE_ENV)
    router = Router(engine=engine, pack_dir=Path(pack_env) if pack_env else None,
                    counts_dir=Path(counts_to) if counts_to else None, capturing=capturing,
                    generic=GenericLayers(engine, native))
    if pack_env:
        pack = Pack.model_validate_json((Path(pack_env) / "manifest.json").read_text())
        router.run_id = pack.run_id
        for entry in pack.entries:
            if entry.family not in {spec.family for spec in targets.get(entry.module_class, [])}:
                router.unrouted.append({"candidate_id": entry.candidate_id, "family": entry.family,
                                        "reason": f"no {engine} layer takes a {entry.family} kernel for "
                                                  f"{entry.module_class}"})
                continue
            router.routes.setdefault((entry.module_class, entry.family), []).append(entry)
            router.custom[entry.candidate_id] = _Calls()
    atexit.register(router.write, True)
    threading.Thread(target=router.flusher, name="kernelbot-counters", daemon=True).start()
    router.write(force=True)
    return router


def read_reports(counts_dir: Path) -> list[PluginReport]:
    """What every engine process's plugin wrote (one file per process)."""
    return [PluginReport.model_validate_json(p.read_text()) for p in sorted(Path(counts_dir).glob("counts-*.json"))]
