"""The candidate's sampled pass, measured by the harness from outside the runner (sampling.py does the measuring, as
the parent does for the reference): the harness opens perf events on the runner's threads, asks for the calls in
requests whose sizes it chooses, switches its sampler on and off at the runner's marks around each request's calls
(answering each, so the runner's own checks between requests are not sampled), follows threads started meanwhile
while it waits, reads the runner's mappings and CPU clock itself, and attributes every sample with the
content-based identity of the candidate's builds.

Nothing the runner says decides a place: the calls counted are the calls the harness asked for; a mark only says when
the sampler is on, and exactly one start and one end per request or the channel's protocol is broken; the only report
taken from the runner, its Triton launches' windows, counts only inside a span the harness sampled, on threads it
sampled, and only for code such a launch runs (sampling.checked_windows, sampling.places). Where the harness can sample
itself but not its runner (a candidate that made its process unreadable), that is tampering.

Imported by harness.py; works on its Runner handle (pid, ask, events).
"""

from __future__ import annotations

import math
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kernelbot.agent.verify import sampling
from kernelbot.agent.verify.messages import Message, Profile, Reply, SampleRequest, TritonLaunch
from kernelbot.agent.verify.runner import WORK, code_places
from kernelbot.agent.verify.runner_channel import RunnerDied

CHECKED_SAMPLED = 3  # the sampled calls whose outputs go back to be checked (picked by the harness once all ran)
MIN_CALL_NS = 1_000  # the least CPU a call is taken to cost when the harness sizes its next request


class _Runner(Protocol):
    pid: int
    events: list[Message]

    def ask(self, request: Any, watcher: Watcher | None = None) -> Reply: ...


class SampleError(Exception):
    """The candidate failed during its sampled calls, or the harness lost sight of its runner."""


class Watcher:
    """The harness's sampler during one sampled request: polled while the harness waits, switched on at the runner's
    start mark and off at its end mark."""

    def __init__(self, sampler: sampling.Sampler) -> None:
        self.sampler, self.phase = sampler, "idle"

    def poll(self) -> None:
        self.sampler.poll()

    def mark(self, phase: str) -> None:
        if self.phase != {"start": "idle", "end": "on"}[phase]:
            raise ValueError(f"a sampling mark ({phase}) out of order")
        if phase == "start":
            self.sampler.enable()
        else:
            self.sampler.disable()
        self.phase = "on" if phase == "start" else "done"


@dataclass
class Sampled:
    """What the harness measured of the pass: the Profile's sampling fields, tampering it saw, the sampled calls whose
    outputs the profile request asks back."""
    fields: dict[str, Any] = field(default_factory=dict)
    tamper: list[str] = field(default_factory=list)
    checked: list[int] = field(default_factory=list)
    error: str | None = None

    def into(self, profile: Profile) -> None:
        """The profile's sampling fields replaced by the harness's own reading, whatever the runner sent."""
        profile.places, profile.calls, profile.period_ns, profile.problem = {}, 0, 0, None
        for name, value in self.fields.items():
            setattr(profile, name, value)
        if self.error is not None and profile.error is None:
            profile.error = self.error


def sampled_pass(runner: _Runner, model: int, inputs: list[Any], module: str, foreign: frozenset[str]) -> Sampled:
    """The candidate's calls on `inputs`, sampled from outside its runner until they used sampling.MIN_NS of its CPU
    (at least one, at most sampling.MAX_CALLS)."""
    own_dirs, torch_dirs = code_places(module, Path.cwd() / WORK)
    runner.ask(SampleRequest(model=model, inputs=inputs))  # staged outside the pass: unpickling is no call's work
    seen, found = len(runner.events), Sampled()

    def windows(spans: list[sampling.Span], threads: set[int]) -> list[sampling.Window]:
        reported = [(e.thread, e.start_ns, e.end_ns) for e in runner.events[seen:] if isinstance(e, TritonLaunch)]
        kept, found.tamper = sampling.checked_windows(reported, spans, threads)
        return kept

    try:
        result = sampling.measure(runner.pid, lambda sampler: _calls(runner, model, sampler), own_dirs, torch_dirs,
                                  foreign, windows)
    except (SampleError, OSError) as exc:
        found.error = str(exc) if isinstance(exc, SampleError) else \
            f"the harness lost sight of the runner's sampled calls ({exc})"
        return found
    if "problem" in result:
        found.fields["problem"] = result["problem"]
        found.tamper += _refused(result["problem"])
        return found
    found.fields = result
    found.checked = sorted({secrets.randbelow(result["calls"]) for _ in range(CHECKED_SAMPLED)})
    return found


def _calls(runner: _Runner, model: int, sampler: sampling.Sampler) -> int:
    """Requests of calls until the calls used sampling.MIN_NS of the runner's CPU while the sampler was on: one call
    first, then as many as the CPU per call so far says are left (the harness's count, its reading of the runner's
    CPU clock)."""
    made = 0
    while made < sampling.MAX_CALLS and (made == 0 or sampler.cpu_ns < sampling.MIN_NS):
        per_call = max(MIN_CALL_NS, sampler.cpu_ns // max(1, made))
        calls = 1 if made == 0 else min(sampling.MAX_CALLS - made,
                                        max(1, math.ceil((sampling.MIN_NS - sampler.cpu_ns) / per_call)))
        watcher = Watcher(sampler)
        reply = runner.ask(SampleRequest(model=model, calls=calls), watcher)
        if reply.error is not None:
            raise SampleError(reply.error[:500])
        if watcher.phase != "done":
            raise RunnerDied("made its sampled calls without marking them (tampering with the harness's channel)")
        made += calls
    return made


def _refused(problem: str) -> list[str]:
    """Tampering, where perf events work for the harness on itself but not on its runner."""
    probe = sampling.Sampler(os.getpid())
    if not probe.open():
        return []  # refused to everybody here (Docker's seccomp profile): said so, not judged
    probe.close()
    return [f"the harness could not sample the candidate's process, though it can sample its own ({problem}): "
            "the runner was made unreadable"]
