"""What a GPU job's sandbox must let the CUDA driver do, tried here without a GPU: name its threads under /proc
(from a runner forked after the first Landlock layer, or from a job that runs the candidate itself), run with no
address-space limit, run Triton's compile tools unrecorded; and what it still refuses, and that a CPU job gets none
of it."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelbot.agent.verify.messages import NoopJob
from kernelbot.sandbox import run_job
from kernelbot.sandbox.box import STDERR
from kernelbot.sandbox.landlock import abi_version
from kernelbot.sandbox.runner import launched, memory_limit, namespaces_available

# The job's first layer; then, for a job that forks its runner (whose pid that layer could not know), the fork and
# the runner's own layer. Then what the CUDA driver does at cuInit (name a thread) and what a candidate must still
# not do: write its process's other /proc files (its oom_score_adj, written back unchanged) or outside the box.
LAYERS = textwrap.dedent("""
    import json, os, sys, threading
    from pathlib import Path
    from kernelbot.sandbox.confine import Harness, confine_runner
    from kernelbot.sandbox.landlock import restrict
    box, outside, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    gpu, forks = mode != "cpu", mode != "gpu-no-runner"
    restrict(box, gpu, forks=forks)

    def attempts():
        seen = {}
        with open("/proc/self/oom_score_adj") as f:
            oom = f.read()
        for name, path, text in (("thread_name", f"/proc/self/task/{threading.get_native_id()}/comm", "kb-runner"),
                                 ("other_proc_file", "/proc/self/oom_score_adj", oom),
                                 ("outside", str(outside), "x")):
            try:
                with open(path, "w") as f:
                    f.write(text)
                seen[name] = "written"
            except OSError as exc:
                seen[name] = type(exc).__name__
        return json.dumps(seen)

    if not forks:
        print(attempts())
        sys.exit(0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        work = box / "work"
        work.mkdir()
        confine_runner(work, [], Harness(), gpu=gpu)
        os.write(write, attempts().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    print(os.read(read, 4096).decode())
""")
REFUSED_ELSEWHERE = {"other_proc_file": "PermissionError", "outside": "PermissionError"}


def _layers(tmp_path: Path, mode: str) -> dict[str, str]:
    box = tmp_path / mode
    box.mkdir()
    proc = subprocess.run([sys.executable, "-c", LAYERS, str(box), str(tmp_path / f"outside_{mode}.txt"), mode],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(abi_version() < 1, reason="this kernel has no Landlock")
@pytest.mark.parametrize("mode", ["gpu", "gpu-no-runner"])
def test_a_gpu_job_can_name_its_threads_as_the_cuda_driver_does_and_writes_nothing_else(tmp_path, mode):
    assert _layers(tmp_path, mode) == {"thread_name": "written", **REFUSED_ELSEWHERE}


@pytest.mark.skipif(abi_version() < 1, reason="this kernel has no Landlock")
def test_a_cpu_jobs_runner_cannot_write_under_proc(tmp_path):
    assert _layers(tmp_path, "cpu") == {"thread_name": "PermissionError", **REFUSED_ELSEWHERE}


@pytest.mark.parametrize("address_limited", [True, False])
def test_only_a_cpu_job_gets_an_address_space_limit(address_limited):
    probe = "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0])"
    proc = subprocess.run(launched([sys.executable, "-c", probe], None, 30, address_limited), capture_output=True,
                          text=True, timeout=60)
    assert int(proc.stdout) == (memory_limit() if address_limited else resource.RLIM_INFINITY)


def test_a_job_starts_with_no_python_run_between_fork_and_exec_in_the_threaded_runner(tmp_path, monkeypatch):
    """The sanitizer starts its four tools side by side from threads, on a GPU node beside CUDA's own: a preexec_fn
    there could deadlock in the forked child. The limits are applied by the exec'd launcher instead."""
    from kernelbot.sandbox import runner

    started: list[dict] = []
    real_popen = subprocess.Popen

    def popen(args, **kwargs):
        started.append({"args": list(args), **kwargs})
        return real_popen(args, **kwargs)

    monkeypatch.setenv("KERNELBOT_SANDBOX", "process")
    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    result = run_job(NoopJob().model_dump(mode="json"), tmp_path / "w", timeout=60, gpu=0)
    assert result.status == "ok", result.detail
    job, = [s for s in started if "job.json" in s["args"]]
    assert job.get("preexec_fn") is None and job["start_new_session"]
    assert job["args"][1:4] == ["-I", "-S", str(runner.LAUNCH)]  # the launcher imports the standard library only


def test_the_process_runner_says_which_limit_a_job_ran_under(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELBOT_SANDBOX", "process")
    job = NoopJob().model_dump(mode="json")
    cpu, gpu = run_job(job, tmp_path / "cpu", timeout=60), run_job(job, tmp_path / "gpu", timeout=60, gpu=0)
    assert cpu.status == gpu.status == "ok"
    assert any(p.startswith("address space ") for p in cpu.protections)
    assert any("no address-space limit" in p for p in gpu.protections)


# A wrapper that, like compute-sanitizer, runs the harness as its child (so the harness is not pid 1 of the job's pid
# namespace): from inside, the path the CUDA driver writes a thread's name to must exist.
FORKING_WRAPPER = ["sh", "-c", '[ -d "/proc/self/task/$$" ] || echo "no /proc of the job\'s pid namespace" >&2; "$@"',
                   "sh"]


@pytest.mark.skipif(not namespaces_available(), reason="needs root and util-linux unshare (pid namespaces)")
def test_a_job_under_a_forking_wrapper_sees_the_proc_of_its_own_pid_namespace(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELBOT_SANDBOX", "process")
    result = run_job(NoopJob().model_dump(mode="json"), tmp_path, timeout=60, gpu=0, wrapper=FORKING_WRAPPER)
    assert result.status == "ok", result.detail
    assert "no /proc" not in (tmp_path / STDERR).read_text()


AUDITED = textwrap.dedent("""
    import json, os, shutil, subprocess, sys
    from pathlib import Path
    from kernelbot.sandbox.confine import Recorder, install_audit
    box = Path(sys.argv[1])
    planted = box / "gcc"  # a program of a build tool's name, written where a candidate can write
    shutil.copy(shutil.which("true"), planted)
    read, write = os.pipe()
    install_audit(Recorder(write, box))
    for argv in (["file", "-b", sys.executable], ["ldconfig", "-p"], ["true"]):
        subprocess.run(argv, capture_output=True)
    quiet = [(os.POSIX_SPAWN_DUP2, os.open(os.devnull, os.O_WRONLY), fd) for fd in (1, 2)]
    for path in (shutil.which("file"), shutil.which("true"), str(planted)):  # as subprocess starts some programs
        os.waitpid(os.posix_spawn(path, [os.path.basename(path), "--version"], {}, file_actions=quiet), 0)
    os.close(write)
    print(os.read(read, 65536).decode())
""")


def test_tritons_compile_tools_run_unrecorded_and_any_other_program_is_recorded(tmp_path):
    # Triton's first compile on a GPU runs ptxas, `/sbin/ldconfig -p` and `file` (platform.architecture)
    proc = subprocess.run([sys.executable, "-c", AUDITED, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert [r["kind"] for r in records] == ["process"] * 3
    assert records[0]["detail"] == "subprocess ['true']"
    assert [r["detail"].split(" ")[0] for r in records[1:]] == ["os.posix_spawn"] * 2
    assert "/true'" in records[1]["detail"] and f"{tmp_path}/gcc'" in records[2]["detail"]
