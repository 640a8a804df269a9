"""Child-side confinement, run by the worker before it imports any candidate code.

Inside the namespaces `unshare` made (pid, net, mount), as root: make every mount private, keep only the
job's box writable (the rest of the filesystem is remounted read-only), mount a /proc for the new pid
namespace, then drop every capability so the candidate cannot undo any of it. Then an audit hook and an
environment trap record what the candidate tries: writes outside the box, sockets, signals, spawning
programs, looking up secrets. Records go to a pipe the parent reads; the candidate can add to them, not
take them back.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from pathlib import Path

MS_RDONLY, MS_NOSUID, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 32, 4096, 16384, 1 << 18
PR_CAPBSET_DROP = 24
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)
BUILD_TOOLS = {"c++", "g++", "gcc", "cc", "nvcc", "ninja", "ld", "x86_64-linux-gnu-g++", "x86_64-linux-gnu-gcc"}
libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, flags: int, fstype: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype)]
    if libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def lock_filesystem(box: Path) -> list[str]:
    """Read-only everything but `box`; a fresh /proc. Only valid in a private mount namespace, as root."""
    _mount(None, "/", MS_REC | MS_PRIVATE)
    _mount(str(box), str(box), MS_BIND | MS_REC)  # its own mount, so it stays writable
    _mount(None, "/", MS_REMOUNT | MS_BIND | MS_RDONLY)
    os.chdir(box)  # the old cwd still points into the now read-only mount underneath
    done = ["filesystem read-only outside the work dir"]
    for extra in ("/tmp", "/dev/shm", "/var/tmp"):
        try:  # separate tmpfs mounts would otherwise stay writable
            if os.path.ismount(extra):
                _mount(None, extra, MS_REMOUNT | MS_BIND | MS_RDONLY)
        except OSError:
            done.append(f"{extra} left writable")
    try:
        _mount("proc", "/proc", MS_NOSUID, "proc")
        done.append("own /proc")
    except OSError:
        pass
    return done


def drop_capabilities() -> None:
    """Empty the bounding set: the exec'd or current root process keeps no capability, so it cannot remount,
    load modules, trace others or change namespaces."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: past the last
            break

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()
    if libc.syscall(126, ctypes.byref(header), ctypes.byref(data)) != 0:  # capset
        raise OSError(ctypes.get_errno(), "capset failed")


class Recorder:
    def __init__(self, fd: int | None, box: Path) -> None:
        self.fd, self.box = fd, str(box)

    def __call__(self, kind: str, detail: str) -> None:
        if self.fd is not None:
            try:
                os.write(self.fd, (json.dumps({"kind": kind, "detail": detail[:300]}) + "\n").encode())
            except OSError:
                pass

    def outside_box(self, path) -> bool:
        try:
            p = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return not (p == self.box or p.startswith(self.box + os.sep) or p in ("/dev/null", "/dev/zero"))


def install_audit(record: Recorder) -> None:
    def hook(event: str, args: tuple) -> None:
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1] or "", args[2] or 0
            writing = any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            if writing and isinstance(path, (str, bytes, os.PathLike)) and record.outside_box(path):
                record("write_outside_workdir", f"open({os.fsdecode(path)!r}, {mode!r})")
        elif event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            record("network", f"{event} {args[1:]!r}")
            raise PermissionError(f"kernelbot sandbox: {event} refused")
        elif event in ("os.kill", "os.killpg"):
            record("signal", f"{event}{args!r}")
            if args and args[0] not in (0, os.getpid()):
                raise PermissionError(f"kernelbot sandbox: {event} refused")
        elif event in ("os.fork", "os.forkpty", "os.system", "os.posix_spawn", "os.spawn", "os.exec"):
            record("process", f"{event} {str(args)[:200]}")
        elif event == "subprocess.Popen":
            exe = os.path.basename(os.fsdecode(args[0])) if args and args[0] else ""
            if exe not in BUILD_TOOLS:
                record("process", f"subprocess {str(args[1])[:200]}")
        elif event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames"):
            record("introspection", f"{event}: looking through the harness's objects")
        elif event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.truncate") and args:
            if record.outside_box(args[0]):
                record("write_outside_workdir", f"{event} {os.fsdecode(args[0])!r}")

    sys.addaudithook(hook)


def trap_environment(record: Recorder) -> None:
    """Looking up a secret-looking variable is recorded (the variables themselves were never passed in)."""
    base = type(os.environ)

    class TrappedEnviron(base):  # type: ignore[misc, valid-type]
        def __getitem__(self, key):
            if isinstance(key, str) and SECRET_NAME.search(key):
                record("secret_lookup", f"environment variable {key!r}")
            return base.__getitem__(self, key)

    os.environ.__class__ = TrappedEnviron


def confine(box: Path) -> list[str]:
    """Apply what this process can; return the protections now in force."""
    protections = []
    audit_fd = os.environ.pop("KERNELBOT_AUDIT_FD", None)
    record = Recorder(int(audit_fd) if audit_fd else None, box)
    if os.getpid() == 1 and os.geteuid() == 0:  # pid 1 of the namespaces unshare made for us
        protections += ["own pid namespace", "no network (own net namespace)"]
        try:
            protections += lock_filesystem(box)
        except OSError as exc:
            protections.append(f"filesystem NOT locked ({exc})")
        try:
            drop_capabilities()
            protections.append("no capabilities")
        except OSError as exc:
            protections.append(f"capabilities NOT dropped ({exc})")
    from kernelbot.sandbox.landlock import restrict

    protections += restrict(box) or ["no Landlock on this kernel"]
    install_audit(record)
    trap_environment(record)
    protections.append("audit hook (blocks sockets and signals from Python) and environment trap")
    return protections
