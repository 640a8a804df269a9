"""The clocks a candidate reads, so that a verified call looks hours after its import, as it would in serving.

A kernel can be honest only while it is young: `_T0 = time.monotonic()` at import, then wrong once
`time.monotonic() - _T0` passes a few minutes (verification is over by then; an engine runs it for hours). So every
clock the candidate's process reads while it loads (its import and its construction) reads H hours earlier than the
kernel's, and CPU-time clocks read C more hours of CPU from the moment it has loaded (H, C random per job, H below
the machine's uptime so that no clock reads before boot). Since the clocks move once, around the load, every
difference measured after it is exact: the benchmark's timings, the settle windows, the sampler's windows.

How: a small library preloaded into the job's processes (LD_PRELOAD; built here, in the trusted parent, with the
system's C compiler) stands in for libc's clock_gettime, gettimeofday, time, clock, times and getrusage, and for the
functions that wait until an absolute time (clock_nanosleep, the condition, semaphore and mutex timed waits: Python's
sleep, its locks' timeouts and the GIL's switch all wait so), which it moves back by the same amount. Its shift is
zero until the runner sets it; the runner sets it twice (before the load, after it), and a third setting is refused,
so a candidate that changes it during its import makes the runner's second setting fail, which is reported.

What it cannot move (docs/verification.md): the processor's time-stamp counter (rdtsc), raw clock_gettime system
calls (syscall(2) through ctypes), and time stamps the kernel writes (a file's mtime, /proc/self/stat's start time
and CPU times); a candidate that compares those with the clocks, or that notices the jump itself (hours between its
import and its first call), can still tell.

Parent side: `job_env(device)`. Runner side: `Shift` (disguise.loading sets it around the load).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import random
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernelbot.paths import cache_dir

PRELOAD = "LD_PRELOAD"
LIBRARY_PREFIX = "libclk-"
CONTROL = "clockshift_set"  # the library's one entry point: (wall ns, CPU ns) -> 0, or -1 once it was set twice
HOURS = (2.0, 30.0)  # H, the apparent time between the load and the first call, drawn log-uniformly in hours
UPTIME_MARGIN_S = 600.0  # H stays this far below the machine's uptime: no clock reads before boot
DEVICES = ("cpu",)  # where jobs get the library (a GPU job's CUDA driver threads are untried with it)

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/times.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t wall_ns, cpu_ns;
static volatile int settings_left = 2;

static int (*r_gettime)(clockid_t, struct timespec *);
static int (*r_gettimeofday)(struct timeval *, void *);
static time_t (*r_time)(time_t *);
static clock_t (*r_clock)(void);
static clock_t (*r_times)(struct tms *);
static int (*r_getrusage)(int, struct rusage *);
static int (*r_nanosleep)(clockid_t, int, const struct timespec *, struct timespec *);
static int (*r_cond_timedwait)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
static int (*r_cond_clockwait)(pthread_cond_t *, pthread_mutex_t *, clockid_t, const struct timespec *);
static int (*r_sem_timedwait)(sem_t *, const struct timespec *);
static int (*r_sem_clockwait)(sem_t *, clockid_t, const struct timespec *);
static int (*r_mutex_timedlock)(pthread_mutex_t *, const struct timespec *);
static int (*r_mutex_clocklock)(pthread_mutex_t *, clockid_t, const struct timespec *);

static void *real(const char *name, const char *version) {
    void *f = version ? dlvsym(RTLD_NEXT, name, version) : 0;
    return f ? f : dlsym(RTLD_NEXT, name);
}

__attribute__((constructor)) static void resolve(void) {
    r_gettime = real("clock_gettime", 0);
    r_gettimeofday = real("gettimeofday", 0);
    r_time = real("time", 0);
    r_clock = real("clock", 0);
    r_times = real("times", 0);
    r_getrusage = real("getrusage", 0);
    r_nanosleep = real("clock_nanosleep", 0);
    r_cond_timedwait = real("pthread_cond_timedwait", "GLIBC_2.3.2");
    r_cond_clockwait = real("pthread_cond_clockwait", 0);
    r_sem_timedwait = real("sem_timedwait", 0);
    r_sem_clockwait = real("sem_clockwait", 0);
    r_mutex_timedlock = real("pthread_mutex_timedlock", 0);
    r_mutex_clocklock = real("pthread_mutex_clocklock", 0);
}

static int cpu_clock(clockid_t id) {
    return id == CLOCK_PROCESS_CPUTIME_ID || id == CLOCK_THREAD_CPUTIME_ID || id < 0;
}

static int64_t shift_of(clockid_t id) { return cpu_clock(id) ? cpu_ns : wall_ns; }

static struct timespec moved(const struct timespec *t, int64_t ns) {
    int64_t total = (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec + ns;
    struct timespec out;
    out.tv_sec = total / 1000000000LL;
    out.tv_nsec = total % 1000000000LL;
    if (out.tv_nsec < 0) { out.tv_nsec += 1000000000LL; out.tv_sec -= 1; }
    return out;
}

int clockshift_set(int64_t wall, int64_t cpu) {
    if (settings_left <= 0) return -1;
    settings_left -= 1;
    wall_ns = wall;
    cpu_ns = cpu;
    return 0;
}

int kb_gettime(clockid_t id, struct timespec *ts) __asm__("clock_gettime");
int kb_gettime(clockid_t id, struct timespec *ts) {
    if (!r_gettime) resolve();
    int r = r_gettime(id, ts);
    int64_t s = shift_of(id);
    if (r == 0 && s && ts) *ts = moved(ts, s);
    return r;
}

int kb_gettimeofday(struct timeval *tv, void *tz) __asm__("gettimeofday");
int kb_gettimeofday(struct timeval *tv, void *tz) {
    if (!r_gettimeofday) resolve();
    int r = r_gettimeofday(tv, tz);
    if (r == 0 && wall_ns && tv) {
        struct timespec t = {tv->tv_sec, tv->tv_usec * 1000};
        t = moved(&t, wall_ns);
        tv->tv_sec = t.tv_sec;
        tv->tv_usec = t.tv_nsec / 1000;
    }
    return r;
}

time_t kb_time(time_t *out) __asm__("time");
time_t kb_time(time_t *out) {
    if (!r_time) resolve();
    time_t now = r_time(0) + (time_t)(wall_ns / 1000000000LL);
    if (out) *out = now;
    return now;
}

clock_t kb_clock(void) __asm__("clock");
clock_t kb_clock(void) {
    if (!r_clock) resolve();
    clock_t c = r_clock();
    return c == (clock_t)-1 ? c : c + (clock_t)(cpu_ns / (1000000000LL / CLOCKS_PER_SEC));
}

clock_t kb_times(struct tms *buf) __asm__("times");
clock_t kb_times(struct tms *buf) {
    if (!r_times) resolve();
    clock_t r = r_times(buf);
    long hz = sysconf(_SC_CLK_TCK);
    if (buf && r != (clock_t)-1) buf->tms_utime += (clock_t)(cpu_ns / (1000000000LL / hz));
    return r == (clock_t)-1 ? r : r + (clock_t)(wall_ns / (1000000000LL / hz));
}

int kb_getrusage(int who, struct rusage *u) __asm__("getrusage");
int kb_getrusage(int who, struct rusage *u) {
    if (!r_getrusage) resolve();
    int r = r_getrusage(who, u);
    if (r == 0 && u && cpu_ns && (who == RUSAGE_SELF || who == RUSAGE_THREAD)) {
        struct timespec t = {u->ru_utime.tv_sec, u->ru_utime.tv_usec * 1000};
        t = moved(&t, cpu_ns);
        u->ru_utime.tv_sec = t.tv_sec;
        u->ru_utime.tv_usec = t.tv_nsec / 1000;
    }
    return r;
}

int kb_nanosleep(clockid_t id, int flags, const struct timespec *req, struct timespec *rem)
    __asm__("clock_nanosleep");
int kb_nanosleep(clockid_t id, int flags, const struct timespec *req, struct timespec *rem) {
    if (!r_nanosleep) resolve();
    if (!(flags & TIMER_ABSTIME) || !shift_of(id)) return r_nanosleep(id, flags, req, rem);
    struct timespec at = moved(req, -shift_of(id));
    return r_nanosleep(id, flags, &at, rem);
}

int kb_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *at)
    __asm__("pthread_cond_timedwait");
int kb_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *at) {
    if (!r_cond_timedwait) resolve();
    if (!wall_ns || !at) return r_cond_timedwait(c, m, at);
    struct timespec real_at = moved(at, -wall_ns);
    return r_cond_timedwait(c, m, &real_at);
}

int kb_cond_clockwait(pthread_cond_t *c, pthread_mutex_t *m, clockid_t id, const struct timespec *at)
    __asm__("pthread_cond_clockwait");
int kb_cond_clockwait(pthread_cond_t *c, pthread_mutex_t *m, clockid_t id, const struct timespec *at) {
    if (!r_cond_clockwait) resolve();
    if (!wall_ns || !at) return r_cond_clockwait(c, m, id, at);
    struct timespec real_at = moved(at, -wall_ns);
    return r_cond_clockwait(c, m, id, &real_at);
}

int kb_sem_timedwait(sem_t *s, const struct timespec *at) __asm__("sem_timedwait");
int kb_sem_timedwait(sem_t *s, const struct timespec *at) {
    if (!r_sem_timedwait) resolve();
    if (!wall_ns || !at) return r_sem_timedwait(s, at);
    struct timespec real_at = moved(at, -wall_ns);
    return r_sem_timedwait(s, &real_at);
}

int kb_sem_clockwait(sem_t *s, clockid_t id, const struct timespec *at) __asm__("sem_clockwait");
int kb_sem_clockwait(sem_t *s, clockid_t id, const struct timespec *at) {
    if (!r_sem_clockwait) resolve();
    if (!wall_ns || !at) return r_sem_clockwait(s, id, at);
    struct timespec real_at = moved(at, -wall_ns);
    return r_sem_clockwait(s, id, &real_at);
}

int kb_mutex_timedlock(pthread_mutex_t *m, const struct timespec *at) __asm__("pthread_mutex_timedlock");
int kb_mutex_timedlock(pthread_mutex_t *m, const struct timespec *at) {
    if (!r_mutex_timedlock) resolve();
    if (!wall_ns || !at) return r_mutex_timedlock(m, at);
    struct timespec real_at = moved(at, -wall_ns);
    return r_mutex_timedlock(m, &real_at);
}

int kb_mutex_clocklock(pthread_mutex_t *m, clockid_t id, const struct timespec *at)
    __asm__("pthread_mutex_clocklock");
int kb_mutex_clocklock(pthread_mutex_t *m, clockid_t id, const struct timespec *at) {
    if (!r_mutex_clocklock) resolve();
    if (!wall_ns || !at) return r_mutex_clocklock(m, id, at);
    struct timespec real_at = moved(at, -wall_ns);
    return r_mutex_clocklock(m, id, &real_at);
}
"""


# ---------------------------------------------------------------- parent side: the library and the job's environment

@functools.cache
def library() -> Path | None:
    """The preloaded library, built once per source with the system's C compiler next to kernelbot's cache (not in
    it: what lies under the cache counts as the candidate's own code, sampling.place_of_file); None without one (a
    build that failed is not tried again in this process)."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        return None
    folder = cache_dir().with_name(cache_dir().name + "-clock")
    target = folder / f"{LIBRARY_PREFIX}{hashlib.sha256(SOURCE.encode()).hexdigest()[:16]}.so"
    if target.exists():
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src, out = Path(tmp) / "clk.c", Path(tmp) / "clk.so"
            src.write_text(SOURCE)
            subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(src), "-ldl"], check=True,
                           capture_output=True, timeout=120)
            os.replace(out, target)  # atomic: a concurrent build leaves one whole library
    except (OSError, subprocess.SubprocessError):
        return None
    return target


def job_env(device: str) -> dict[str, str]:
    """What a verify or benchmark job's environment adds: the library preloaded (ahead of any the caller preloads)
    on `device`s in DEVICES, where it was built."""
    path = library() if device in DEVICES else None
    if path is None:
        return {}
    return {PRELOAD: " ".join(filter(None, (str(path), os.environ.get(PRELOAD, ""))))}


# ---------------------------------------------------------------- runner side: setting the shift

def own_library(path: str) -> bool:
    """Whether `path` (an LD_PRELOAD entry) is this module's library."""
    return os.path.basename(path).startswith(LIBRARY_PREFIX)


@dataclass
class Shift:
    """The shift one runner applies around its load: H (ns, wall clocks) during it, C (ns of CPU) after it, through
    the library's setter, found before the candidate loads (`setter`: None where the job has no library)."""
    wall_ns: int
    cpu_ns: int
    setter: Callable[[int, int], int] | None

    @classmethod
    def draw(cls) -> Shift:
        """H log-uniform in HOURS (below the uptime less UPTIME_MARGIN_S), C a random share of H, from the OS's
        randomness (a candidate cannot seed it)."""
        rng = random.Random(secrets.randbits(64))
        hours = HOURS[0] * (HOURS[1] / HOURS[0]) ** rng.random()
        wall = min(hours * 3600.0, max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - UPTIME_MARGIN_S),
                   max(0.0, time.monotonic() - UPTIME_MARGIN_S))
        return cls(int(wall * 1e9), int(wall * rng.uniform(0.3, 0.9) * 1e9), _setter())

    def before_load(self) -> str:
        """Set the wall clocks back by H; a protection's description, or why there is none."""
        if self.setter is None:
            return "clocks not shifted (no preloaded clock library: no C compiler, or not a CPU job)"
        if self.wall_ns <= 0 or self.setter(-self.wall_ns, 0) != 0:
            return "clocks not shifted (the machine's uptime is too short, or the library refused)"
        return (f"clocks read while the candidate loaded set back {self.wall_ns / 3.6e12:.1f} h, CPU clocks "
                f"{self.cpu_ns / 3.6e12:.1f} h ahead after it")

    def after_load(self) -> list[str]:
        """Wall clocks back to the kernel's, CPU clocks C ahead; a tamper finding when the library refused (the
        candidate set it meanwhile)."""
        if self.setter is None or self.wall_ns <= 0 or self.setter(0, self.cpu_ns) == 0:
            return []
        return ["the clocks' shift was set while the candidate loaded (its own call into the clock library): the "
                "harness could not set it"]


def _setter() -> Callable[[int, int], int] | None:
    try:
        setter = ctypes.CDLL(None)[CONTROL]
    except (OSError, AttributeError):
        return None
    setter.argtypes, setter.restype = [ctypes.c_int64, ctypes.c_int64], ctypes.c_int
    return setter
