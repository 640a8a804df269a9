"""What every op family in kernel_library provides (after Liger-Kernel's discipline): a reference, kernels per backend
each behind a wrapper, and the Family record below, which the folder's __init__.py registers (registry.py). A
family's folder holds no tests: they are tests/kernel_library/test_<family>.py, and its benchmark is in
benchmarks/family_kernels.py (kernel_library/README.md says how to add a family)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from kernelbot.kernel_library.identity import ROOT  # the library root, defined once

GENERIC = "generic"  # the family of tasks whose reference is extracted from the model, not written by hand


class OpCall(NamedTuple):
    """One profiled op: its name and its inputs' dims and type names, as the trace records them."""

    name: str
    dims: list[list[int]]
    types: list[str]


def _leading_dims(shapes: list[list[int]]) -> list[list[int]]:
    return [list(range(len(s) - 1)) for s in shapes]


@dataclass(frozen=True)
class Family:
    name: str
    module_classes: tuple[str, ...]  # nn.Module class names this family replaces
    wrappers: dict[str, str]  # backend -> "module:Class" implementing ModelNew with a CONFIG
    configs: dict[str, list[dict[str, Any]]]  # backend -> configurations the proposer tries
    dtypes: dict[str, tuple[str, ...]]  # backend -> dtypes its kernels take
    init_args: Callable[[torch.nn.Module], list[Any]]
    # (flops, min bytes) of one call, from the dims of the first op the module launched (input, weights)
    cost: Callable[[list[list[int]], int], tuple[float, float]]
    # does this live module produce these dims (same weights' shapes, supported variant)?
    matches: Callable[[torch.nn.Module, list[list[int]]], bool]
    inputs: int = 1  # how many of the call's dims are forward()'s inputs (the rest are weights)
    # forward()'s inputs a model reads from memory on each call, not fresh from the op before (a layer's KV cache,
    # written steps ago): the benchmark rotates enough draws of them to leave the caches, as it does weights
    state_inputs: tuple[int, ...] = ()
    # per input, the dims that change between calls; by default every dim but the feature dim
    free_dims: Callable[[list[list[int]]], list[list[int]]] = _leading_dims
    # the call's (dims, type names) from the ops the module ran, where its first op does not show them
    call_dims: Callable[[list[OpCall]], tuple[list[list[int]], list[str]] | None] | None = None
    call_ops: int = 256  # how many of the module's first ops call_dims reads
    # structural test of a live module, whatever its class is called: does it compute the family's reference?
    covers: Callable[[torch.nn.Module], bool] | None = None
    # the dims that make calls one hotspot (calls differing elsewhere, e.g. in a KV cache's length, are one group)
    group_dims: Callable[[list[list[int]]], list[list[int]]] | None = None
    # for modules not called with the reference's inputs (an attention takes a cache object): how a live call runs
    # on the kernel — engine_call(kernel, module, args, kwargs, verified input shapes) → a thunk computing the
    # module's output, or None where this call is not one the kernel was verified for
    engine_call: Callable[[torch.nn.Module, torch.nn.Module, tuple, dict, list[list[int]]],
                          Callable[[], Any] | None] | None = None
    # a served call's weights' dims from the layer's constructor arguments, after its inputs' for `cost` (an engine's
    # plugin captures a call's inputs; its weights are the layer's)
    weight_dims: Callable[[list[Any]], list[list[int]]] | None = None

    @property
    def reference_path(self) -> Path:
        return ROOT / self.name / "reference.py"

    def candidate_source(self, backend: str, config: dict[str, Any]) -> str:
        module, cls = self.wrappers[backend].split(":")
        return (
            f'"""kernelbot built-in proposer: {self.name} on {backend}, config {config}."""\n\n'
            f"from kernelbot.kernel_library.{self.name}.{module} import {cls}\n\n\n"
            f"class ModelNew({cls}):\n    CONFIG = {config!r}\n"
        )


def cpp_family(name: str, wrapper: str, **fields: Any) -> Family:
    """A family whose one backend is C++ over the small-M GEMMs (fp32 and bf16, tried at grains 1, 4 and 16), that
    no class name selects: its modules are found by structure (`covers`), or it is only ever routed to."""
    return Family(name=name, module_classes=(), wrappers={"cpp": wrapper},
                  configs={"cpp": [{"grain": 1}, {"grain": 4}, {"grain": 16}]}, dtypes={"cpp": ("float32", "bfloat16")},
                  **fields)


def computes_reference(family: Family, module: torch.nn.Module, inputs: list[torch.Tensor]) -> bool:
    """Does the live module give what the family's reference gives on these inputs, with its own weights? The
    structural test behind `covers` for modules whose class name says nothing (MixtralRMSNorm, MyNorm...)."""
    from kernelbot.loading import load_module

    try:
        reference = load_module(family.reference_path, f"kb_covers_{family.name}").Model(*family.init_args(module))
        reference.load_state_dict(module.state_dict())
        reference.to(inputs[0].device)
        with torch.no_grad():
            want, got = reference(*inputs), module(*inputs)
    except Exception:  # another signature or state layout: not this family's op
        return False
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
        return False
    tol = 1e-5 if want.dtype == torch.float32 else 1e-2
    return torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)


def same_output(got: Any, want: torch.Tensor) -> bool:
    """Does a live module's output (the first element where it returns a tuple, as transformers' attentions do) give
    the reference's: same shape, close within the dtype's noise (1e-4 in fp32, 2e-2 in bf16/fp16)?"""
    got = got[0] if isinstance(got, tuple) else got
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return False
    tol = 1e-4 if want.dtype == torch.float32 else 2e-2
    return torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)


def rows(shape: list[int]) -> int:
    return math.prod(shape[:-1])


def dtype_name(dtype: torch.dtype) -> str:
    """'bfloat16' for torch.bfloat16: how records and init args name a dtype."""
    return str(dtype).removeprefix("torch.")


def hot_path(kernel: torch.nn.Module, dtype: str) -> Any:
    """The kernel's hot path bound for this dtype (forward or step with weights packed once), where `bound` and the
    forward (and step) that call it are one kernel_library class's own (the first with a `bound` in the kernel's MRO),
    defined in it or in its bases, none overridden: a candidate's own methods are what was verified, so a candidate
    that redefines any of them runs through its forward (None); so does a class that puts another library class's
    forward before them (a reference Model's, which never runs `bound`)."""
    if not hasattr(kernel, "bound"):  # a kernel with no bound hot path (Triton wrappers, some C++ ones)
        return None
    mro = type(kernel).__mro__
    owners = {next((c for c in mro if name in vars(c)), None)
              for name in ("bound", "forward", "step") if hasattr(kernel, name)}
    library = next((c for c in mro if _library_class(c) and hasattr(c, "bound")), None)
    if library is None or not all(_library_class(owner) and owner in library.__mro__ for owner in owners):
        return None
    return kernel.bound(getattr(torch, dtype))


def _library_class(cls: type | None) -> bool:
    """Whether `cls` is a kernel_library class: defined in one of its modules, under the name it has there."""
    return cls is not None and cls.__module__.startswith("kernelbot.kernel_library.") and getattr(
        sys.modules.get(cls.__module__), cls.__name__, None) is cls
