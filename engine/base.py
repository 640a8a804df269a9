from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from kernelbot.records import ModelSpec, Pack


class EngineAdapter(Protocol):
    """What kernelbot needs from a serving engine. One implementation per engine."""

    spec: ModelSpec

    def run_workload(self) -> torch.Tensor:
        """Run the serving workload once; return the generated token ids."""

    def profile(self, trace_path: Path) -> None:
        """Run the workload under the profiler and write a Kineto trace to trace_path."""

    def apply_pack(self, pack: Pack, pack_dir: Path) -> None:
        """Route matching calls to the pack's kernels (and count them)."""

    def remove_pack(self) -> None:
        """Restore the original model exactly."""
