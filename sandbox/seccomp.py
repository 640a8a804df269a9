"""A seccomp filter for the process that runs candidate code, from the moment the candidate has loaded: it can start no
process and reach into no other process's memory, whatever it calls (a libc `fork()` through ctypes raises no audit
event; the kernel sees every system call).

Refused, by ending the process at once (SIGSYS, which the harness reports as a violation): fork and vfork; clone
without CLONE_THREAD (a new process; threads stay allowed, as pools need them); execve and execveat; ptrace;
process_vm_readv and process_vm_writev; and any system call of another ABI (32-bit x86 or x32 on x86-64, whose numbers
differ). clone3 returns ENOSYS: its flags sit in memory a filter cannot read, and the C library then creates its
threads with clone. Installed for every thread of the process at once (TSYNC); threads started later inherit it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from dataclasses import dataclass, field

from kernelbot.sandbox.confine import libc
from kernelbot.sandbox.landlock import PR_SET_NO_NEW_PRIVS

SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
CLONE_THREAD = 0x00010000
_LD_W_ABS, _JEQ_K, _JSET_K, _JGE_K, _RET_K = 0x20, 0x15, 0x45, 0x35, 0x06
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (the low 32 bits of the first argument)
X32_BIT = 0x40000000


@dataclass(frozen=True)
class _Abi:
    """One architecture's audit id, seccomp's own number, and the numbers of what is refused."""
    arch: int
    seccomp: int
    clone: int
    clone3: int
    killed: dict[str, int] = field(default_factory=dict)
    x32: bool = False  # x86-64's x32 ABI: the same architecture id, numbers with X32_BIT set


ABIS = {
    "x86_64": _Abi(0xC000003E, 317, 56, 435, {"fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101,
                                              "process_vm_readv": 310, "process_vm_writev": 311}, x32=True),
    "aarch64": _Abi(0xC00000B7, 277, 220, 435, {"execve": 221, "execveat": 281, "ptrace": 117,
                                                "process_vm_readv": 270, "process_vm_writev": 271}),
}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def program(abi: _Abi) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jump if true, jump if false, k) instructions."""
    kill, allow = (_RET_K, 0, 0, RET_KILL_PROCESS), (_RET_K, 0, 0, RET_ALLOW)
    head = [(_LD_W_ABS, 0, 0, _ARCH), (_JEQ_K, 1, 0, abi.arch), kill, (_LD_W_ABS, 0, 0, _NR)]
    if abi.x32:
        head += [(_JGE_K, 0, 1, X32_BIT), kill]
    killed = list(abi.killed.values())
    # after the head: clone (check its flags), clone3 (ENOSYS), each refused number, then allow
    body = [(_JEQ_K, 0, 4, abi.clone), (_LD_W_ABS, 0, 0, _ARG0), (_JSET_K, 1, 0, CLONE_THREAD), kill, allow,
            (_JEQ_K, 0, 1, abi.clone3), (_RET_K, 0, 0, RET_ERRNO | errno.ENOSYS)]
    for k, nr in enumerate(killed):
        body.append((_JEQ_K, len(killed) - k, 0, nr))
    return head + body + [allow, kill]


def refuse_processes() -> str:
    """Install the filter on every thread of this process; what is now in force, or why nothing is."""
    abi = ABIS.get(platform.machine())
    if abi is None:
        return f"no seccomp filter for {platform.machine()}: processes are refused by the audit hook only"
    instructions = program(abi)
    filters = (_SockFilter * len(instructions))(*(_SockFilter(*i) for i in instructions))
    prog = _SockFprog(len(instructions), filters)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.syscall(abi.seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(prog)) != 0:
        return f"no seccomp filter ({os.strerror(ctypes.get_errno())}): processes are refused by the audit hook only"
    return "seccomp, once the candidate loaded: no new process, no exec, no ptrace, no other process's memory"
