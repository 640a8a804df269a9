"""Route a model's module calls to a kernel pack's kernels, counting every call both ways."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from kernelbot.engine.layer_route import PARTS, LeanLayer, has_parts, probe_agrees
from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.base import GENERIC, hot_path
from kernelbot.loading import load_module
from kernelbot.records import KERNEL_LABEL, CallSignature, Pack, PackEntry


@dataclass
class CallCounts:
    calls: int = 0  # calls that ran the pack's kernel
    fallback_calls: int = 0  # calls on matching modules whose shapes the pack does not cover


def _signature(args: tuple, kwargs: dict) -> tuple | None:
    """(shape, dtype) of each argument: torch.Size hashes and compares as the tuple of its dims."""
    if kwargs or not args or not all(isinstance(a, torch.Tensor) for a in args):
        return None
    return tuple((a.shape, a.dtype) for a in args)


def kernel_label(entry: PackEntry) -> str:
    """The trace annotation for a pack kernel: its id, dtype and the dims the profiler saw it replace."""
    return f"{KERNEL_LABEL}{entry.candidate_id} {entry.dtype} {json.dumps(entry.profiled_dims)}"


class GenericCall:
    """Routes a module call to a generic kernel when the call has exactly the extracted signature: the same
    argument structure and constants, tensors of the same shapes and dtypes; the kernel's output tensors are put
    back into the module's own output structure."""

    def __init__(self, sig: CallSignature) -> None:
        self.spec = pytree.treespec_loads(sig.spec)
        self.out_spec = pytree.treespec_loads(sig.output_spec)
        self.none = sig.output_none
        self.tensors = [(t.index, torch.Size(t.shape), getattr(torch, t.dtype)) for t in sig.tensors]
        self.constants = [(int(i), c) for i, c in sig.constants]

    def inputs(self, args: tuple, kwargs: dict) -> list[torch.Tensor] | None:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if spec != self.spec or any(repr(leaves[i]) != c for i, c in self.constants):
            return None
        found = [leaves[i] for i, _, _ in self.tensors]
        if any(not isinstance(x, torch.Tensor) or x.shape != shape or x.dtype != dtype
               for x, (_, shape, dtype) in zip(found, self.tensors, strict=True)):
            return None
        return found

    def output(self, result: torch.Tensor | tuple) -> object:
        produced = iter(result if isinstance(result, tuple | list) else (result,))
        return pytree.tree_unflatten([None if none else next(produced) for none in self.none], self.out_spec)


def _generic_run(call: GenericCall, kernel: torch.nn.Module, inputs: list[torch.Tensor]) -> object:
    return call.output(kernel.forward(*inputs))


def _counted(run: Callable[[], Any], counts: CallCounts, label: str) -> Callable[[], Any]:
    def counted() -> Any:
        counts.calls += 1
        if torch.autograd._profiler_enabled():  # name the kernel in traces, so re-profiles can rank it
            with torch.profiler.record_function(label):
                return run()
        return run()
    return counted


@dataclass
class _Route:
    kernels: dict[tuple, tuple[Callable[..., Any], CallCounts, str]] = field(default_factory=dict)
    generic: list[tuple[GenericCall, torch.nn.Module, CallCounts, str]] = field(default_factory=list)
    # families whose calls carry more than the reference's inputs (an attention's cache): their own engine_call
    engine: list[tuple[Callable, Any, CallCounts, str, list[list[int]]]] = field(default_factory=list)
    fallback: CallCounts = field(default_factory=CallCounts)

    def resolve(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> Callable[[], Any] | None:
        """The pack kernel's run for this call (counted and labelled when it runs), or None: not a verified call."""
        for engine_call, kernel, counts, label, shapes in self.engine:
            run = engine_call(kernel, module, args, kwargs, shapes)
            if run is not None:
                return _counted(run, counts, label)
        for call, kernel, counts, label in self.generic:
            inputs = call.inputs(args, kwargs)
            if inputs is not None:
                return _counted(partial(_generic_run, call, kernel, inputs), counts, label)
        hit = self.kernels.get(_signature(args, kwargs))
        if hit is None:
            return None
        run, counts, label = hit
        return _counted(lambda: run(*args), counts, label)


class PackPatcher:
    """Wraps forward() of each module the pack covers; calls with the shapes and dtype the kernel was
    verified and measured on go to the kernel, everything else to the original forward. Kernels are called
    through their forward() (no nn.Module call): no hooks' cost, and no module of their own in traces, so a
    re-profile sees the replaced module as the unit it was, with the kernel's label inside."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.counts: dict[str, CallCounts] = {}  # candidate id -> counts
        self.fallbacks: dict[str, CallCounts] = {}  # module class -> counts
        self._patched: list[torch.nn.Module] = []
        self.lean_layers: list[str] = []  # decoder layers run part to part (engine/layer_route.py)
        # Kernels outlive remove(): re-applying a pack must not rebuild them or repack their weights.
        self._kernels: dict[tuple[str, int], torch.nn.Module] = {}

    def apply(self, pack: Pack, pack_dir: Path) -> None:
        self.remove()
        routes: dict[int, _Route] = {}
        for entry in pack.entries:
            counts = self.counts.setdefault(entry.candidate_id, CallCounts())
            for module in self._matching(entry):
                kernel = self._kernel(entry, pack_dir, module)
                route = routes.setdefault(id(module), _Route(fallback=self.fallbacks.setdefault(
                    entry.module_class, CallCounts())))
                if entry.signature is not None:
                    route.generic.append((GenericCall(entry.signature), kernel, counts, kernel_label(entry)))
                    continue
                engine_call = FAMILIES[entry.family].engine_call
                if engine_call is not None:
                    stepper = hot_path(kernel, entry.dtype) or kernel
                    route.engine.append((engine_call, stepper, counts, kernel_label(entry), entry.input_shapes))
                    continue
                sig = tuple((tuple(s), getattr(torch, entry.dtype)) for s in entry.input_shapes)
                route.kernels[sig] = (hot_path(kernel, entry.dtype) or kernel.forward, counts, kernel_label(entry))
        for module in self.model.modules():
            if id(module) in routes:
                self._wrap(module, routes[id(module)])
        for name, module in self.model.named_modules():
            attention = getattr(module, "self_attn", None)
            if has_parts(module) and id(attention) in routes and routes[id(attention)].engine:
                self._route_layer(name, module, routes)

    def _route_layer(self, name: str, layer: torch.nn.Module, routes: dict[int, _Route]) -> None:
        """Run the layer part to part (engine/layer_route.py) if it probes the same as its own forward at every
        shape its attention kernel takes; the probe's calls are not counted."""
        resolvers = [routes[id(p)].resolve if id(p) in routes else None
                     for p in (getattr(layer, part) for part in PARTS)]
        lean = LeanLayer(layer, layer.forward, resolvers)
        counts = [*self.counts.values(), *self.fallbacks.values()]
        before = [(c.calls, c.fallback_calls) for c in counts]
        try:
            agrees = all(probe_agrees(layer, lean, shapes) for *_, shapes in routes[id(layer.self_attn)].engine)
        except Exception:  # a layer whose forward takes other arguments: it keeps its forward
            agrees = False
        for c, (calls, fallback_calls) in zip(counts, before, strict=True):
            c.calls, c.fallback_calls = calls, fallback_calls
        if agrees:
            layer.forward = lean
            self._patched.append(layer)
            self.lean_layers.append(name)

    def _kernel(self, entry: PackEntry, pack_dir: Path, module: torch.nn.Module) -> torch.nn.Module:
        key = (f"{pack_dir.resolve()}/{entry.candidate_id}", id(module))
        if key not in self._kernels:
            name = f"kb_pack_{entry.candidate_id}"
            kernel = load_module(pack_dir / entry.source_file, name).ModelNew(*entry.init_args)
            if entry.family == GENERIC:  # every parameter and buffer, non-persistent ones too, by name
                names = dict(module.named_parameters())
                names.update(module.named_buffers())
                kernel.load_state_dict({n: names[n] for n in kernel.state_dict()})
            else:
                kernel.load_state_dict(module.state_dict())
            place = next(module.parameters(), None)
            if place is not None:
                kernel.to(place.device)
            self._kernels[key] = kernel.eval()
        return self._kernels[key]

    def _matching(self, entry: PackEntry) -> list[torch.nn.Module]:
        if entry.family == GENERIC:
            return [self.model.get_submodule(p) for p in entry.module_paths]
        family = FAMILIES[entry.family]
        return [m for m in self.model.modules()
                if type(m).__name__ == entry.module_class and family.init_args(m) == entry.init_args]

    def _wrap(self, module: torch.nn.Module, route: _Route) -> None:
        original = module.forward

        def forward(*args, **kwargs):
            run = route.resolve(module, args, kwargs)
            if run is None:
                route.fallback.fallback_calls += 1
                return original(*args, **kwargs)
            return run()

        module.forward = forward  # instance attribute shadows the class method; removed by remove()
        self._patched.append(module)

    def remove(self) -> None:
        for module in self._patched:
            del module.forward
        self._patched.clear()
        self.lean_layers.clear()

    def reset_counts(self) -> None:
        for c in [*self.counts.values(), *self.fallbacks.values()]:
            c.calls = c.fallback_calls = 0
