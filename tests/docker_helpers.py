"""A real Docker engine for tests: dockerd on a private socket with vfs storage, no iptables and no bridge
(nothing on this machine's network changes), and optionally Debian's docker-registry on 127.0.0.1. Both are
started here and stopped by their own process group; nothing is pulled."""

from __future__ import annotations

import io
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any


def missing_reason(binaries: tuple[str, ...] = ("dockerd", "docker-registry", "busybox")) -> str | None:
    """Why a real engine cannot be started here, or None."""
    missing = [b for b in binaries if shutil.which(b) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install docker.io docker-registry busybox-static)"
    if os.geteuid() != 0:
        return "dockerd needs root"
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the Docker SDK (kernelbot[docker]) is not installed"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """Stop a service started here: its own process group (start_new_session), TERM then KILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def start_dockerd(tmp: Path) -> tuple[subprocess.Popen, Any]:
    """dockerd with its socket, data and state under `tmp` (keep it short: containerd's socket path must fit);
    returns the process and a connected SDK client. Raises RuntimeError with the log tail if it does not come up."""
    import docker

    sock = tmp / "docker.sock"
    with open(tmp / "dockerd.log", "wb") as log:
        proc = subprocess.Popen(
            ["dockerd", f"--host=unix://{sock}", f"--data-root={tmp}/data", f"--exec-root={tmp}/x",
             f"--pidfile={tmp}/docker.pid", "--storage-driver=vfs", "--iptables=false", "--ip6tables=false",
             "--bridge=none"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(120):
        try:
            client = docker.DockerClient(base_url=f"unix://{sock}", timeout=300)  # contacts the daemon
            client.ping()
            return proc, client
        except Exception:
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"dockerd did not come up: {(tmp / 'dockerd.log').read_text()[-2000:]}")


def start_registry(tmp: Path) -> tuple[subprocess.Popen, str]:
    """docker-registry on 127.0.0.1, storing under `tmp`; returns the process and its host:port."""
    port = free_port()
    (tmp / "registry.yml").write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp}/registry\nhttp:\n  addr: 127.0.0.1:{port}\n")
    with open(tmp / "registry.log", "wb") as log:
        proc = subprocess.Popen(["docker-registry", "serve", str(tmp / "registry.yml")], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(120):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, f"127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"docker-registry did not come up: {(tmp / 'registry.log').read_text()[-2000:]}")


def busybox_rootfs() -> bytes:
    """A root filesystem of one static busybox, as a tar to `docker import`."""
    rootfs = io.BytesIO()
    with tarfile.open(fileobj=rootfs, mode="w") as tar:
        tar.add(shutil.which("busybox"), arcname="bin/busybox")
        link = tarfile.TarInfo("bin/sh")
        link.type, link.linkname = tarfile.SYMTYPE, "busybox"
        tar.addfile(link)
    return rootfs.getvalue()
