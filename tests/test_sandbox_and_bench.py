"""The sandbox and the benchmark together: a clearly faster candidate is accepted and a slower one is not, a
timeout ends the candidate and everything it started, and the child's environment carries no secrets."""

import os
import time

import pytest
from helpers import write_module

from kernelbot.agent.verify.bench import bench, per_round
from kernelbot.agent.verify.messages import BenchResult, Facts
from kernelbot.agent.verify.run import verify
from kernelbot.records import Task
from kernelbot.sandbox.runner import child_env

TASK = Task(id="t", hotspot_id="h", family="", module_class="Model", dtype="float32", input_shapes=[[4, 32]],
            free_dims=[[0]], init_args=[], share=0.0, floor_us=0.0)

REFERENCE = """
import time
import torch
from torch import nn

class Model(nn.Module):
    def forward(self, x):
        time.sleep(SLEEP)
        return torch.tanh(x)
"""

CANDIDATE = """
import time
import torch
from torch import nn

class ModelNew(nn.Module):
    def forward(self, x):
        time.sleep(SLEEP)
        return torch.tanh(x)
"""


def _pair(tmp_path, ref_sleep: float, cand_sleep: float):
    ref = write_module(tmp_path / "reference.py", REFERENCE.replace("SLEEP", str(ref_sleep)))
    cand = write_module(tmp_path / "c" / "candidate.py", CANDIDATE.replace("SLEEP", str(cand_sleep)))
    return ref, cand


def test_bench_accepts_a_clearly_faster_candidate(tmp_path):
    # The reference sleeps 200 ms a call, the candidate not at all: a gap a busy host does not close (at load 5 on 2
    # cores, with a CPU-bound process beside it, the candidate's 4x32 tanh measured 16 ms a call, the wait for a core).
    # What is asserted is the verdict and that the record agrees with itself, never how large the ratio came out.
    ref, cand = _pair(tmp_path, 0.2, 0.0)
    result = bench(TASK, ref, cand, tmp_path / "b", rounds=7, device="cpu")
    assert result.significant
    assert (result.candidate_id, result.rounds) == ("c", 7)
    assert result.reference_us >= 200_000 > result.candidate_us  # each side's time is its own call's
    assert result.speedup == pytest.approx(result.reference_us / result.candidate_us, rel=1e-2)
    assert result.host is not None  # how busy the host was comes with the numbers


def test_bench_rejects_a_slower_candidate(tmp_path):
    # 20 ms against 200 ms a call, for the same reason: on a busy host a call that does not sleep measured 12 ms
    ref, cand = _pair(tmp_path, 0.02, 0.2)
    result = bench(TASK, ref, cand, tmp_path / "b", rounds=7, device="cpu")
    assert not result.significant
    assert result.candidate_us >= 200_000 > result.reference_us
    assert result.speedup == pytest.approx(result.reference_us / result.candidate_us, rel=1e-2)


def processes_running(marker: str) -> list[int]:
    """PIDs (as this machine sees them) whose command line contains `marker`, zombies excluded."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            state = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry))
    return found


def test_timeout_ends_the_candidate_and_everything_it_started(tmp_path):
    marker = f"{600 + os.getpid() % 1000}.{time.time_ns() % 10**6}"
    ref = write_module(tmp_path / "reference.py", REFERENCE.replace("SLEEP", "0"))
    # started as the module loads: once it has, the runner can start no process (its seccomp filter)
    cand = write_module(tmp_path / "c" / "candidate.py", f"""
import os, subprocess
from torch import nn

subprocess.Popen(["sleep", "{marker}"])  # a child in the candidate's group
if os.fork() == 0:  # and a daemon that leaves the group
    os.setsid()
    os.execvp("sleep", ["sleep", "{marker}"])

class ModelNew(nn.Module):
    def forward(self, x):
        while True:
            pass
""")
    t0 = time.perf_counter()
    verdict = verify(TASK, ref, cand, tmp_path / "w", timeout=10)
    assert "timeout" in verdict.failed
    assert time.perf_counter() - t0 < 60
    assert not (tmp_path / "w" / "box").exists()  # the work dir is removed
    deadline = time.time() + 5
    while processes_running(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert processes_running(marker) == []


def test_child_environment_has_no_secrets(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("HF_TOKEN", "hf-test")
    monkeypatch.setenv("KERNELBOT_HARMLESS", "1")
    env = child_env()
    assert "OPENAI_API_KEY" not in env and "HF_TOKEN" not in env
    assert env["KERNELBOT_HARMLESS"] == "1"


def _rounds(medians: list[float], means: list[float], cand_medians: list[float],
            cand_means: list[float]) -> BenchResult:
    return BenchResult(reference_us=medians, reference_mean_us=means, candidate_us=cand_medians,
                       candidate_mean_us=cand_means, iters=20, facts=Facts())


def test_a_round_is_timed_by_its_median_call_when_both_sides_wait_out_the_same_stalls():
    # a 4 ms tick in one call of twenty lifts each side's mean by about 200 us, the fast candidate's most of all
    report = _rounds([400.0] * 5, [600.0] * 5, [100.0] * 5, [300.0] * 5)
    ref, cand, by_mean = per_round(report)
    assert (ref, cand, by_mean) == ([400.0] * 5, [100.0] * 5, False)


def test_a_candidate_whose_slow_calls_cost_more_than_the_hosts_stalls_is_timed_by_its_mean_calls():
    # the same stalls, and work done once every few calls that puts 900 us on each of its calls' mean
    report = _rounds([400.0] * 5, [600.0] * 5, [100.0] * 5, [1100.0] * 5)
    ref, cand, by_mean = per_round(report)
    assert (ref, cand, by_mean) == ([600.0] * 5, [1100.0] * 5, True)
