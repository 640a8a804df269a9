"""A CUDA job's harness forks its runners before anything in it touches CUDA: a child forked from a process that
queried the CUDA runtime cannot initialise CUDA ("Cannot re-initialize CUDA in forked subprocess"), so every verify
and bench job on a GPU would end as the candidate's crash.

On this CPU build of torch the harness runs as on a CUDA build: the device-count entry point is put in place (which is
what makes torch call itself CUDA-compiled) and records every call; the fork itself is stopped and reports whether
CUDA had been queried by then."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernelbot.agent.verify.messages import BenchJob, VerifyJob

# Runs in a fresh interpreter, in the box: torch.utils.cpp_extension must not have been imported yet.
AS_ON_A_CUDA_BUILD = r"""
import json, os, sys
import torch

queries = []
torch._C._cuda_getDeviceCount = lambda: queries.append("cudaGetDeviceCount") or 0
torch.version.cuda = "13.0"
assert torch.cuda._is_compiled(), "torch would not take itself for a CUDA build"


def fork():
    print(json.dumps({"forked": True, "cuda_queried_before": queries}), flush=True)
    os._exit(0)


os.fork = fork
sys.argv = ["harness", "job.json"]
from kernelbot.agent.verify import harness

harness.main()
print(json.dumps({"forked": False, "cuda_queried_before": queries}), flush=True)
"""


def _jobs(box: Path) -> dict[str, dict]:
    files = {name: str(box / name) for name in ("candidate.py", "plan.pt", "state.pt", "inputs.pt")}
    return {
        "verify": VerifyJob(candidate=files["candidate.py"], plan=files["plan.pt"], state_dicts=[files["state.pt"]],
                            init_seed=1, device="cuda").model_dump(mode="json"),
        "bench": BenchJob(reference=files["candidate.py"], candidate=files["candidate.py"], init_args=[],
                          state_dict=files["state.pt"], inputs=files["inputs.pt"], rounds=1,
                          device="cuda").model_dump(mode="json"),
    }


@pytest.mark.parametrize("kind", ["verify", "bench"])
def test_a_cuda_jobs_harness_forks_its_runner_before_anything_queries_cuda(tmp_path: Path, kind: str) -> None:
    (tmp_path / "job.json").write_text(json.dumps(_jobs(tmp_path)[kind]))
    (tmp_path / "cuda_home").mkdir()  # torch's extension tools look for the toolkit, then ask for the GPU
    env = {"PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path / "cuda_home"), "PYTHONPATH": ":".join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", AS_ON_A_CUDA_BUILD], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stderr[-2000:]
    seen = json.loads(lines[0])
    assert seen["forked"], "the harness never forked a runner: the test shows nothing"
    assert seen["cuda_queried_before"] == [], "CUDA was queried before the fork: the runner cannot use the GPU"
