"""Where a call's CPU time is spent, by the code the sampled instructions belong to, not by any name or label.

Linux's perf events sample every thread of this process every PERIOD_NS of its CPU time, in user space only; each
sample is an instruction address, a thread and a time. (Threads started after sampling began cannot be followed: an
inherited per-thread event has no ring buffer. The process's CPU clock counts them, so what no sample explains is
counted as `other`.) The address is looked up in /proc/self/maps and its file decides the place:
  own      code the candidate built (files under its box or the kernel library's build cache, or next to its
           module, whose identity is no installed library's: a copy of one is that library, provenance.py), and every
           sample a thread took while it ran one of the candidate's Triton launches in the interpreter (the launch's
           window, on the launching thread)
  torch    PyTorch's libraries, and what torch.compile generated (its cache)
  other    every other library: numpy, scipy, ..., and code generated in anonymous memory (oneDNN's JIT)
  neutral  the interpreter, the C and C++ runtimes, the loader, OpenMP's runtime, ctypes' call machinery (its module
           and libffi): glue anybody's code runs on
Used in the runner (the candidate's calls) and in the parent (the reference's, the same way), so the two compare.
Where perf events cannot be opened (Docker's default seccomp profile refuses them), `Sampler.open` says so and
nothing is sampled.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import platform
import struct
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kernelbot.agent.verify.provenance import identity

PERIOD_NS = 50_000  # one sample per 50 µs of a thread's CPU time
MIN_NS = 20_000_000  # a sampled pass runs calls until they used this much CPU (some hundreds of samples)
MAX_CALLS = 1000
PAGES = 16  # ring buffer pages per thread's event (plus its header page)
PLACES = ("own", "torch", "other", "neutral")
_SYSCALL = {"x86_64": 298, "aarch64": 241}.get(platform.machine())
_ENABLE, _DISABLE, _RESET = 0x2400, 0x2401, 0x2403
_TYPE_SOFTWARE, _TASK_CLOCK = 1, 1
_SAMPLE_IP, _SAMPLE_TID, _SAMPLE_TIME = 1, 2, 4
_DISABLED, _EXCLUDE_KERNEL, _EXCLUDE_HV, _USE_CLOCKID = 1, 1 << 5, 1 << 6, 1 << 25
_CLOCK_MONOTONIC = 1
_RECORD_SAMPLE = 9
_NEUTRAL = ("libpython", "libc.so", "libc-", "libm.so", "libm-", "libstdc++", "libgcc_s", "ld-linux", "libpthread",
            "libdl.so", "librt.so", "libgomp", "libomp", "libiomp", "[vdso]", "[vsyscall]", "_ctypes.", "libffi")
_libc = ctypes.CDLL(None, use_errno=True)


def _attr(period_ns: int) -> bytes:
    """struct perf_event_attr (PERF_ATTR_SIZE_VER5): task-clock samples of IP, TID and TIME, user space only, on
    CLOCK_MONOTONIC, disabled until enabled."""
    flags = _DISABLED | _EXCLUDE_KERNEL | _EXCLUDE_HV | _USE_CLOCKID
    head = struct.pack("IIQQQQQ", _TYPE_SOFTWARE, 112, _TASK_CLOCK, period_ns,
                       _SAMPLE_IP | _SAMPLE_TID | _SAMPLE_TIME, 0, flags)
    tail = struct.pack("IIQQQQIiQIHH", 0, 0, 0, 0, 0, 0, 0, _CLOCK_MONOTONIC, 0, 0, 0, 0)
    return head + tail


@dataclass
class _Event:
    fd: int
    ring: mmap.mmap


@dataclass
class Sampler:
    """Sampling of this process's threads; `open` before the calls, `samples` after them."""
    period_ns: int = PERIOD_NS
    events: list[_Event] = field(default_factory=list)
    problem: str | None = None

    def open(self) -> bool:
        if _SYSCALL is None:
            self.problem = f"no perf_event_open for {platform.machine()}"
            return False
        attr = ctypes.create_string_buffer(_attr(self.period_ns), 112)
        size = (PAGES + 1) * mmap.PAGESIZE
        for name in os.listdir("/proc/self/task"):
            fd = _libc.syscall(_SYSCALL, attr, int(name), -1, -1, 8)  # PERF_FLAG_FD_CLOEXEC
            if fd < 0:
                if not self.events:
                    self.problem = f"perf events unavailable ({os.strerror(ctypes.get_errno())})"
                    return False
                continue  # the thread ended meanwhile
            try:
                ring = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError as exc:
                os.close(fd)
                self.problem = f"perf ring buffer unavailable ({exc.strerror})"
                self.close()
                return False
            self.events.append(_Event(fd, ring))
        return bool(self.events)

    def _ioctl(self, request: int) -> None:
        for event in self.events:
            _libc.ioctl(event.fd, request, 0)

    def enable(self) -> None:
        self._ioctl(_RESET)
        self._ioctl(_ENABLE)

    def disable(self) -> None:
        self._ioctl(_DISABLE)

    def samples(self) -> list[tuple[int, int, int]]:
        """(instruction address, thread, CLOCK_MONOTONIC ns) of every sample taken so far; the rings are emptied."""
        found = []
        for event in self.events:
            found += _drain(event.ring)
        return found

    def close(self) -> None:
        for event in self.events:
            event.ring.close()
            os.close(event.fd)
        self.events = []


def _drain(ring: mmap.mmap) -> list[tuple[int, int, int]]:
    page = mmap.PAGESIZE
    head, tail = struct.unpack_from("QQ", ring, 1024)
    size = PAGES * page
    data = bytes(ring[page:page + size])
    found = []
    pos = tail
    while pos + 8 <= head:
        kind, _misc, length = struct.unpack("IHH", _wrapped(data, pos % size, 8))
        if length < 8:
            break
        if kind == _RECORD_SAMPLE and length >= 32:
            ip, _pid, tid, when = struct.unpack("QIIQ", _wrapped(data, (pos + 8) % size, 24))
            found.append((ip, tid, when))
        pos += length
    struct.pack_into("Q", ring, 1032, head)  # data_tail: the kernel may write over what was read
    return found


def _wrapped(data: bytes, start: int, n: int) -> bytes:
    end = start + n
    return data[start:end] if end <= len(data) else data[start:] + data[:end - len(data)]


def mappings() -> list[tuple[int, int, str]]:
    """(start, end, file or [name] or "") of every executable mapping of this process."""
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) >= 5 and "x" in parts[1]:
                lo, hi = (int(v, 16) for v in parts[0].split("-"))
                found.append((lo, hi, parts[5].strip() if len(parts) > 5 else ""))
    return found


def place_of_file(path: str, own_dirs: tuple[str, ...], torch_dirs: tuple[str, ...],
                  foreign: frozenset[str] = frozenset()) -> str:
    """The place of the code in file `path` (real): `foreign`, the identities of installed libraries
    (provenance.identity: a file under the candidate's places with one of those is a copy of that library: other)."""
    name = os.path.basename(path)
    if path == os.path.realpath(sys.executable) or name.startswith(_NEUTRAL) or path.startswith(_NEUTRAL):
        return "neutral"  # torch ships its own OpenMP runtime: its threads' spinning is nobody's work
    if path.startswith(torch_dirs):  # torch.compile's cache sits in the box too: torch's, not the candidate's
        return "torch"
    if path.startswith(own_dirs):
        return "other" if foreign and identity(path) in foreign else "own"
    if f"{os.sep}torch{os.sep}" in path:
        return "torch"
    return "other"


def places(samples: Iterable[tuple[int, int, int]], maps: list[tuple[int, int, str]], own_dirs: tuple[str, ...],
           torch_dirs: tuple[str, ...], windows: Iterable[tuple[int, ...]] = (),
           foreign: frozenset[str] = frozenset()) -> dict[str, int]:
    """Samples per place. `windows`: (thread, start, end, ...) of the candidate's Triton launches, on
    CLOCK_MONOTONIC (own, whatever ran)."""
    counts = dict.fromkeys(PLACES, 0)
    by_thread: dict[int, list[tuple[int, int]]] = {}
    for tid, start, end, *_ in windows:
        by_thread.setdefault(tid, []).append((start, end))
    ordered = sorted(maps)
    starts = [lo for lo, _, _ in ordered]
    cache: dict[str, str] = {}

    for ip, tid, when in samples:
        if any(start <= when <= end for start, end in by_thread.get(tid, ())):
            counts["own"] += 1
            continue
        i = bisect.bisect_right(starts, ip) - 1
        path = ordered[i][2] if i >= 0 and ip < ordered[i][1] else ""
        if path not in cache:
            real = os.path.realpath(path) if path.startswith(os.sep) else path
            cache[path] = place_of_file(real, own_dirs, torch_dirs, foreign) if real else "other"
        counts[cache[path]] += 1
    return counts


def sampled_calls(call: Callable[[], Any], own_dirs: tuple[str, ...], torch_dirs: tuple[str, ...],
                  foreign: frozenset[str] = frozenset(),
                  windows: Callable[[], Iterable[tuple[int, ...]]] = tuple,
                  clock: Callable[[], int] = time.process_time_ns) -> dict[str, Any]:
    """Run `call` under the sampler until it used MIN_NS of CPU (at least once, at most MAX_CALLS times): samples
    per place, the calls made and the sampling period; or why nothing could be sampled."""
    followed = set(os.listdir("/proc/self/task"))
    sampler = Sampler()
    if not sampler.open():
        return {"problem": sampler.problem}
    calls = 0
    try:
        sampler.enable()
        start = clock()
        while calls < MAX_CALLS and (calls == 0 or clock() - start < MIN_NS):
            call()
            calls += 1
        sampler.disable()
        used = clock() - start
        samples = sampler.samples()
        counts = places(samples, mappings(), own_dirs, torch_dirs, windows(), foreign)
    finally:
        sampler.close()
    # CPU no sample explains: where threads were started during the calls (none of them followed), theirs, so not
    # own; else the sampling's own slack (a period's rounding per thread, a ring that filled), nobody's
    unexplained = used - (len(samples) + len(sampler.events)) * sampler.period_ns
    started = set(os.listdir("/proc/self/task")) - followed
    counts["other" if started else "neutral"] += max(0, unexplained) // sampler.period_ns
    return {"places": counts, "calls": calls, "period_ns": sampler.period_ns}


def per_call_ns(result: dict[str, Any], which: Iterable[str]) -> float:
    """CPU nanoseconds per call spent in the places `which`."""
    return sum(result["places"][p] for p in which) * result["period_ns"] / max(1, result["calls"])
