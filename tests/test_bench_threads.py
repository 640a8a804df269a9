"""A candidate's benchmark runs on the threads the model runs its op on (Task.threads): a served engine's worker may
have fewer cores than the host, and then both runners are bound to that many before any thread pool starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import write_module
from test_verify import RMS_TASK

from kernelbot.agent.tasks.references import reference_source
from kernelbot.agent.verify import bench as bench_module

ON_ONE_CORE = """
import os, torch
from kernelbot.agent.verify.runner import _bind, _warm_up
_bind(1)
_warm_up("cpu", 1)
print(len(os.sched_getaffinity(0)), torch.get_num_threads())
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a host with more than one core")
def test_a_runner_with_fewer_threads_than_the_host_is_bound_to_as_many_cores_before_its_pool_starts():
    out = subprocess.run([sys.executable, "-c", ON_ONE_CORE], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1"]


def test_a_tasks_threads_reach_its_benchmark_job(monkeypatch, tmp_path):
    sent: list[dict] = []

    def run_job(job: dict, *args, **kwargs):
        sent.append(job)
        raise RuntimeError("not run here")

    monkeypatch.setattr(bench_module, "run_job", run_job)
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    for threads in (1, None):
        with pytest.raises(RuntimeError, match="not run here"):
            bench_module.bench(RMS_TASK.model_copy(update={"threads": threads}), ref, ref, tmp_path / "bench",
                               rounds=2, device="cpu")
    assert [job["threads"] for job in sent] == [1, None]
