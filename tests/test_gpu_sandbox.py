"""What a GPU job's sandbox must let the CUDA driver do, tried here without a GPU: name its threads under /proc
from a runner forked after the first Landlock layer, run with no address-space limit, run Triton's compile tools;
and a CPU job still gets none of that."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelbot.agent.verify.messages import NoopJob
from kernelbot.sandbox import run_job
from kernelbot.sandbox.confine import BUILD_TOOLS
from kernelbot.sandbox.landlock import abi_version

# The job's first layer, a fork (the runner, whose pid the first layer could not know), the runner's own layer,
# then what the CUDA driver does at cuInit (name a thread) and what a candidate must still not do (write elsewhere).
LAYERS = textwrap.dedent("""
    import json, os, sys, threading
    from pathlib import Path
    from kernelbot.sandbox.confine import confine_runner
    from kernelbot.sandbox.landlock import restrict
    box, outside, gpu = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "gpu"
    restrict(box, gpu)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        work = box / "work"
        work.mkdir()
        confine_runner(work, [], [], gpu=gpu)
        seen = {}
        for name, path in (("thread_name", f"/proc/self/task/{threading.get_native_id()}/comm"),
                           ("outside", str(outside))):
            try:
                with open(path, "w") as f:
                    f.write("kb-runner")
                seen[name] = "written"
            except OSError as exc:
                seen[name] = type(exc).__name__
        os.write(write, json.dumps(seen).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    print(os.read(read, 4096).decode())
""")


def _layers(tmp_path: Path, kind: str) -> dict[str, str]:
    box = tmp_path / kind
    box.mkdir()
    proc = subprocess.run([sys.executable, "-c", LAYERS, str(box), str(tmp_path / f"outside_{kind}.txt"), kind],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(abi_version() < 1, reason="this kernel has no Landlock")
def test_a_gpu_jobs_runner_can_name_its_threads_as_the_cuda_driver_does_and_still_writes_nowhere_else(tmp_path):
    assert _layers(tmp_path, "gpu") == {"thread_name": "written", "outside": "PermissionError"}


@pytest.mark.skipif(abi_version() < 1, reason="this kernel has no Landlock")
def test_a_cpu_jobs_runner_cannot_write_under_proc(tmp_path):
    assert _layers(tmp_path, "cpu") == {"thread_name": "PermissionError", "outside": "PermissionError"}


def test_a_gpu_job_runs_without_an_address_space_limit_and_a_cpu_job_with_one(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELBOT_SANDBOX", "process")
    job = NoopJob().model_dump(mode="json")
    cpu = run_job(job, tmp_path / "cpu", timeout=60)
    gpu = run_job(job, tmp_path / "gpu", timeout=60, gpu=0)
    assert cpu.status == gpu.status == "ok"
    assert any(p.startswith("address space ") for p in cpu.protections)
    assert not any(p.startswith("address space ") for p in gpu.protections)
    assert any("no address-space limit" in p for p in gpu.protections)


def test_tritons_own_compile_tools_are_build_tools_not_violations():
    # Triton's first compile on a GPU runs ptxas, `/sbin/ldconfig -p` and `file` (platform.architecture)
    assert {"ptxas", "ldconfig", "file"} <= BUILD_TOOLS
