"""The in-box harness (started by the sandbox as `python -m kernelbot.agent.verify.harness job.json`): a harness
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
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import random
import secrets
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import torch
from pydantic import BaseModel

from kernelbot.agent.verify import cuda_check, messages, probes, provenance, sampling
from kernelbot.agent.verify.cuda_check import NeedsGPU
from kernelbot.agent.verify.messages import (
    EVENTS,
    FACT_KINDS,
    JOB,
    MAX_BUILDS,
    REQUEST,
    REQUEST_TYPES,
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
    Message,
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
from kernelbot.engine import device as device_mod
from kernelbot.engine.device import DeviceChoice, Stopwatch, timed_call
from kernelbot.loading import load_module
from kernelbot.paths import cache_dir
from kernelbot.records import KernelBuild
from kernelbot.sandbox import confine as confine_mod
from kernelbot.sandbox import landlock, seccomp
from kernelbot.sandbox.confine import AUDIT_LOST, Recorder, confine, lost_records

# Bound before any candidate code runs: replacing these later does not reach the harness or the runner loop.
_sleep = time.sleep
_process_ns = time.process_time_ns
_cuda_synchronize = torch.cuda.synchronize
_Tensor = torch.Tensor
_T = torch._C.TensorBase
_detach, _cpu, _contiguous, _copy, _reshape, _view = _T.detach, _T.cpu, _T.contiguous, _T.copy_, _T.reshape, _T.view
_numpy, _untyped_storage, _set, _empty = _T.numpy, _T.untyped_storage, _T.set_, torch.empty
_empty_strided, _as_strided, _to_device = torch.empty_strided, _T.as_strided, _T.to
_dumps, _sha256, _write, _read = pickle.dumps, hashlib.sha256, os.write, os.read
_leaves = messages.output_leaves
WORK = "tmp"  # the runner's only writable directory, inside the box
_PROTECTIONS: list[str] = []  # the runner's own, reported with its first reply
HOST_THREADS = torch.get_num_threads()  # read at import, before main() makes the harness single-threaded
# The thread-count runs: one thread, and this many times the host's (partial sums with slots for "enough" threads)
THREAD_FACTOR = 4
# The fresh values' call repeated while processes of the harness's own load the cores, each busy for LOAD_BURST_S and
# asleep as long (their wake-ups take the runner's threads off their cores at any point of their work: a publication
# race wrong once in thousands of quiet calls shows within hundreds), for CONTENTION_S or CONTENTION_CALLS calls
CONTENTION_S = 0.2
CONTENTION_CALLS = 4000
LOAD_BURST_S = 5e-5
REPEAT_KEPT = 2  # outputs of repeated calls that differed from the first, sent back to be judged
CHECKS_PER_ROUND = 4  # timed candidate calls per round whose outputs go back to be checked
# CPU a candidate's own threads may use while no call runs: in the second half of the settle window after a call
# (an OpenMP pool spins a few milliseconds after its last parallel region, then sleeps), and over the whole job
SPIN_NS = 2_000_000
HELD_BYTES = 64 << 20  # outputs of the profiled calls the runner holds to the end of the job
CHECKED_SAMPLED = 3  # the sampled calls whose outputs go back to be checked (picked once all ran)
OUTSIDE_NS = 20_000_000
# Between one runner's turn and the other's: longer than an OpenMP pool spins after its last parallel region, so the
# idle runner's threads are asleep, not spinning on a core, while the other's calls are timed.
SWITCH_GAP_S = 0.02
SETTLE_S = VerifyJob.model_fields["settle_s"].default  # verification's pause after a call (jittered there): some
# benchmark calls get one before them
PERTURBED = 8  # elements of each float input a benchmark call changes before it runs
DISTURBED_EVERY = 8  # one benchmark call in this many is poisoned or paused before, and not timed
# Classes whose every attribute the seal covers: a method added or replaced on a tensor changes every tensor, and one
# on a request's class changes what the runner reads out of every request; the audit recorder's, its fields too.
SEALED_CLASSES = (torch.Tensor, torch.UntypedStorage, BaseModel, Message, Request, *REQUEST_TYPES, Recorder)


class LoadError(Exception):
    """The candidate did not import, build or construct: reported as the `compile` check."""


class RunnerDied(Exception):
    """The runner ended, or its messages could not be read, in the middle of a request."""


# ---------------------------------------------------------------- framing (both sides)

def _send(fd: int, payload: bytes) -> None:
    data = len(payload).to_bytes(8, "little") + payload
    view = memoryview(data)
    while view:
        view = view[_write(fd, view):]


def _recv(fd: int) -> bytes:
    header = _read_exactly(fd, 8)
    return _read_exactly(fd, int.from_bytes(header, "little"))


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = _read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _PlainUnpickler(pickle.Unpickler):
    """What a runner sends is plain data: no class may be looked up, so no code of its runs here."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"refused {module}.{name}: runners send plain data only")


def _plain_loads(data: bytes) -> Any:
    return _PlainUnpickler(io.BytesIO(data)).load()


# ---------------------------------------------------------------- tensors as plain data

def _encode(t: torch.Tensor, whole_storage: bool = False) -> tuple:
    """A plain tensor as plain data: ("T", dtype, shape, stride, offset, bytes). With `whole_storage`, every byte
    of its storage (guard regions around an input included); else a contiguous copy of its values."""
    if whole_storage:
        c = _on(_detach(t), "cpu")
        raw = _numpy(_set(_empty(0, dtype=torch.uint8), _untyped_storage(c))).tobytes()
        return ("T", str(t.dtype).removeprefix("torch."), tuple(t.shape), tuple(c.stride()), c.storage_offset(), raw)
    c = _contiguous(_cpu(_detach(t)))
    raw = _numpy(_view(_reshape(c, (-1,)), torch.uint8)).tobytes() if c.numel() else b""
    return ("T", str(t.dtype).removeprefix("torch."), tuple(t.shape), tuple(c.stride()), 0, raw)


def _decode(item: Any) -> Any:
    if not (isinstance(item, tuple) and len(item) == 6 and item[0] == "T"):
        return item
    _, dtype_name, shape, stride, offset, raw = item
    dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(dtype, torch.dtype):
        raise RunnerDied(f"unknown dtype {str(dtype_name)[:40]!r} in a runner's reply")
    storage = torch.frombuffer(bytearray(raw), dtype=torch.uint8).untyped_storage() if raw else \
        torch.empty(0, dtype=torch.uint8).untyped_storage()
    return torch.empty(0, dtype=dtype).set_(storage, int(offset), tuple(shape), tuple(stride))


def _outputs(value: Any, facts: dict[str, list[str]]) -> tuple[list[Any], list[Any]]:
    """(encoded outputs, the output objects): containers opened as messages.output_leaves does (through the base
    types' own methods), plain tensors copied at once, numbers kept, anything else refused (a tensor subclass is not
    touched, so nothing lazy of it runs)."""
    items = _leaves(value)
    encoded = []
    for o in items:
        if type(o) is _Tensor:
            encoded.append(_encode(o))
        elif isinstance(o, torch.Tensor):
            facts["subclass"].append(f"returned a {type(o).__module__}.{type(o).__qualname__}")
            encoded.append(None)
        elif o is None or type(o) in (int, float, bool):
            encoded.append(o)
        else:
            facts["subclass"].append(f"returned a {type(o).__qualname__} (only tensors and numbers are outputs)")
            encoded.append(None)
    return encoded, items


# ---------------------------------------------------------------- the harness's handle on a runner

@dataclass
class RunnerSetup:
    module: str  # path of the module the runner imports
    cls: str  # Model or ModelNew
    device: str = "cpu"
    triton: bool = False
    poison: bool = False  # CPU allocations filled with a pattern from the start (verification; a benchmark poisons
    # single untimed calls)
    settle_s: float = SETTLE_S
    threads: int = field(default_factory=lambda: HOST_THREADS)  # torch's intra-op threads, as a real process has
    # no new process, exec, ptrace or other process's memory once the candidate loaded (seccomp.py): a candidate's
    # runner on a CPU (on a GPU, Triton compiles at its first launch with programs of its own)
    sealed_processes: bool = False
    foreign: frozenset[str] = frozenset()  # installed libraries' identities: a copy of one is not the candidate's own


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
                _serve(setup, down_r, up_w)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(down_r)
        os.close(up_w)
        return cls(pid, down_w, up_r)

    def ask(self, request: Request) -> Reply:
        """Send one request; collect the events that arrive before its reply; return the reply. What the runner sends
        is read as plain data and must fit the messages' models, or the runner is taken to have tampered."""
        self.seq += 1
        request.seq = self.seq
        try:
            _send(self.to_runner, pickle.dumps(request.model_dump()))
            while True:
                message = _plain_loads(_recv(self.from_runner))
                if not isinstance(message, tuple) or not message:
                    raise RunnerDied("sent a malformed message (tampering with the harness's channel)")
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

    def close(self) -> str | None:
        """End the runner; how it ended when that was not our doing."""
        ended = None
        try:
            for _ in range(50):  # a runner that just died may not have been reaped yet
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    break
                time.sleep(0.01)
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


# ---------------------------------------------------------------- the runner

# Made in the runner (_warm_up), never in the harness: a parallel op there before forking leaves the runners an
# OpenMP pool that does not exist. Large enough that summing it is a parallel region on any thread count.
_WAKE: list[torch.Tensor] = []


def _wake_threads() -> None:
    """Just before a timed CPU call: one parallel region, so the OpenMP pool's threads are awake and spinning when
    the clock starts, as they are between the ops of a forward pass. After the harness's round trip they may have
    gone to sleep, and waking them inside the timed call charged every op with it (50 µs ops timed at 190 µs)."""
    _WAKE[0].sum()


def _warm_up(device: str, threads: int) -> None:
    """Start torch's thread pool, CUDA and the profiler now, so the threads a candidate starts are told apart
    from theirs. The pool is started one larger than the host's threads (started at THREAD_FACTOR times as many, its
    idle threads spun past the settle window's allowance after calls: in 2 of 8 verifications of a plain PyTorch
    candidate, none of 8 so). On a GPU, what the harness does there later (copies both ways, events, a profiled CUDA
    op) is done once first: the driver and the profiler may start threads of their own at the first of each."""
    _WAKE.append(torch.ones(1 << 17))
    for count in (threads + 1, threads):  # the harness runs single-threaded (main); a runner has the host's threads
        torch.set_num_threads(count)
        torch.ones(1 << 20).sum()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        (torch.ones(1 << 10).to("cuda") * 2).cpu()
        end.record()
        _cuda_synchronize()
    probes.measure_work(torch.zeros(1, device="cuda").sum if device == "cuda" else (lambda: None), all_threads=True)


def _sealed_attributes(triton: bool) -> dict[str, tuple[Any, str]]:
    import ctypes

    from kernelbot.agent.verify import triton_check

    attributes = {**{name: pair for name, pair in probes._TIMING.items()},
                  "ctypes.CDLL.__init__": (ctypes.CDLL, "__init__"), "sys.setprofile": (sys, "setprofile")}
    return {**attributes, **(triton_check.sealed_attributes() if triton else {})}


def _to(xs: list[Any], device: str) -> list[Any]:
    return [_on(x, device) if isinstance(x, torch.Tensor) else x for x in xs]


def _on(t: torch.Tensor, device: str) -> torch.Tensor:
    """`t` on `device` in the same layout with its whole storage: guard regions around an input and a strided view's
    gaps go along, so writes a kernel makes there on a GPU are seen as on a CPU (`Tensor.to` copies the elements
    alone)."""
    if t.device.type == torch.device(device).type:
        return t
    item, nbytes = t.element_size(), _untyped_storage(t).nbytes()
    if nbytes % item:
        return _to_device(t, device)
    flat = _set(_empty(0, dtype=t.dtype, device=t.device), _untyped_storage(t), 0, (nbytes // item,), (1,))
    return _as_strided(_to_device(flat, device), t.shape, t.stride(), t.storage_offset())


def _clones(xs: list[Any]) -> list[Any]:
    """Copies in the same layout (strides): a second run on a transposed or strided input sees one again."""
    return [_copy(_empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device), x)
            if isinstance(x, torch.Tensor) else x for x in xs]


def _build(model_cls: type, init_args: list[Any], state_dict: dict[str, Any], init_seed: int,
           unloadable: list[str]) -> torch.nn.Module:
    try:
        torch.manual_seed(init_seed)  # KernelBench's convention, for candidates whose parameters are named differently
        model = model_cls(*init_args)
        try:
            model.load_state_dict(state_dict, strict=True)
        except RuntimeError as exc:
            unloadable.append(f"reference weights not loadable ({str(exc).splitlines()[0][:200]}); "
                         "the candidate keeps its own seeded initialisation")
    except NeedsGPU:
        raise
    except Exception as exc:
        raise LoadError(f"{type(exc).__name__}: {exc}") from exc
    return model.eval()


def _load(path: str, cls: str) -> type:
    try:
        return getattr(load_module(path, f"kb_{cls.lower()}"), cls)
    except NeedsGPU:
        raise
    except Exception as exc:
        raise LoadError(f"{type(exc).__name__}: {exc}") from exc


class Tools(NamedTuple):
    """Everything the runner's loop and its helpers call, bound before the candidate is imported: an immutable
    tuple, so replacing a module's function afterwards does not reach them (and the seal reports it), and
    each function's code is checked before every request, so swapping its code is caught before it runs."""
    send: Callable[[int, bytes], None]
    recv: Callable[[int], bytes]
    dumps: Callable[..., bytes]
    loads: Callable[[bytes], Any]
    encode: Callable[..., tuple]
    outputs_of: Callable[..., tuple[list[Any], list[Any]]]
    os_threads: Callable[[], dict[int, int]]
    aliasing: Callable[..., list[str]]
    spans: Callable[[list[Any]], list[tuple[int, int]]]
    weight_snapshot: Callable[[torch.nn.Module], tuple]
    weight_changes: Callable[..., list[str]]
    profile_call: Callable[..., dict[str, Any]]
    set_order: Callable[..., None]
    order_dependent: Callable[[], frozenset[str]]
    seal: Callable[..., tuple]
    seal_changes: Callable[..., list[str]]
    timing_snapshot: Callable[[], dict[str, int]]
    parse_request: Callable[[Any], Request]  # pydantic-core's compiled validator: no Python of it to replace
    timing_changes: Callable[[dict[str, int]], list[str]]
    timed_call: Callable[..., tuple[float, Any]]
    stopwatch: Callable[[], Stopwatch]  # device events on a GPU, perf_counter_ns on a CPU (bound before the load)
    flush: Callable[[], None] | None  # writes a buffer twice the GPU's L2 before each timed call; None on a CPU
    sleep: Callable[[float], None]
    cuda_sync: Callable[[], None]
    wake_threads: Callable[[], None]
    sha256: Callable[[bytes], Any]
    clones: Callable[[list[Any]], list[Any]]
    to: Callable[[list[Any], str], list[Any]]
    refill: Callable[..., list[Any]]
    threads_after: Callable[..., list[str]]
    reweight: Callable[..., None]
    cpu_since: Callable[..., tuple[int, tuple]]
    op_load: Callable[..., tuple]
    op_call: Callable[..., tuple]
    op_timed_call: Callable[..., tuple]
    op_final: Callable[..., None]
    tampered: Callable[..., list[str]]
    op_profile: Callable[..., tuple[dict[str, Any], list[list[Any]], tuple]]
    op_repeat: Callable[..., tuple[dict[str, Any], tuple]]
    same_bytes: Callable[[torch.Tensor, torch.Tensor], bool]
    clock: Callable[[], float]
    audit_channel: Callable[[], tuple[int, int] | None]
    sampled_calls: Callable[..., dict[str, Any]]
    windows: Callable[[], tuple]
    set_threads: Callable[[int], None]
    leaves: Callable[[Any], list[Any]]
    poison: Callable[[bool], bool]  # CPU allocations poisoned from now on, or not
    randbelow: Callable[[int], int]  # the OS's randomness: a candidate cannot seed it


class Watch(NamedTuple):
    """The runner's fixed observations: set once before the candidate loads (a tuple: nothing can be rebound)."""
    setup: RunnerSetup
    tools: Tools
    codes: tuple  # (function, its code) for every function in tools
    known_threads: frozenset[int]  # torch's, the profiler's (and CUDA's): not the candidate's
    modules: tuple
    attributes: dict[str, tuple[Any, str]]
    classes: tuple[type, ...]
    snapshot: tuple
    timers: dict[str, int]
    phase: list[Any]  # the program order the loop asked for, the kernels it pinned: launches report what they ran
    audit: tuple[int, int] | None  # the audit channel's (device, inode) when the candidate loaded
    places: probes.Places  # (the candidate's own code, torch's generated code, installed libraries): _places

def _violation(kind: str, detail: str) -> str:
    """A violation the harness itself saw (the runner can neither mute nor forge it), recorded for the parent."""
    if confine_mod.RECORDER is not None:
        confine_mod.RECORDER(kind, detail)
    return detail


def _no_channel() -> None:
    return None


def _tampered(watch: Watch) -> list[str]:
    """Code swapped in a bound tool, the audit channel closed or replaced, or anything the seal covers replaced
    since the candidate loaded."""
    swapped = [f"{getattr(fn, '__name__', '?')}.__code__ was replaced" for fn, code in watch.codes
               if fn.__code__ is not code]
    if watch.tools.audit_channel() != watch.audit:
        swapped.append("the sandbox's audit channel was closed or replaced (its records could not reach the parent)")
    return swapped or watch.tools.seal_changes(watch.snapshot, watch.tools.seal(watch.modules, watch.attributes,
                                                                                  watch.classes))


def _serve(setup: RunnerSetup, rfd: int, wfd: int) -> None:
    """The runner: confine, instrument, then answer the harness's requests until it closes the channel. Its
    state lives in this frame's locals, as immutable tuples (a candidate cannot rebind them).

    Requests arrive as plain data and become typed requests through pydantic-core's compiled validator, bound
    before the candidate loaded, after the seal was read (a class of theirs changed is reported before any field
    is read). Replies and facts stay plain dicts and lists keyed by the messages' field names: what leaves the
    runner must not pass through code the candidate could replace in its own process (a method of a class can be
    replaced, dict's cannot); the harness validates each reply into a Reply."""
    watch = _prepare(setup, wfd)
    tools = watch.tools
    tampered = tools.tampered
    models: tuple = ()
    weights: tuple = ()
    held: tuple = ()  # every output returned so far: (objects, digests of their bytes, byte ranges)
    slots: tuple = ()  # (name, tensors) kept for calls on the same tensor objects
    loaded: tuple = ()  # the state dict each model was loaded with
    staged: tuple = ()  # bench: input sets
    last: Any = None  # bench: the last timed call's outputs
    quiet = tools.cpu_since(None, watch.known_threads)  # (CPU the candidate's threads used outside calls, mark)
    windows = 0  # each request's gap after it is a window where no call runs (a timed call's is allowed for there)
    while True:
        try:
            data = tools.loads(tools.recv(rfd))
        except EOFError:
            return
        reply: dict[str, Any] = {}
        facts: dict[str, list[str]] = {k: [] for k in FACT_KINDS}
        facts["tamper"] += tampered(watch)
        request = tools.parse_request(data)
        op = request.op
        windows += op not in ("tcall", "fetch", "idle")
        try:
            if op == "load":
                reply, models = tools.op_load(setup, request, facts)
                loaded = tuple(sd for _, sd in request.models)
                weights = tuple(tools.weight_snapshot(m) for m in models)
                quiet = tools.cpu_since(None, watch.known_threads)  # what loading took is no call's business
            elif op in ("case", "refill"):
                if op == "case":
                    sent = tools.to(request.inputs, setup.device)
                    slots = (*slots, (request.keep, sent)) if request.keep else slots
                    extras = (request.again, request.orders, request.order_seed, request.inputs_after, True)
                else:
                    sent = tools.refill(dict(slots)[request.slot], request.values, setup.device)
                    extras = (False, False, 0, False, request.poison)
                reply, held, quiet = tools.op_call(watch, models[request.model], sent, extras, held,
                                                   weights[request.model], facts, quiet)
            elif op == "reweight":
                tools.reweight(models[request.model], request.state_dict, request.names, request.buffer_names,
                               loaded[request.model])
                weights = tuple(tools.weight_snapshot(m) for m in models)
            elif op in ("profile", "repeat"):  # its calls are calls: the CPU they use is no work between calls
                outside = quiet[0] + tools.cpu_since(quiet[1], watch.known_threads)[0]
                inputs = tools.to(request.inputs, setup.device)
                if op == "profile":
                    reply["profile"], reply["later"], held = tools.op_profile(watch, models[request.model], inputs,
                                                                              held, facts)
                else:
                    reply, held = tools.op_repeat(watch, models[request.model], inputs, request, held, facts)
                quiet = (outside, tools.cpu_since(None, watch.known_threads)[1])
                facts["tamper"] += tampered(watch)
            elif op == "stage":
                staged = tuple(tuple(tools.to(s, setup.device)) for s in request.sets)
            elif op == "tcall":  # between its own timed calls an OpenMP pool may spin: only its own times pay
                reply["us"], last = tools.op_timed_call(watch, models[request.model], staged[request.set],
                                                        request.perturb, request.poison)
                quiet = (quiet[0], tools.cpu_since(None, watch.known_threads)[1])
            elif op == "idle":  # the reference's turn, after a pause longer than a pool spins: no work may run
                used, mark = tools.cpu_since(quiet[1], watch.known_threads)
                quiet = (quiet[0] + (0 if request.start else max(0, used - SPIN_NS)), mark)
            elif op == "fetch":  # held to the end of the job, as a verified call's outputs are
                reply["out"], held = _held_call(tools, last, [], held, facts)
            elif op == "final":
                tools.op_final(watch, held, quiet, facts, windows)
                reply["ptxas"] = cuda_check.REPORTS
        except LoadError as exc:
            reply = {"error": str(exc)[:1500], "stage": "compile", "ptxas": cuda_check.REPORTS}
        except NeedsGPU as exc:
            reply = {"error": str(exc)[:1500], "stage": "needs_gpu", "ptxas": cuda_check.REPORTS}
        except Exception as exc:
            reply = {**reply, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        facts["tamper"] += tampered(watch)
        facts["timing"] += tools.timing_changes(watch.timers)
        reply["facts"] = facts
        tools.send(wfd, tools.dumps(("reply", request.seq, reply)))


def _prepare(setup: RunnerSetup, wfd: int) -> Watch:
    """Before the candidate loads: start torch's threads, bind the tools, instrument, confine, seal, poison."""
    from kernelbot.agent.verify import triton_check

    work = Path.cwd() / WORK
    os.chdir(work)
    _warm_up(setup.device, setup.threads)
    cuda_check.install(work)  # here, after the fork: importing torch's extension tools queries CUDA
    device = DeviceChoice(kind="cuda" if setup.device == "cuda" else "cpu", name=setup.device, reason="runner")
    tools = Tools(
        send=_send, recv=_recv, dumps=pickle.dumps, loads=pickle.loads, encode=_encode, outputs_of=_outputs,
        os_threads=probes.os_threads, aliasing=probes.aliasing, spans=probes.spans,
        weight_snapshot=probes.weight_snapshot, weight_changes=probes.weight_changes, profile_call=probes.profile_call,
        set_order=triton_check.set_order, order_dependent=triton_check.order_dependent, seal=probes.seal,
        seal_changes=probes.seal_changes, timing_snapshot=probes.timing_snapshot,
        parse_request=REQUEST.validator.validate_python, timing_changes=probes.timing_changes,
        timed_call=timed_call, stopwatch=device.stopwatch, flush=device.l2_flusher(),
        sleep=_sleep, cuda_sync=_cuda_synchronize, wake_threads=_wake_threads, sha256=_sha256, clones=_clones, to=_to,
        refill=_refill, threads_after=_threads_after, reweight=_reweight, cpu_since=_cpu_since, op_load=_op_load,
        op_call=_op_call, op_timed_call=_op_timed_call, op_final=_op_final, tampered=_tampered, op_profile=_op_profile,
        op_repeat=_op_repeat, same_bytes=probes.same_bytes, clock=time.perf_counter,
        audit_channel=confine_mod.RECORDER.channel if confine_mod.RECORDER else _no_channel,
        sampled_calls=sampling.sampled_calls, windows=triton_check.recent_windows, set_threads=torch.set_num_threads,
        leaves=_leaves, poison=probes.poison_allocations, randbelow=secrets.randbelow)
    codes = tuple((fn, fn.__code__) for fn in tools if hasattr(fn, "__code__"))
    places = (*_places(setup.module, work), setup.foreign)
    probes.install(places)
    phase: list[Any] = ["natural", frozenset()]  # the order asked for, and the kernels kept in natural order

    def sink(kind: str, data: dict[str, Any]) -> None:
        asked = "natural" if data.get("kernel") in phase[1] else phase[0]
        extra = {"phase": phase[0]} if kind == "triton_launch" else {}
        tools.send(wfd, tools.dumps(("event", kind, {**data, "asked": asked, **extra})))

    if setup.triton:
        triton_check.install(sink)
    known = frozenset(tools.os_threads())
    module = Path(setup.module)
    modules = (sys.modules[__name__], probes, confine_mod, landlock, seccomp, cuda_check, messages, sampling,
               provenance, device_mod) + ((triton_check,) if setup.triton else ())
    # the harness's own code, from its loop on: it alone may set a profile function (profile_call's native-call counter)
    protections = confine_mod.confine_runner(work, [module, module.parent / "__pycache__"],
                                             confine_mod.harness_code(modules, _serve.__code__),
                                             gpu=setup.device == "cuda")
    attributes = _sealed_attributes(setup.triton)
    timers = tools.timing_snapshot()
    if setup.poison and setup.device == "cpu":
        probes.poison_allocations()
    elif setup.poison:  # CUDA memory is not malloc's: torch fills fresh allocations with NaN instead
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True
    _PROTECTIONS[:] = protections
    watch = Watch(setup, tools, codes, known, modules, attributes, SEALED_CLASSES,
                  tools.seal(modules, attributes, SEALED_CLASSES), timers, phase, tools.audit_channel(), places)
    # before the candidate loads: what the harness reads in this process's memory after every reply
    tools.send(wfd, tools.dumps(("event", "memory_pins", {"pins": probes.pins([tools, watch, codes])})))
    return watch


def _places(module: str, work: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(where code the candidate built lives: its box, the kernel library's build cache, its module's folder; where
    torch.compile's generated code lives, inside the box), as real-path prefixes for sampling.places."""
    own = [work.parent, Path(module).resolve().parent, cache_dir()]  # the library's builds load from the cache
    generated = [Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or work / "torchinductor")]
    prefix = lambda paths: tuple(os.path.realpath(p) + os.sep for p in paths)  # noqa: E731
    return prefix(own), prefix(generated) + (os.path.join(os.path.realpath(work), "torchinductor_"),)


def _refill(sent: list[Any], values: list[Any], device: str) -> list[Any]:
    """New contents in the same tensors, through .data: same pointers, ids and version counters."""
    with torch.no_grad():
        for x, v in zip(sent, values, strict=True):
            if isinstance(x, torch.Tensor):
                x.data.copy_(v.to(device))
    return sent


def _op_call(watch: Watch, model: torch.nn.Module, sent: list[Any], extras: tuple[bool, bool, int, bool],
             held: tuple, weights: tuple, facts: dict[str, list[str]], quiet: tuple[int, tuple]
             ) -> tuple[dict[str, Any], tuple, tuple[int, tuple]]:
    """One verified call: outputs copied at once, then aliasing, late writes, work left running, a second run
    on copies, other program orders, the inputs and weights afterwards. Everything after the call goes through
    the bound tools, and the seal is read right after it (before a patch made during the call could undo
    itself). `extras`, read from the request before the call: (a second run, other program orders, their seed,
    the inputs afterwards, poisoned allocations). `quiet`: (CPU the candidate's threads used while no call ran,
    where that was last read), carried from call to call. Not poisoned: this call's allocations are as malloc
    gives them (a candidate that writes every element only while it sees poison is caught on such a call)."""
    tools, setup, reply = watch.tools, watch.setup, {}
    again, orders, order_seed, inputs_after, poisoned = extras
    used, _ = tools.cpu_since(quiet[1], watch.known_threads)
    outside = quiet[0] + used
    unpoison = setup.poison and not poisoned and setup.device == "cpu"
    with torch.inference_mode():
        try:
            if unpoison:
                tools.poison(False)
            out = model(*sent)
            if setup.device == "cuda":
                tools.cuda_sync()
        except Exception as exc:
            reply["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        finally:
            if unpoison:
                tools.poison(True)
        facts["tamper"] += tools.tampered(watch)
        if "error" not in reply:
            encoded, items = tools.outputs_of(out, facts)
            reply["out"] = encoded
            facts["aliasing"] += tools.aliasing(items, sent, [r for h in held for r in h[2]],
                                                [t for _, t, _ in weights])
            settle = setup.settle_s * (500 + tools.randbelow(1001)) / 1000  # no fixed gap a candidate could time
            tools.sleep(settle / 2)
            _, mark = tools.cpu_since(None, watch.known_threads)
            tools.sleep(settle / 2)
            working, _ = tools.cpu_since(mark, watch.known_threads)
            settled, _ = tools.outputs_of(out, {k: [] for k in FACT_KINDS})
            if any(a is not None and b is not None and a[5] != b[5] for a, b in zip(encoded, settled, strict=True)):
                facts["late"].append("the output kept changing after the call returned")
            held = (*held, _kept(tools, encoded, items))  # digests of the bytes as the call returned them
            facts["threads"] += tools.threads_after(working, "after the call returned", watch.known_threads)
            if again:
                copies = tools.clones(sent)
                reply["again"], held = _held_call(tools, model(*copies), copies, held, facts)
            # a candidate that launched no Triton kernel on a CPU has no program order: vary the thread count
            threaded = orders and setup.device == "cpu" and not tools.windows()
            if orders:
                reply["schedule"] = "thread count" if threaded else "program order"
            for order in ("reversed", "shuffled") if orders else ():
                # shuffled: kernels whose results depend on program order legitimately keep the natural one, so
                # that every other kernel must give the same bits (their float atomics excuse nothing else)
                pinned = tools.order_dependent() if order == "shuffled" else frozenset()
                if threaded:
                    tools.set_threads(1 if order == "reversed" else THREAD_FACTOR * setup.threads)
                else:
                    tools.set_order(order, seed=order_seed, pinned=pinned)
                    watch.phase[:] = [order, pinned]
                try:
                    copies = tools.clones(sent)
                    reply[order], held = _held_call(tools, model(*copies), copies, held, facts)
                finally:
                    tools.set_threads(setup.threads)
                    tools.set_order("natural")
                    watch.phase[:] = ["natural", frozenset()]
    if inputs_after:  # guard regions included (on CUDA too: the inputs went to the device with them, _on)
        reply["inputs_after"] = [tools.encode(x, True) if isinstance(x, torch.Tensor) else x for x in sent]
    facts["weights"] += tools.weight_changes(weights, model)
    return reply, held, (outside, tools.cpu_since(None, watch.known_threads)[1])


def _held_call(tools: Tools, out: Any, inputs: list[Any], held: tuple, facts: dict[str, list[str]]
               ) -> tuple[list[Any], tuple]:
    """A further call's outputs, encoded, checked for memory shared with its inputs or any output still held, and
    held too (to the end of the job): a candidate cycling through buffers is caught on the second run as on the
    first."""
    encoded, items = tools.outputs_of(out, facts)
    facts["aliasing"] += tools.aliasing(items, inputs, [r for h in held for r in h[2]])
    return encoded, (*held, _kept(tools, encoded, items))


def _kept(tools: Tools, encoded: list[Any], items: list[Any]) -> tuple:
    """What the runner holds of a call's outputs to the end of the job: the objects, digests of their encoded bytes
    (compared again when the job ends), the byte ranges their elements lie in."""
    return items, tuple(tools.sha256(e[5]).digest() if e else None for e in encoded), tuple(tools.spans(items))


def _op_timed_call(watch: Watch, model: torch.nn.Module, inputs: tuple, perturb: list[tuple[int, int, Any]],
                   poisoned: bool = False) -> tuple[float, Any]:
    """The benchmark's call: this call's change to the inputs (outside the clock), then the one timing protocol
    (engine/device.py's timed_call: on a GPU the L2 flush, then device events around the call), with the
    stopwatch bound before the candidate loaded. `poisoned`: CPU allocations poisoned, as in verification (the
    harness does not count this call's time: poison costs a fill per allocation)."""
    tools = watch.tools
    for index, flat, value in perturb:  # on a GPU a launch of its own, queued before the flush and the start mark
        _set_element(inputs[index], flat, value)
    poisoned = poisoned and watch.setup.device == "cpu"
    with torch.inference_mode():
        if watch.setup.device != "cuda":
            tools.wake_threads()
        if poisoned:
            tools.poison(True)
        try:
            return tools.timed_call(model, inputs, tools.stopwatch(), tools.flush)
        finally:
            if poisoned:
                tools.poison(False)


def _op_profile(watch: Watch, model: torch.nn.Module, inputs: list[Any], held: tuple, facts: dict[str, list[str]]
                ) -> tuple[dict[str, Any], list[list[Any]], tuple]:
    """The op log of one call, then (on a CPU) where the CPU time of more calls went, by the code it ran in. Those
    calls' outputs are held too, up to HELD_BYTES, and none may share memory with an output held before it: a
    candidate that cycles through more output buffers than a verification makes calls is caught reusing one. The
    profiled call's outputs and a few of the sampled calls', picked at random once all ran, go back encoded to be
    checked: a call made under the profiler or the sampler is a call like any other."""
    tools, kept = watch.tools, []
    room = [HELD_BYTES]

    def call() -> None:
        items = tools.leaves(model(*inputs))  # not encoded: that would be time in torch, counted as the candidate's
        size = sum(t.numel() * t.element_size() for t in items if isinstance(t, torch.Tensor))
        if size <= room[0]:
            room[0] -= size
            kept.append(items)

    with torch.inference_mode():
        # sampled first: the profiler leaves threads of its own busy after its call, CPU time no sample explains
        sampled = tools.sampled_calls(call, *watch.places, tools.windows) if watch.setup.device == "cpu" else {}
        profile = tools.profile_call(model, inputs, watch.places, tools.windows)
        profile.update(sampled)
    profiled = [tools.leaves(out) for out in profile.pop("outputs")]
    earlier = [r for h in held for r in h[2]]
    for items in kept + profiled:
        found = tools.aliasing(items, inputs, earlier)
        if found:
            facts["aliasing"].append(f"one of {len(kept) + len(profiled)} repeated calls: {found[0]}")
            break
        earlier += tools.spans(items)
    picked = {tools.randbelow(len(kept)) for _ in range(CHECKED_SAMPLED)} if kept else set()
    checked = [tools.outputs_of(items, facts) for items in profiled + [kept[k] for k in sorted(picked)]]
    unread = [items for k, items in enumerate(kept) if k not in picked]
    return profile, [encoded for encoded, _ in checked], (
        *held, *(_kept(tools, encoded, items) for encoded, items in checked),
        *((items, (), tuple(tools.spans(items))) for items in unread))


def _op_repeat(watch: Watch, model: torch.nn.Module, inputs: list[Any], request: RepeatRequest, held: tuple,
               facts: dict[str, list[str]]) -> tuple[dict[str, Any], tuple]:
    """The same call repeated (while the harness loads the cores), each time's outputs compared with the first call's
    byte for byte: the first call's and up to REPEAT_KEPT that differed go back to be judged. All are held to the end
    of the job (the others up to HELD_BYTES, as the profiled calls' are: a late write into one lands in memory still
    held, not in memory freed and handed out again), and none may share memory with an output held before or with
    the first."""
    tools = watch.tools
    seconds, calls = request.seconds, request.calls  # read before the first call
    earlier = [r for h in held for r in h[2]]
    kept: list[tuple[list[Any], list[Any]]] = []
    unread: list[list[Any]] = []
    room, made, differing = HELD_BYTES, 0, 0
    start = tools.clock()
    with torch.inference_mode():
        while made < calls and (made == 0 or tools.clock() - start < seconds):
            items = tools.leaves(model(*inputs))
            made += 1
            found = tools.aliasing(items, inputs, earlier)
            if found and not facts["aliasing"]:
                facts["aliasing"].append(f"one of {made} repeated calls: {found[0]}")
            if not kept:
                kept.append(tools.outputs_of(items, facts))
                earlier += tools.spans(items)
                continue
            first = kept[0][1]
            if len(items) != len(first) or not all(
                    tools.same_bytes(a, b) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) else
                    type(a) is type(b) and a == b for a, b in zip(items, first, strict=True)):
                differing += 1
                if len(kept) <= REPEAT_KEPT:
                    kept.append(tools.outputs_of(items, facts))
                    continue
            size = sum(t.numel() * t.element_size() for t in items if isinstance(t, torch.Tensor))
            if size <= room:
                room -= size
                unread.append(items)
    reply = {"repeated": [encoded for encoded, _ in kept], "repeat_calls": made, "repeat_differing": differing}
    return reply, (*held, *(_kept(tools, encoded, items) for encoded, items in kept),
                   *((items, (), tuple(tools.spans(items))) for items in unread))


def _op_final(watch: Watch, held: tuple, quiet: tuple[int, tuple], facts: dict[str, list[str]], windows: int
              ) -> None:
    """When the job ends: every output ever returned still holds its bytes; the candidate's threads (whenever they
    started, at import too) did not use the CPU while no call ran, beyond an OpenMP pool's spin after each call's
    last parallel region: libgomp ends pool threads when a team is smaller than the last and starts new ones when it
    grows (team sizes follow each call's shape, and the thread-count runs), so a C++ kernel's pool threads are not
    all known ones (a library GEMM's job counted 24 ms over its 40-odd gaps)."""
    tools = watch.tools
    tools.sleep(max(watch.setup.settle_s, 0.1))
    for items, digests, _ in held:
        if not digests:  # a profiled call's: held for its memory, its bytes never read
            continue
        now = tools.outputs_of(items, {k: [] for k in FACT_KINDS})[0]
        if any(d is not None and e is not None and tools.sha256(e[5]).digest() != d
               for d, e in zip(digests, now, strict=True)):
            facts["late"].append("an output changed after its call returned (found when the job ended)")
            break
    used, _ = tools.cpu_since(quiet[1], watch.known_threads)
    facts["threads"] += tools.threads_after(quiet[0] + used, "between its calls and after the last",
                                            watch.known_threads, OUTSIDE_NS + windows * SPIN_NS)


def _reweight(model: torch.nn.Module, new: dict[str, Any], names: list[str], buffer_names: list[str],
              loaded: dict[str, Any]) -> None:
    """New weights copied into the same parameters and buffers: by name; else, for those named otherwise, in
    registration order (parameters) and state-dict order (float buffers, where the new ones differ from those loaded),
    where the count, every shape and every value agree with the reference's loaded ones (its seeded initialisation
    matched the reference's, so the order does). Anything else cannot take new weights: an error, so the
    result_caching check fails instead of being skipped."""
    with torch.no_grad():
        try:
            model.load_state_dict(new, strict=True)
            return
        except RuntimeError:
            pass
        buffers = [b for b in model.buffers() if b.is_floating_point()]
        for kind, tensors, order in (("parameters", list(model.parameters()), names), ("buffers", buffers,
                                                                                        buffer_names)):
            if all(n in loaded and torch.equal(new[n], loaded[n]) for n in order):
                continue  # nothing of this kind changes
            if len(tensors) != len(order) or any(
                    n not in loaded or t.shape != loaded[n].shape or t.dtype != loaded[n].dtype or
                    not torch.equal(_detach(t).cpu(), loaded[n]) for t, n in zip(tensors, order, strict=False)):
                raise ValueError(f"its {kind} match the reference's neither by name nor in order (count, shapes and "
                                 "values), so new weights cannot be copied into them: name them as the reference does")
            for t, n in zip(tensors, order, strict=True):
                t.copy_(new[n].to(t.device))


def _op_load(setup: RunnerSetup, request: LoadRequest, facts: dict[str, list[str]]
             ) -> tuple[dict[str, Any], tuple[torch.nn.Module, ...]]:
    model_cls = _load(setup.module, setup.cls)
    models = tuple(_build(model_cls, init, sd, request.init_seed, facts["unloadable_weights"]).to(setup.device)
                   for init, sd in request.models)
    sealed = [seccomp.refuse_processes()] if setup.sealed_processes else []  # its builds are done: no more programs
    return {"ptxas": cuda_check.REPORTS, "protections": [*_PROTECTIONS, *sealed]}, models


def _cpu_since(mark: tuple[int, dict[int, int]] | None, known: frozenset[int]
               ) -> tuple[int, tuple[int, dict[int, int]]]:
    """(nanoseconds of CPU this process's threads other than `known` used since `mark` (the candidate's: native
    threads, and threads that ended meanwhile, included, since the process's own CPU clock counts them), a new
    mark). Without a mark, 0 and the mark."""
    now = (_process_ns(), {tid: ns for tid, ns in probes.os_threads().items() if tid in known})
    if mark is None:
        return 0, now
    harness = sum(ns - mark[1][tid] for tid, ns in now[1].items() if tid in mark[1])
    return max(0, now[0] - mark[0] - harness), now


def _threads_after(used_ns: int, when: str, known: frozenset[int], allowed_ns: int = SPIN_NS) -> list[str]:
    """A finding when threads the candidate started (OS threads, native ones included) used more CPU than
    `allowed_ns` while no call of it ran; it names those still alive, with the CPU each has used."""
    if used_ns <= allowed_ns:
        return []
    alive = ", ".join(f"{name} {ns / 1e6:.1f} ms" for name, ns in probes.thread_names(known))
    return [f"the candidate's threads used {used_ns / 1e6:.1f} ms of CPU {when} (OS threads, native ones "
            f"included): work goes on while no call runs{f' (alive: {alive})' if alive else ''}"]


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


def _decoded(values: list[Any] | None) -> list[Any]:
    return [_decode(v) for v in values] if values is not None else []


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
    reply = runner.ask(ProfileRequest(model=main, inputs=plan.fresh))
    _facts(reply, "profiled call", facts)
    profile = reply.profile if reply.profile is not None else \
        Profile(error=(reply.error or "no profile came back")[:500])
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


def _set_element(t: torch.Tensor, flat: int, value: Any) -> None:
    """Element `flat` (in row-major order) of `t` set to `value`, whatever its layout (a transposed input too)."""
    index = []
    for size in reversed(t.shape):
        flat, i = divmod(flat, size)
        index.append(i)
    t[tuple(reversed(index))] = value


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
    candidate = Runner.spawn(RunnerSetup(module=job.candidate, cls="ModelNew", device=job.device,
                                         sealed_processes=job.device == "cpu"))
    runners = [Runner.spawn(RunnerSetup(module=job.reference, cls="Model", device=job.device)), candidate]
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

        for i in (0, 1):
            for k in range(3):
                timed(i, k)
        iters = max(1, min(200, int(job.round_seconds * 1e6 / max(timed(0, 0), 1.0))))
        times: list[list[float]] = [[], []]
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
                times[i].append(statistics.fmean(counted))
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
    return BenchResult(reference_us=times[0], candidate_us=times[1], iters=iters, facts=facts)


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
                            traceback=traceback.format_exc()[-3000:])
    if "ptxas" not in result.model_fields_set:  # the harness's own builds (a sanitize job loads the candidate here)
        result.ptxas = [PtxasReport.model_validate(r) for r in cuda_check.REPORTS]
    result.protections = protections + result.protections
    Path("result.json").write_text(result.model_dump_json())


if __name__ == "__main__":
    main()
