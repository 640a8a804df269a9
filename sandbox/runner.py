from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kernelbot.sandbox.confine import SECRET_NAME, libc
from kernelbot.sandbox.gpu import check_health, ecc_errors
from kernelbot.sandbox.gpu import isolation_env as gpu_env

PR_SET_PDEATHSIG = 1
PIDS_CGROUP = Path("/sys/fs/cgroup/pids")
MAX_PROCESSES = 256  # per job: a fork bomb hits this instead of the machine
MAX_FILE_BYTES = 2 << 30
OUTPUTS = ("result.json", "outputs.pt")  # what the parent takes out of the box before it is removed


@dataclass
class SandboxResult:
    status: Literal["ok", "timeout", "crash", "error"]
    seconds: float
    returncode: int | None
    detail: str  # last lines of the child's stderr, or its own error report
    payload: dict[str, Any] | None  # what the worker wrote to result.json
    violations: list[dict[str, str]] = field(default_factory=list)  # what the candidate tried and was refused
    protections: list[str] = field(default_factory=list)  # what was in force


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k)}
    env.update(extra or {})
    return env


def namespaces_available() -> bool:
    """Root with util-linux `unshare` that can make pid, net and mount namespaces here (KERNELBOT_NO_NAMESPACES=1
    turns them off, to run as an unprivileged user would: Landlock and the audit hook then stand alone)."""
    return os.environ.get("KERNELBOT_NO_NAMESPACES") != "1" and _can_unshare()


@functools.cache
def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--net", "--mount", "true"], capture_output=True)
    return probe.returncode == 0


def memory_limit() -> int:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(16 << 30, int(total * 0.6))


def _make_cgroup() -> Path | None:
    if os.geteuid() != 0 or not os.access(PIDS_CGROUP, os.W_OK):
        return None
    for stale in PIDS_CGROUP.glob("kernelbot-*"):  # left by a kernelbot that was killed; removable once empty
        owner = stale.name.split("-")[1]
        if owner.isdigit() and Path(f"/proc/{owner}").exists():
            continue  # another kernelbot's, maybe about to get its child: not ours to remove
        try:
            if not (stale / "cgroup.procs").read_text().strip():
                stale.rmdir()
        except OSError:
            pass
    group = PIDS_CGROUP / f"kernelbot-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        group.mkdir()
        (group / "pids.max").write_text(str(MAX_PROCESSES))
        return group
    except OSError:
        return None


def _end_everything(proc: subprocess.Popen, group: Path | None) -> set[int]:
    """Kill the child's process group and every process in its cgroup (that includes daemons that left the
    group with setsid), until none is left; returns the pids it saw."""
    seen = {proc.pid}
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if group is None:
        return seen
    try:
        (group / "pids.max").write_text("0")  # no new process from here on: a fork bomb cannot refill
    except OSError:
        pass
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except OSError:
            return seen
        if not pids:
            break
        seen.update(pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    while time.monotonic() < deadline:  # the last processes may still be exiting
        try:
            group.rmdir()
            return seen
        except OSError:
            time.sleep(0.02)
    return seen


def run_job(job: dict[str, Any], workdir: Path, timeout: float, env: dict[str, str] | None = None,
            wrapper: list[str] | None = None, gpu: int | None = None, runner: str | None = None) -> SandboxResult:
    """Run one worker job in a fresh child process inside a fresh box (a directory of a random name under the
    system's temporary directory, or $KERNELBOT_BOX_ROOT, removed afterwards: its path says nothing about the job,
    so a candidate cannot tell verification from timing by it);
    whatever happens, nothing it started survives. `wrapper` prefixes the worker's command (a sanitizer).
    With `gpu`, the job sees only that GPU, and after a crash or timeout the GPU must come back healthy
    (gpu.GPUUnhealthy is raised when it does not). `runner` (else $KERNELBOT_SANDBOX): process, docker, or
    auto (docker when a daemon is reachable and the sandbox image builds; see docker_runner)."""
    from kernelbot.sandbox import docker_runner

    if docker_runner.choose(runner) == "docker":
        return docker_runner.run_job(job, workdir, timeout, env, wrapper, gpu)
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    box = Path(tempfile.mkdtemp(prefix="kb-", dir=os.environ.get("KERNELBOT_BOX_ROOT") or None)).resolve()
    (box / "tmp").mkdir(parents=True)
    (box / "job.json").write_text(json.dumps(job))
    for name in OUTPUTS:
        (workdir / name).unlink(missing_ok=True)
    group = _make_cgroup()
    isolated = namespaces_available()
    protections = ["process runner", f"timeout {timeout:.0f} s", "own session and process group",
                   "secrets scrubbed from env", f"address space {memory_limit() >> 30} GiB",
                   f"files ≤ {MAX_FILE_BYTES >> 30} GiB", "no core dumps"]
    protections.append(f"≤ {MAX_PROCESSES} processes (pids cgroup)" if group else "no process cap (no pids cgroup)")
    if not isolated:
        protections.append("no namespaces (needs root and util-linux unshare): Landlock, where the kernel has it, "
                           "and the audit hook stand in")
    read_fd, write_fd = os.pipe()

    def limit() -> None:  # runs in the child between fork and exec
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # if kernelbot itself dies, the job dies with it
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit(),) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (int(timeout) + 5,) * 2)

    command = [*(wrapper or []), sys.executable, "-m", "kernelbot.sandbox.worker", "job.json"]
    if isolated:
        command = ["unshare", "--pid", "--fork", "--net", "--mount", "--kill-child", *command]
    # Every place a library writes to by default is pointed into the box (the parent's own values, e.g. the
    # TORCHINDUCTOR_CACHE_DIR that torch exports once it has used the cache, would lead outside it).
    extra = {"HOME": str(box), "TMPDIR": str(box / "tmp"), "PYTHONDONTWRITEBYTECODE": "1",
             "TORCHINDUCTOR_CACHE_DIR": str(box / "tmp" / "inductor"), "TRITON_CACHE_DIR": str(box / "tmp" / "triton"),
             "XDG_CACHE_HOME": str(box / "tmp" / "cache"),
             "KERNELBOT_AUDIT_FD": str(write_fd), **(env or {}), **(gpu_env(gpu) if gpu is not None else {})}
    ecc_before = ecc_errors(gpu) if gpu is not None else None
    t0 = time.perf_counter()
    with open(workdir / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(command, cwd=box, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                env=child_env(extra), start_new_session=True, preexec_fn=limit, pass_fds=(write_fd,))
        os.close(write_fd)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            pids = _end_everything(proc, group)
            proc.wait()
    seconds = time.perf_counter() - t0
    with os.fdopen(read_fd, "rb") as pipe:
        records = pipe.read(1 << 20).decode(errors="replace").splitlines()
    violations = []
    for line in records:
        try:
            violations.append(json.loads(line))
        except json.JSONDecodeError:
            violations.append({"kind": "garbled", "detail": line[:200]})
    for name in OUTPUTS:
        if (box / name).is_file() and not (box / name).is_symlink():
            shutil.move(box / name, workdir / name)
    shutil.rmtree(box, ignore_errors=True)
    tail = (workdir / "stderr.txt").read_text(errors="replace")[-2000:]
    result_path = workdir / "result.json"
    try:
        payload = json.loads(result_path.read_text()) if result_path.exists() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        payload = None
    if isinstance(payload, dict):
        protections += [p for p in payload.get("protections", []) if isinstance(p, str)]

    def result(status, code, detail) -> SandboxResult:
        return SandboxResult(status, seconds, code, detail, payload, violations, protections)

    if gpu is not None:
        protections.append(f"GPU {gpu} only (CUDA_VISIBLE_DEVICES)")
        if timed_out or proc.returncode != 0:
            protections.append(check_health(gpu, pids, ecc_before))
    if timed_out:
        return result("timeout", None, f"no result after {timeout:.0f} s")
    if proc.returncode < 0 or proc.returncode >= 128:  # unshare reports a signalled child as 128 + signal
        sig = -proc.returncode if proc.returncode < 0 else proc.returncode - 128
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return result("crash", proc.returncode, f"killed by {name}\n{tail}")
    if not isinstance(payload, dict) or proc.returncode != 0:
        return result("crash", proc.returncode, f"exit code {proc.returncode}, no result\n{tail}")
    if payload.get("error"):
        return result("error", proc.returncode, str(payload["error"]))
    return result("ok", proc.returncode, tail)
