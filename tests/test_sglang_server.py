"""The SGLang adapter's server side — launch, readiness, the built-in workload, /start_profile collection,
clean shutdown — against a stand-in server speaking SGLang's HTTP protocol (a real server needs a GPU)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from helpers import free_port

from kernelbot import KernelbotError
from kernelbot.engine.sglang_adapter import (
    ServerConfig,
    SGLangServer,
    Workload,
    profile,
    run_workload,
    trace_kernel_hits,
)

STANDIN = [sys.executable, str(Path(__file__).with_name("standin_sglang_server.py"))]



def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_launch_serve_profile_and_stop(tmp_path):
    config = ServerConfig(model_path="fake/model", tp=2, port=free_port(), launch_cmd=STANDIN, ready_timeout=60,
                          pack_dir=tmp_path / "pack", counts_dir=tmp_path / "counts")
    (tmp_path / "pack").mkdir()
    server = SGLangServer(config, tmp_path / "server.log")
    with server:
        pid = server.proc.pid
        metrics = run_workload(config.url, Workload(num_prompts=6, input_len=16, output_len=10, concurrency=3))
        traces = profile(config, Workload(num_prompts=2, input_len=8, output_len=4, concurrency=2), tmp_path / "prof")
    assert metrics.requests == 6 and metrics.output_tokens == 60
    assert metrics.mean_ttft_ms > 0 and metrics.mean_itl_ms > 0 and metrics.output_throughput > 0
    assert metrics.telemetry["before"]["available"] is False  # no GPU here: recorded as absent, not faked
    assert sorted(p.name for p in traces) == ["kernelbot-TP-0.trace.json.gz", "kernelbot-TP-1.trace.json.gz"]
    assert trace_kernel_hits(traces, ["kb_rmsnorm"]) == {p.name: 1 for p in traces}  # the plugin was selected
    assert not _alive(pid)  # stopped with its process group


def test_a_server_that_dies_is_a_one_line_error(tmp_path):
    config = ServerConfig(model_path="fake/model", port=free_port(), launch_cmd=[*STANDIN, "--die"], ready_timeout=60)
    with pytest.raises(KernelbotError, match="exited with code 3 before it was ready"):
        SGLangServer(config, tmp_path / "server.log").start()
