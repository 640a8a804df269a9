"""What every op family in kernel_library provides (Liger-Kernel's discipline: one op = reference +
kernels per backend + wrapper + test + benchmark)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

ROOT = Path(__file__).parent


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
    max_rows: int | None = None  # kernels built for small M (decode); larger inputs are left alone
    inputs: int = 1  # how many of the call's dims are forward()'s inputs (the rest are weights)
    # per input, the dims that change between calls; by default every dim but the feature dim
    free_dims: Callable[[list[list[int]]], list[list[int]]] = _leading_dims
    # the call's (dims, type names) from the ops the module ran, where its first op does not show them
    call_dims: Callable[[list[OpCall]], tuple[list[list[int]], list[str]] | None] | None = None

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


def rows(shape: list[int]) -> int:
    return math.prod(shape[:-1])


def dtype_name(dtype: torch.dtype) -> str:
    """'bfloat16' for torch.bfloat16: how records and init args name a dtype."""
    return str(dtype).removeprefix("torch.")
