"""The one router between a model's layers and a kernel pack: in this process (engine/patching.py installs it on a
transformers model's modules) and inside a served engine's processes (the vLLM and SGLang plugins install it
through their engines' seams: engine/vllm_plugin.py, engine/sglang_plugin.py).

Per call of a hooked layer (`LayerSpec`: which family's kernel stands in for which layer class, how a call maps onto
the kernel's inputs, which entries take it):
- route (a pack): a call goes to a pack kernel only for a layer variant, shape, dtype and device the kernel was
  verified on; everything else runs the layer's own path and is counted as a fallback, with the reason. A kernel's
  first call on each layer is checked against the layer's own output, and later calls are timed beside it (the
  op benchmarked where it runs): a kernel that differs there, or is slower there, stops taking calls. Decisions are
  kept per layer and call key, and a settled call takes a fast path.
- capture (served, KERNELBOT_CAPTURE_DIR): what the engine really runs — each layer variant's family, constructor
  arguments, dtype and the row counts continuous batching produced — and whether the family's reference gives the
  layer's own outputs on a live call (the engine's own forward is the judge). kernelbot makes its tasks from these.
Layers no family covers (`generic_spec`) are captured and routed the same way by engine/generic_layers.py.

Served, a pack comes from KERNELBOT_PACK_DIR and every process writes what it saw to `<counts dir>/counts-pid<P>.json`
(a `PluginReport`), read back by `read_reports`. Nothing here imports the profiler or pandas: it runs in every worker
of the engine.
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
from functools import partial
from pathlib import Path
from typing import Any

import torch

from kernelbot.engine.generic_layers import GenericLayers, native_params, plain_call
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
    """How one family's kernel stands in for one variant of a layer class (an engine's layer, or a transformers
    module in-process)."""

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
    # which of the pack's entries (already of this layer's class, family, dtype and arguments) take the call; default:
    # a kernel takes calls of the widths it was verified at and at most its rows (the row rule, `_rows_fit`)
    fits: Callable[[PackEntry, torch.nn.Module, dict[str, Any]], bool] | None = None
    # whether a route is decided once per layer and call key (shapes, dtypes, presence): not where `fits` or a
    # generic kernel's constants read more of the call than that
    cached: bool = True
    # whether a kernel's first call here is checked against the layer's own output and later calls timed beside it:
    # not where the layer's own path writes state no copy of the call's tensors holds (a transformers cache)
    probes: bool = True
    # the kernel's run for one layer, where a call needs more than the kernel's forward (default: its hot path)
    stepper: Callable[[torch.nn.Module, PackEntry, torch.nn.Module], Callable[..., Any]] | None = None
    # the dims a profiled call's label names (default: the call's inputs'); the ranking reads them back
    label_dims: Callable[[PackEntry, list[list[int]]], Any] = lambda entry, shapes: shapes
    # whether a call may carry keywords the parameters do not name (a forward taking **kwargs)
    open_kwargs: bool = False

    def layer_args(self, layer: torch.nn.Module) -> list[Any]:
        if self.init_args is not None:
            return self.init_args(layer)
        from kernelbot.kernel_library import FAMILIES

        return FAMILIES[self.family].init_args(layer)


def generic_spec(cls: type, **engine: Any) -> LayerSpec | None:
    """How a generic kernel stands in for a layer class no family covers (engine/generic_layers.py): any call of
    tensors and None, matched to a kernel by the layer's attributes and the call's exact signature; None for a
    class whose native forward takes *args or **kwargs. `engine`: the engine's own LayerSpec fields (variant,
    mutable)."""
    params = native_params(cls)
    if params is None:
        return None
    return LayerSpec(GENERIC, params, inputs=lambda c: [v for p in params if isinstance(v := c.get(p), torch.Tensor)],
                     run=lambda k, c: k(c), accepts=plain_call, **engine)


def named(params: tuple[str, ...], args: tuple, kwargs: dict, open_kwargs: bool = False) -> dict[str, Any] | None:
    """The call's arguments by name, or None for a call that does not fit the signature."""
    if len(args) > len(params) or (not open_kwargs and set(kwargs) - set(params[len(args):])):
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
    own: dict[tuple, str] = field(default_factory=dict)  # call signature → why it settled on the engine's own path


@dataclass
class _Variant:
    """What capture gathers for one (layer class, family, arguments, dtype, fixed dims)."""

    record: LayerCapture
    checked: bool = False


@dataclass
class Router:
    """One process's view of the pack and of what its layers run (this process's model, or a served engine's)."""

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
    # layer → family → the entries named for this very layer (`named_for`), in place of its class's `routes`
    layer_entries: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    variants: dict[str, _Variant] = field(default_factory=dict)
    # candidate → (engine, kernel): each timed call's (µs, rows)
    timings: dict[str, tuple[list[tuple[float, int]], list[tuple[float, int]]]] = field(default_factory=dict)
    generic: GenericLayers = field(default_factory=lambda: GenericLayers(""))  # layers no family covers
    step_rows: int | None = None  # the engine's step budget in tokens, where its plugin reads it (PluginReport's)
    probe_after: int = PROBE_AFTER  # a kernel's calls before its timed ones
    probe_every: int = PROBE_EVERY  # ... then one call in this many is timed
    dirty: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    # per thread: the classes of the captured layers whose own path is running (innermost last)
    running: threading.local = field(default_factory=threading.local)

    def report(self) -> PluginReport:
        return PluginReport(pid=os.getpid(), rank=_rank(), engine=self.engine, run_id=self.run_id,
                            pack_dir=str(self.pack_dir or ""), hooked=self.hooked,
                            custom={cid: c.record() for cid, c in self.custom.items()},
                            fallback=self.fallback, unrouted=self.unrouted,
                            captures=[v.record for v in self.variants.values()], generic=self.generic.records(),
                            step_rows=self.step_rows)

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
        """One call of a hooked layer, run where `resolve` routes it."""
        return self.resolve(specs, layer, original, args, kwargs)()

    def resolve(self, specs: list[LayerSpec], layer: torch.nn.Module, original: Callable[..., Any], args: tuple,
                kwargs: dict) -> Callable[[], Any]:
        """Where one call of a hooked layer goes, as a thunk to run now: a pack kernel when one was verified for it,
        else the engine's own path (`original`); captured on the way when capturing. A call whose signature this
        layer has settled (routed, probed and timed; or to the engine's own path) takes the fast path: one lookup,
        then the kernel or the engine's path."""
        state = self.layers.get(layer)
        if state is not None and (state.fast or state.own) and not self.capturing and \
                not torch.autograd._profiler_enabled():
            signature = _signature(specs[0], layer, args, kwargs)
            fast = state.fast.get(signature)
            if fast is not None and not fast.calls.disabled:
                fast.calls.calls += 1
                self.dirty = True
                return partial(fast.spec.run, fast.run, named(fast.spec.params, args, kwargs, fast.spec.open_kwargs))
            reason = state.own.get(signature)
            if reason is not None:
                self._fallback(layer, reason)
                return partial(original, *args, **kwargs)
        own = partial(original, *args, **kwargs)
        spec, call = _spec_for(specs, args, kwargs)
        if spec is None or call is None:
            self._fallback(layer, "signature")
            return own
        routing = bool(self.routes) or len(self.layer_entries) > 0
        x = spec.inputs(call)[spec.main] if routing or self.capturing else None
        entry, reason = self._decide(spec, layer, call, x) if routing else (None, "")
        if entry is None:
            if routing:
                self._settle_own(spec, specs, layer, args, kwargs, reason)
            return partial(self._capture, spec, layer, call, original, args, kwargs) if self.capturing else own
        run = self._kernel(entry, spec, layer)
        counts = self.custom[entry.candidate_id]
        if counts.disabled:
            self._settle_own(spec, specs, layer, args, kwargs, counts.disabled)
            return own
        timing = spec.probes and counts.timed < PROBE_CALLS
        if spec.probes and entry.candidate_id not in self._of(layer).probed:
            return partial(self._probe, spec, layer, call, entry, run, original, args, kwargs, timed=False)
        profiling = torch.autograd._profiler_enabled()  # a traced call runs one path: the trace shows the model
        if timing and not profiling and counts.calls >= self.probe_after and counts.calls % self.probe_every == 0:
            return partial(self._probe, spec, layer, call, entry, run, original, args, kwargs, timed=True)
        self._counted(entry)
        if spec.settles and not timing:
            self._of(layer).fast[_signature(specs[0], layer, args, kwargs)] = _Fast(spec, run, counts)
        if self.capturing and spec.family != GENERIC:
            self._count(spec, layer, call, reason="", kernel=entry.candidate_id)
        if not profiling:
            return partial(spec.run, run, call)
        label = spec.label_dims(entry, [list(t.shape) for t in spec.inputs(call)])
        return partial(_labelled, f"{KERNEL_LABEL}{entry.candidate_id} {entry.dtype} {json.dumps(label)}",
                       partial(spec.run, run, call))

    def _counted(self, entry: PackEntry) -> None:
        counts = self.custom[entry.candidate_id]
        counts.calls += 1
        self.write(force=counts.calls == 1)

    def _probe(self, spec: LayerSpec, layer: torch.nn.Module, call: dict[str, Any], entry: PackEntry,
               run: Callable[..., Any], original: Callable[..., Any], args: tuple, kwargs: dict, *,
               timed: bool) -> Any:
        """The engine's own path beside the kernel, on copies of what it writes. On a layer's first call: a layer
        whose own output the kernel does not give (numerics its class and arguments do not show) keeps the engine's
        path. `timed` (PROBE_CALLS calls of each path spread out once the kernel has warmed, probe_every apart): the
        op the kernel replaces benchmarked where it runs. Only the path that runs first is timed, in the cache the
        model's previous ops left (the second would find the weights the first just read), the order alternating
        between calls; a kernel slower there than the engine's own path stops taking calls."""
        copies = {k: v.clone() for k, v in call.items() if isinstance(v, torch.Tensor)
                  and (spec.written is None or k in spec.written)}
        own_call = {**call, **copies}
        engine_times, kernel_times = self.timings.setdefault(entry.candidate_id, ([], []))
        kernel_first = len(kernel_times) < len(engine_times)

        def engine_path() -> Any:
            return self._own_path(layer, original, tuple(own_call[p] for p in spec.params[:len(args)]),
                                  {k: own_call[k] for k in kwargs})

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
            rows = call_rows(spec.family, [list(t.shape) for t in spec.inputs(call)], spec.main)
            (kernel_times if kernel_first else engine_times).append(
                ((kernel_s if kernel_first else engine_s) * 1e6, max(rows, 1)))
            self._timed_call(entry)
        self._counted(entry)
        return result

    def _timed_call(self, entry: PackEntry) -> None:
        """The two paths compared per row of their calls, at the median call's rows: continuous batching mixes
        calls of many sizes (prefill chunks of 128 and 897 rows), each path is timed on other calls, and medians of
        whole calls compared the sizes each path happened to get (a prefill GEMM twice as slow as the engine's at 897
        rows measured even with it)."""
        counts = self.custom[entry.candidate_id]
        engine, kernel = self.timings[entry.candidate_id]
        counts.timed = min(len(engine), len(kernel))
        if not counts.timed:
            return
        rows = statistics.median(r for _, r in engine + kernel)
        counts.engine_us, counts.kernel_us = (round(statistics.median(us / r for us, r in path) * rows, 2)
                                              for path in (engine, kernel))
        if counts.timed >= PROBE_CALLS and counts.kernel_us > counts.engine_us:
            counts.disabled = (f"slower in the engine than its own path ({counts.kernel_us:.1f} vs "
                               f"{counts.engine_us:.1f} µs a call of {rows:g} rows, per-row medians of "
                               f"{counts.timed})")
            self.write(force=True)

    def _decide(self, spec: LayerSpec, layer: torch.nn.Module, call: dict[str, Any],
                x: torch.Tensor | None) -> tuple[PackEntry | None, str]:
        if not isinstance(x, torch.Tensor):
            return None, "signature"
        # a layer's variant is fixed once built, so the decision depends only on what changes between calls
        state = self._of(layer)
        if not spec.cached:
            entry, reason = self._route(spec, layer, call, x)
            if entry is not None and state.probed.get(entry.candidate_id):
                return None, "the kernel's output differs from this layer's own"
            return entry, reason
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
        """(the pack entry for this call, "") or (None, why it falls back): among the entries of the layer's arguments
        and the call's dtype, those the spec's `fits` takes, else the row rule's (`_rows_fit`)."""
        dtype = dtype_name(x.dtype)
        reason = spec.variant(layer, call, dtype)
        if reason:
            return None, reason
        named_here = self.layer_entries.get(layer)
        entries = named_here.get(spec.family, []) if named_here is not None else \
            self.routes.get((type(layer).__name__, spec.family))
        if not entries:
            return None, f"no {spec.family} kernel in the pack"
        if spec.family == GENERIC:
            entry, why = self.generic.route(entries, layer, spec.params, call, by_variant=named_here is None)
            if entry is not None and not device_ok(entry.backend, x):
                return None, f"device ({entry.backend} kernel, {x.device.type} tensor)"
            return entry, why
        args = self._args(spec, layer)
        fits = [e for e in entries if e.dtype == dtype and e.init_args == args]
        if spec.fits is not None:
            fits = [e for e in fits if spec.fits(e, layer, call)]
            if not fits:
                return None, "call shapes or dtype not one the pack's kernels were verified on"
        else:
            fits, reason = _rows_fit(spec, fits, [list(t.shape) for t in spec.inputs(call)])
            if not fits:
                return None, reason
        if not device_ok(fits[0].backend, x):
            return None, f"device ({fits[0].backend} kernel, {x.device.type} tensor)"
        return fits[0], ""

    def named_for(self, layer: torch.nn.Module, entries: list[PackEntry]) -> None:
        """The entries `layer` may take, whatever its class's are (in-process: the modules each entry was matched to
        when the pack was applied); the layer's earlier decisions are dropped."""
        by_family: dict[str, list[PackEntry]] = {}
        for entry in entries:
            by_family.setdefault(entry.family, []).append(entry)
            self.custom.setdefault(entry.candidate_id, _Calls())
        self.layer_entries[layer] = by_family
        state = self._of(layer)
        state.decisions.clear()
        state.fast.clear()

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
                if spec.stepper is not None:
                    run = spec.stepper(kernel, entry, layer)
                elif entry.family == GENERIC:
                    run = self.generic.runner(entry, spec.params, run)
                kernels[entry.candidate_id] = run
        return kernels[entry.candidate_id]

    def _of(self, layer: torch.nn.Module) -> _LayerState:
        state = self.layers.get(layer)
        if state is None:
            state = self.layers[layer] = _LayerState()
        return state

    def _settle_own(self, spec: LayerSpec, specs: list[LayerSpec], layer: torch.nn.Module, args: tuple,
                    kwargs: dict, reason: str) -> None:
        """A call that runs the engine's own path, counted; where its arguments settle its route, later calls of its
        signature go there on the fast path (the decision and a disabled kernel never change back)."""
        self._fallback(layer, reason)
        if spec.settles and spec.cached:
            self._of(layer).own[_signature(specs[0], layer, args, kwargs)] = reason

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
            return self._own_path(layer, original, args, kwargs)
        variant.checked = True
        copies = {k: v.clone() for k, v in call.items() if isinstance(v, torch.Tensor)
                  and (spec.written is None or k in spec.written)}
        inputs = spec.inputs({**call, **copies})  # as they were before the engine's path wrote any in place
        result = self._own_path(layer, original, args, kwargs)
        got = spec.outputs(result, call) if spec.outputs is not None else _tensors(result)
        variant.record.agrees, variant.record.why = _agrees(spec, layer, self._args(spec, layer), inputs, got)
        self.write(force=True)
        return result

    def _enclosing(self) -> list[str]:
        if not hasattr(self.running, "classes"):
            self.running.classes = []
        return self.running.classes

    def _own_path(self, layer: torch.nn.Module, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """A layer's own path, run by the router (captured, or beside its kernel): the hooked layers it calls are
        captured as `within` this layer's class."""
        enclosing = self._enclosing()
        enclosing.append(type(layer).__name__)
        try:
            return original(*args, **kwargs)
        finally:
            enclosing.pop()

    def _count(self, spec: LayerSpec, layer: torch.nn.Module, call: dict[str, Any],
               reason: str, kernel: str = "") -> tuple[_Variant | None, str]:
        inputs = spec.inputs(call)
        if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
            return None, "signature"
        x = inputs[spec.main]
        args = self._args(spec, layer)
        fixed = fixed_dims(spec.family, [list(t.shape) for t in inputs])
        within = next(reversed(self._enclosing()), "")
        key = json.dumps([type(layer).__name__, spec.family, args, dtype_name(x.dtype), fixed, reason, kernel, within],
                         default=str)
        variant = self.variants.get(key)
        if variant is None:
            traced = spec.traced_as(layer, call) if spec.traced_as is not None else ""
            variant = self.variants[key] = _Variant(LayerCapture(
                engine_class=type(layer).__name__, module_class=traced, family=spec.family, init_args=args,
                dtype=dtype_name(x.dtype),
                input_shapes=[list(t.shape) for t in inputs], calls=0, rows={}, why=reason, kernel=kernel,
                within=within))
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


def _rows_fit(spec: LayerSpec, entries: list[PackEntry], shapes: list[list[int]]) -> tuple[list[PackEntry], str]:
    """The entries of the call's widths that take its rows (at most those each was verified at), fewest rows first;
    or why none does. Row counts change with every batch: a kernel takes calls with at most the rows it was verified
    at (that shape, and fuzzed rows below it)."""
    fixed = fixed_dims(spec.family, shapes)
    entries = [e for e in entries if fixed_dims(spec.family, e.input_shapes) == fixed]
    if not entries:
        return [], "layer arguments, widths or dtype not in the pack"
    n = call_rows(spec.family, shapes, spec.main)
    entries = sorted((e for e in entries if call_rows(spec.family, e.input_shapes, spec.main) >= n),
                     key=lambda e: call_rows(spec.family, e.input_shapes, spec.main))
    return entries, "" if entries else "more rows than the pack's kernels were verified on"


def _signature(spec: LayerSpec, layer: torch.nn.Module, args: tuple, kwargs: dict) -> tuple:
    """What a call's route depends on when its arguments settle it: their shapes, dtypes and presence, and the
    layer's mutable state."""
    shapes = tuple((a.shape, a.dtype) if isinstance(a, torch.Tensor) else a is None for a in args)
    return (spec.mutable(layer), shapes,
            *((k, (v.shape, v.dtype) if isinstance(v, torch.Tensor) else v is None) for k, v in kwargs.items()))


def _labelled(label: str, run: Callable[[], Any]) -> Any:
    """The kernel's call named in the profiler's trace, so a re-profile can rank it."""
    with torch.profiler.record_function(label):
        return run()


def _timed(path: str, run: Callable[[], Any]) -> tuple[Any, float]:
    """(result, seconds) of one call of `path` ("engine" or "kernel")."""
    start = time.perf_counter()
    out = run()
    return out, time.perf_counter() - start


def _spec_for(specs: list[LayerSpec], args: tuple, kwargs: dict) -> tuple[LayerSpec | None, dict[str, Any] | None]:
    for spec in specs:
        call = named(spec.params, args, kwargs, spec.open_kwargs)
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
                    native: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                    by_structure: tuple[LayerSpec, ...] = ()) -> Router | None:
    """The process's router from its environment (pack to route, counters' and captures' directory), or None when
    kernelbot asked for neither. `by_structure`: layers found by what they hold, whatever their class is called (a
    model's MLP: each model file defines its own); their families' entries route under the entry's class. Pack
    entries no layer takes are listed as unrouted, with the reason."""
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
            if entry.family not in {spec.family for spec in [*targets.get(entry.module_class, []), *by_structure]}:
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
