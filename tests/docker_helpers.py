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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from helpers import free_port


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

    def connect() -> Any:
        client = docker.DockerClient(base_url=f"unix://{sock}", timeout=300)  # contacts the daemon
        client.ping()
        return client

    return proc, _when_up(proc, connect, tmp / "dockerd.log")


def start_registry(tmp: Path) -> tuple[subprocess.Popen, str]:
    """docker-registry on 127.0.0.1, storing under `tmp`; returns the process and its host:port."""
    port = free_port()
    (tmp / "registry.yml").write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp}/registry\nhttp:\n  addr: 127.0.0.1:{port}\n")
    with open(tmp / "registry.log", "wb") as log:
        proc = subprocess.Popen(["docker-registry", "serve", str(tmp / "registry.yml")], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def connect() -> str:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return f"127.0.0.1:{port}"

    return proc, _when_up(proc, connect, tmp / "registry.log")


def _when_up(proc: subprocess.Popen, connect: Callable[[], Any], log: Path) -> Any:
    """connect()'s result once it stops raising (up to a minute); else stop the service and raise with its log."""
    for _ in range(120):
        try:
            return connect()
        except Exception:
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"{Path(proc.args[0]).name} did not come up: {log.read_text()[-2000:]}")


_PYTHON_PATHS = """
import os, sys, sysconfig, pip
paths = sysconfig.get_paths()
print(os.path.realpath(sys.executable))  # a venv's python links to its base interpreter
print(paths["stdlib"])
print(next(p for p in sys.path if p.endswith("lib-dynload")))  # the base's, also from inside a venv
print(os.path.dirname(pip.__file__))
print(sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})["purelib"])
"""
_SKIP = {"test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__", "site-packages",
         "dist-packages"}


def _stdlib_member(m: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = m.name.split("/")
    if set(parts) & _SKIP or any(p.startswith(("config-", "_tkinter", "_test")) for p in parts):
        return None  # tests, GUI, the static libpython a build would link: not needed to run pip
    return m


def python_rootfs() -> bytes:
    """This machine's python3 (the base interpreter, the shared libraries it and its extension modules link, its
    standard library, and pip in its own site-packages) at their own paths, plus busybox as /bin/sh: a base image
    that can `pip install` a wheel."""
    out = subprocess.run(["python3", "-c", _PYTHON_PATHS], capture_output=True, text=True, check=True).stdout
    exe, stdlib, dynload, pip_dir, purelib = out.split()
    binaries = [exe, *(str(p) for p in Path(dynload).glob("*.so") if not p.name.startswith(("_tkinter", "_test")))]
    libs = set()
    for line in subprocess.run(["ldd", *binaries], capture_output=True, text=True).stdout.splitlines():
        parts = line.split()  # "libz.so.1 => /lib/.../libz.so.1 (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)"
        path = parts[2] if len(parts) > 2 and parts[1] == "=>" else (parts[0] if parts else "")
        if path.startswith("/") and not path.endswith(":"):  # not ldd's "<file>:" headers
            libs.add(path)
    rootfs = io.BytesIO()
    with tarfile.open(fileobj=rootfs, mode="w") as tar:
        tar.add(shutil.which("busybox"), arcname="bin/busybox")
        for link, target in (("bin/sh", "busybox"), ("usr/bin/python3", exe)):
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for path in sorted(libs) + [exe]:
            tar.add(os.path.realpath(path), arcname=path.lstrip("/"))  # the file itself, at the name it is linked by
        tar.add(stdlib, arcname=stdlib.lstrip("/"), filter=_stdlib_member)
        tar.add(pip_dir, arcname=f"{purelib}/pip".lstrip("/"))
    return rootfs.getvalue()


def busybox_rootfs() -> bytes:
    """A root filesystem of one static busybox, as a tar to `docker import`."""
    rootfs = io.BytesIO()
    with tarfile.open(fileobj=rootfs, mode="w") as tar:
        tar.add(shutil.which("busybox"), arcname="bin/busybox")
        link = tarfile.TarInfo("bin/sh")
        link.type, link.linkname = tarfile.SYMTYPE, "busybox"
        tar.addfile(link)
    return rootfs.getvalue()
