"""The typed messages of the verification wing, one schema for every side that speaks them.

  parent -> box       a Job (job.json), written by the parent, read by the harness
  harness -> runner   a Request (one per call the runner makes), as plain data on the harness's channel
  runner -> harness   a Reply (its Facts, outputs as EncodedTensor tuples) and Events (Triton launches, findings)
  box -> parent       result.json: a VerifyResult, BenchResult, Done or Failure; outputs.pt: VerifyOutputs or
                      BenchOutputs (tensors as torch.save'd them, loaded with weights_only=True)

Everything that crosses a process boundary travels as plain data (JSON, or pickles of builtins and tensors) and is
validated into these models by the side that reads it; what came from the box or a runner is never trusted beyond
what the model admits (unknown fields are refused).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from kernelbot.records import KernelBuild


class Message(BaseModel):
    """Unknown fields are refused; tensors travel inside as they are."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


# ---------------------------------------------------------------- how outputs are laid out (both sides)

MAX_NESTING = 8
# Bound at import, before any candidate code runs: a container's items are read through the base type's own methods,
# so a subclass's __iter__, __len__ or values() (which would let it decide what is checked) is never called.
_tuple_len, _tuple_item, _list_len, _list_item, _dict_values = tuple.__len__, tuple.__getitem__, list.__len__, \
    list.__getitem__, dict.values


def output_leaves(value: Any, depth: int = 0) -> list[Any]:
    """A model's outputs as one flat list, in order: tuples and lists (named result tuples included) opened item by
    item, dicts by their values in insertion order (a transformers ModelOutput is one), recursively; anything else
    (a tensor, a number, an object) is one output. The parent reads the reference's outputs so, the runner the
    candidate's."""
    if depth > MAX_NESTING:
        return [value]
    if isinstance(value, tuple):
        items = [_tuple_item(value, i) for i in range(_tuple_len(value))]
    elif isinstance(value, list):
        items = [_list_item(value, i) for i in range(_list_len(value))]
    elif isinstance(value, dict):
        items = list(_dict_values(value))
    else:
        return [value]
    return [leaf for item in items for leaf in output_leaves(item, depth + 1)]


# ---------------------------------------------------------------- the job (parent -> box)

class VerifyJob(Message):
    kind: Literal["verify"] = "verify"
    candidate: str  # the candidate module's path
    plan: str  # torch.save'd plan: init args, the input sets (guarded), fresh and changed values
    state_dicts: list[str]  # one per model of the plan
    alternates: list[str] = Field(default_factory=list)  # state dicts of new weights for the result_caching check
    param_names: list[str] = Field(default_factory=list)  # the reference's parameters, in registration order
    buffer_names: list[str] = Field(default_factory=list)  # its float buffers in its state dict, in order
    init_seed: int
    triton: bool = False  # the candidate runs in Triton's interpreter with triton_check installed (CPU only)
    device: str = "cpu"
    settle_s: float = 0.02
    foreign_builds: list[str] = Field(default_factory=list)  # installed libraries' identities (provenance.py)


class SanitizeJob(Message):
    """One call on the main input set, for a sanitizer to watch (compute-sanitizer on a GPU, AddressSanitizer on a
    CPU)."""
    kind: Literal["sanitize"] = "sanitize"
    candidate: str
    plan: str
    state_dicts: list[str]
    init_seed: int
    device: str = "cuda"


class BenchJob(Message):
    kind: Literal["bench"] = "bench"
    reference: str
    candidate: str
    init_args: list[Any]
    state_dict: str
    inputs: str  # torch.save'd input sets the timed calls rotate through
    rounds: int
    device: str = "cpu"
    round_seconds: float = 0.02
    copies: int = 1  # models built from the state dict, timed calls cycling over them (weights beyond the caches)
    threads: int | None = None  # the runners' threads, each bound to as many cores (Task.threads); None: the host's


class NoopJob(Message):
    """Nothing: measures the sandbox's own cost per job."""
    kind: Literal["noop"] = "noop"


class BuildJob(Message):
    """The compile gate on a CPU host: one call on the main input set in Triton's interpreter, each launched kernel
    compiled for the target (compile_gate), in a process with no process filter (Triton's compiler runs ptxas)."""
    kind: Literal["build"] = "build"
    candidate: str
    plan: str
    state_dicts: list[str]
    init_seed: int


Job = Annotated[VerifyJob | SanitizeJob | BenchJob | BuildJob | NoopJob, Field(discriminator="kind")]
JOB: TypeAdapter[Job] = TypeAdapter(Job)


class SentCase(Message):
    label: str
    model: int  # index into SentPlan.init_args
    inputs: list[Any]  # guarded: canary regions around every contiguous tensor


class SentPlan(Message):
    """What a verify or sanitize job runs the candidate on (torch.save'd beside the job by the parent)."""
    init_args: list[list[Any]]
    cases: list[SentCase]
    fresh: list[Any] = Field(default_factory=list)  # another draw at the main case's shapes (caching check)
    changed: list[list[Any]] = Field(default_factory=list)  # `fresh`, one element changed per call


# ---------------------------------------------------------------- observations and reports

class Facts(Message):
    """What a runner observed around the candidate's calls, by kind; the judge turns each kind into a check."""
    subclass: list[str] = Field(default_factory=list)  # tensor subclasses or other objects returned
    aliasing: list[str] = Field(default_factory=list)
    late: list[str] = Field(default_factory=list)  # outputs changing after the call returned
    threads: list[str] = Field(default_factory=list)  # threads left running
    weights: list[str] = Field(default_factory=list)  # parameters changed
    tamper: list[str] = Field(default_factory=list)  # the harness's code, seal or channel disturbed
    timing: list[str] = Field(default_factory=list)  # clocks or comparison functions replaced
    unloadable_weights: list[str] = Field(default_factory=list)  # the reference's weights did not load by name
    notes: list[str] = Field(default_factory=list)


FACT_KINDS: tuple[str, ...] = tuple(Facts.model_fields)


class PtxasKernel(Message):
    kernel: str
    arch: str
    registers: int | None
    smem_bytes: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int


class PtxasReport(Message):
    """nvcc -Xptxas -v on the candidate's CUDA sources."""
    ok: bool
    kernels: list[PtxasKernel] = Field(default_factory=list)
    log: str = ""


class Profile(Message):
    """The profiled call: aten compute work on every thread, the candidate's own kernels, whether the op log stayed
    intact (the runner's); then, on a CPU, samples of where its calls' CPU time went (sampling.PLACES), over `calls`
    calls one sample per `period_ns` (or why nothing was sampled): those the harness takes and attributes itself,
    whatever the runner's reply said (parent_sampling.py); or why no profile came back."""
    compute: dict[str, float] = Field(default_factory=dict)
    compute_ns: int = 0  # wall time of the profiled call's outermost aten compute ops (the op log's)
    own_kernels: list[str] = Field(default_factory=list)
    intact: bool = False
    places: dict[str, int] = Field(default_factory=dict)
    calls: int = 0
    period_ns: int = 0
    problem: str | None = None
    error: str | None = None


class TritonReport(Message):
    """Rebuilt by the harness from the launches and findings a runner streamed."""
    launches: int = 0
    programs: int = 0
    kernels: list[str] = Field(default_factory=list)
    out_of_bounds: list[str] = Field(default_factory=list)
    races: list[str] = Field(default_factory=list)
    precision: list[str] = Field(default_factory=list)  # float32 tl.dot at a lower precision than the interpreter's
    order_dependent_kernels: list[str] = Field(default_factory=list)  # float atomic adds, or writes inside a lock
    builds: list[KernelBuild] = Field(default_factory=list)  # each launched specialization compiled for the target
    order_mismatch: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------- harness -> runner

# A plain tensor as plain data: ("T", dtype, shape, stride, storage offset, bytes).
EncodedTensor = tuple[Literal["T"], str, tuple[int, ...], tuple[int, ...], int, bytes]
# One output as it leaves a runner: a tensor, a number, or None (something refused).
Value = EncodedTensor | bool | int | float | None
Stage = Literal["compile", "run", "needs_gpu"]
# What a case's extra runs vary: Triton's program order (reversed, then shuffled), or, for a candidate that launched
# no Triton kernel on a CPU, torch's thread count (one thread, then four times the cores': other chunkings)
Schedule = Literal["program order", "thread count"]


class Request(Message):
    seq: int = 0  # set by the harness when it sends


class LoadRequest(Request):
    """Import the module, build one model per (init args, state dict)."""
    op: Literal["load"] = "load"
    models: list[tuple[list[Any], dict[str, Any]]]
    init_seed: int


class CaseRequest(Request):
    """One verified call on an input set (kept under `keep` for later calls on the same tensors)."""
    op: Literal["case"] = "case"
    model: int
    inputs: list[Any]
    again: bool = False  # a second run on copies
    orders: bool = False  # also in reversed and shuffled Triton program order
    order_seed: int = 0
    inputs_after: bool = False  # send the inputs back afterwards, guard regions included
    keep: str | None = None


class RefillRequest(Request):
    """New values in the tensors kept under `slot`, then a verified call on them."""
    op: Literal["refill"] = "refill"
    model: int
    slot: str
    values: list[Any]
    poison: bool = True  # False: this call's allocations are left as malloc gives them


class ReweightRequest(Request):
    """New weights copied into the same parameters and buffers: by name, else (a candidate whose parameters or buffers
    are named otherwise) in the order `names` and `buffer_names` give the reference's, where count, shapes and loaded
    values agree."""
    op: Literal["reweight"] = "reweight"
    model: int
    state_dict: dict[str, Any]
    names: list[str] = Field(default_factory=list)  # the reference's parameters, in registration order
    buffer_names: list[str] = Field(default_factory=list)  # the reference's float buffers, in state-dict order


class SampleRequest(Request):
    """`calls` calls for the harness's sampled pass (the harness samples them from outside: parent_sampling.py), on
    the inputs the pass's first request staged (`inputs`); their outputs are held until the profile request."""
    op: Literal["sample"] = "sample"
    model: int
    calls: int = 0
    inputs: list[Any] | None = None


class ProfileRequest(Request):
    """The op log's call; then the outputs of the profiled call and of the sampled calls `checked` (indices the
    harness picked once the pass had run) go back to be checked."""
    op: Literal["profile"] = "profile"
    model: int
    inputs: list[Any]
    checked: list[int] = Field(default_factory=list)


class RepeatRequest(Request):
    """The same call again and again for `seconds` (at most `calls` times) while other processes load the cores: every
    output compared with the first by its bytes."""
    op: Literal["repeat"] = "repeat"
    model: int
    inputs: list[Any]
    seconds: float
    calls: int


class StageRequest(Request):
    """The benchmark's input sets, held by the runner."""
    op: Literal["stage"] = "stage"
    sets: list[list[Any]]


class TimedCallRequest(Request):
    """One timed call on a staged set by one of the loaded models (copies of one model's weights), after changing
    some input elements (index, flat position, value)."""
    op: Literal["tcall"] = "tcall"
    set: int
    model: int = 0
    perturb: list[tuple[int, int, float | int | bool]] = Field(default_factory=list)
    poison: bool = False  # CPU allocations poisoned for this call, as in verification (its time is not counted)


class FetchRequest(Request):
    """The last timed call's outputs, asked for only after it returned."""
    op: Literal["fetch"] = "fetch"


class IdleRequest(Request):
    """The other runner's turn starts (`start`) or ends: the candidate's threads must rest while it is timed."""
    op: Literal["idle"] = "idle"
    start: bool


class FinalRequest(Request):
    """The end of the job: outputs still final, no thread left."""
    op: Literal["final"] = "final"


AnyRequest = Annotated[LoadRequest | CaseRequest | RefillRequest | ReweightRequest | SampleRequest | ProfileRequest |
                       RepeatRequest | StageRequest | TimedCallRequest | FetchRequest | IdleRequest | FinalRequest,
                       Field(discriminator="op")]
REQUEST: TypeAdapter[AnyRequest] = TypeAdapter(AnyRequest)
REQUEST_TYPES: tuple[type[Request], ...] = (LoadRequest, CaseRequest, RefillRequest, ReweightRequest, SampleRequest,
                                            ProfileRequest, RepeatRequest, StageRequest, TimedCallRequest, FetchRequest,
                                            IdleRequest, FinalRequest)


# ---------------------------------------------------------------- runner -> harness

class Reply(Message):
    """A runner's answer to one request; which fields are set depends on the request."""
    facts: Facts
    error: str | None = None
    stage: Stage | None = None  # with an error at load: compile or needs_gpu
    ptxas: list[PtxasReport] | None = None
    protections: list[str] | None = None  # the runner's own, with its load reply
    out: list[Value] | None = None
    again: list[Value] | None = None
    reversed: list[Value] | None = None
    shuffled: list[Value] | None = None
    schedule: Schedule | None = None  # what `reversed` and `shuffled` varied
    inputs_after: list[Value] | None = None
    profile: Profile | None = None
    later: list[list[Value]] | None = None  # the profiled call's outputs, then some sampled calls'
    repeated: list[list[Value]] | None = None  # a repeat's first outputs, then up to REPEAT_KEPT that differed
    repeat_calls: int | None = None
    repeat_differing: int | None = None  # calls whose outputs differed from the first call's in any byte
    us: float | None = None  # a timed call's microseconds




class TritonLaunch(Message):
    kernel: str
    programs: int
    order: str  # the program order it ran in
    float_atomic_adds: int = 0
    locked_writes: int = 0  # plain writes made while holding a lock
    asked: str  # the order the harness had asked for then (natural for a kernel it pinned)
    phase: str = "natural"  # the order asked for the whole run
    # the launch's window: the thread it ran on, its start and end on CLOCK_MONOTONIC (checked by the harness against
    # the pass it sampled: sampling.checked_windows)
    thread: int = 0
    start_ns: int = 0
    end_ns: int = 0


class TritonFinding(Message):
    kind: Literal["out_of_bounds", "race", "precision"]
    text: str
    asked: str


MAX_BUILDS = 40  # builds a report keeps: a runner may stream no more


class TritonBuild(Message):
    build: KernelBuild  # a launched kernel compiled for the GPU target (compile_gate)
    asked: str


class MemoryPins(Message):
    """Sent once by a runner before its candidate loads: (address, pointer) pairs of its own state that must not
    change, which the harness reads in the runner's memory after every reply (probes.pins)."""
    pins: list[tuple[int, int]]


class SampleMark(Message):
    """Sent by a runner right before its sampled calls (`start`) and right after them (`end`), each time waiting for the
    harness's answer: the harness's sampler is on exactly around the calls (parent_sampling.py). Exactly one of each
    per sampled request, in order, or the runner broke the channel's protocol."""
    phase: Literal["start", "end"]


EVENTS: dict[str, type[Message]] = {"triton_launch": TritonLaunch, "triton_finding": TritonFinding,
                                    "triton_build": TritonBuild, "memory_pins": MemoryPins}


# ---------------------------------------------------------------- box -> parent

class CaseRun(Message):
    """One input set's verified call, decoded: outputs, the second run, other schedules, inputs afterwards."""
    out: list[Any] = Field(default_factory=list)
    again: list[Any] | None = None
    reversed: list[Any] | None = None
    shuffled: list[Any] | None = None
    schedule: Schedule | None = None
    inputs_after: list[Any] = Field(default_factory=list)
    error: str | None = None

    def in_order(self, order: str) -> list[Any] | None:
        """The outputs of the `order` run (reversed or shuffled), when that ran."""
        return self.reversed if order == "reversed" else self.shuffled if order == "shuffled" else None


SCHEDULE_RUNS = {"program order": {"reversed": "reversed program order", "shuffled": "shuffled program order"},
                 "thread count": {"reversed": "one thread", "shuffled": "four times as many threads as cores"}}


class CallResult(Message):
    out: list[Any] | None = None
    error: str | None = None


class Repeated(Message):
    """The fresh values' call made again and again while other processes loaded the cores."""
    calls: int = 0
    differing: int = 0  # calls whose outputs differed from the first call's in any byte
    outs: list[list[Any]] = Field(default_factory=list)  # the first call's outputs, then some of those that differed
    error: str | None = None


class VerifyOutputs(Message):
    """outputs.pt of a verify job."""
    runs: list[CaseRun]
    caching_out: list[Any] | None = None
    caching_error: str | None = None
    element_outs: list[CallResult] = Field(default_factory=list)
    reweight_outs: list[CallResult] = Field(default_factory=list)  # one per set of new weights (VerifyJob.alternates)
    later_outs: list[list[Any]] = Field(default_factory=list)  # on the fresh values: the profiled and sampled calls
    repeated: Repeated | None = None  # on the fresh values, under contention
    main_again: CallResult | None = None  # the main input set once more, after other calls


class CheckedCall(Message):
    inputs: list[Any]
    out: list[Any]


class BenchOutputs(Message):
    """outputs.pt of a bench job: some timed calls' inputs and outputs, for the parent to check."""
    checked: list[CheckedCall]


class BoxResult(Message):
    """What every job's result.json carries: the protections in force in the box (the sandbox reads these too)."""
    protections: list[str] = Field(default_factory=list)
    ptxas: list[PtxasReport] = Field(default_factory=list)


class Failure(BoxResult):
    """The job could not finish: the candidate failed to load or run, or a runner died. `error` is candidate text."""
    kind: Literal["failure"] = "failure"
    error: str
    stage: Stage
    facts: Facts = Field(default_factory=Facts)
    traceback: str = ""


class VerifyResult(BoxResult):
    kind: Literal["verify"] = "verify"
    facts: Facts
    profile: Profile
    triton: TritonReport | None = None


class BenchResult(BoxResult):
    kind: Literal["bench"] = "bench"
    reference_us: list[float]  # each round's median call
    candidate_us: list[float]
    reference_mean_us: list[float]  # each round's mean call
    candidate_mean_us: list[float]
    iters: int
    facts: Facts


class Done(BoxResult):
    """A sanitize or noop job that ran to its end."""
    kind: Literal["done"] = "done"


class Builds(BoxResult):
    """A build job's kernels, compiled for the target."""
    kind: Literal["builds"] = "builds"
    builds: list[KernelBuild] = Field(default_factory=list, max_length=MAX_BUILDS)


Result = Annotated[Failure | VerifyResult | BenchResult | Done | Builds, Field(discriminator="kind")]
RESULT: TypeAdapter[Result] = TypeAdapter(Result)


def read_result(payload: dict[str, Any] | None) -> Result | None:
    """The box's result.json as its model; None when there is none or it does not fit one (the job then crashed)."""
    if payload is None:
        return None
    try:
        return RESULT.validate_python(payload)
    except ValueError:
        return None
