"""The process runner: a job's harness as a child process in its own session and process group, in a pids cgroup and
(as root, with util-linux) its own pid, net and mount namespaces, with rlimits on memory, file size, core dumps and
CPU time; audit records come back through a pipe. A job given loopback ports (box.LOOPBACK_PORTS_ENV: the
compute-sanitizer's front end talks to its target over them) has its network namespace's loopback brought up, and no
other interface; without namespaces it gets no ports (Landlock could not keep them on loopback). The box
(sandbox/box.py) is the same as the docker runner's; this module only confines and starts the child, and dispatches
to the docker runner when that one is chosen.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from kernelbot.sandbox import docker_runner
from kernelbot.sandbox.box import (
    HARNESS_ARGS,
    LOOPBACK_PORTS_ENV,
    MAX_FILE_BYTES,
    MAX_PROCESSES,
    STDERR,
    Ending,
    SandboxResult,
    box_env,
    child_env,
    close_box,
    drain_records,
    loopback_ports,
    memory_limit,
    open_box,
    outcome,
)
from kernelbot.sandbox.gpu import check_health, ecc_errors
from kernelbot.sandbox.gpu import isolation_env as gpu_env

__all__ = ["PIDS_CGROUP", "SandboxResult", "child_env", "namespaces_available", "run_job"]
LAUNCH = Path(__file__).with_name("launch.py")  # applies a job's limits, then becomes the job
PIDS_CGROUP = Path("/sys/fs/cgroup/pids")


def namespaces_available() -> bool:
    """Root with util-linux `unshare` that can make pid, net and mount namespaces here (KERNELBOT_NO_NAMESPACES=1
    turns them off, to run as an unprivileged user would: Landlock and the audit hook then stand alone)."""
    return os.environ.get("KERNELBOT_NO_NAMESPACES") != "1" and _can_unshare()


@functools.cache
def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--net", "--mount", "--mount-proc", "true"],
                           capture_output=True)
    return probe.returncode == 0


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
            wrapper: list[str] | None = None, gpu: int | None = None, runner: str | None = None,
            address_limit: bool = True) -> SandboxResult:
    """Run one job in a fresh child process inside a fresh box (sandbox/box.py: a directory of a random name,
    removed afterwards; result.json and outputs.pt come back to `workdir`, with the child's stderr.txt);
    whatever happens, nothing it started survives. `wrapper` prefixes the harness's command (a sanitizer).
    With `gpu`, the job sees only that GPU, and after a crash or timeout the GPU must come back healthy
    (gpu.GPUUnhealthy is raised when it does not). `runner` (else $KERNELBOT_SANDBOX): process, docker, or
    auto (docker when a daemon is reachable and the sandbox image builds; see docker_runner). `address_limit`
    False: no address-space limit (an AddressSanitizer job reserves terabytes of shadow memory it never touches; the
    cgroup's memory limit, where there is one, still holds)."""
    limited = address_limit and gpu is None
    if docker_runner.choose(runner) == "docker":
        return docker_runner.run_job(job, workdir, timeout, env, wrapper, gpu, limited)
    workdir = workdir.resolve()
    box = open_box(job, workdir)
    group = _make_cgroup()
    isolated = namespaces_available()
    protections = _protections(timeout, group, isolated, limited)
    read_fd, write_fd = os.pipe()
    extra = {**box_env(box), "KERNELBOT_AUDIT_FD": str(write_fd), **(env or {}),
             **(gpu_env(gpu) if gpu is not None else {})}
    loopback = loopback_ports(extra) is not None
    if loopback and not isolated:  # Landlock's rules name ports, not addresses: only a namespace keeps them local
        del extra[LOOPBACK_PORTS_ENV]
        loopback = False
        protections.append("no TCP at all: loopback ports need a network namespace of the job's own (root and "
                           "unshare), so compute-sanitizer cannot reach its target here")
    command = [*(wrapper or []), sys.executable, *HARNESS_ARGS, "job.json"]
    if isolated:  # with loopback, the job makes its network namespace itself (launch.py), with lo up
        # --mount-proc: under a wrapper the harness is not pid 1 and mounts no /proc itself, and the CUDA driver names
        # its threads through /proc/self/task/<tid>/comm with this namespace's tids (on an H200 node, 2026-12-04:
        # cuInit's error 304 under compute-sanitizer while the host's /proc was left)
        command = ["unshare", "--pid", "--fork", *([] if loopback else ["--net"]), "--mount", "--mount-proc",
                   "--kill-child", *command]
        protections += ["own network namespace with loopback only (for compute-sanitizer)"] if loopback else []
    ecc_before = ecc_errors(gpu) if gpu is not None else None
    records, stop = bytearray(), threading.Event()
    reader = threading.Thread(target=drain_records, args=(read_fd, stop, records), daemon=True)
    t0 = time.perf_counter()
    with open(workdir / STDERR, "wb") as err:
        proc = subprocess.Popen(launched(command, group, timeout, limited, isolated and loopback), cwd=box,
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=child_env(extra),
                                start_new_session=True, pass_fds=(write_fd,))
        os.close(write_fd)
        reader.start()
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            pids = _end_everything(proc, group)
            proc.wait()
    seconds = time.perf_counter() - t0
    stop.set()
    reader.join()
    os.close(read_fd)
    close_box(box, workdir)
    if gpu is not None:
        protections.append(f"GPU {gpu} only (CUDA_VISIBLE_DEVICES)")
        if timed_out or proc.returncode != 0:
            protections.append(check_health(gpu, pids, ecc_before))
    return outcome(workdir, timeout, Ending(timed_out, proc.returncode, seconds, bytes(records)), protections)


def _protections(timeout: float, group: Path | None, isolated: bool, address_limited: bool) -> list[str]:
    protections = ["process runner", f"timeout {timeout:.0f} s", "own session and process group",
                   "secrets scrubbed from env",
                   f"address space {memory_limit() >> 30} GiB" if address_limited else
                   "no address-space limit (the CUDA driver, or AddressSanitizer, reserves more virtual memory than "
                   "any limit allows)",
                   f"files ≤ {MAX_FILE_BYTES >> 30} GiB", "no core dumps"]
    protections.append(f"≤ {MAX_PROCESSES} processes (pids cgroup)" if group else "no process cap (no pids cgroup)")
    if not isolated:
        protections.append("no namespaces (needs root and util-linux unshare): Landlock, where the kernel has it, "
                           "and the audit hook stand in")
    return protections


def launched(command: list[str], group: Path | None, timeout: float, address_limited: bool,
            loopback: bool = False) -> list[str]:
    """`command` started through launch.py, which applies the job's limits to itself and then becomes the job: no
    Python runs between fork and exec in this (threaded) process. A GPU job gets no address-space limit: the CUDA
    driver reserves virtual ranges for unified memory far beyond physical memory, and cuInit fails under such a limit.
    With `loopback`, the job moves into a network namespace of its own and brings its loopback up (unshare's --net
    leaves it down)."""
    limits = {"cgroup": str(group) if group is not None else None, "cpu_s": int(timeout) + 5,
              "address_bytes": memory_limit() if address_limited else 0, "file_bytes": MAX_FILE_BYTES,
              "loopback": loopback}
    return [sys.executable, "-I", "-S", str(LAUNCH), json.dumps(limits), *command]
