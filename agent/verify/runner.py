"""The runner's side of the harness: what a process the harness forks (harness.Runner.spawn) does, the only code
that runs a candidate's. It starts torch's threads, binds everything it calls into immutable tuples (Tools, Watch)
before the candidate loads, confines itself further (confine.confine_runner: it reads only the system, Python,
kernelbot and the one module it loads, writes only box/tmp, and cannot signal or trace the harness), imports its
module and then answers the harness's requests one at a time (_serve): verified calls with what is observed around
them (aliasing, late writes, work left running, other program orders or thread counts, the inputs and weights
afterwards), the benchmark's timed calls, the op log and the calls the harness samples from outside (runner_calls.py),
repeated calls, and the checks when the job ends. After every request it compares a seal over the harness's modules
(this one, runner_channel, the harness's own, the messages' and the probes' included), so patching the harness is
reported, not obeyed; the harness reads its pinned state, and samples its calls, from outside its process.

Imports runner_channel (the messages' framing and encoding); harness.py imports this module, never the reverse.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import torch
from pydantic import BaseModel

from kernelbot.agent.verify import (
    clocks,
    cuda_check,
    disguise,
    messages,
    probes,
    provenance,
    runner_calls,
    runner_channel,
    sampling,
)
from kernelbot.agent.verify.cuda_check import NeedsGPU
from kernelbot.agent.verify.messages import (
    FACT_KINDS,
    REQUEST,
    REQUEST_TYPES,
    LoadRequest,
    Message,
    RepeatRequest,
    Request,
    VerifyJob,
)
from kernelbot.agent.verify.runner_calls import HELD_BYTES, NO_PASS, op_profile, op_sample
from kernelbot.agent.verify.runner_calls import kept as _kept
from kernelbot.agent.verify.runner_channel import _detach, _encode, _leaves, _on, _outputs, _recv, _send
from kernelbot.hardware import device as device_mod
from kernelbot.hardware.device import DeviceChoice, Stopwatch, timed_call
from kernelbot.loading import load_module
from kernelbot.paths import cache_dir
from kernelbot.sandbox import confine as confine_mod
from kernelbot.sandbox import landlock, seccomp
from kernelbot.sandbox.confine import Recorder

# Bound before any candidate code runs: replacing these later does not reach the harness or the runner loop.
_sleep = time.sleep
_process_ns = time.process_time_ns
_cuda_synchronize = torch.cuda.synchronize
_copy, _empty_strided, _sha256 = torch._C.TensorBase.copy_, torch.empty_strided, hashlib.sha256
WORK = "tmp"  # the runner's only writable directory, inside the box
_PROTECTIONS: list[str] = []  # the runner's own, reported with its first reply
HOST_THREADS = torch.get_num_threads()  # read at import, before main() makes the harness single-threaded
# The thread-count runs: one thread, and this many times the host's (partial sums with slots for "enough" threads)
THREAD_FACTOR = 4
REPEAT_KEPT = 2  # outputs of repeated calls that differed from the first, sent back to be judged
# CPU a candidate's own threads may use while no call runs: in the second half of the settle window after a call
# (an OpenMP pool spins a few milliseconds after its last parallel region, then sleeps; where a busy host stretched
# the spin into that half, in a window after it), and over the whole job
SPIN_NS = 2_000_000
OUTSIDE_NS = 20_000_000
SETTLE_S = VerifyJob.model_fields["settle_s"].default  # verification's pause after a call (jittered there): some
# benchmark calls get one before them
# Classes whose every attribute the seal covers: a method added or replaced on a tensor changes every tensor, and one
# on a request's class changes what the runner reads out of every request; the audit recorder's, its fields too.
SEALED_CLASSES = (torch.Tensor, torch.UntypedStorage, BaseModel, Message, Request, *REQUEST_TYPES, Recorder)


class LoadError(Exception):
    """The candidate did not import, build or construct: reported as the `compile` check."""


@dataclass
class RunnerSetup:
    module: str  # path of the module the runner imports
    cls: str  # Model or ModelNew
    device: str = "cpu"
    triton: bool = False
    poison: bool = False  # CPU allocations filled with a pattern from the start (verification; a benchmark poisons
    # single untimed calls)
    settle_s: float = SETTLE_S
    threads: int = field(default_factory=lambda: HOST_THREADS)  # torch's intra-op threads, as a real process has;
    # fewer than the host's: the runner is bound to as many cores (as an engine binds its worker)
    # no new process, exec, ptrace or other process's memory once the candidate loaded (seccomp.py): a candidate's
    # runner on a CPU (on a GPU, Triton compiles at its first launch with programs of its own)
    sealed_processes: bool = False
    foreign: frozenset[str] = frozenset()  # installed libraries' identities: a copy of one is not the candidate's own


# ---------------------------------------------------------------- the runner

# Made in the runner (_warm_up), never in the harness: a parallel op there before forking leaves the runners an
# OpenMP pool that does not exist. Large enough that summing it is a parallel region on any thread count.
_WAKE: list[torch.Tensor] = []


def _wake_threads() -> None:
    """Just before a timed CPU call: one parallel region, so the OpenMP pool's threads are awake and spinning when
    the clock starts, as they are between the ops of a forward pass. After the harness's round trip they may have
    gone to sleep, and waking them inside the timed call charged every op with it (50 µs ops timed at 190 µs)."""
    _WAKE[0].sum()


def _bind(threads: int) -> None:
    """Fewer threads than the host's: this process bound to that many of its cores, before any thread pool starts,
    so a candidate's own OpenMP pool sizes itself to them too, as in an engine's worker bound to its cores."""
    cores = sorted(os.sched_getaffinity(0))
    if threads < len(cores):
        os.sched_setaffinity(0, cores[:threads])


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
        return getattr(load_module(path, disguise.module_name(path) if cls == "ModelNew" else f"kb_{cls.lower()}"), cls)
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
    op_sample: Callable[..., tuple]
    op_profile: Callable[..., tuple[dict[str, Any], list[list[Any]], tuple]]
    op_repeat: Callable[..., tuple[dict[str, Any], tuple]]
    same_bytes: Callable[[torch.Tensor, torch.Tensor], bool]
    clock: Callable[[], float]
    audit_channel: Callable[[], tuple[int, int] | None]
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
    places: probes.Places  # (the candidate's own code, torch's generated code, installed libraries): code_places


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


def _serve(setup: RunnerSetup, rfd: int, wfd: int, harness: tuple[ModuleType, ...]) -> None:
    """The runner: confine, instrument, then answer the harness's requests until it closes the channel. Its
    state lives in this frame's locals, as immutable tuples (a candidate cannot rebind them).

    Requests arrive as plain data and become typed requests through pydantic-core's compiled validator, bound
    before the candidate loaded, after the seal was read (a class of theirs changed is reported before any field
    is read). Replies and facts stay plain dicts and lists keyed by the messages' field names: what leaves the
    runner must not pass through code the candidate could replace in its own process (a method of a class can be
    replaced, dict's cannot); the harness validates each reply into a Reply."""
    watch = _prepare(setup, wfd, harness)
    tools = watch.tools
    tampered = tools.tampered
    models: tuple = ()
    weights: tuple = ()
    held: tuple = ()  # every output returned so far: (objects, digests of their bytes, byte ranges)
    slots: tuple = ()  # (name, tensors) kept for calls on the same tensor objects
    loaded: tuple = ()  # the state dict each model was loaded with
    staged: tuple = ()  # bench: input sets
    last: Any = None  # bench: the last timed call's outputs
    sampled: tuple = NO_PASS  # the harness's sampled pass: its inputs, its calls' outputs, bytes left to hold them
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
            elif op in ("sample", "profile", "repeat"):  # its calls are calls: their CPU is no work between calls
                outside = quiet[0] + tools.cpu_since(quiet[1], watch.known_threads)[0]
                if op == "sample":
                    sampled = tools.op_sample(watch, models[request.model], request, sampled, (rfd, wfd))
                elif op == "profile":
                    reply["profile"], reply["later"], held = tools.op_profile(
                        watch, models[request.model], tools.to(request.inputs, setup.device), held, facts, sampled,
                        request.checked)
                    sampled = NO_PASS
                else:
                    inputs = tools.to(request.inputs, setup.device)
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


def _prepare(setup: RunnerSetup, wfd: int, harness: tuple[ModuleType, ...]) -> Watch:
    """Before the candidate loads: start torch's threads, bind the tools, instrument, confine, seal, poison.
    `harness`: the modules of the harness that forked this runner (its entry point's, as the process runs it), sealed
    and taken for the harness's own code with this module's."""
    from kernelbot.agent.verify import triton_check

    disguise.neutral_code([triton_check])  # imported after the harness renamed its code, before anything binds it
    work = Path.cwd() / WORK
    os.chdir(work)
    _bind(setup.threads)
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
        op_call=_op_call, op_timed_call=_op_timed_call, op_final=_op_final, tampered=_tampered, op_sample=op_sample,
        op_profile=op_profile, op_repeat=_op_repeat, same_bytes=probes.same_bytes, clock=time.perf_counter,
        audit_channel=confine_mod.RECORDER.channel if confine_mod.RECORDER else _no_channel,
        windows=triton_check.recent_windows, set_threads=torch.set_num_threads,
        leaves=_leaves, poison=probes.poison_allocations, randbelow=secrets.randbelow)
    codes = tuple((fn, fn.__code__) for fn in tools if hasattr(fn, "__code__"))
    places = (*code_places(setup.module, work), setup.foreign)
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
    modules = (*harness, sys.modules[__name__], runner_channel, runner_calls, probes, confine_mod, landlock, seccomp,
               cuda_check, messages, sampling, provenance, device_mod, clocks, disguise) + \
        ((triton_check,) if setup.triton else ())
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


def code_places(module: str, work: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
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
            working = _work_after(tools, settle, watch.known_threads)
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


def _op_timed_call(watch: Watch, model: torch.nn.Module, inputs: tuple, perturb: list[tuple[int, int, Any]],
                   poisoned: bool = False) -> tuple[float, Any]:
    """The benchmark's call: this call's change to the inputs (outside the clock), then the one timing protocol
    (hardware/device.py's timed_call: on a GPU the L2 flush, then device events around the call), with the
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
    shown: list[str] = []
    with disguise.loading(facts, shown):  # nothing of the process names verification; its clocks read hours back
        model_cls = _load(setup.module, setup.cls)
        models = tuple(_build(model_cls, init, sd, request.init_seed, facts["unloadable_weights"]).to(setup.device)
                       for init, sd in request.models)
    sealed = [seccomp.refuse_processes()] if setup.sealed_processes else []  # its builds are done: no more programs
    return {"ptxas": cuda_check.REPORTS, "protections": [*_PROTECTIONS, *shown, *sealed]}, models


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


def _work_after(tools: Tools, settle: float, known: frozenset[int]) -> int:
    """Nanoseconds of CPU the candidate's threads used in the second half of the pause `settle` after a call. Where
    that is more than a pool's spin but within OUTSIDE_NS, the reading is of a further half: a spin that a busy host
    stretched into the second half has ended by then, work that goes on has not."""
    tools.sleep(settle / 2)
    _, mark = tools.cpu_since(None, known)
    tools.sleep(settle / 2)
    working, mark = tools.cpu_since(mark, known)
    if SPIN_NS < working <= OUTSIDE_NS:
        tools.sleep(settle / 2)
        working, _ = tools.cpu_since(mark, known)
    return working


def _threads_after(used_ns: int, when: str, known: frozenset[int], allowed_ns: int = SPIN_NS) -> list[str]:
    """A finding when threads the candidate started (OS threads, native ones included) used more CPU than
    `allowed_ns` while no call of it ran; it names those still alive, with the CPU each has used."""
    if used_ns <= allowed_ns:
        return []
    alive = ", ".join(f"{name} {ns / 1e6:.1f} ms" for name, ns in probes.thread_names(known))
    return [f"the candidate's threads used {used_ns / 1e6:.1f} ms of CPU {when} (OS threads, native ones "
            f"included): work goes on while no call runs{f' (alive: {alive})' if alive else ''}"]


def _set_element(t: torch.Tensor, flat: int, value: Any) -> None:
    """Element `flat` (in row-major order) of `t` set to `value`, whatever its layout (a transposed input too)."""
    index = []
    for size in reversed(t.shape):
        flat, i = divmod(flat, size)
        index.append(i)
    t[tuple(reversed(index))] = value
