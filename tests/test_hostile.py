"""Hostile candidates through `verify`: each gets a failing verdict, and nothing escapes the sandbox."""

import json
import os
import time
from pathlib import Path

import pytest
from helpers import loopback_listener, write_module
from test_sandbox_and_bench import REFERENCE, TASK, processes_running

from kernelbot.agent.verify.run import verify
from kernelbot.sandbox.docker_runner import LABEL
from kernelbot.sandbox.landlock import abi_version
from kernelbot.sandbox.runner import PIDS_CGROUP, namespaces_available

# Each escape is tried with the full sandbox (namespaces, as root), as an unprivileged user would get it
# (no namespaces: Landlock and the audit hook alone), and in the Docker runner (a dockerd of this session's own).
# The Docker runner's run under -m slow (a container a test); the fast set runs its own hostile corpus
# (tests/test_docker_sandbox.py).
MODES = ["namespaces", "landlock", pytest.param("docker", marks=pytest.mark.slow)]
# Escapes that Landlock stops as the namespaces do (the filesystem, the process group): its runs are slow ones too
NAMESPACES_FAST = ["namespaces", *(pytest.param(m, marks=pytest.mark.slow) for m in ("landlock", "docker"))]


@pytest.fixture
def mode(request, monkeypatch):
    if request.param == "docker":
        client, tmp = request.getfixturevalue("docker_daemon")
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp}/docker.sock")
        monkeypatch.setenv("KERNELBOT_SANDBOX", "docker")
        yield request.param
        assert client.containers.list(all=True, filters={"label": LABEL}) == []  # every job's container removed
        return
    monkeypatch.setenv("KERNELBOT_SANDBOX", "process")
    if request.param == "landlock":
        if abi_version() < 4:
            pytest.skip("this kernel has no Landlock with network rules (ABI >= 4)")
        monkeypatch.setenv("KERNELBOT_NO_NAMESPACES", "1")
    elif not namespaces_available():
        pytest.skip("namespaces need root and util-linux unshare")
    yield request.param

REPO = Path(__file__).resolve().parents[1]
HEADER = """
import os, socket, subprocess, sys, time
import torch
from torch import nn

class ModelNew(nn.Module):
    def forward(self, x):
"""


def _run(tmp_path, body: str, timeout: float = 30.0):
    ref = write_module(tmp_path / "reference.py", REFERENCE.replace("SLEEP", "0"))
    indented = "\n".join("        " + line for line in body.strip().splitlines())
    cand = write_module(tmp_path / "c" / "candidate.py", HEADER + indented + "\n        return torch.tanh(x)\n")
    return verify(TASK, ref, cand, tmp_path / "w", timeout=timeout)


def _everything_written(tmp_path) -> str:
    return "".join(p.read_bytes().decode(errors="replace") for p in tmp_path.rglob("*") if p.is_file())


def test_sleep_past_the_timeout(tmp_path):
    assert "timeout" in _run(tmp_path, "time.sleep(600)", timeout=6).failed


def test_memory_balloon_is_capped(tmp_path):
    verdict = _run(tmp_path, "hog = bytearray(64 << 30)")
    assert "crash" in verdict.failed and "MemoryError" in json.dumps([c.detail for c in verdict.checks])


def test_fork_bomb_is_capped_and_cleaned_up(tmp_path):
    verdict = _run(tmp_path, "while True:\n    os.fork()", timeout=20)
    assert verdict.verdict == "fail" and {"crash", "timeout", "sandbox_violation"} & set(verdict.failed)
    if PIDS_CGROUP.is_dir():  # this job's cgroup (named after this process) was emptied and removed
        assert list(PIDS_CGROUP.glob(f"kernelbot-{os.getpid()}-*")) == []


@pytest.mark.parametrize("mode", NAMESPACES_FAST, indirect=True)
@pytest.mark.parametrize("target", [Path.home() / "kb_hostile_home.txt", REPO / "kb_hostile_checkout.txt"])
def test_writes_outside_the_work_dir(tmp_path, target, mode):
    verdict = _run(tmp_path, f"""
try:
    with open({str(target)!r}, "w") as f:
        f.write("pwned")
except OSError:
    pass
os.system("echo pwned > {target}.sh")
""")
    assert "sandbox_violation" in verdict.failed
    assert not target.exists()
    target.unlink(missing_ok=True)


@pytest.mark.parametrize("mode", MODES, indirect=True)
def test_secrets_are_absent_and_asking_for_them_is_a_violation(tmp_path, monkeypatch, mode):
    secret = f"sk-hostile-{time.time_ns()}"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("HF_TOKEN", secret)
    verdict = _run(tmp_path, """
found = [os.environ.get("OPENAI_API_KEY"), os.getenv("HF_TOKEN")] + [v for k, v in os.environ.items()]
print(found, file=sys.stderr)
with open("loot.txt", "w") as f:
    f.write(repr(found))
""")
    assert "sandbox_violation" in verdict.failed
    assert secret not in _everything_written(tmp_path)
    assert secret not in verdict.model_dump_json()


@pytest.mark.parametrize("mode", NAMESPACES_FAST, indirect=True)
def test_what_a_candidate_reads_or_says_does_not_reach_the_verdict(tmp_path, monkeypatch, mode):
    """Without namespaces the parent's /proc entries are there to read: the runner's own Landlock layer refuses
    them (and credentials under /etc), the attempt is a violation, and the candidate's exception text reaches
    the verdict only as a short excerpt."""
    secret = f"sk-verdict-{time.time_ns()}"
    monkeypatch.setenv("KB_HOSTILE_API_KEY", secret)
    verdict = _run(tmp_path, f"""
loot = []
for path in ["/etc/shadow", "/proc/{os.getpid()}/environ", "/proc/{os.getppid()}/environ", "/proc/1/environ"]:
    try:
        with open(path, "rb") as f:
            loot.append(f.read().decode(errors="replace"))
    except OSError:
        pass
raise RuntimeError("loot: " + " | ".join(loot) * 20)
""")
    assert secret not in verdict.model_dump_json()
    assert "sandbox_violation" in verdict.failed and "crash" in verdict.failed
    assert "read_outside_box" in next(c.detail for c in verdict.checks if c.id == "sandbox_violation")
    assert len(next(c.detail for c in verdict.checks if c.id == "crash")) < 400


@pytest.mark.parametrize("mode", MODES, indirect=True)
def test_no_network_even_to_loopback(tmp_path, mode):
    with loopback_listener() as (port, received):
        verdict = _run(tmp_path, f"""
try:
    s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
    s.sendall(b"exfiltrated")
except OSError:
    pass
subprocess.run(["python3", "-c", "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"])
""")
    assert "sandbox_violation" in verdict.failed
    assert received == []  # neither from Python nor from a program it started


@pytest.mark.parametrize("mode", NAMESPACES_FAST, indirect=True)
def test_killing_the_parent_does_not_stop_the_run(tmp_path, mode):
    if mode == "landlock" and abi_version() < 6:
        pytest.skip("signal scoping needs Landlock ABI >= 6")
    verdict = _run(tmp_path, "import signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)")
    assert verdict.verdict == "fail"  # and this test process is still here to say so


@pytest.mark.parametrize("mode", NAMESPACES_FAST, indirect=True)
def test_detached_daemon_is_ended_and_flagged(tmp_path, mode):
    marker = f"{700 + os.getpid() % 1000}.{time.time_ns() % 10**6}"
    verdict = _run(tmp_path, f"""
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "{marker}"])
    os._exit(0)
""")
    assert "sandbox_violation" in verdict.failed
    deadline = time.time() + 5
    while processes_running(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert processes_running(marker) == []


def test_protections_are_recorded(tmp_path, monkeypatch):
    # torch exports TORCHINDUCTOR_CACHE_DIR once it has used its cache; a child must not inherit a path outside
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "outside"))
    verdict = _run(tmp_path, "from torch._inductor.runtime.cache_dir_utils import cache_dir\ncache_dir()")
    assert verdict.failed == ["reference_fallback"], verdict.problems  # harmless, but all PyTorch
    text = " ".join(verdict.protections)
    assert "timeout" in text and "secrets scrubbed" in text
    if namespaces_available():
        assert "no network" in text and "read-only" in text and "no capabilities" in text
    if abi_version() >= 4:
        assert "Landlock" in text and "no TCP bind or connect" in text
