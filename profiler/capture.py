from __future__ import annotations

import gzip
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


def profile_callable(fn: Callable[[], object], trace_path: Path) -> None:
    """Run fn once under torch.profiler (shapes and Python stacks on) and write a gzipped Kineto trace."""
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True, with_stack=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(trace_path, "wb", compresslevel=3) as dst:
            shutil.copyfileobj(src, dst)
