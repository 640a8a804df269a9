"""What the C++ backends' wrapper classes share: the extension built from their source, and their weights packed
once into the layouts their kernels take (repacked when a weight is replaced or written in place)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch

from kernelbot.kernel_library.cpp_build import load_cpp

Pack = Callable[[list[torch.Tensor]], torch.Tensor]


class PackedWeights:
    """Panels packed once from live weights; repacked if a weight is replaced or written in place."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._panels: torch.Tensor | None = None

    def get(self, weights: list[torch.Tensor], pack: Pack) -> torch.Tensor:
        key = (pack, *((w.data_ptr(), w._version) for w in weights))
        if key != self._key:
            self._panels, self._key = pack(weights), key
        assert self._panels is not None
        return self._panels


class CppWrapper:
    """Put before a family's reference Model in a C++ wrapper's bases: loads SOURCE's extension (`_ext`) after the
    Model is built, and keeps one PackedWeights per name for `packed`. The wrapper's `bound(dtype)`, where it has one,
    is its forward for inputs of that dtype with the weights packed and the constants taken once: the engine's hot
    path (kernel_library.base.hot_path), bound again whenever a pack is applied."""

    SOURCE: ClassVar[Path]
    CONFIG: dict[str, Any] = {"grain": 4}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._ext = load_cpp(self.SOURCE)
        self._packed: dict[str, PackedWeights] = {}

    def packed(self, name: str, weights: list[torch.Tensor], pack: Pack) -> torch.Tensor:
        """`weights` packed by `pack`, kept under `name` until a weight or the packing changes."""
        return self._packed.setdefault(name, PackedWeights()).get(weights, pack)
