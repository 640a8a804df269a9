"""A kernel pack on a model in this process: each module a pack entry matches has its forward routed through the one
router (engine/router.py), which counts every call both ways, checks a kernel's first call on each module against
the module's own output, times it beside the module's own path and switches off a kernel slower there; decoder
layers whose attention takes a kernel run part to part (engine/layer_route.py)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from kernelbot.engine.generic_layers import GenericCall
from kernelbot.engine.layer_route import PARTS, LeanLayer, has_parts, probe_agrees
from kernelbot.engine.router import LayerSpec, Router
from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.base import GENERIC, hot_path
from kernelbot.records import IN_PROCESS, Pack, PackEntry

Route = tuple[list[LayerSpec], Callable[..., Any]]  # a module's specs and its own forward
# An in-process model's batches do not change between calls, so a kernel's in-model timings are taken on consecutive
# calls once each path has run a few (oneDNN builds its primitives on a shape's first call): they are done within a
# workload or two, before the end-to-end rounds that they would otherwise slow.
PROBE_AFTER = 8


def _params(module: torch.nn.Module) -> tuple[str, ...]:
    """The named parameters of the module's forward, in order (not *args or **kwargs)."""
    params = list(inspect.signature(type(module).forward).parameters.values())[1:]
    return tuple(p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


def _profiled_dims(entry: PackEntry, shapes: list[list[int]]) -> list[list[int]]:
    """A kernel's trace label names the dims the profiler saw it replace (its roofline cost's), not its inputs'."""
    return entry.profiled_dims


def _plain_spec(family: str, params: tuple[str, ...]) -> LayerSpec:
    """A module called with its reference's inputs, as tensors: the kernel takes exactly the verified shapes."""

    def inputs(call: dict[str, Any]) -> list[torch.Tensor]:
        return [call[p] for p in params if p in call]

    def fits(entry: PackEntry, layer: torch.nn.Module, call: dict[str, Any]) -> bool:
        given = inputs(call)
        return ([list(t.shape) for t in given] == entry.input_shapes
                and all(t.dtype == getattr(torch, entry.dtype) for t in given))

    return LayerSpec(family, params, inputs=inputs, run=lambda k, c: k(*inputs(c)),
                     accepts=lambda c: bool(c) and all(isinstance(v, torch.Tensor) for v in c.values()),
                     fits=fits, written=(), label_dims=_profiled_dims)


def _engine_call_spec(family: str, params: tuple[str, ...]) -> LayerSpec:
    """A module called with more than its reference's inputs (an attention's cache object): the family's engine_call
    says whether the kernel was verified for the call and runs it; the module's own path writes the cache, so its
    first call is not run beside the kernel (the layer route's probe compares whole layers on fresh caches)."""
    engine_call = FAMILIES[family].engine_call
    assert engine_call is not None
    first = params[0]

    def split(call: dict[str, Any]) -> tuple[tuple, dict]:
        return (call[first],), {k: v for k, v in call.items() if k != first}

    def stepper(kernel: torch.nn.Module, entry: PackEntry, layer: torch.nn.Module) -> Callable[..., Any]:
        step = hot_path(kernel, entry.dtype) or kernel
        return lambda call: engine_call(step, layer, *split(call), entry.input_shapes)()

    return LayerSpec(family, params, inputs=lambda c: [c[first]], run=lambda k, c: k(c),
                     accepts=lambda c: isinstance(c.get(first), torch.Tensor),
                     fits=lambda e, layer, c: engine_call(None, layer, *split(c), e.input_shapes) is not None,
                     cached=False, settles=False, probes=False, stepper=stepper, label_dims=_profiled_dims,
                     open_kwargs=True)


def _generic_spec(params: tuple[str, ...]) -> LayerSpec:
    """A module no family covers, on a kernel extracted from its forward: any call with exactly the extracted
    signature, constants included (so every call is matched, not settled by shapes)."""

    def inputs(call: dict[str, Any]) -> list[torch.Tensor]:
        return [t for t in pytree.tree_leaves(call) if isinstance(t, torch.Tensor)]

    return LayerSpec(GENERIC, params, inputs=inputs, run=lambda k, c: k(c), accepts=lambda c: bool(inputs(c)),
                     cached=False, settles=False, written=(), label_dims=_profiled_dims)


def _specs(module: torch.nn.Module, entries: list[PackEntry]) -> list[LayerSpec]:
    """How each family among `entries` takes the module's calls: attention-like families first, then generic kernels,
    then the plain ones."""
    params = _params(module)
    families = list(dict.fromkeys(e.family for e in entries))
    specs = [_engine_call_spec(f, params) for f in families
             if f != GENERIC and FAMILIES[f].engine_call is not None and params]
    specs += [_generic_spec(params) for f in families if f == GENERIC]
    return specs + [_plain_spec(f, params) for f in families if f != GENERIC and FAMILIES[f].engine_call is None]


class PackPatcher:
    """Installs packs on one model: wraps forward() of each module a pack's entry matches, the call then going where
    the router sends it (the kernel for the shapes and dtype it was verified and measured on, else the module's own
    forward). Kernels are called through their forward() (no nn.Module call): no hooks' cost, and no module of their
    own in traces, so a re-profile sees the replaced module as the unit it was, with the kernel's label inside. The
    router outlives remove(): re-applying a pack neither rebuilds kernels nor repacks their weights, and what the
    router measured of a kernel on this model (its first-call checks, its in-model timing) stands."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.router = Router(engine=IN_PROCESS, pack_dir=None, counts_dir=None, capturing=False,
                             probe_after=PROBE_AFTER, probe_every=1)
        self.pack: Pack | None = None
        self._patched: list[torch.nn.Module] = []
        self.lean_layers: list[str] = []  # decoder layers run part to part (engine/layer_route.py)

    def apply(self, pack: Pack, pack_dir: Path) -> None:
        self.remove()
        self.pack, self.router.pack_dir = pack, pack_dir
        named: dict[torch.nn.Module, list[PackEntry]] = {}
        for entry in pack.entries:
            for module in self._matching(entry):
                named.setdefault(module, []).append(entry)
        routes: dict[torch.nn.Module, Route] = {}
        for module, entries in named.items():
            entries = [e for e in entries if e.family != GENERIC or self._generic_named(e, _params(module))]
            if not entries:
                continue
            specs = _specs(module, entries)
            self.router.named_for(module, entries)
            routes[module] = (specs, module.forward)
            self._wrap(module, routes[module])
        for name, module in self.model.named_modules():
            attention = getattr(module, "self_attn", None)
            shapes = self._attention_shapes(named[attention]) if attention in routes else []
            if has_parts(module) and shapes:
                self._route_layer(name, module, routes, shapes)

    def _generic_named(self, entry: PackEntry, params: tuple[str, ...]) -> bool:
        """Gives the router the generic entry's signature in its by-name form; False (listed as unrouted) where the
        extracted call does not bind to the forward's named parameters."""
        assert entry.signature is not None, "a generic pack entry without its call signature"
        matcher = GenericCall(entry.signature).by_name(params)
        if matcher is None:
            self.router.unrouted.append({"candidate_id": entry.candidate_id, "family": GENERIC,
                                         "reason": f"its call does not bind to {entry.module_class}.forward's named "
                                                   "parameters"})
            return False
        self.router.generic.matchers[entry.candidate_id] = matcher
        return True

    @staticmethod
    def _attention_shapes(entries: list[PackEntry]) -> list[list[list[int]]]:
        return [e.input_shapes for e in entries if e.family != GENERIC and FAMILIES[e.family].engine_call is not None]

    def _route_layer(self, name: str, layer: torch.nn.Module, routes: dict[torch.nn.Module, Route],
                     shapes: list[list[list[int]]]) -> None:
        """Run the layer part to part (engine/layer_route.py) if it probes the same as its own forward at every
        shape its attention kernel takes; the probe's calls are not counted."""
        resolvers = [self._resolver(routes[part]) if part in routes else None
                     for part in (getattr(layer, p) for p in PARTS)]
        lean = LeanLayer(layer, layer.forward, resolvers)
        calls = {cid: c.calls for cid, c in self.router.custom.items()}
        fallback = {cls: dict(reasons) for cls, reasons in self.router.fallback.items()}
        try:
            agrees = all(probe_agrees(layer, lean, s) for s in shapes)
        except Exception:  # a layer whose forward takes other arguments: it keeps its forward
            agrees = False
        for cid, c in self.router.custom.items():
            c.calls = calls.get(cid, 0)
        self.router.fallback = fallback
        if agrees:
            layer.forward = lean
            self._patched.append(layer)
            self.lean_layers.append(name)

    def _resolver(self, route: Route) -> Callable[[torch.nn.Module, tuple, dict], Callable[[], Any]]:
        specs, original = route
        return lambda module, args, kwargs: self.router.resolve(specs, module, original, args, kwargs)

    def _matching(self, entry: PackEntry) -> list[torch.nn.Module]:
        if entry.family == GENERIC:
            return [self.model.get_submodule(p) for p in entry.module_paths]
        family = FAMILIES[entry.family]
        return [m for m in self.model.modules()
                if type(m).__name__ == entry.module_class and family.init_args(m) == entry.init_args]

    def _wrap(self, module: torch.nn.Module, route: Route) -> None:
        specs, original = route
        router = self.router

        def forward(*args: Any, **kwargs: Any) -> Any:
            return router.handle(specs, module, original, args, kwargs)

        module.forward = forward  # instance attribute shadows the class method; removed by remove()
        self._patched.append(module)

    def remove(self) -> None:
        for module in self._patched:
            del module.forward
        self._patched.clear()
        self.lean_layers.clear()
        self.router.layer_entries.clear()

    @property
    def counts(self) -> dict[str, int]:
        """Calls of each of the applied pack's kernels."""
        entries = self.pack.entries if self.pack is not None else []
        return {e.candidate_id: c.calls if (c := self.router.custom.get(e.candidate_id)) else 0 for e in entries}

    @property
    def fallbacks(self) -> dict[str, int]:
        """Calls of each class of the applied pack's modules that ran the module's own forward."""
        classes = dict.fromkeys(e.module_class for e in (self.pack.entries if self.pack is not None else []))
        return {cls: sum(self.router.fallback.get(cls, {}).values()) for cls in classes}

    @property
    def switched_off(self) -> dict[str, str]:
        """The applied pack's kernels the router stopped sending calls to in this model, and why."""
        entries = self.pack.entries if self.pack is not None else []
        return {e.candidate_id: c.disabled for e in entries
                if (c := self.router.custom.get(e.candidate_id)) is not None and c.disabled}

    def reset_counts(self) -> None:
        for c in self.router.custom.values():
            c.calls = 0
        self.router.fallback.clear()
