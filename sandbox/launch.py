"""A job's first program: applies the process runner's limits to itself, then becomes the job (exec).

    python -I -S launch.py LIMITS_JSON COMMAND...

The limits are applied here, in a fresh process with one thread, instead of in a `preexec_fn` between fork and exec
in the runner's process: that process has threads (the sanitizer's tools start side by side, and on a GPU node the
CUDA driver's and torch's threads run beside them), and Python code run in a child forked from a threaded parent can
deadlock on a lock another thread held at the fork. Started with -I -S it imports the standard library only.

LIMITS_JSON: {"cgroup": pids cgroup folder or null, "cpu_s": seconds of CPU time, "address_bytes": address-space
limit or 0 for none, "file_bytes": largest file, "loopback": whether to enter a network namespace of its own with its
loopback up}. Besides these: no core dumps, and the job is killed when the process that started it dies.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import signal
import socket
import struct
import sys

PR_SET_PDEATHSIG = 1
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
FAILED = 125  # this launcher's own exit status when a limit could not be applied


def own_loopback(libc: ctypes.CDLL) -> None:
    """Move this process into a new network namespace and bring its loopback interface up: it can reach nothing but
    itself. Needs CAP_SYS_ADMIN (root)."""
    if libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack_from("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def apply(limits: dict) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # if kernelbot itself dies, the job dies with it (kept across exec)
    if limits["loopback"]:
        own_loopback(libc)
    if limits["cgroup"]:
        with open(os.path.join(limits["cgroup"], "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    if limits["address_bytes"]:
        resource.setrlimit(resource.RLIMIT_AS, (limits["address_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"],) * 2)


def main(argv: list[str]) -> None:
    try:
        apply(json.loads(argv[0]))
        os.execvp(argv[1], argv[1:])
    except (OSError, ValueError, KeyError, IndexError) as exc:
        print(f"kernelbot launch: could not start the job: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(FAILED)


if __name__ == "__main__":
    main(sys.argv[1:])
