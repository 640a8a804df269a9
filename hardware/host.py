"""How busy the host is while something is timed: the 1-minute load average, the CPU count, and the CPU time our
own process tree and everyone else's processes used over a window, read from /proc (two reads of each process's
stat line, a few milliseconds). A timing taken on a contended host says so beside its numbers.

Contended: the load average, less the cores our own process tree kept busy, is above half the cores; or, over the
window itself, other processes kept more than half the cores busy.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from kernelbot.records import BusyProcess, HostLoad

CONTENDED_SHARE = 0.5  # of the cores, busy with work that is not ours
BUSIEST = 5  # other processes listed by name
PROC = Path("/proc")


@dataclass(frozen=True)
class ProcSample:
    """Every process's parent and CPU ticks (user + system) at one instant."""

    at_ns: int
    ticks: dict[int, int]
    parents: dict[int, int]
    names: dict[int, str]
    reaped: int = 0  # our process's children that ended and were waited for: their ticks (and their children's)


def read_stat(line: str) -> tuple[str, int, int]:
    """(name, parent pid, user + system ticks) from a /proc/PID/stat line; the name may hold spaces and ')'."""
    name, rest = line[line.index("(") + 1:line.rindex(")")], line[line.rindex(")") + 2:].split()
    return name, int(rest[1]), int(rest[11]) + int(rest[12])


def sample() -> ProcSample | None:
    """All processes' CPU ticks now, or None where there is no /proc."""
    if not (PROC / "self" / "stat").exists():
        return None
    at = time.perf_counter_ns()
    ticks, parents, names = {}, {}, {}
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            name, parent, used = read_stat((PROC / entry.name / "stat").read_text())
        except (OSError, ValueError, IndexError):  # the process ended between listing and reading
            continue
        pid = int(entry.name)
        ticks[pid], parents[pid], names[pid] = used, parent, name
    return ProcSample(at, ticks, parents, names, reaped_ticks())


def reaped_ticks() -> int:
    """CPU ticks of this process's children that have ended and been waited for (cutime + cstime): a sandboxed job
    that finished inside a timing window is our work, not another process's."""
    try:
        rest = (PROC / "self" / "stat").read_text().rsplit(")", 1)[1].split()
        return int(rest[13]) + int(rest[14])
    except (OSError, ValueError, IndexError):
        return 0


def own_tree(parents: dict[int, int], root: int) -> set[int]:
    """root and every process descended from it."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, []))
    return tree


def tree_cores(root: int, window_s: float = 0.2) -> float | None:
    """Cores that `root` and its descendants used over the next `window_s` seconds; None where there is no /proc."""
    before = sample()
    time.sleep(window_s)
    after = sample()
    if before is None or after is None:
        return None
    used = sum(after.ticks.get(p, 0) - before.ticks.get(p, 0) for p in own_tree(after.parents, root))
    return used / os.sysconf("SC_CLK_TCK") / ((after.at_ns - before.at_ns) / 1e9)


def is_contended(load_1m: float | None, cpu_count: int, own_cores: float | None,
                 others_cores: float | None) -> bool:
    limit = CONTENDED_SHARE * cpu_count
    by_load = load_1m is not None and load_1m - (own_cores or 0.0) > limit
    return by_load or (others_cores is not None and others_cores > limit)


def host_load(since: ProcSample | None = None, window_s: float = 0.05) -> HostLoad:
    """The host's load now; CPU shares over the window since `since` (a sample taken when timing began), or over
    `window_s` of waiting here when there is none."""
    try:
        load_1m: float | None = round(os.getloadavg()[0], 2)
    except OSError:
        load_1m = None
    cpus = os.cpu_count() or 1
    start = since if since is not None else sample()
    if start is None:
        return HostLoad(load_1m=load_1m, cpu_count=cpus, contended=is_contended(load_1m, cpus, None, None),
                        note="no /proc here: CPU shares of processes not read")
    if since is None:
        time.sleep(window_s)
    end = sample()
    assert end is not None  # /proc was there a moment ago
    window = max((end.at_ns - start.at_ns) / 1e9, 1e-6)
    per_tick = 1 / (os.sysconf("SC_CLK_TCK") * window)
    ours = own_tree(end.parents, os.getpid())
    used = {pid: (t - start.ticks.get(pid, 0)) * per_tick for pid, t in end.ticks.items()}
    own = sum(c for pid, c in used.items() if pid in ours) + (end.reaped - start.reaped) * per_tick
    others = {pid: c for pid, c in used.items() if pid not in ours and c > 0}
    busiest = sorted(others, key=lambda pid: -others[pid])[:BUSIEST]
    others_cores = sum(others.values())
    return HostLoad(load_1m=load_1m, cpu_count=cpus, window_s=round(window, 4), own_cores=round(own, 3),
                    others_cores=round(others_cores, 3),
                    busiest=[BusyProcess(pid=p, name=end.names[p], cores=round(others[p], 3)) for p in busiest],
                    contended=is_contended(load_1m, cpus, own, others_cores))


def last_level_cache_bytes(default: int = 32 << 20) -> int:
    """The CPU's last-level cache in bytes (the largest cache sysfs lists for cpu0), `default` where none is listed."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text[:-1] if unit != 1 else text
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes, default=default)
