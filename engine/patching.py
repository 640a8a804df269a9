"""Route a model's module calls to a kernel pack's kernels, counting every call both ways."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.base import dtype_name
from kernelbot.loading import load_module
from kernelbot.profiler.trace import KERNEL_LABEL
from kernelbot.records import Pack, PackEntry


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


@dataclass
class _Route:
    kernels: dict[tuple, tuple[torch.nn.Module, CallCounts, str]] = field(default_factory=dict)
    fallback: CallCounts = field(default_factory=CallCounts)


class PackPatcher:
    """Wraps forward() of each module the pack covers; calls with the shapes and dtype the kernel was
    verified and measured on go to the kernel, everything else to the original forward."""

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
            kernel.load_state_dict(module.state_dict())
            self._kernels[key] = kernel.eval()
        return self._kernels[key]

    def _matching(self, entry: PackEntry) -> list[torch.nn.Module]:
        family = FAMILIES[entry.family]
        return [m for m in self.model.modules()
                if type(m).__name__ == entry.module_class and family.init_args(m) == entry.init_args]

    def _wrap(self, module: torch.nn.Module, route: _Route) -> None:
        original = module.forward

        def forward(*args, **kwargs):
            hit = route.kernels.get(_signature(args, kwargs))
            if hit is None:
                route.fallback.fallback_calls += 1
                return original(*args, **kwargs)
            kernel, counts, label = hit
            counts.calls += 1
            if torch.autograd._profiler_enabled():  # name the kernel in traces, so re-profiles can rank it
                with torch.profiler.record_function(label):
                    return kernel(*args)
            return kernel(*args)

        module.forward = forward  # instance attribute shadows the class method; removed by remove()
        self._patched.append(module)

    def remove(self) -> None:
        for module in self._patched:
            del module.forward
        self._patched.clear()

    def reset_counts(self) -> None:
        for c in [*self.counts.values(), *self.fallbacks.values()]:
            c.calls = c.fallback_calls = 0
