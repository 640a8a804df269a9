"""Landlock (Linux ≥ 5.13, unprivileged): after this, the process and everything it starts can write only under
the box, cannot bind or connect TCP sockets (ABI ≥ 4) except on the loopback ports its job was given
(box.LOOPBACK_PORTS_ENV: compute-sanitizer's), and cannot signal processes outside its own domain or reach abstract
unix sockets (ABI ≥ 6). It needs no root, so it is what stands in for the namespaces where those are not available,
and an extra layer where they are.
"""

from __future__ import annotations

import ctypes
import glob
import os
from pathlib import Path

from kernelbot.sandbox.box import loopback_ports
from kernelbot.sandbox.confine import libc

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
PR_SET_NO_NEW_PRIVS = 38
# Filesystem rights that change something (reading and executing stay free).
WRITE_FILE, REMOVE_DIR, REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
MAKE_ANY = sum(1 << b for b in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
REFER, TRUNCATE = 1 << 13, 1 << 14
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1


class _Ruleset(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPort(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def abi_version() -> int:
    version = libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(0, version)


def gpu_writable(later_process: bool = False) -> list[Path]:
    """What the CUDA driver opens for writing (as NVIDIA's and sandboxers' reports describe; not yet seen here): the
    NVIDIA device nodes, read-write, and its threads' names (/proc/<pid>/task/<tid>/comm, driver 570+; refused,
    cuInit fails with error 304). Landlock rules bind to inodes: this process's own threads are /proc/self/task,
    but for a process forked later (`later_process`: a runner) only all of /proc can be named, so that layer must
    be narrowed by one the later process applies itself (confine_runner)."""
    threads = Path("/proc") if later_process else Path("/proc/self/task")
    return [Path(p) for p in sorted(glob.glob("/dev/nvidia*"))] + [threads]


def restrict(box: Path, gpu: bool = False, forks: bool = False) -> list[str]:
    """Apply Landlock to this process; returns the protections now in force (empty if Landlock is absent).
    With `gpu`, the CUDA driver's writes (gpu_writable) are allowed too: for this process, or, where it `forks`
    the process that runs the candidate, for that one (which must then narrow them with a layer of its own)."""
    abi = abi_version()
    if abi < 1:
        return []
    writes = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_ANY | (REFER if abi >= 2 else 0) | \
        (TRUNCATE if abi >= 3 else 0)
    file_writes = WRITE_FILE | (TRUNCATE if abi >= 3 else 0)
    rules = [(box, writes), (Path("/dev/null"), file_writes)] + \
        [(path, file_writes) for path in (gpu_writable(forks) if gpu else [])]
    attr = _Ruleset(writes, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                    SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(_Ruleset) if abi >= 6 else 16 if abi >= 4 else 8
    fd = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        return [f"Landlock unavailable ({os.strerror(ctypes.get_errno())})"]
    ports = loopback_ports(os.environ) if abi >= 4 else None
    try:
        for path, rights in rules:
            target = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(rights, target)
                if libc.syscall(SYS_ADD_RULE, fd, RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    return [f"Landlock rule for {path} refused ({os.strerror(ctypes.get_errno())})"]
            finally:
                os.close(target)
        for port in ports or ():
            rule = _NetPort(NET_BIND_TCP | NET_CONNECT_TCP, port)
            if libc.syscall(SYS_ADD_RULE, fd, RULE_NET_PORT, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                return [f"Landlock rule for TCP port {port} refused ({os.strerror(ctypes.get_errno())})"]
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
                libc.syscall(SYS_RESTRICT_SELF, fd, ctypes.c_uint32(0)) != 0:
            return [f"Landlock not applied ({os.strerror(ctypes.get_errno())})"]
    finally:
        os.close(fd)
    done = [f"Landlock ABI {abi}: writes only inside the work dir" +
            (" and, for the CUDA driver, to the GPU's device nodes and thread names" if gpu else "")]
    if abi >= 4:
        done.append("Landlock: no TCP bind or connect" + (
            f" except on ports {ports.start}-{ports.stop - 1} (compute-sanitizer's, loopback only where the job has "
            "its own network namespace)" if ports else ""))
    if abi >= 6:
        done.append("Landlock: no signals to processes outside the sandbox, no abstract unix sockets")
    return done
