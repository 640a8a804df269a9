"""Profile one callable with torch.profiler and write its Kineto trace as gzipped Chrome JSON.

Kineto (torch.profiler's C++ library) writes a `USDT:... profiler_start` and a `USDT:... profiler_stop` line straight
to the process's stderr file descriptor, which lands on the console in the middle of `kernelbot optimize`. Its
KINETO_LOG_LEVEL cannot hide them alone: USDT ranks above ERROR (a level that hides them hides Kineto's errors too),
and Kineto reads the variable once, when torch loads. So the profiler starts and stops with fd 2 pointed at a buffer,
and everything else written there meanwhile goes back to stderr.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

STDERR_FD = 2
KINETO_MARKER = b"USDT:"  # the start of each line Kineto's USDT log level writes


@contextmanager
def kineto_markers_hidden() -> Iterator[None]:
    """Within: fd 2 writes into a buffer; after: the buffer's lines go back to fd 2, less Kineto's USDT lines."""
    sys.stderr.flush()
    try:
        saved = os.dup(STDERR_FD)
    except OSError:  # no stderr to protect
        yield
        return
    with tempfile.TemporaryFile() as buffer:
        os.dup2(buffer.fileno(), STDERR_FD)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, STDERR_FD)
            os.close(saved)
            buffer.seek(0)
            _write_all(STDERR_FD, _without_markers(buffer.read()))


def _without_markers(text: bytes) -> bytes:
    return b"".join(line for line in text.splitlines(keepends=True) if not line.startswith(KINETO_MARKER))


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def profile_callable(fn: Callable[[], object], trace_path: Path) -> None:
    """Run fn once under torch.profiler (shapes and Python stacks on) and write a gzipped Kineto trace."""
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities, record_shapes=True, with_stack=True)
    with kineto_markers_hidden():
        prof.start()
    try:
        fn()
    finally:
        with kineto_markers_hidden():
            prof.stop()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(trace_path, "wb", compresslevel=3) as dst:
            shutil.copyfileobj(src, dst)
