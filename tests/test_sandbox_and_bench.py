import os
import time

from helpers import write_module

from kernelbot.agent.bench import bench
from kernelbot.agent.verify import verify
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
    ref, cand = _pair(tmp_path, 0.004, 0.0)
    result = bench(TASK, ref, cand, tmp_path / "b", rounds=7)
    assert result.significant and result.speedup > 3


def test_bench_rejects_a_slower_candidate(tmp_path):
    ref, cand = _pair(tmp_path, 0.0, 0.002)
    result = bench(TASK, ref, cand, tmp_path / "b", rounds=7)
    assert not result.significant and result.speedup < 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it has ended all the same
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[1].split()[0] != "Z"


def test_timeout_ends_the_candidate_and_everything_it_started(tmp_path):
    ref = write_module(tmp_path / "reference.py", REFERENCE.replace("SLEEP", "0"))
    cand = write_module(tmp_path / "c" / "candidate.py", """
import subprocess
from pathlib import Path
from torch import nn

class ModelNew(nn.Module):
    def forward(self, x):
        child = subprocess.Popen(["sleep", "600"])
        Path("grandchild.pid").write_text(str(child.pid))
        while True:
            pass
""")
    t0 = time.perf_counter()
    verdict = verify(TASK, ref, cand, tmp_path / "w", timeout=15)
    assert verdict.failed == ["timeout"]
    assert time.perf_counter() - t0 < 60
    pid = int((tmp_path / "w" / "grandchild.pid").read_text())
    deadline = time.time() + 5
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def test_child_environment_has_no_secrets(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("HF_TOKEN", "hf-test")
    monkeypatch.setenv("KERNELBOT_HARMLESS", "1")
    env = child_env()
    assert "OPENAI_API_KEY" not in env and "HF_TOKEN" not in env
    assert env["KERNELBOT_HARMLESS"] == "1"
