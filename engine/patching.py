"""Route a model's module calls to a kernel pack's kernels, counting every call both ways."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.base import GENERIC, dtype_name
from kernelbot.loading import load_module
from kernelbot.profiler.trace import KERNEL_LABEL
from kernelbot.records import CallSignature, Pack, PackEntry


@dataclass
class CallCounts:
    calls: int = 0  # calls that ran the pack's kernel
    fallback_calls: int = 0  # calls on matching modules whose shapes the pack does not cover


def _signature(args: tuple, kwargs: dict) -> tuple | None:
    if kwargs or not args or not all(isinstance(a, torch.Tensor) for a in args):
        return None
    return tuple((tuple(a.shape), dtype_name(a.dtype)) for a in args)


def kernel_label(entry: PackEntry) -> str:
    """The trace annotation for a pack kernel: its id, dtype and the dims the profiler saw it replace."""
    return f"{KERNEL_LABEL}{entry.candidate_id} {entry.dtype} {json.dumps(entry.profiled_dims)}"


@contextlib.contextmanager
def _labelled(label: str) -> Iterator[None]:
    """Name the kernel in traces while profiling, so re-profiles can rank it."""
    if torch.autograd._profiler_enabled():
        with torch.profiler.record_function(label):
            yield
    else:
        yield


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


@dataclass
class _Route:
    kernels: dict[tuple, tuple[torch.nn.Module, CallCounts, str]] = field(default_factory=dict)
    generic: list[tuple[GenericCall, torch.nn.Module, CallCounts, str]] = field(default_factory=list)
    # families whose calls carry more than the reference's inputs (an attention's cache): their own engine_call
    engine: list[tuple[Callable, torch.nn.Module, CallCounts, str, list[list[int]]]] = field(default_factory=list)
    fallback: CallCounts = field(default_factory=CallCounts)


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
                    route.engine.append((engine_call, kernel, counts, kernel_label(entry), entry.input_shapes))
                    continue
                sig = tuple((tuple(s), entry.dtype) for s in entry.input_shapes)
                route.kernels[sig] = (kernel, counts, kernel_label(entry))
        for module in self.model.modules():
            if id(module) in routes:
                self._wrap(module, routes[id(module)])

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
            for engine_call, kernel, counts, label, shapes in route.engine:
                run = engine_call(kernel, module, args, kwargs, shapes)
                if run is not None:
                    counts.calls += 1
                    with _labelled(label):
                        return run()
            for call, kernel, counts, label in route.generic:
                inputs = call.inputs(args, kwargs)
                if inputs is not None:
                    counts.calls += 1
                    with _labelled(label):
                        return call.output(kernel.forward(*inputs))
            hit = route.kernels.get(_signature(args, kwargs))
            if hit is None:
                route.fallback.fallback_calls += 1
                return original(*args, **kwargs)
            kernel, counts, label = hit
            counts.calls += 1
            with _labelled(label):
                return kernel.forward(*args)

        module.forward = forward  # instance attribute shadows the class method; removed by remove()
        self._patched.append(module)

    def remove(self) -> None:
        for module in self._patched:
            del module.forward
        self._patched.clear()

    def reset_counts(self) -> None:
        for c in [*self.counts.values(), *self.fallbacks.values()]:
            c.calls = c.fallback_calls = 0
