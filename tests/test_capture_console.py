"""What profiling leaves on the console: none of Kineto's `USDT: ... profiler_start/profiler_stop` lines, which it
writes to the stderr file descriptor itself (so capfd, which captures fd 2, sees them), and everything else."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
import torch

from kernelbot.engine.capture import kineto_markers_hidden, profile_callable


def test_profiling_a_callable_prints_no_kineto_usdt_line_and_still_writes_its_trace(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "tiny.json.gz"
    profile_callable(lambda: torch.ones(4, 4) @ torch.ones(4, 4), trace)
    err = capfd.readouterr().err
    assert "USDT" not in err and "profiler_start" not in err and "profiler_stop" not in err, err
    names = {event.get("name") for event in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]}
    assert "aten::mm" in names


def test_other_stderr_output_while_the_markers_are_hidden_is_written_back_in_order(
        capfd: pytest.CaptureFixture[str]) -> None:
    with kineto_markers_hidden():
        os.write(2, b"before\nUSDT:2026-01-01 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a warning from elsewhere\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "before\na warning from elsewhere\nafter\n"
