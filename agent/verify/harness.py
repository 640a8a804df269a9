"""The in-box harness (started by the sandbox as `python -c ... job.json`, box.HARNESS_ARGS): a harness
process that never runs candidate code, and runners it forks that do.

Jobs (job.json in the working directory, a messages.Job):
  verify:   run ModelNew on every input set the parent prepared, with the observations judge.py turns into checks
  bench:    time Model (reference) and ModelNew, each in a runner of its own, call by call in interleaved
            rounds, on inputs that change before every call; some calls' outputs, picked after they returned,
            come back for the parent to check and stay held to the end; a few untimed calls look like verified
            ones (poisoned, or after a pause), and the candidate's threads are watched while the reference is timed
  sanitize: one call on the main input set, for a sanitizer to watch (a single process)
  noop:     nothing (measures the sandbox's own cost per job)

The harness forks each runner before it reads anything of the job. A runner confines itself further
(confine.confine_runner: it reads only the system, Python, kernelbot and the one module it loads, writes only
box/tmp, and cannot signal or trace the harness), imports its module and then answers requests one at a time:
inputs reach it only with the call that uses them. What it sends back is decoded as plain data (no code of its
runs in the harness) and must fit messages.Reply; only the harness writes result.json and outputs.pt (a
messages.Result, VerifyOutputs or BenchOutputs), in the box directory the runner cannot write to. A runner binds
what it uses before the candidate loads and compares a seal over the harness's modules (the messages' included)
after every request, so patching the harness is reported, not obeyed. What the harness reads itself, from outside the
candidate's process: the runner's pinned state in its memory after every reply (a raw write through ctypes), whether
the seccomp filter a candidate's CPU runner installs once the candidate loaded is in force on every thread
(sandbox/seccomp.py: no new process), any process the candidate left running, and a runner ended by a refused system
call. For the contention runs it starts processes of its own that load the cores.

The harness's trades, one module each, imported one way (harness -> runner -> runner_channel):
  runner_channel.py  the channel both sides speak: frames, plain-data replies, tensors as plain data
  runner.py          the runner process: its confinement, bound tools, request loop and observations
  harness.py         this module, the entry point: the handle on a runner (spawn, ask, close), the jobs, main()
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import secrets
import select
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernelbot.agent.verify import cuda_check, disguise, parent_sampling
from kernelbot.agent.verify.cuda_check import NeedsGPU
from kernelbot.agent.verify.messages import (
    EVENTS,
    FACT_KINDS,
    JOB,
    MAX_BUILDS,
    BenchJob,
    BenchOutputs,
    BenchResult,
    BuildJob,
    Builds,
    CallResult,
    CaseRequest,
    CaseRun,
    CheckedCall,
    Done,
    Facts,
    FetchRequest,
    FinalRequest,
    IdleRequest,
    LoadRequest,
    MemoryPins,
    NoopJob,
    Profile,
    ProfileRequest,
    PtxasReport,
    RefillRequest,
    Repeated,
    RepeatRequest,
    Reply,
    Request,
    ReweightRequest,
    SampleMark,
    SanitizeJob,
    SentPlan,
    StageRequest,
    TimedCallRequest,
    TritonBuild,
    TritonFinding,
    TritonLaunch,
    TritonReport,
    VerifyJob,
    VerifyOutputs,
    VerifyResult,
)
from kernelbot.agent.verify.messages import Failure as JobFailure
from kernelbot.agent.verify.runner import (
    HOST_THREADS,
    SETTLE_S,
    WORK,
    LoadError,
    RunnerSetup,
    _build,
    _clones,
    _load,
    _serve,
    _set_element,
    _to,
)
from kernelbot.agent.verify.runner_channel import RunnerDied, _decoded, _plain_loads, _recv, _send
from kernelbot.records import KernelBuild
from kernelbot.sandbox import confine as confine_mod
from kernelbot.sandbox.confine import AUDIT_LOST, confine, lost_records

# The fresh values' call repeated while processes of the harness's own load the cores, each busy for LOAD_BURST_S and
# asleep as long (their wake-ups take the runner's threads off their cores at any point of their work: a publication
# race wrong once in thousands of quiet calls shows within hundreds), for CONTENTION_S or CONTENTION_CALLS calls
CONTENTION_S = 0.2
CONTENTION_CALLS = 4000
LOAD_BURST_S = 5e-5
CHECKS_PER_ROUND = 4  # timed candidate calls per round whose outputs go back to be checked
# Between one runner's turn and the other's: longer than an OpenMP pool spins after its last parallel region, so the
# idle runner's threads are asleep, not spinning on a core, while the other's calls are timed.
SWITCH_GAP_S = 0.02
PERTURBED = 8  # elements of each float input a benchmark call changes before it runs
DISTURBED_EVERY = 8  # one benchmark call in this many is poisoned or paused before, and not timed
POLL_S = 0.005  # while the harness samples a runner's calls, it follows new threads and drains rings this often


# ---------------------------------------------------------------- the harness's handle on a runner

@dataclass
class Runner:
    pid: int
    to_runner: int
    from_runner: int
    events: list[TritonLaunch | TritonFinding] = field(default_factory=list)
    seq: int = 0
    pins: list[tuple[int, int]] | None = None  # the runner's own state, sent before its candidate loaded
    memory: int | None = None  # /proc/<pid>/mem of the runner, opened here

    @classmethod
    def spawn(cls, setup: RunnerSetup) -> Runner:
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the runner: never returns into the harness's code
            code = 1
            try:
                os.close(down_w)
                os.close(up_r)
                _serve(setup, down_r, up_w, (sys.modules[__name__],))  # this module sealed with the runner's
                code = 0
            except BaseException:
                sys.stderr.write(disguise.readable(traceback.format_exc()))
            finally:
                os._exit(code)
        os.close(down_r)
        os.close(up_w)
        return cls(pid, down_w, up_r)

    def ask(self, request: Request, watcher: parent_sampling.Watcher | None = None) -> Reply:
        """Send one request; collect the events that arrive before its reply; return the reply. What the runner sends
        is read as plain data and must fit the messages' models, or the runner is taken to have tampered. `watcher`:
        the harness's sampler for a sampled request, polled every POLL_S while nothing has arrived and switched by
        the runner's marks, each answered (any mark without one is tampering)."""
        self.seq += 1
        request.seq = self.seq
        try:
            _send(self.to_runner, pickle.dumps(request.model_dump()))
            while True:
                while watcher is not None and not select.select([self.from_runner], [], [], POLL_S)[0]:
                    watcher.poll()
                message = _plain_loads(_recv(self.from_runner))
                if not isinstance(message, tuple) or not message:
                    raise RunnerDied("sent a malformed message (tampering with the harness's channel)")
                if message[0] == "event" and len(message) == 3 and message[1] == "sample_mark":
                    if watcher is None:
                        raise RunnerDied("sent a sampling mark out of turn (tampering with the harness's channel)")
                    watcher.mark(SampleMark.model_validate(message[2]).phase)  # out of order: a ValueError
                    _send(self.to_runner, pickle.dumps(("marked", self.seq)))
                    continue
                if message[0] == "event" and len(message) == 3 and isinstance(message[2], dict):
                    kind = EVENTS.get(message[1]) if isinstance(message[1], str) else None
                    if kind is None:
                        raise RunnerDied("sent an event of no known kind (tampering with the harness's channel)")
                    event = kind.model_validate(message[2])
                    if isinstance(event, MemoryPins):
                        if self.pins is not None:
                            raise RunnerDied("sent its memory pins twice (tampering with the harness's channel)")
                        self.pins = event.pins
                    else:
                        self.events.append(event)
                    continue
                if message[0] != "reply" or len(message) != 3 or message[1] != self.seq or \
                        not isinstance(message[2], dict):
                    raise RunnerDied("sent a reply out of turn (tampering with the harness's channel)")
                reply = Reply.model_validate(message[2])
                reply.facts.tamper += self.memory_changes()
                return reply
        except (OSError, EOFError) as exc:
            raise RunnerDied(self.close() or f"its channel failed ({type(exc).__name__})") from None
        except (pickle.UnpicklingError, ValueError, TypeError, IndexError, AttributeError) as exc:
            self.close()  # a ValidationError is a ValueError: a reply or event that does not fit its model
            raise RunnerDied(f"sent a message the harness cannot read ({type(exc).__name__}): tampering with "
                             "the harness's channel") from None

    def memory_changes(self) -> list[str]:
        """The runner's pinned state (probes.pins) as the harness reads it in the runner's memory, from outside: a raw
        write into it (through ctypes), or a runner made unreadable, is tampering."""
        if self.pins is None:
            return ["the runner sent no memory pins before its candidate loaded"]
        try:
            if self.memory is None:
                self.memory = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
            changed = sum(int.from_bytes(os.pread(self.memory, 8, address), sys.byteorder) != value
                          for address, value in self.pins)
        except OSError as exc:
            return [f"the harness could not read the runner's memory ({exc.strerror}): its state cannot be checked"]
        return [f"{changed} of {len(self.pins)} pointers of the harness's state in the runner were overwritten in "
                "memory (a raw write, as through ctypes)"] if changed else []

    def hung_up(self) -> bool:
        """Whether the runner's end of the channel is closed (what it sent unasked is dropped, a bounded amount: the
        job is over)."""
        try:
            for _ in range(64):
                if not select.select([self.from_runner], [], [], 0)[0]:
                    return False
                if not os.read(self.from_runner, 1 << 16):
                    return True
        except OSError:
            return True
        return False

    def close(self) -> str | None:
        """End the runner; how it ended when that was not our doing."""
        ended = None
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            # a runner that just died may not be reaped yet (its end of the channel closes first): waited for; one
            # still serving (its job done, waiting for the next request) is ended at once
            for _ in range(50 if pid == 0 and self.hung_up() else 0):
                time.sleep(0.01)
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    break
            if pid == 0:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == AUDIT_LOST:
                ended = lost_records("the candidate's process")
            elif os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSYS:
                ended = _violation("process", "the candidate's process made a system call refused once it loaded (a "
                                              "new process, exec, ptrace or another process's memory): killed")
            elif os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
                ended = f"the candidate's process was killed by {name}"
            else:
                ended = f"the candidate's process exited (code {os.WEXITSTATUS(status)}) in the middle of a call"
        except ChildProcessError:
            pass
        for fd in (self.to_runner, self.from_runner, self.memory):
            try:
                if fd is not None:
                    os.close(fd)
            except OSError:
                pass
        return ended


def _violation(kind: str, detail: str) -> str:
    """A violation the harness itself saw (the runner can neither mute nor forge it), recorded for the parent."""
    if confine_mod.RECORDER is not None:
        confine_mod.RECORDER(kind, detail)
    return detail


# ---------------------------------------------------------------- the harness's jobs

def _processes() -> dict[int, int]:
    """pid -> parent pid of every process this process can see."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                found[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # it ended meanwhile
    return found


def _strays(runner: Runner, runners: list[Runner]) -> list[int]:
    """Processes the candidate's runner started (while it loaded, before the seccomp filter) that still run: below it,
    or left by it to this harness, their subreaper (a daemon that left its parent)."""
    parents = _processes()
    below = {pid for pid, parent in parents.items() if parent == os.getpid()} - {r.pid for r in runners}
    while True:
        more = {pid for pid, parent in parents.items() if parent in below | {runner.pid}} - below
        if not more:
            return sorted(below)
        below |= more


def _after_load(runner: Runner, runners: list[Runner], sealed: bool) -> list[str]:
    """What the harness itself reads once a candidate has loaded, from outside its process: processes it started that
    are still running (a violation: each is ended now), and whether every thread of its runner is under the seccomp
    filter (a harness_tamper finding when not)."""
    for pid in _strays(runner, runners):
        _violation("process", f"a process the candidate started (pid {pid}) was still running once it had loaded: "
                              "ended")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if not sealed:
        return []
    try:
        modes = [_status_field(f"/proc/{runner.pid}/task/{tid}/status", "Seccomp")
                 for tid in os.listdir(f"/proc/{runner.pid}/task")]
    except OSError:
        return []  # it ended: its ending is reported
    if modes and all(mode == "2" for mode in modes):
        return []
    return ["the runner's seccomp filter (no new process once the candidate loaded) is not in force on every thread"]


def _status_field(path: str, name: str) -> str | None:
    try:
        with open(path) as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(name + ":")), None)
    except OSError:
        return None


def _facts(reply: Reply, label: str, into: Facts) -> None:
    """A reply's observations added to the job's, each labelled with the call it was made in."""
    for kind in FACT_KINDS:
        kept: list[str] = getattr(into, kind)
        for text in getattr(reply.facts, kind):
            if kind not in ("notes", "tamper", "timing"):
                kept.append(f"{label}: {text}")
            elif text not in kept:  # the same replaced function is reported once, not per call
                kept.append(text)


def _triton_report(runner: Runner) -> TritonReport:
    """The Triton report rebuilt from the events the runner streamed, launch by launch."""
    report = TritonReport()
    kernels: set[str] = set()
    for event in runner.events:
        if isinstance(event, TritonLaunch):
            report.launches += 1
            report.programs += event.programs
            kernels.add(event.kernel[:80])
            if event.order != event.asked and len(report.order_mismatch) < 3:
                report.order_mismatch.append(f"{event.kernel[:80]} ran in {event.order[:20]} program order, "
                                             f"the harness asked for {event.asked[:20]}")
        elif isinstance(event, TritonBuild):
            report.builds += [event.build][:MAX_BUILDS - len(report.builds)]
        else:
            target = {"out_of_bounds": report.out_of_bounds, "race": report.races, "precision": report.precision}[
                event.kind]
            if len(target) < 20:
                target.append(event.text[:400])
    report.kernels, report.order_dependent_kernels = sorted(kernels), sorted(_order_dependent(runner.events))
    return report


def _order_dependent(events: list[TritonLaunch | TritonFinding]) -> set[str]:
    """Kernels that showed a legitimate dependence on program order: float atomic adds, or writes inside a lock."""
    return {e.kernel[:80] for e in events if isinstance(e, TritonLaunch) and (e.float_atomic_adds or e.locked_writes)}


def _orders_missing(events: list[TritonLaunch | TritonFinding], label: str) -> list[str]:
    """A request that asked for every program order must show launches in each (counted here, in the harness); a
    kernel kept in natural order for the shuffled run must have shown float atomics or locked writes."""
    launches = [e for e in events if isinstance(e, TritonLaunch)]
    if not launches:
        return []
    allowed = _order_dependent(events)
    problems = [f"{label}: no Triton launch ran in {order} program order although the harness asked for it"
                for order in ("reversed", "shuffled") if order not in {e.phase for e in launches}]
    problems += [f"{label}: {e.kernel[:80]} was kept in natural program order without float atomics or locks"
                 for e in launches if e.phase == "shuffled" and e.asked == "natural" and e.kernel[:80] not in allowed]
    return problems[:3]


def _schedule_unexplained(events: list[TritonLaunch | TritonFinding], label: str, schedule: str | None) -> list[str]:
    """A runner varies Triton program orders instead of thread counts once it has launched a Triton kernel: one that
    did so before the harness ever saw a launch was steered by launch windows forged in its process (which skips the
    thread-count runs)."""
    if schedule != "program order" or any(isinstance(e, TritonLaunch) for e in events):
        return []
    return [f"{label}: the runner varied Triton program orders, not thread counts, though it never streamed a Triton "
            "launch"]


def _ptxas(reports: list[PtxasReport] | None) -> list[PtxasReport]:
    return list(reports or [])


def _verify(job: VerifyJob) -> VerifyResult | JobFailure:
    setup = RunnerSetup(module=job.candidate, cls="ModelNew", device=job.device, triton=job.triton,
                        poison=True, settle_s=job.settle_s, sealed_processes=job.device == "cpu",
                        foreign=frozenset(job.foreign_builds))
    runner = Runner.spawn(setup)  # before the plan is read: the runner never holds inputs it was not given
    facts = Facts()
    try:
        plan = SentPlan.model_validate(torch.load(job.plan))
        state_dicts = [torch.load(p) for p in job.state_dicts]
        loaded = runner.ask(LoadRequest(models=list(zip(plan.init_args, state_dicts, strict=True)),
                                        init_seed=job.init_seed))
        _facts(loaded, "load", facts)
        if loaded.error is not None:
            return JobFailure(error=loaded.error[:1500], stage=loaded.stage or "compile", ptxas=_ptxas(loaded.ptxas),
                              facts=facts)
        facts.tamper += _after_load(runner, [runner], setup.sealed_processes)
        protections = (loaded.protections or [])[:4]
        runs = []
        for i, case in enumerate(plan.cases):
            orders, seen = (setup.triton or job.device == "cpu") and i < 2, len(runner.events)
            reply = runner.ask(CaseRequest(model=case.model, inputs=case.inputs, again=True, orders=orders,
                                           order_seed=i, inputs_after=True, keep="main" if i == 0 else None))
            _facts(reply, case.label, facts)
            if orders and reply.error is None:
                facts.tamper += _orders_missing(runner.events[seen:], case.label)
                facts.tamper += _schedule_unexplained(runner.events, case.label, reply.schedule)
            if reply.error is not None:
                runs.append(CaseRun(error=reply.error[:300], inputs_after=_decoded(reply.inputs_after)))
                continue
            runs.append(CaseRun(out=_decoded(reply.out), inputs_after=_decoded(reply.inputs_after),
                                schedule=reply.schedule,
                                **{k: _decoded(getattr(reply, k)) for k in ("again", "reversed", "shuffled")
                                   if getattr(reply, k) is not None}))
        outputs, profile = _later_calls(runner, plan, plan.cases[0].model, facts, job, runs)
        final = runner.ask(FinalRequest())
        _facts(final, "end of job", facts)
        ptxas = _ptxas(final.ptxas or loaded.ptxas)
        triton = _triton_report(runner) if setup.triton else None
    except RunnerDied as exc:
        return JobFailure(error=str(exc), stage="run", facts=facts)
    finally:
        runner.close()
    torch.save(outputs.model_dump(), "outputs.pt")
    return VerifyResult(facts=facts, profile=profile, triton=triton, ptxas=ptxas, protections=protections)


def _later_calls(runner: Runner, plan: SentPlan, main: int, facts: Facts, job: VerifyJob,
                 runs: list[CaseRun]) -> tuple[VerifyOutputs, Profile]:
    """Calls on the main case's own tensors with new contents (all of them, then one element at a time), the op
    log, the fresh values' call repeated under contention, the main input set once more (its bits after other calls),
    and each set of new weights copied into the same parameters and buffers. About half of the calls on the main
    case's tensors, at random (one at least), run with CPU allocations as malloc gives them, the others poisoned as
    every earlier call was."""
    outputs = VerifyOutputs(runs=runs)
    calls = 1 + len(plan.changed) + len(job.alternates)
    clean = set(random.Random(secrets.randbits(64)).sample(range(calls), max(1, calls // 2)))
    reply = runner.ask(RefillRequest(model=main, slot="main", values=plan.fresh, poison=0 not in clean))
    _facts(reply, "new values in the same tensors", facts)
    if reply.error is not None:
        outputs.caching_error = reply.error[:500]
    else:
        outputs.caching_out = _decoded(reply.out)
    for k, values in enumerate(plan.changed):
        reply = runner.ask(RefillRequest(model=main, slot="main", values=values, poison=k + 1 not in clean))
        _facts(reply, f"one element changed ({k + 1})", facts)
        outputs.element_outs.append(_call_result(reply))
    seen = len(runner.events)
    # sampled first, by the harness from outside the runner: the profiler leaves threads of its own busy after its call
    sampled = parent_sampling.sampled_pass(runner, main, plan.fresh, job.candidate, frozenset(job.foreign_builds)) \
        if job.device == "cpu" else parent_sampling.Sampled()
    facts.tamper += sampled.tamper
    reply = runner.ask(ProfileRequest(model=main, inputs=plan.fresh, checked=sampled.checked))
    _facts(reply, "profiled call", facts)
    profile = reply.profile if reply.profile is not None else \
        Profile(error=(reply.error or "no profile came back")[:500])
    sampled.into(profile)  # what the harness measured, not what the runner replied
    launches = sum(isinstance(e, TritonLaunch) for e in runner.events[seen:])
    if launches and reply.profile is not None:
        profile.own_kernels.append(f"{launches} Triton launch(es)")
    outputs.later_outs = [_decoded(out) for out in reply.later or []]
    # threads of its own that the cores' load can interleave otherwise: a candidate on a CPU that launched no Triton
    # kernel (the interpreter runs one program at a time; on a GPU the cores' load is not the kernel's)
    if job.device == "cpu" and not any(isinstance(e, TritonLaunch) for e in runner.events):
        with _loaded_cores(HOST_THREADS):
            reply = runner.ask(RepeatRequest(model=main, inputs=plan.fresh, seconds=CONTENTION_S,
                                             calls=CONTENTION_CALLS))
        _facts(reply, "repeated under contention", facts)
        outputs.repeated = Repeated(error=reply.error[:300]) if reply.error is not None else \
            Repeated(calls=reply.repeat_calls or 0, differing=reply.repeat_differing or 0,
                     outs=[_decoded(out) for out in reply.repeated or []])
    reply = runner.ask(CaseRequest(model=main, inputs=plan.cases[0].inputs))
    _facts(reply, "the main input set once more", facts)
    outputs.main_again = _call_result(reply)
    for k, path in enumerate(job.alternates):
        reply = runner.ask(ReweightRequest(model=main, state_dict=torch.load(path), names=job.param_names,
                                           buffer_names=job.buffer_names))
        _facts(reply, "new weights", facts)
        if reply.error is None:
            reply = runner.ask(RefillRequest(model=main, slot="main", values=plan.fresh,
                                             poison=1 + len(plan.changed) + k not in clean))
            _facts(reply, "new weights in the same parameters", facts)
        outputs.reweight_outs.append(_call_result(reply))
    return outputs, profile


def _call_result(reply: Reply) -> CallResult:
    return CallResult(error=reply.error[:500]) if reply.error is not None else CallResult(out=_decoded(reply.out))


@contextlib.contextmanager
def _loaded_cores(count: int) -> Iterator[None]:
    """`count` processes of the harness's own (no candidate code) for the length of the block, each busy for
    LOAD_BURST_S and then asleep as long, over and over: the runner's threads lose their cores often, at any point."""
    pids = []
    try:
        for _ in range(count):
            pid = os.fork()
            if pid == 0:
                try:
                    confine_mod.libc.prctl(confine_mod.PR_SET_PDEATHSIG, signal.SIGKILL)
                    while True:
                        start = time.perf_counter()
                        while time.perf_counter() - start < LOAD_BURST_S:
                            pass
                        time.sleep(LOAD_BURST_S)
                finally:
                    os._exit(0)
            pids.append(pid)
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


def _mask_like(x: torch.Tensor) -> bool:
    """bool, only 0s and 1s, or not all finite (an additive mask): left alone by the benchmark's changes."""
    if x.dtype == torch.bool:
        return True
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        return True
    return bool(((x == 0) | (x == 1)).all())


def _perturbation(inputs: list[Any], rng: random.Random) -> list[tuple[int, int, Any]]:
    """Up to PERTURBED elements of each float input that is not a mask (else one of an integer input: an index may
    not take two places), each set to (minus) the value of another element: every timed call sees contents no earlier
    call saw, values stay in the drawn range, and a kernel that leaves part of its output as an earlier call wrote it
    is seen in the checked calls."""
    changes = []
    tensors = [(i, x) for i, x in enumerate(inputs)
               if isinstance(x, torch.Tensor) and x.numel() > 1 and not _mask_like(x)]
    floats = [(i, x) for i, x in tensors if x.is_floating_point()]
    for i, x in floats or [(i, x) for i, x in tensors if x.dtype != torch.bool][:1]:
        flat = x.reshape(-1)
        for _ in range(min(PERTURBED, flat.numel() // 2) if x.is_floating_point() else 1):
            j, k = rng.randrange(flat.numel()), rng.randrange(flat.numel())
            value = flat[k].item()
            changes.append((i, j, -value if x.is_floating_point() else value))
    return changes


def _disturbances(iters: int, rng: random.Random) -> list[tuple[bool, float]]:
    """For each of a round's calls: (poisoned allocations, a pause before it in seconds), as verification has them:
    one or the other for one call in DISTURBED_EVERY, at random and apart from which calls are checked; such a call
    is not timed. A round of fewer than 4 calls keeps all of them undisturbed."""
    plain = [(False, 0.0)] * iters
    if iters < 4:
        return plain
    for k in rng.sample(range(iters), max(1, iters // DISTURBED_EVERY)):
        plain[k] = (True, 0.0) if rng.random() < 0.5 else (False, rng.uniform(0.5, 1.5) * SETTLE_S)
    return plain


def _bench(job: BenchJob) -> BenchResult | JobFailure:
    # the candidate's runner first: its pid is then the same as in verification (2 in a pid namespace)
    threads = job.threads or HOST_THREADS  # the model's: a served worker may have fewer than the host
    candidate = Runner.spawn(RunnerSetup(module=job.candidate, cls="ModelNew", device=job.device, threads=threads,
                                         sealed_processes=job.device == "cpu"))
    runners = [Runner.spawn(RunnerSetup(module=job.reference, cls="Model", device=job.device, threads=threads)),
               candidate]
    facts = Facts()
    rng = random.Random(secrets.randbits(64))
    try:
        state_dict = torch.load(job.state_dict)
        drawn = [list(s) for s in torch.load(job.inputs)]
        copies = [[_clones(s) for s in drawn] for _ in runners]  # each runner's inputs, as the harness tracks them
        for who, r in zip(("reference", "candidate"), runners, strict=True):
            reply = r.ask(LoadRequest(models=[(job.init_args, state_dict)] * job.copies, init_seed=0))
            if reply.error is not None:
                return JobFailure(error=f"{who}: {reply.error[:500]}", stage="run")
            if r is candidate:
                facts.tamper += _after_load(r, runners, job.device == "cpu")
            r.ask(StageRequest(sets=drawn))

        def timed(i: int, k: int, poisoned: bool = False) -> float:
            sets = copies[i]
            changes = _perturbation(sets[k % len(sets)], rng)
            for index, flat, value in changes:
                _set_element(sets[k % len(sets)][index], flat, value)
            reply = runners[i].ask(TimedCallRequest(set=k % len(sets), model=k % job.copies, perturb=changes,
                                                    poison=poisoned))
            if reply.error is not None or reply.us is None:
                raise RunnerDied(f"{'candidate' if i else 'reference'}: {(reply.error or 'no time came back')[:300]}")
            return reply.us

        for i in (0, 1):  # every copy called once first: a kernel packs or caches per module on its first call, as
            for k in range(max(3, job.copies)):  # a model's does before it serves; timed, that is noise and a bias
                timed(i, k)
        iters = max(1, min(200, int(job.round_seconds * 1e6 / max(timed(0, 0), 1.0))))
        times: list[list[float]] = [[], []]
        means: list[list[float]] = [[], []]
        checked = []
        calls = 0
        for r in range(job.rounds):
            picks = set(rng.sample(range(iters), min(CHECKS_PER_ROUND, iters)))
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):  # alternate who goes first: drift hits both alike
                time.sleep(SWITCH_GAP_S * rng.uniform(1.0, 2.0))
                if i == 0:
                    candidate.ask(IdleRequest(start=True))
                counted = []
                for k, (poisoned, gap) in enumerate(_disturbances(iters, rng)):
                    calls += 1
                    if gap:
                        time.sleep(gap)
                    us = timed(i, calls, poisoned)
                    if not (poisoned or gap):
                        counted.append(us)
                    if i == 1 and k in picks:  # decided before the round, asked only after the call returned
                        reply = runners[1].ask(FetchRequest())
                        _facts(reply, f"timed call {calls}", facts)
                        checked.append(CheckedCall(inputs=_clones(copies[1][calls % len(drawn)]),
                                                   out=_decoded(reply.out)))
                times[i].append(statistics.median(counted))  # a stall of the host's (a 4 ms tick) is no call's
                means[i].append(statistics.fmean(counted))  # what a slow call in every few costs (bench.py)
                if i == 0:
                    _facts(candidate.ask(IdleRequest(start=False)), f"while the reference was timed (round {r + 1})",
                           facts)
        final = runners[1].ask(FinalRequest())
        _facts(final, "end of benchmark", facts)
    except RunnerDied as exc:
        return JobFailure(error=str(exc), stage="run")
    finally:
        for r in runners:
            r.close()
    torch.save(BenchOutputs(checked=checked).model_dump(), "outputs.pt")
    return BenchResult(reference_us=times[0], candidate_us=times[1], reference_mean_us=means[0],
                       candidate_mean_us=means[1], iters=iters, facts=facts)


def _sanitize(job: SanitizeJob) -> Done:
    """One call on the main case, for a sanitizer to watch: compute-sanitizer on a GPU (the parent wraps this process
    in it), AddressSanitizer on a CPU (the parent preloads its runtime; the candidate's C++ loads its ASan build)."""
    plan = SentPlan.model_validate(torch.load(job.plan))
    model = _build(_load(job.candidate, "ModelNew"), plan.init_args[0], torch.load(job.state_dicts[0]),
                   job.init_seed, []).to(job.device)
    with torch.inference_mode():
        model(*_to(plan.cases[0].inputs, job.device))
        if job.device == "cuda":
            torch.cuda.synchronize()
    return Done()


def _build_gate(job: BuildJob) -> Builds:
    """The compile gate for a CPU host (compile_gate): one call on the main case in Triton's interpreter, each kernel
    launched compiled for the target. A job of its own, in this process: Triton's compiler runs ptxas (a program),
    which a verified CPU runner's process filter refuses once its candidate has loaded."""
    from kernelbot.agent.verify import triton_check  # imported here, as by runners: it imports Triton

    triton_check.install(None)
    plan = SentPlan.model_validate(torch.load(job.plan))
    model = _build(_load(job.candidate, "ModelNew"), plan.init_args[0], torch.load(job.state_dicts[0]),
                   job.init_seed, [])
    with torch.inference_mode():
        model(*plan.cases[0].inputs)
    return Builds(builds=[KernelBuild.model_validate(b) for b in triton_check.REPORT.builds][:MAX_BUILDS])


def _run(job: VerifyJob | SanitizeJob | BenchJob | BuildJob | NoopJob
         ) -> VerifyResult | BenchResult | Done | Builds | JobFailure:
    if isinstance(job, VerifyJob):
        return _verify(job)
    if isinstance(job, BenchJob):
        return _bench(job)
    if isinstance(job, SanitizeJob):
        return _sanitize(job)
    if isinstance(job, BuildJob):
        return _build_gate(job)
    return Done()


def main() -> None:
    # The harness's own tensor work stays on this thread: an OpenMP pool of its own would spin on a core after each
    # parallel op (and runners forked from it would inherit the pool's state), taking the core a timed call needs.
    # On 2 cores that made a 60 µs op time at 2.4 ms. Runners restore the host's thread count (RunnerSetup.threads).
    torch.set_num_threads(1)
    # a process a runner started and left is reparented here (its parent gone), where _strays finds it
    confine_mod.libc.prctl(confine_mod.PR_SET_CHILD_SUBREAPER, 1)
    job = JOB.validate_json(Path(sys.argv[1]).read_bytes())
    forks = isinstance(job, (VerifyJob, BenchJob))
    # a harness that forks runners leaves the audit hook to them: it runs no candidate code itself
    gpu = isinstance(job, (VerifyJob, SanitizeJob, BenchJob)) and job.device == "cuda"
    protections = confine(Path.cwd(), audit=not forks, gpu=gpu)  # before any candidate code is imported
    (Path.cwd() / WORK).mkdir(exist_ok=True)
    # Nothing may touch CUDA before a fork: a forked child of a process that queried the device count cannot
    # initialise CUDA ("Cannot re-initialize CUDA in forked subprocess"), and importing torch.utils.cpp_extension
    # queries it on a CUDA build. Runners install the check themselves; a job that forks none installs it here.
    if not forks:
        cuda_check.install(Path.cwd() / WORK)
    result: VerifyResult | BenchResult | Done | Builds | JobFailure
    try:
        result = _run(job)
    except NeedsGPU as exc:
        result = JobFailure(error=str(exc), stage="needs_gpu")
    except Exception as exc:  # the candidate's failure is a result, reported to the parent
        message = str(exc) if isinstance(exc, LoadError) else f"{type(exc).__name__}: {exc}"
        result = JobFailure(error=message.strip()[:1500], stage="compile" if isinstance(exc, LoadError) else "run",
                            traceback=disguise.readable(traceback.format_exc())[-3000:])
    if "ptxas" not in result.model_fields_set:  # the harness's own builds (a sanitize job loads the candidate here)
        result.ptxas = [PtxasReport.model_validate(r) for r in cuda_check.REPORTS]
    result.protections = protections + result.protections
    Path("result.json").write_text(result.model_dump_json())


if __name__ == "__main__":
    main()
