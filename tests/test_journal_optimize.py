"""A real `kernelbot optimize` killed with SIGKILL at a random candidate and resumed: no recorded candidate is lost
or recomputed, and resuming the finished run again reproduces the same report."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from helpers import recorded_candidates

ARGS = ["--model", "llama-micro", "--batch", "4", "--prompt-len", "8", "--decode-steps", "4", "--families",
        "rmsnorm", "--no-compile", "--rounds", "3", "--min-share", "0", "--max-tasks", "1", "--iterations", "2"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelbot.cli", *args], capture_output=True, text=True, timeout=1200)


@pytest.mark.slow
def test_kill_9_mid_run_then_resume(tmp_path):
    run_dir, store = tmp_path / "run", str(tmp_path / "store")
    kill_after = random.randint(1, 3)
    proc = subprocess.Popen([sys.executable, "-m", "kernelbot.cli", "optimize", *ARGS, "--store", store,
                             "--run-dir", str(run_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 900
    while proc.poll() is None and time.monotonic() < deadline:
        if (run_dir / "journal.sqlite").exists() and len(recorded_candidates(run_dir)) >= kill_after:
            break
        time.sleep(0.5)
    assert proc.poll() is None, f"the run ended before its candidate {kill_after}: {proc.stderr.read()[-1500:]}"
    os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, nothing else
    proc.wait()
    recorded = recorded_candidates(run_dir)
    assert len(recorded) >= kill_after and not (run_dir / "report.json").exists()

    status = _cli("status", str(run_dir))
    assert status.returncode == 0 and "stopped (killed or crashed" in status.stdout, status.stdout

    resumed = _cli("optimize", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final = recorded_candidates(run_dir)
    for key, value in recorded.items():  # kept exactly: same verdict (seed included), benchmark, row
        assert final[key] == value, key
    report = json.loads((run_dir / "report.json").read_text())
    assert report["sessions"] == 2 and (run_dir / "report.html").exists()
    rows = {k["candidate_id"]: k for k in report["kernels"]}
    for value in recorded.values():  # in the report, with the benchmark measured before the kill
        assert rows[value["row"]["candidate_id"]]["speedup"] == value["row"]["speedup"]
    assert "resuming" in (run_dir / "log.txt").read_text()

    again = _cli("optimize", "--resume", str(run_dir))  # everything recorded: the same final state
    assert again.returncode == 0, again.stderr[-2000:]
    report_2 = json.loads((run_dir / "report.json").read_text())
    for key in ("kernels", "baseline_ms", "optimized_ms", "fidelity", "hotspots_before", "hotspots_after"):
        assert report_2[key] == report[key], key
    assert recorded_candidates(run_dir) == final
