"""Engine adapters: load a model, run its workload, profile it, apply and remove kernel packs."""

from kernelbot.engine.base import EngineAdapter
from kernelbot.engine.torch_engine import TorchEngine, builtin_spec

__all__ = ["EngineAdapter", "TorchEngine", "builtin_spec"]
