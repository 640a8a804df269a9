"""The Docker runner: choosing it, and the hostile corpus through `verify` in it (a dockerd of this session's
own, tests/conftest.py). The escapes tried from tests/test_hostile.py run there too, as its `docker` mode."""

import os
import time
from pathlib import Path

import pytest
from test_hostile import _everything_written, _run

from kernelbot import KernelbotError
from kernelbot.sandbox import docker_runner
from kernelbot.sandbox.docker_runner import LABEL
from kernelbot.sandbox.runner import run_job

WORKDIR_FILES = {"plan.pt", "state_dict_0.pt", "state_dict_1.pt", "alt_state_dict_0.pt", "alt_state_dict_1.pt",
                 "alt_state_dict_2.pt", "stderr.txt", "result.json", "outputs.pt"}


@pytest.fixture
def fresh_engine(monkeypatch):
    monkeypatch.setattr(docker_runner, "_ready", {})  # no daemon probe cached from another test


@pytest.fixture
def docker(docker_daemon, monkeypatch, fresh_engine):
    client, tmp = docker_daemon
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp}/docker.sock")
    monkeypatch.setenv("KERNELBOT_SANDBOX", "docker")
    yield client
    assert client.containers.list(all=True, filters={"label": LABEL}) == []  # every job's container removed


def _processes_under(root: Path) -> list[int]:
    """PIDs (as this machine sees them) whose working directory is under `root`, zombies excluded."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            state = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cwd.startswith(str(root)) and state != "Z":
            found.append(int(entry))
    return found


def test_runner_choice_and_bad_input_is_one_line(monkeypatch, fresh_engine):
    monkeypatch.setenv("KERNELBOT_SANDBOX", "podman")
    with pytest.raises(KernelbotError, match="unknown sandbox runner 'podman'") as bad:
        docker_runner.choose(None)
    assert "\n" not in str(bad.value)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert docker_runner.choose("process") == "process"
    assert docker_runner.choose("auto") == "process"  # no daemon: auto falls back to the process runner
    with pytest.raises(KernelbotError, match="docker sandbox runner is unavailable") as down:
        docker_runner.choose("docker")
    assert "\n" not in str(down.value)


def test_auto_uses_a_reachable_daemon_and_says_so(docker_daemon, monkeypatch, fresh_engine, tmp_path):
    client, tmp = docker_daemon
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp}/docker.sock")
    monkeypatch.setenv("KERNELBOT_SANDBOX", "auto")
    result = run_job({"kind": "noop"}, tmp_path / "w", timeout=120)
    assert result.status == "ok", result.detail
    assert result.protections[0].startswith("docker runner (kernelbot-sandbox:")
    for limit in ("no network (--network none)", "read-only root filesystem", "≤ 256 processes (--pids-limit)",
                  "no capabilities (--cap-drop ALL)", "no new privileges", "user 65534", "audit hook"):
        assert any(limit in p for p in result.protections), limit
    assert run_job({"kind": "noop"}, tmp_path / "p", timeout=120, runner="process").protections[0] == "process runner"
    assert client.containers.list(all=True, filters={"label": LABEL}) == []


# (candidate body, timeout, the verdict's failed checks must meet this set)
CORPUS = {
    "segfault": ("import ctypes\nctypes.string_at(0)", 30, {"crash"}),
    "os_exit": ("os._exit(0)", 30, {"crash"}),
    "memory_balloon": ("hog = bytearray(64 << 30)", 30, {"crash"}),
    "infinite_loop": ("while True:\n    pass", 10, {"timeout"}),
    "sleep_past_timeout": ("time.sleep(600)", 10, {"timeout"}),
    "fork_bomb": ("while True:\n    os.fork()", 20, {"crash", "timeout", "sandbox_violation"}),
}
SLOW = {"sleep_past_timeout", "fork_bomb"}  # the same timeout path as infinite_loop; killing 256 torch processes


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CORPUS])
def test_hostile_corpus_in_docker(docker, tmp_path, monkeypatch, case):
    body, timeout, expected = CORPUS[case]
    secret = f"sk-docker-{time.time_ns()}"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    verdict = _run(tmp_path, body, timeout=timeout)  # and the run goes on: this process is here to check
    assert verdict.verdict == "fail" and expected & set(verdict.failed), verdict.failed
    if case == "memory_balloon":  # refused by the address-space limit, as in the process runner
        assert "MemoryError" in str([c.detail for c in verdict.checks])
    assert secret not in _everything_written(tmp_path) and secret not in verdict.model_dump_json()
    assert {p.name for p in (tmp_path / "w").iterdir()} <= WORKDIR_FILES  # the box is gone, nothing else left
    deadline = time.time() + 5
    while _processes_under(tmp_path) and time.time() < deadline:
        time.sleep(0.1)
    assert _processes_under(tmp_path) == []


def test_audit_records_cannot_be_read_back_or_erased(docker, tmp_path):
    verdict = _run(tmp_path, """
try:
    socket.create_connection(("127.0.0.1", 9), timeout=1)
except OSError:
    pass
tried = []
for path in ["/.kernelbot/audit"] + ["/proc/self/fd/" + fd for fd in os.listdir("/proc/self/fd")]:
    try:
        target = path if path.startswith("/.") else os.readlink(path)
        if target == "/.kernelbot/audit" or target.startswith("pipe:"):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            tried.append(f"{path}: opened, read {os.read(fd, 1 << 16)!r}")
    except OSError as exc:
        tried.append(f"{path}: {type(exc).__name__}")
raise RuntimeError("tried " + "; ".join(tried))
""")
    failed = {c.id: c.detail for c in verdict.checks if c.status == "fail"}
    assert "network: socket.connect" in failed["sandbox_violation"]  # the record made it out
    assert "tried /.kernelbot/audit: PermissionError; /proc/self/fd/" in failed["crash"]  # and its open fd:
    assert failed["crash"].count("PermissionError") >= 2 and "opened" not in failed["crash"]


def test_limits_in_force_inside_the_container(docker, tmp_path):
    verdict = _run(tmp_path, """
import resource
def first(*paths):
    for p in paths:
        try:
            return open(p).read().strip()
        except OSError:
            pass
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
nets = [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]]
try:
    open("/usr/kb_probe", "w")
    rootfs = "writable"
except OSError as exc:
    rootfs = exc.strerror
facts = {"uid": os.getuid(), "caps": status["CapEff"].strip(), "nnp": status["NoNewPrivs"].strip(), "nets": nets,
         "pids": first("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max"),
         "as": resource.getrlimit(resource.RLIMIT_AS)[0] > 0, "core": resource.getrlimit(resource.RLIMIT_CORE),
         "usr": rootfs, "home": os.getcwd().startswith(os.environ["HOME"])}  # the runner works in a folder of the box
raise RuntimeError(repr(facts))
""")
    crash = next(c.detail for c in verdict.checks if c.id == "crash")
    for fact in ("'uid': 65534", "'caps': '0000000000000000'", "'nnp': '1'", "'nets': ['lo']", "'pids': '256'",
                 "'as': True", "'core': (0, 0)", "'usr': 'Read-only file system'", "'home': True"):
        assert fact in crash, (fact, crash)
    assert verdict.protections[0].startswith("docker runner")
