"""One engine server on loopback: started in its own process group, ready when its health endpoint answers, stopped
by that group (never by name). A server that does not come up ends in one line: its last log line and the command
that reproduces it."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kernelbot import KernelbotError
from kernelbot.hardware import host

HOST = "127.0.0.1"
IDLE_CORES = 0.1  # a server using less than this is idle
IDLE_LIMIT_S = 5.0  # the longest wait for it


@dataclass(frozen=True)
class Launch:
    """How to start a server: its command (the port given by `command(port)`), its environment and health path."""

    name: str  # for messages: "vllm", "sglang"
    command: Callable[[int], list[str]]
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    ready_timeout: float = 900.0


_HANDED_OUT: set[int] = set()  # ports given to servers of this process (one may not be listening yet)


def free_port(preferred: int) -> int:
    """The first of `preferred` and the ports after it that nothing listens on and no server of this process was
    given; else a port the kernel hands out."""
    for port in [*range(preferred, preferred + 16), 0]:
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            found = int(s.getsockname()[1])
        _HANDED_OUT.add(found)
        return found
    raise KernelbotError("no free port on 127.0.0.1 for the engine server")


def last_line(log: Path) -> str:
    """The log's last non-empty line (what a dead server said last)."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][:300] if lines else "(empty log)"


def last_error(log: Path) -> str:
    """The log's last line naming an error (a worker's traceback ends in one), else its last line."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    errors = [ln for ln in lines if "Error" in ln and not ln.startswith("#")]
    return (errors or lines or ["(empty log)"])[-1][:300]


class ServerProcess:
    """A running server; `with` stops it (its whole process group) however the block ends."""

    def __init__(self, launch: Launch, log_path: Path, port: int) -> None:
        self.launch, self.log_path = launch, log_path
        self.port = free_port(port)
        self.argv = launch.command(self.port)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def reproduce(self) -> str:
        """The shell command that starts this server by hand, its kernelbot environment included."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.launch.env.items()))
        return f"{env} {shlex.join(self.argv)}".strip()

    def __enter__(self) -> ServerProcess:
        """Launched (not yet ready: `wait_ready`, so that several servers start side by side)."""
        self.launch_process()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Launched and ready; stopped again if it does not come up."""
        self.launch_process()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def launch_process(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.launch.env}
        with open(self.log_path, "ab") as log:
            log.write(f"# kernelbot: {self.reproduce()}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_term_with_parent)
        (self.log_path.parent / "server.pid").write_text(f"{self.proc.pid}\n")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.launch.ready_timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise KernelbotError(
                    f"the {self.launch.name} server exited with code {self.proc.returncode} before it was ready: "
                    f"{last_line(self.log_path)} (log {self.log_path}; reproduce with: {self.reproduce()})")
            try:
                with urllib.request.urlopen(f"{self.url}{self.launch.health_path}", timeout=10) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise KernelbotError(f"the {self.launch.name} server was not ready after {self.launch.ready_timeout:.0f} s: "
                             f"{last_line(self.log_path)} (log {self.log_path}; reproduce with: {self.reproduce()})")

    def settle(self, limit_s: float = IDLE_LIMIT_S) -> float:
        """Wait until the server's processes are idle (under IDLE_CORES over a short window), at most `limit_s`;
        the seconds waited. An engine keeps working after its last request (vLLM's worker busy-polls its shared-memory
        queue for a second), and on a small host a round of the other server would share the cores with it."""
        start = time.monotonic()
        while self.proc is not None and self.proc.poll() is None and time.monotonic() - start < limit_s:
            cores = host.tree_cores(self.proc.pid)
            if cores is None or cores < IDLE_CORES:
                break
        return time.monotonic() - start

    def bound_cores(self) -> list[int]:
        """The cores the engine binds its worker to: the narrowest CPU affinity among the server's processes (vLLM
        binds its worker's threads and leaves the API server the rest); empty when none is narrower than the host."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        masks = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.getpgid(int(pid)) == self.proc.pid:
                    masks.append(sorted(os.sched_getaffinity(int(pid))))
            except OSError:
                continue
        narrowest = min(masks, key=len, default=[])
        return narrowest if len(narrowest) < len(os.sched_getaffinity(0)) else []

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the server's process group (its engine and worker processes too), SIGKILL what is left."""
        if self.proc is None or self.proc.returncode is not None:
            return
        group = self.proc.pid  # start_new_session: the server leads its own group
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
            if sig == signal.SIGTERM:  # the leader is gone: its children get the same grace, then SIGKILL
                _wait_group(group, grace)
        self.proc.wait(timeout=grace)
        _HANDED_OUT.discard(self.port)


def _term_with_parent() -> None:
    """In the server's process, before it runs: SIGTERM when kernelbot dies, however it dies (a killed run leaves
    no server behind; the engine then stops its own workers)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _wait_group(group: int, grace: float) -> None:
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
