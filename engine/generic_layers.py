"""Layers no family covers: a generic kernel (the layer's own forward, extracted) stands in for them when a call has
exactly the extracted signature (`GenericCall`). In-process, the extraction ran on the model's modules; inside a served
engine's processes, the layer classes an engine's plugin hooks generically (vLLM's CustomOps with a native forward)
get their calls captured as generic tasks and routed to generic kernels, as engine/router.py's router does for the
families.

- capture: the first call of each (layer variant, call signature) outside a profiled window runs the engine's own
  path with its inputs kept; the layer's native forward (pure PyTorch) is then traced (engine/extract.py) under
  the engine's switch to its native ops, into a reference over ATen ops only, and checked against the engine's own
  output on that call. The record (GenericCapture) carries the reference: kernelbot makes the task from it.
- route: a pack's generic kernel takes a call of a layer built like the captured one (the same attributes) with
  exactly the captured signature; everything else runs the engine's own path.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from kernelbot.engine import extract
from kernelbot.kernel_library.base import GENERIC, dtype_name
from kernelbot.records import CallSignature, GenericCapture, PackEntry

MAX_CAPTURES = 64  # distinct (variant, signature) pairs extracted per process
PLAIN = (type(None), bool, int, float, str)


class GenericCall:
    """Matches a call against an extracted signature: the same argument structure and constants, tensors of the same
    shapes and dtypes; the kernel's output tensors are put back into the layer's own output structure. The kernel
    takes the call's tensors in the order the extraction saw them."""

    def __init__(self, sig: CallSignature) -> None:
        self.spec = pytree.treespec_loads(sig.spec)
        self.out_spec = pytree.treespec_loads(sig.output_spec)
        self.none = sig.output_none
        self.tensors = [(t.index, torch.Size(t.shape), getattr(torch, t.dtype)) for t in sig.tensors]
        self.constants = [(int(i), c) for i, c in sig.constants]

    def by_name(self, params: tuple[str, ...]) -> GenericCall | None:
        """The same signature for the call in router form, `((), {name: value})` in the forward's parameter order
        (an in-process extraction saw the call as it was made, positional arguments and all); None where the call
        cannot be named so (more positional arguments than parameters, keywords the forward does not name)."""
        args, kwargs = pytree.tree_unflatten(list(range(self.spec.num_leaves)), self.spec)
        if len(args) > len(params) or set(kwargs) - set(params[len(args):]):
            return None
        called = dict(zip(params, args, strict=False)) | kwargs
        leaves, spec = pytree.tree_flatten(((), {p: called[p] for p in params if p in called}))
        where = {old: new for new, old in enumerate(leaves)}
        named = object.__new__(GenericCall)
        named.spec, named.out_spec, named.none = spec, self.out_spec, self.none
        named.tensors = [(where[i], shape, dtype) for i, shape, dtype in self.tensors]
        named.constants = [(where[i], c) for i, c in self.constants]
        return named

    @property
    def direct(self) -> bool:
        """Whether the kernel takes a named call's top-level tensors in parameter order (then a settled call's tensors
        are passed without flattening it): no argument nests tensors, and the extraction saw them in that order."""
        indices = [i for i, _, _ in self.tensors]
        return all(c.num_leaves <= 1 for c in self.spec.children_specs[1].children_specs) and indices == sorted(indices)

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


def native_params(cls: type) -> tuple[str, ...] | None:
    """The parameters of a layer class's native forward, or None when it takes *args or **kwargs (a call could not
    be matched by name)."""
    params = list(inspect.signature(cls.forward_native).parameters.values())[1:]
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None
    return tuple(p.name for p in params)


def normal(params: tuple[str, ...], call: dict[str, Any]) -> dict[str, Any]:
    """The call by name, in the forward's parameter order: one form for capture and routing alike."""
    return {p: call[p] for p in params if p in call}


def plain_call(call: dict[str, Any]) -> bool:
    """Calls whose arguments are tensors or None: their shapes, dtypes and None-ness settle the route."""
    return all(v is None or isinstance(v, torch.Tensor) for v in call.values())


def _plain(value: Any) -> bool:
    return isinstance(value, PLAIN) or (isinstance(value, tuple | list) and all(_plain(v) for v in value))


def layer_variant(layer: torch.nn.Module) -> str:
    """What can make two layers of one class compute differently: their own plain attributes (numbers, strings,
    flags and tuples of them) and their tensors' names, shapes and dtypes, as JSON."""
    attributes = {k: v for k, v in sorted(vars(layer).items()) if not k.startswith("_") and _plain(v)}
    state = {**dict(layer.named_parameters()), **dict(layer.named_buffers())}
    return json.dumps([type(layer).__name__, attributes,
                       [[n, list(t.shape), dtype_name(t.dtype)] for n, t in state.items()]], default=str)


@contextlib.contextmanager
def _native_forward(layer: torch.nn.Module):
    """The layer's calls run its native forward (an instance attribute shadows the class's forward)."""
    layer.forward = layer.forward_native
    try:
        yield
    finally:
        del layer.forward


def _clone(x: Any) -> Any:
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


@dataclass
class GenericLayers:
    """One engine process's generic layers: what capture extracted, and the matchers of the pack's generic kernels."""

    engine: str
    native: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # the engine's native ops
    captures: dict[tuple, GenericCapture] = field(default_factory=dict)
    matchers: dict[str, GenericCall] = field(default_factory=dict)  # candidate id → its call matcher
    variants: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)  # layer → its variant

    def variant(self, layer: torch.nn.Module) -> str:
        if layer not in self.variants:
            self.variants[layer] = layer_variant(layer)
        return self.variants[layer]

    def records(self) -> list[GenericCapture]:
        return list(self.captures.values())

    # -- capture -----------------------------------------------------------------------------------------------
    def capture(self, params: tuple[str, ...], layer: torch.nn.Module, call: dict[str, Any],
                original: Callable[[], Any]) -> tuple[Any, bool]:
        """The call run by the engine's own path, captured; (result, whether a record was added or changed)."""
        named = normal(params, call)
        key = (self.variant(layer), *((k, None if v is None else (v.shape, v.dtype)) for k, v in named.items()))
        record = self.captures.get(key)
        if record is not None:
            record.calls += 1
            return original(), False
        if len(self.captures) >= MAX_CAPTURES:
            return original(), False
        signature = extract.signature_of((), named)
        dtype = next((t.dtype for t in signature.tensors if t.dtype in ("float32", "bfloat16", "float16")), "")
        record = self.captures[key] = GenericCapture(engine_class=type(layer).__name__, variant=key[0], dtype=dtype,
                                                     signature=signature, calls=1)
        if torch.autograd._profiler_enabled():
            record.why = "first called while the profiler ran (a capture is extracted outside the profiled load)"
            return original(), True
        inputs = pytree.tree_map(_clone, named)  # as they were before the engine's path wrote any in place
        result = original()
        self._extract(record, layer, extract.Call((), inputs, output=pytree.tree_map(_clone, result)))
        return result, True

    def _extract(self, record: GenericCapture, layer: torch.nn.Module, call: extract.Call) -> None:
        """The call's reference from the layer's native forward, checked against the engine's output (`call`)."""
        try:
            with self.native(), _native_forward(layer):
                ex = extract.extract(layer, [call])
            foreign = sorted(set(re.findall(r"torch\.ops\.(\w+)\.", ex.graph_code)) - {"aten", "prims"})
            if foreign:
                record.why = (f"its native forward calls {', '.join(foreign)} ops, which only the engine's process "
                              "defines (no reference can run without the engine)")
                return
            record.signature = ex.signature
            record.reference = extract.reference_source(
                ex, layer, f"{self.engine}'s {type(layer).__name__}, its native forward as captured in the engine's "
                           "process", record.dtype)
        except extract.NotExtractable as exc:
            record.why = str(exc)
        except Exception as exc:  # a native forward that does not trace or run here: no task, the reason kept
            record.why = f"its native forward did not trace ({type(exc).__name__}: {str(exc)[:200]})"

    # -- route -------------------------------------------------------------------------------------------------
    def matcher(self, entry: PackEntry) -> GenericCall:
        if entry.candidate_id not in self.matchers:
            assert entry.signature is not None, "a generic pack entry without its call signature"
            self.matchers[entry.candidate_id] = GenericCall(entry.signature)
        return self.matchers[entry.candidate_id]

    def route(self, entries: list[PackEntry], layer: torch.nn.Module, params: tuple[str, ...],
              call: dict[str, Any], by_variant: bool = True) -> tuple[PackEntry | None, str]:
        """The generic entry built for this layer's variant (`by_variant`; else `entries` were named for this very
        layer) and this call's exact signature, or why none is."""
        fits = [e for e in entries
                if e.family == GENERIC and (not by_variant or e.layer_variant == self.variant(layer))]
        if not fits:
            return None, "layer attributes not in the pack"
        named = normal(params, call)
        for entry in fits:
            if self.matcher(entry).inputs((), named) is not None:
                return entry, ""
        return None, "call signature not in the pack"

    def runner(self, entry: PackEntry, params: tuple[str, ...], forward: Callable[..., Any]) -> Callable[..., Any]:
        """The kernel's run for a settled call: its tensors in order in, the layer's own output structure out."""
        matcher = self.matcher(entry)
        output = matcher.output

        def run(call: dict[str, Any]) -> Any:
            return output(forward(*[v for p in params if isinstance(v := call.get(p), torch.Tensor)]))

        def flattened(call: dict[str, Any]) -> Any:
            return output(forward(*matcher.inputs((), normal(params, call))))

        return run if matcher.direct else flattened
