"""Where a pass of calls spends its CPU time, by the code the sampled instructions belong to, not by any name or label.

One implementation measures both sides, and for the candidate it runs outside the candidate's process: the harness
opens Linux perf events on each of its runner's threads (perf_event_open with the thread's id and cpu -1; a process
may sample another of its own user in user space at perf_event_paranoid 2), has them on only while the calls it asked
for run, follows threads started meanwhile, drains their ring buffers, reads the runner's /proc/<pid>/maps and CPU
clock and attributes every sample itself (parent_sampling.py). The parent samples the reference in its own process
the same way (`sampled_calls`). Each sample is an instruction address, a thread and a time (task-clock, one per
PERIOD_NS of a thread's CPU time). The address is looked up in the mappings (read before and after the pass: a range
whose file changed between the two readings is `other`) and its file decides the place:
  own      code the candidate built (files under its box or the kernel library's build cache, or next to its
           module, whose identity is no installed library's: a copy of one is that library, provenance.py)
  torch    PyTorch's libraries, and what torch.compile generated (its cache)
  other    every other library: numpy, scipy, ..., and code generated in anonymous memory (oneDNN's JIT)
  neutral  the interpreter, the C and C++ runtimes, the loader, OpenMP's runtime, ctypes' call machinery (its module
           and libffi): glue anybody's code runs on
A sample a thread took inside one of the candidate's Triton launches in the interpreter (a window the runner reported,
on that thread: `checked_windows`) is own where it is in code such a launch runs — the interpreter and the runtimes,
numpy's and Triton's own libraries — and keeps its place anywhere else; in torch's libraries it is nobody's
(the interpreter copying the launch's arguments) where the candidate has no native code of its own, whose every torch
op the op log sees, and torch's where it has.
CPU time no sample explains: where the followed threads' own clocks (each event's count) exceed their samples, kernel
time and the sampling's rounding (neutral); the process's CPU clock beyond the followed threads' is threads the
sampler never followed (started and ended between two looks at /proc/<pid>/task), counted as `other`. Where perf
events cannot be opened (Docker's default seccomp profile refuses them), the pass says so and nothing is sampled.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import importlib.util
import mmap
import os
import platform
import struct
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernelbot.agent.verify.provenance import identity

PERIOD_NS = 50_000  # one sample per 50 µs of a thread's CPU time
MIN_NS = 20_000_000  # a sampled pass runs calls until they used this much CPU (some hundreds of samples)
MAX_CALLS = 10_000
PAGES = 16  # ring buffer pages per thread's event (plus its header page): 2048 samples, 100 ms of one thread's CPU
PLACES = ("own", "torch", "other", "neutral")
_SYSCALL = {"x86_64": 298, "aarch64": 241}.get(platform.machine())
_ENABLE, _DISABLE = 0x2400, 0x2401
_TYPE_SOFTWARE, _TASK_CLOCK = 1, 1
_SAMPLE_IP, _SAMPLE_TID, _SAMPLE_TIME = 1, 2, 4
_DISABLED, _EXCLUDE_KERNEL, _EXCLUDE_HV, _USE_CLOCKID = 1, 1 << 5, 1 << 6, 1 << 25
_CLOCK_MONOTONIC = 1
_RECORD_SAMPLE = 9
_FD_CLOEXEC = 8
_NEUTRAL = ("libpython", "libc.so", "libc-", "libm.so", "libm-", "libstdc++", "libgcc_s", "ld-linux", "libpthread",
            "libdl.so", "librt.so", "libgomp", "libomp", "libiomp", "[vdso]", "[vsyscall]", "_ctypes.", "libffi")
_CHANGED = "\0changed"  # a range whose file differs between two readings of the mappings
_libc = ctypes.CDLL(None, use_errno=True)
Mappings = list[tuple[int, int, str]]
Window = tuple[int, int, int]  # (thread, start, end on CLOCK_MONOTONIC)
Span = tuple[int, int]  # (start, end on CLOCK_MONOTONIC) of a time the sampler was on


def _attr(period_ns: int, disabled: bool = True) -> bytes:
    """struct perf_event_attr (PERF_ATTR_SIZE_VER5): task-clock samples of IP, TID and TIME, user space only, on
    CLOCK_MONOTONIC, disabled until enabled (or enabled from the start)."""
    flags = (_DISABLED if disabled else 0) | _EXCLUDE_KERNEL | _EXCLUDE_HV | _USE_CLOCKID
    head = struct.pack("IIQQQQQ", _TYPE_SOFTWARE, 112, _TASK_CLOCK, period_ns,
                       _SAMPLE_IP | _SAMPLE_TID | _SAMPLE_TIME, 0, flags)
    tail = struct.pack("IIQQQQIiQIHH", 0, 0, 0, 0, 0, 0, 0, _CLOCK_MONOTONIC, 0, 0, 0, 0)
    return head + tail


def process_cpu_ns(pid: int) -> int:
    """The CPU time process `pid` has used, all its threads (ended ones too), read from outside it: its process
    CPU-time clock (clock_getcpuclockid's, which any process may read)."""
    return time.clock_gettime_ns(((~pid) << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)


def threads(pid: int) -> set[int]:
    try:
        return {int(name) for name in os.listdir(f"/proc/{pid}/task")}
    except OSError:
        return set()


@dataclass
class _Event:
    fd: int
    ring: mmap.mmap


@dataclass
class Sampler:
    """Samples of the threads of process `pid`: `open` before the pass, `enable` and `disable` around its calls (as
    often as it likes), `poll` while they run (threads started meanwhile followed, rings drained before they fill),
    `samples` and `counted_ns` after it. `spans`: when it was on; `cpu_ns`: the process's CPU time meanwhile."""
    pid: int
    period_ns: int = PERIOD_NS
    events: dict[int, _Event] = field(default_factory=dict)
    found: list[tuple[int, int, int]] = field(default_factory=list)
    problem: str | None = None
    enabled: bool = False
    spans: list[Span] = field(default_factory=list)
    cpu_ns: int = 0
    _since: tuple[int, int] = (0, 0)

    def open(self) -> bool:
        if _SYSCALL is None:
            self.problem = f"no perf_event_open for {platform.machine()}"
            return False
        for tid in sorted(threads(self.pid)):
            failed = self._open(tid)
            if failed and not self.events:
                self.problem = failed
                self.close()
                return False
        if not self.events:
            self.problem = self.problem or f"no thread of process {self.pid} could be sampled"
        return bool(self.events)

    def _open(self, tid: int) -> str | None:
        attr = ctypes.create_string_buffer(_attr(self.period_ns, disabled=not self.enabled), 112)
        fd = _libc.syscall(_SYSCALL, attr, tid, -1, -1, _FD_CLOEXEC)
        if fd < 0:
            return f"perf events unavailable ({os.strerror(ctypes.get_errno())})"  # or the thread ended meanwhile
        try:
            ring = mmap.mmap(fd, (PAGES + 1) * mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(fd)
            return f"perf ring buffer unavailable ({exc.strerror})"
        self.events[tid] = _Event(fd, ring)
        return None

    def follow(self) -> None:
        """Events on the threads started since the last look (enabled at once while the pass runs)."""
        for tid in sorted(threads(self.pid) - set(self.events)):
            self._open(tid)

    def poll(self) -> None:
        self.follow()
        for event in self.events.values():
            self.found += _drain(event.ring)

    def _ioctl(self, request: int) -> None:
        for event in self.events.values():
            _libc.ioctl(event.fd, request, 0)

    def enable(self) -> None:
        """On: every followed thread's event (the process's clock read after, so threads never followed are not
        charged for what the followed ones did before they were on)."""
        self._ioctl(_ENABLE)
        self.enabled = True
        self._since = (time.monotonic_ns(), process_cpu_ns(self.pid))

    def disable(self) -> None:
        if not self.enabled:
            return
        now, cpu = time.monotonic_ns(), process_cpu_ns(self.pid)
        self._ioctl(_DISABLE)
        self.enabled = False
        self.spans.append((self._since[0], now))
        self.cpu_ns += cpu - self._since[1]

    def samples(self) -> list[tuple[int, int, int]]:
        """(instruction address, thread, CLOCK_MONOTONIC ns) of every sample taken so far; the rings are emptied."""
        self.poll()
        found, self.found = self.found, []
        return found

    def counted_ns(self) -> int:
        """CPU time of the followed threads while their events were enabled (each event's count: kernel time too)."""
        total = 0
        for event in self.events.values():
            try:
                total += struct.unpack("Q", os.read(event.fd, 8))[0]
            except OSError:
                continue
        return total

    def close(self) -> None:
        for event in self.events.values():
            event.ring.close()
            os.close(event.fd)
        self.events = {}


def _drain(ring: mmap.mmap) -> list[tuple[int, int, int]]:
    page = mmap.PAGESIZE
    head, tail = struct.unpack_from("QQ", ring, 1024)
    if head == tail:
        return []  # nothing new: most polls of most threads
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


def mappings(pid: int | str = "self") -> Mappings:
    """(start, end, file or [name] or "") of every executable mapping of process `pid`."""
    found = []
    with open(f"/proc/{pid}/maps") as f:
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


@functools.lru_cache(maxsize=1)
def interpreter_dirs() -> tuple[str, ...]:
    """Where the installed libraries a Triton interpreter launch runs lie (numpy, its bundled libraries, Triton):
    real-path prefixes. Installed, so read-only to a candidate."""
    found = []
    for name in ("numpy", "triton"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            package = os.path.dirname(os.path.realpath(spec.origin))
            found += [package + os.sep, package + ".libs" + os.sep]
    return tuple(found)


class _Lookup:
    """The file of an instruction address in one or more readings of a process's mappings: "" where none maps it,
    _CHANGED where two readings disagree (a library mapped over another's range during the pass)."""

    def __init__(self, readings: Sequence[Mappings]) -> None:
        self.readings = [(sorted(maps), [lo for lo, _, _ in sorted(maps)]) for maps in readings]

    def path(self, ip: int) -> str:
        paths = set()
        for ordered, starts in self.readings:
            i = bisect.bisect_right(starts, ip) - 1
            if i >= 0 and ip < ordered[i][1]:
                paths.add(ordered[i][2])
        return paths.pop() if len(paths) == 1 else _CHANGED if paths else ""


def places(samples: Iterable[tuple[int, int, int]], readings: Sequence[Mappings], own_dirs: tuple[str, ...],
           torch_dirs: tuple[str, ...], windows: Iterable[Window] = (),
           foreign: frozenset[str] = frozenset()) -> dict[str, int]:
    """Samples per place. `readings`: the process's mappings, read before and after the pass; `windows`: (thread,
    start, end) of the candidate's Triton launches, on CLOCK_MONOTONIC, already checked (`checked_windows`)."""
    counts = dict.fromkeys(PLACES, 0)
    by_thread: dict[int, list[tuple[int, int]]] = {}
    for tid, start, end in windows:
        by_thread.setdefault(tid, []).append((start, end))
    lookup, cache = _Lookup(readings), {}
    native = torch_in_launches = 0
    for ip, tid, when in samples:
        path = lookup.path(ip)
        if path not in cache:
            cache[path] = _place_of(path, own_dirs, torch_dirs, foreign)
        place, in_launches = cache[path]
        native += place == "own"
        if any(start <= when <= end for start, end in by_thread.get(tid, ())):
            if in_launches:
                place = "own"
            elif place == "torch":
                torch_in_launches += 1
                continue
        counts[place] += 1
    # torch's time inside the launches of a candidate with no native code of its own is the interpreter copying the
    # launch's arguments: every op such a candidate runs goes through the dispatcher, and the op log counts any that
    # computes inside a launch. Native code could call torch's kernels beneath the dispatcher: there it stays torch's.
    counts["torch" if native else "neutral"] += torch_in_launches
    return counts


def _place_of(path: str, own_dirs: tuple[str, ...], torch_dirs: tuple[str, ...], foreign: frozenset[str]
              ) -> tuple[str, bool]:
    """(the place of a mapped file, whether a sample there inside a Triton launch is the launch's own: the
    interpreter, the runtimes, numpy and Triton; never torch's libraries or any other)."""
    if path == _CHANGED or not path:
        return "other", False
    real = os.path.realpath(path) if path.startswith(os.sep) else path
    place = place_of_file(real, own_dirs, torch_dirs, foreign)
    return place, place in ("own", "neutral") or (place == "other" and real.startswith(interpreter_dirs()))


def checked_windows(reported: Iterable[Window], spans: list[Span], seen: set[int]) -> tuple[list[Window], list[str]]:
    """The launch windows a runner reported that may count: inside a span the parent sampled (its calls), on a
    thread the parent sampled (`seen`), not overlapping another on that thread. Windows outside the pass or
    overlapping are no launch the runner made: they are dropped and reported."""
    kept: list[Window] = []
    problems = []
    last: dict[int, int] = {}
    for tid, lo, hi in sorted(reported, key=lambda w: (w[0], w[1])):
        if not any(start <= lo <= hi <= end for start, end in spans) or lo < last.get(tid, lo):
            problems.append(f"a Triton launch window the runner reported (thread {tid}) lies outside the sampled pass "
                            "or over another launch: launch windows were forged")
            continue
        last[tid] = hi
        if tid in seen:
            kept.append((tid, lo, hi))
    return kept, problems[:1]


def measure(pid: int, run: Callable[[Sampler], int], own_dirs: tuple[str, ...], torch_dirs: tuple[str, ...],
            foreign: frozenset[str] = frozenset(),
            windows: Callable[[list[Span], set[int]], list[Window]] = lambda spans, seen: []) -> dict[str, Any]:
    """Sample process `pid` while `run(sampler)` makes its calls, with the sampler on around them (and polled while
    it waits), and returns how many it made: samples per place, the calls and the sampling period; or why nothing
    could be sampled. `windows(spans sampled, threads sampled)`: the launch windows that may count
    (`checked_windows`)."""
    sampler = Sampler(pid)
    if not sampler.open():
        return {"problem": sampler.problem}
    try:
        before = mappings(pid)
        calls = run(sampler)
        sampler.disable()
        samples, followed = sampler.samples(), sampler.counted_ns()
        counts = places(samples, [before, mappings(pid)], own_dirs, torch_dirs,
                        windows(sampler.spans, set(sampler.events)), foreign)
    finally:
        sampler.close()
    counts["other"] += max(0, sampler.cpu_ns - followed) // sampler.period_ns  # threads never followed: not own
    counts["neutral"] += max(0, followed - len(samples) * sampler.period_ns) // sampler.period_ns
    return {"places": counts, "calls": calls, "period_ns": sampler.period_ns}


def sampled_calls(call: Callable[[], Any], own_dirs: tuple[str, ...], torch_dirs: tuple[str, ...],
                  foreign: frozenset[str] = frozenset()) -> dict[str, Any]:
    """`call` run in this process until it used MIN_NS of CPU (at least once, at most MAX_CALLS times), sampled by
    `measure` as the harness samples a runner: how the parent measures the reference."""

    def run(sampler: Sampler) -> int:
        calls, start = 0, time.process_time_ns()
        sampler.enable()
        while calls < MAX_CALLS and (calls == 0 or time.process_time_ns() - start < MIN_NS):
            call()
            calls += 1
        sampler.disable()
        return calls

    return measure(os.getpid(), run, own_dirs, torch_dirs, foreign)


def per_call_ns(result: dict[str, Any], which: Iterable[str]) -> float:
    """CPU nanoseconds per call spent in the places `which`."""
    return sum(result["places"][p] for p in which) * result["period_ns"] / max(1, result["calls"])
