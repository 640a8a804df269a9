"""Engine adapters: load a model, run its workload, profile it, apply and remove kernel packs."""

from __future__ import annotations

from typing import Any

__all__ = ["TorchEngine", "builtin_spec"]


def __getattr__(name: str) -> Any:
    # Lazy, so that the SGLang plugin (kernelbot.engine.sglang_plugin), imported inside SGLang's processes,
    # pulls in neither transformers nor the profiler's dependencies.
    if name in ("TorchEngine", "builtin_spec"):
        from kernelbot.engine import torch_engine

        return getattr(torch_engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
