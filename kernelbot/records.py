"""The records that flow between stages, one way: profile → rank → task → candidate → verdict → pack.

Each is a plain pydantic model written as JSON under the run directory, so any stage can be
rerun from the files of the one before.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

KERNEL_LABEL = "kernelbot::"  # names a pack kernel's calls in traces (the engines label them, the profiler reads them)
IN_PROCESS = "in-process"  # the engine of a model run in kernelbot's own process (not served)



class BusyProcess(BaseModel):
    pid: int
    name: str
    cores: float  # CPU time over the window / the window's length


class HostLoad(BaseModel):
    load_1m: float | None  # None where the OS gives no load average
    cpu_count: int
    window_s: float | None = None  # the stretch over which CPU time was counted; None when /proc was not read
    own_cores: float | None = None  # cores our process tree kept busy over the window
    others_cores: float | None = None  # cores every other process kept busy over the window
    busiest: list[BusyProcess] = Field(default_factory=list)  # the other processes that used most CPU
    contended: bool
    note: str = ""

    def summary(self) -> str:
        """One line for people: the load average, and what other processes used while it was read."""
        others = f", other processes {self.others_cores} cores" if self.others_cores is not None else ""
        busiest = f" (busiest: {', '.join(f'{b.name} {b.cores}' for b in self.busiest)})" if self.busiest else ""
        return f"load average {self.load_1m} on {self.cpu_count} cores{others}{busiest}"


class Device(BaseModel):
    kind: Literal["cpu", "cuda"]
    name: str
    threads: int
    peak_gflops: float
    peak_gbps: float
    peaks_source: str  # "measured on this machine" or the table row used
    notes: list[str] = Field(default_factory=list)

    def floor_us(self, flops: float, nbytes: float) -> float:
        """The roofline floor of some work on this device, in µs: its FLOPs at the peak FLOP/s or its bytes at the
        peak bandwidth, whichever takes longer."""
        return max(flops / (self.peak_gflops * 1e3), nbytes / (self.peak_gbps * 1e3))


class ModelSpec(BaseModel):
    """The model and the workload run on it. A built-in (path None) is a Llama decoder made from these numbers; a
    local Hugging Face directory is built from its config.json, and the numbers here are read from that config."""

    name: str  # a built-in name, or the model directory's basename
    layers: int | None = None  # None where the config does not say (read generically from any architecture)
    hidden: int | None = None
    heads: int | None = None
    intermediate: int | None = None
    vocab: int
    path: str | None = None  # the model directory (absolute); None for a built-in
    architecture: str = "LlamaForCausalLM"  # config.architectures[0], else the class transformers builds
    model_type: str = "llama"
    weights: str = "seeded random"  # or "safetensors (N tensors)"
    dtype: str
    batch: int
    prompt_len: int
    decode_steps: int
    seed: int = 0

    def summary(self) -> str:
        """For people: architecture, the sizes the config gives, dtype, and where the weights came from."""
        sizes = [f"{n} {what}" for n, what in ((self.layers, "layers"), (self.heads, "heads")) if n is not None]
        sizes += [f"{what} {n}" for n, what in ((self.hidden, "hidden"), (self.vocab, "vocab")) if n is not None]
        source = f" from {self.path}" if self.path else ""
        weights = "seeded random weights" if self.weights == "seeded random" else f"{self.weights} weights"
        return f"{self.architecture}{source}: {', '.join(sizes)}; {self.dtype}; {weights}"


class Hotspot(BaseModel):
    id: str
    module_class: str
    module_paths: list[str]
    family: str | None  # kernel_library family that can replace it, None if none can
    input_dims: list[list[int]]  # dims of the first op the module launched (its input, weights)
    dtype: str
    calls: int
    total_us: float
    share: float  # of the profiled forward time
    flops: float = 0.0
    bytes: float = 0.0
    floor_us: float = 0.0  # roofline floor for all calls together
    score_us: float = 0.0  # headroom: time above the floor
    kernel: str | None = None  # the pack kernel that ran here, when profiled with a pack applied


class TensorSpec(BaseModel):
    index: int  # position among the call's flattened arguments
    shape: list[int]
    dtype: str


class CallSignature(BaseModel):
    """A module call as a generic kernel sees it: the arguments' structure (a serialised pytree spec), the
    tensors' shapes and dtypes, the constants (index, repr), and how the outputs rebuild the module's result."""

    spec: str
    tensors: list[TensorSpec]
    constants: list[list[Any]] = Field(default_factory=list)
    output_spec: str = ""
    output_none: list[bool] = Field(default_factory=list)  # output leaves that are None (not computed)


class Task(BaseModel):
    id: str
    hotspot_id: str
    family: str
    module_class: str
    dtype: str
    input_shapes: list[list[int]]  # observed shapes of forward()'s tensor inputs
    free_dims: list[list[int]]  # per input, the dims that may change between calls (batch, tokens)
    init_args: list[Any]
    share: float
    floor_us: float
    profiled_dims: list[list[int]] = Field(default_factory=list)  # the hotspot's first-op dims (input, weights)
    # generic tasks (family "generic"): the call as extracted, and the live modules (dotted names) that compute
    # exactly its graph, so the pack may route their calls
    signature: CallSignature | None = None
    module_paths: list[str] = Field(default_factory=list)
    # served generic tasks: the engine layers' own attributes (GenericCapture.variant); the pack routes calls of
    # layers built alike, in the engine's processes
    layer_variant: str = ""
    region: str = ""  # what the reference covers and what stayed outside it, for people
    threads: int | None = None  # the CPU threads (and cores) the model runs the op on: a served engine's worker's,
    # which may be fewer than the host's; its benchmark runs so. None: the host's


class Origin(str, Enum):
    """Who wrote a candidate: decisions read this, never the proposer's name."""

    BUILTIN = "builtin"  # kernel_library's families, or the generator of generic tasks
    LLM = "llm"
    STORE = "store"  # reused from the kernel store, first accepted in an earlier run


class Candidate(BaseModel):
    id: str
    task_id: str
    backend: Literal["cpp", "triton", "cuda"]
    proposer: str  # for people: "builtin", "llm:<model>", "store:<its first proposer>"
    config: dict[str, Any]
    source_hash: str
    origin: Origin = Origin.BUILTIN

    @model_validator(mode="before")
    @classmethod
    def _origin_of_older_records(cls, data: Any) -> Any:
        """Candidates recorded before origins were: theirs is read from the proposer's name, here only."""
        if isinstance(data, dict) and "origin" not in data:
            prefix = str(data.get("proposer", "")).split(":", 1)[0]
            return {**data, "origin": prefix if prefix in (Origin.LLM.value, Origin.STORE.value) else Origin.BUILTIN}
        return data


CheckStatus = Literal["pass", "fail", "not_run"]


class Check(BaseModel):
    id: str
    status: CheckStatus
    detail: str = ""


class KernelBuild(BaseModel):
    """One kernel compiled ahead of time for a GPU target, no GPU needed (the pre-GPU compile gate): a Triton kernel
    with Triton's compiler and its bundled ptxas, for each specialization it was launched with; a CUDA kernel with
    nvcc. `flags` says what would hurt on the target: spills (slower, not wrong), shared memory over the target's
    per-block limit (the launch fails there)."""
    kernel: str = Field(max_length=200)  # lengths bounded: a runner (candidate code) sends these
    backend: Literal["triton", "cuda"]
    target: str = Field(max_length=16)  # sm_90
    specialization: str = Field("", max_length=400)  # Triton: the launch's argument types, constexprs and options
    ok: bool
    error: str = Field("", max_length=700)
    registers: int | None = None
    spill_bytes: int = 0  # spill stores and loads
    shared_bytes: int = 0  # static and (Triton's) dynamic shared memory per block
    shared_limit: int = 0  # the target's per-block maximum
    flags: list[str] = Field(default_factory=list, max_length=4)


class SanitizerRun(BaseModel):
    """One compute-sanitizer tool's run on a GPU verdict's main input set: whether it ran (its job finished and it
    printed its summary after instrumenting the target) and how many errors it reported."""
    tool: str  # memcheck, racecheck, synccheck, initcheck
    ran: bool
    errors: int = 0


class InterpreterCoverage(str, Enum):
    """What a GPU verdict's second job, Triton's interpreter on the node's CPU at small sizes, covered."""
    RUN = "run"  # planned: the job is to be run
    CHECKED = "checked"  # it ran the candidate's Triton launches: its race and bounds findings count
    NOT_TRITON = "not_triton"  # nothing there for it to check (CUDA code, or no Triton launch)
    NOT_RUN = "not_run"  # it could not check: `race` is not_run unless something failed it


class Verdict(BaseModel):
    candidate_id: str
    verdict: Literal["pass", "fail"]
    failed: list[str]
    checks: list[Check]
    shapes: list[list[list[int]]]  # every input-shape set that was run
    seconds: float
    protections: list[str] = Field(default_factory=list)  # the sandbox's, as in force for this run
    not_run: list[str] = Field(default_factory=list)  # checks that could not run here (never counted as passed)
    cases: list[str] = Field(default_factory=list)  # what each input set was: sizes, fuzzing, value ranges
    seed: int | None = None  # replays this verification with `kernelbot verify --seed`
    notes: list[str] = Field(default_factory=list)
    # Triton launches the CPU interpreter ran: whether the candidate is a Triton kernel is what it launched, never
    # what its source spells (on a GPU, those of its race check in the interpreter on the node's CPU)
    triton_launches: int = 0
    sanitizer_runs: list[SanitizerRun] = Field(default_factory=list)  # on a GPU: each compute-sanitizer tool's run
    interpreter_race: InterpreterCoverage | None = None  # on a GPU: what the interpreter's race job covered
    builds: list[KernelBuild] = Field(default_factory=list)  # its kernels compiled for the run's GPU target

    @property
    def problems(self) -> list[str]:
        """`check: detail` of every failed check, for a message that says why the verdict is what it is."""
        return [f"{c.id}: {c.detail}" for c in self.checks if c.status == "fail"]


class GpuState(BaseModel):
    """One NVML reading of the GPU a run uses; every field None (and `note` saying why) where NVML is absent."""

    available: bool
    nvml_index: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    temperature_c: int | None = None
    throttle_reasons: list[str] = Field(default_factory=list)
    throttled: bool | None = None  # clocks held down for a reason other than idling
    other_processes: list[int] | None = None  # pids on this GPU outside our own process tree
    note: str = ""


class Bench(BaseModel):
    candidate_id: str
    rounds: int
    reference_us: float  # median over rounds
    candidate_us: float
    reference_spread: float  # (p75 - p25) / median
    candidate_spread: float
    speedup: float
    significant: bool  # faster beyond the measured noise
    host: HostLoad | None = None  # over the benchmark: other processes' CPU time makes its ratio doubtful
    # the timed calls cycled over this many copies of the weights, to stream them from memory as a model does
    weight_copies: int = 1
    input_draws: int = 3  # ... and this many input draws (more where the inputs hold a model's state: a KV cache)
    # the weights' copies and the state's draws together still fit twice the last-level cache: a warm-cache figure
    cache_resident: bool = False
    # each round timed by its mean call, not its median: the candidate's slow calls cost more than the host's stalls
    by_mean: bool = False
    gpu_before: GpuState | None = None  # NVML on the benchmark's GPU before and after: clocks, temperature, throttling
    gpu_after: GpuState | None = None


class PackEntry(BaseModel):
    task_id: str
    candidate_id: str
    family: str
    module_class: str
    input_shapes: list[list[int]]
    init_args: list[Any]
    dtype: str
    backend: str
    config: dict[str, Any]
    source_file: str  # relative to pack/
    profiled_dims: list[list[int]] = Field(default_factory=list)
    source_hash: str
    verification: str
    speedup: float
    signature: CallSignature | None = None  # generic kernels: the one call signature they are routed for
    module_paths: list[str] = Field(default_factory=list)
    layer_variant: str = ""  # served generic kernels: the attributes of the engine layers they are routed to


class Pack(BaseModel):
    version: str
    run_id: str
    device: str
    entries: list[PackEntry]


class KLCheck(BaseModel):
    """The next-token distributions (float64 softmax) at every position of the teacher-forced runs (all fed eager's
    tokens): eager against the pack, and each against the same weights in float64. The pack passes when its KL from
    float64, mean and max over positions, is at most `slack` times eager's own, or below `floor` nats (distributions
    that differ only in float32's last bits)."""

    positions: int
    mean: float  # KL(eager ‖ pack) in nats, mean over positions
    max: float
    top1_agreement: float  # positions where eager's and the pack's most likely tokens are the same
    top5_agreement: float  # mean share of eager's 5 most likely tokens among the pack's 5
    eager_mean: float  # KL(float64 ‖ eager): the dtype's own error
    eager_max: float
    pack_mean: float  # KL(float64 ‖ pack)
    pack_max: float
    slack: float
    floor: float

    # computed, so report.json states it; reading a report back ignores it and recomputes
    @computed_field
    @property
    def within_noise(self) -> bool:
        return (self.pack_mean <= max(self.slack * self.eager_mean, self.floor)
                and self.pack_max <= max(self.slack * self.eager_max, self.floor))

    def summary(self) -> str:
        return (f"KL(eager ‖ pack) mean {self.mean:.2e}, max {self.max:.2e} nats, top-1 {self.top1_agreement:.1%}, "
                f"top-5 {self.top5_agreement:.1%} agreement; KL from float64: eager {self.eager_mean:.2e}, with the "
                f"pack {self.pack_mean:.2e} ({'within' if self.within_noise else 'beyond'} {self.slack:g}x eager's "
                f"or {self.floor:.0e} nats)")


class Fidelity(BaseModel):
    # in-process runs: max |Δlogit| with both runs fed eager's tokens; served runs: |Δ logprob| of the greedy
    # tokens up to the first divergence
    max_abs_logit_diff: float
    greedy_match: bool
    token_agreement: float
    # share of distinct 3-grams in the greedy outputs, without and with the pack: a collapse into repetition
    # shows as a drop even where a few tokens differ
    distinct_3grams_before: float | None = None
    distinct_3grams_after: float | None = None
    repetition_collapse: bool = False
    # in-process runs: max |Δlogit| against the same weights in float64 on the same tokens, of eager (the dtype's own
    # error) and with the pack; within_noise when the pack is no more than twice as far off as eager (then changed
    # tokens are near ties the model's dtype cannot decide)
    dtype_noise: float | None = None
    pack_error: float | None = None
    within_noise: bool | None = None
    # in-process runs: the next-token distributions compared position by position (None in older reports and
    # served runs); the pack must also pass this check
    kl: KLCheck | None = None
    # in-process runs: the pack decoded the same tokens in every timed round (False: a kernel changed its answers
    # after the calls this check saw); None where not compared, or where eager's own rounds differ
    rounds_agree: bool | None = None

    # a computed field, so report.json states the verdict; reading a report back ignores it and recomputes
    @computed_field
    @property
    def passed(self) -> bool:
        return ((self.greedy_match or bool(self.within_noise)) and not self.repetition_collapse
                and (self.kl is None or self.kl.within_noise) and self.rounds_agree is not False)

    def summary(self) -> str:
        noise = "" if self.dtype_noise is None else (
            f" (against float64: eager {self.dtype_noise:.2e}, with the pack {self.pack_error:.2e}, "
            f"{'within' if self.within_noise else 'beyond'} the dtype's noise)")
        kl = "" if self.kl is None else f"; {self.kl.summary()}"
        rounds = "" if self.rounds_agree is not False else "; the pack decoded other tokens in later timed rounds"
        return (f"max |Δlogit| {self.max_abs_logit_diff:.2e}{noise}, greedy tokens identical: {self.greedy_match} "
                f"({self.token_agreement:.1%} agreement){kl}{rounds}")


class KernelOutcome(str, Enum):
    """What became of a candidate. Decisions are taken from this value; a KernelResult's reason says it for people."""

    ACCEPTED = "accepted"  # verified, faster beyond noise and the fastest of its task: it joins the pack
    FASTER = "faster"  # verified and faster beyond noise, not yet weighed against its task's other candidates
    OUTPACED = "outpaced"  # verified and faster beyond noise, but another candidate was faster (or won the duel)
    NOT_FASTER = "not_faster"  # verified, not faster beyond the measured noise
    SLOWER_IN_MODEL = "slower_in_model"  # faster alone, but the model end to end was faster without it (the gate)
    NOT_TIMED = "not_timed"  # verified, but its backend cannot be timed on this device
    NOT_VERIFIED = "not_verified"  # correctness could not run here, or the candidate was not run at all
    FAILED = "failed"  # a verification check failed
    HARNESS_ERROR = "harness_error"  # verifying or benchmarking raised: no verdict
    NO_CANDIDATE = "no_candidate"  # no code to run: the generator could not write one, or an LLM answer held none

    @property
    def verified(self) -> bool:
        """The candidate passed verification (whatever its timing showed)."""
        return self in VERIFIED_OUTCOMES


VERIFIED_OUTCOMES = frozenset({KernelOutcome.ACCEPTED, KernelOutcome.FASTER, KernelOutcome.OUTPACED,
                               KernelOutcome.NOT_FASTER, KernelOutcome.NOT_TIMED, KernelOutcome.SLOWER_IN_MODEL})
# How rows written before outcomes were recorded said them: the start of their reason (first match wins).
LEGACY_REASONS = (("verified; ", KernelOutcome.FASTER), ("verified and faster", KernelOutcome.OUTPACED),
                  ("verified but not faster", KernelOutcome.NOT_FASTER), ("verified (", KernelOutcome.NOT_TIMED),
                  ("failed ", KernelOutcome.FAILED), ("harness error", KernelOutcome.HARNESS_ERROR),
                  ("no built-in candidate", KernelOutcome.NO_CANDIDATE),
                  ("LLM answer unusable", KernelOutcome.NO_CANDIDATE))


def legacy_outcome(status: str, reason: str) -> KernelOutcome:
    """The outcome of a row written before KernelResult had one (old report.json files and journals), from its
    status and reason; the only place a reason is read. Any reason not listed was never verified."""
    if status == "accepted":
        return KernelOutcome.ACCEPTED
    return next((o for start, o in LEGACY_REASONS if reason.startswith(start)), KernelOutcome.NOT_VERIFIED)


class Placement(BaseModel):
    """Where a candidate was verified and timed when a Ray cluster ran it (`optimize --cluster`)."""

    node: str  # Ray node id (hex)
    node_ip: str
    worker: str  # Ray worker id (hex)
    device: str  # "<kind>:<model name>", e.g. "cuda:NVIDIA H100 80GB HBM3"; timings compare only within one
    attempts: int = 1  # tries it took: more than one when a worker or node died mid-candidate


class KernelResult(BaseModel):
    """One candidate's row: made whole where its candidate is evaluated, never patched afterwards. What later steps
    learn of it (its standing among its task's candidates, a duel, the gate, calls, torch.compile's gain) makes a new
    row (`model_copy(update=...)`), and the report's rows are built once from records of their own
    (agent/measure/end_to_end.py's final_rows)."""

    model_config = ConfigDict(frozen=True)  # setting a field raises: a patch after creation fails loudly

    op: str
    module: str
    backend: str
    shapes: list[list[int]]
    reason: str  # for people; decisions read `outcome`
    speedup: float | None
    outcome: KernelOutcome  # given by every stage that makes or changes a row; derived for older rows, see below
    reference_us: float | None = None  # per call, in the candidate's benchmark
    time_us: float | None = None
    floor_us: float | None = None  # roofline floor per call on this device
    calls: int = 0
    fallback_calls: int = 0
    candidate_id: str = ""
    # where the candidate came from and what it targets (optimize fills these; older reports lack them)
    proposer: str = ""
    hotspot_id: str = ""
    share: float | None = None  # the targeted hotspot's share of the profiled time
    flops: float | None = None  # per call, from the hotspot's shapes (roofline position)
    bytes: float | None = None
    iteration: int = 0
    placement: Placement | None = None  # cluster runs only: node, worker and device that ran it
    # torch.compile's gain over eager on this task's own region (tasks/<id>/compile.json), for accepted kernels' tasks
    region_compile_speedup: float | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome is KernelOutcome.ACCEPTED

    @computed_field  # in report.json for readers of the file; derived, so it cannot disagree with `outcome`
    @property
    def status(self) -> Literal["accepted", "rejected"]:
        return "accepted" if self.accepted else "rejected"

    @model_validator(mode="before")
    @classmethod
    def _outcome_of_older_rows(cls, data: Any) -> Any:
        """Rows written before outcomes were recorded still load: theirs is read from status and reason."""
        if isinstance(data, dict) and "outcome" not in data:
            return {**data, "outcome": legacy_outcome(str(data.get("status", "")), str(data.get("reason", "")))}
        return data


class LLMCall(BaseModel):
    """One request to the LLM, as recorded under the run directory (secrets redacted before writing)."""

    id: str
    task_id: str
    round: int  # 0: first generation; 1..R: repair rounds
    sample: int
    model: str
    api_base: str | None = None
    messages: list[dict[str, str]] = Field(default_factory=list)
    answer: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cost_known: bool = False  # False when litellm has no price for the model: cost_usd is then 0
    latency_s: float = 0.0
    attempts: int = 1  # HTTP attempts, retries included
    error: str = ""  # why the call failed, when it did
    candidate_id: str | None = None  # the candidate its code became, if any
    outcome: str = ""  # what became of it: no code, failed <check>, verified, accepted, ...


class LLMUsage(BaseModel):
    """The LLM stage of a run, summed."""

    model: str
    api_base: str | None = None
    calls: int = 0
    failed_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cost_known: bool = True
    seconds: float = 0.0
    candidates: int = 0
    verified: int = 0
    accepted: int = 0
    stop_reason: str = ""  # the budget that ended the stage, or "" when every task ran its rounds
    fallback: str = ""  # why the built-in proposer took over, when it did
    budgets: dict[str, Any] = Field(default_factory=dict)


class EndToEndTimes(BaseModel):
    """Workload times (ms) of the interleaved end-to-end rounds, and how busy the host was over them."""

    eager: list[float]
    kernelbot: list[float]
    compiled: list[float] = Field(default_factory=list)
    graph_decode: list[float] = Field(default_factory=list)  # static cache, decode steps replayed from a graph (GPUs)
    host: HostLoad | None = None  # None in runs recorded before the host was read
    # rounds (from 0) that decoded other tokens than the first round did, eager's and the pack's
    eager_rounds_differ: list[int] = Field(default_factory=list)
    pack_rounds_differ: list[int] = Field(default_factory=list)


class InModelSource(str, Enum):
    """Where a kernel's in-model figure comes from."""

    GATE_TRIAL = "gate trial"  # the pack's rounds without it against with it (in-process leave-one-out)
    ENGINE_TIMING = "engine timing"  # the router's calls timed beside the op they replace, in the model (or engine)
    # the op's time a call in the model's profile before the pack against the kernel's in the packed model's profile
    PROFILES = "profiles"


class AloneVsModel(BaseModel):
    """One pack kernel's gain alone (its benchmark) beside its gain in the model: in-process the gate's leave-one-out
    trial, per workload run, or (a pack the gate left whole) the profiles before and after the pack; served the
    plugin's in-engine timing, over the calls the served rounds made. Where they disagree by more than 2x, what was
    measured of why."""

    model_config = ConfigDict(frozen=True)

    candidate_id: str
    speedup_alone: float
    calls: int  # into the kernel, per workload run (served: over the rounds)
    predicted_ms: float  # from its benchmark: calls x (the op's time - the kernel's), per call as benchmarked
    measured_ms: float  # the pack's median round without it minus with it (served: calls x the in-engine saving)
    bench_call_us: float | None  # the kernel's time a call in its benchmark
    # its time a call in the model: its module's in the packed model's profile, the router's work included (served:
    # the kernel's median timed call in the engine)
    model_call_us: float | None
    judged: bool  # either saving is beyond the rounds' noise (served: the kernel's calls were timed in the engine)
    disagrees: bool  # judged, and the two savings differ by more than 2x (or have opposite signs)
    cause: str  # for people: what the measurements say of the difference ("" where they agree)
    source: InModelSource = InModelSource.GATE_TRIAL
    model_op_us: float | None = None  # the op the kernel replaced, a call in the model (served: the engine's own op)


class Report(BaseModel):
    run_id: str
    model: ModelSpec
    device: Device
    baseline_ms: float
    optimized_ms: float
    compiled_ms: float | None
    speedup: float
    speedup_vs_compiled: float | None
    timing_rounds: int
    graph_decode_ms: float | None = None  # eager model, static cache, CUDA-graph decode steps: measured on GPUs only
    fidelity: Fidelity
    kernels: list[KernelResult]
    hotspots_before: list[Hotspot]
    hotspots_after: list[Hotspot]
    notes: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    llm: LLMUsage | None = None  # present when candidates came from an LLM (--llm)
    iterations: int = 1  # profile → generate → integrate rounds run
    stop_reason: str = ""  # the budget that ended the work early, or ""
    budget: dict[str, Any] = Field(default_factory=dict)  # the run's budgets as given
    reused: list[str] = Field(default_factory=list)  # candidates taken from the kernel store
    sessions: int = 1  # 1 + how many times the run was resumed
    host: HostLoad | None = None  # over the end-to-end rounds: a contended host makes every ratio above doubtful
    engine: str = IN_PROCESS  # or the served engine: "vllm", "sglang"
    serving: ServedComparison | None = None  # served runs: the A/B on the server (its rounds are baseline/optimized)
    floor: WorkloadFloor | None = None
    peak_rss_mib: float | None = None  # kernelbot's own process at its largest (the sandbox's and servers' apart)
    alone_vs_model: list[AloneVsModel] = Field(default_factory=list)  # in-process packs of 2+ kernels (gate trials)


class KernelStat(BaseModel):
    name: str
    total_us: float
    count: int
    mean_us: float
    share: float  # of GPU busy time
    op: str | None  # the CPU op that launched it (most of its time)
    shapes: list | None  # that op's Input Dims
    dtype: str | None
    module: str | None  # nn.Module path, where the trace has python_function events
    floor_us: float  # roofline floor, all calls together; 0 when the op is not understood
    floor_known: bool
    score: float  # headroom: time saved if it ran at its floor
    communication: bool = False  # NCCL/RCCL: reported, never a rewrite target


class OpStat(BaseModel):
    op: str
    shapes: list | None
    dtype: str | None
    kernels: list[str]
    total_us: float
    calls: int
    share: float
    floor_us: float
    score: float


class RankStat(BaseModel):
    rank: str
    gpu_busy_us: float
    span_us: float
    kernels: int
    straggler: bool


class RankReport(BaseModel):
    source: str
    device: str
    peaks: str  # which peaks were used, or why there are none
    gpu_busy_us: float
    gpu_idle_share: float
    launches: int
    linking: str  # how kernels were tied to ops: "external id" or "time containment"
    kernels: list[KernelStat]
    ops: list[OpStat]
    ranks: list[RankStat] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class KernelCalls(BaseModel):
    """Calls into one pack kernel in one engine process."""

    calls: int = 0  # eager calls (each one ran the kernel)
    captured: int = 0  # calls during CUDA-graph capture (replays run the kernel without calling Python)
    # the first calls run both the kernel and the engine's own path on the same inputs, in the engine's process
    timed: int = 0
    kernel_us: float | None = None  # median per call over the timed calls
    engine_us: float | None = None
    disabled: str = ""  # why the kernel stopped taking calls in this process (slower than the engine's own path)


class LayerCapture(BaseModel):
    """One variant of an engine layer as the engine really ran it (engine/router.py, capture mode): which
    family stands in for it, built how, at which shapes; and whether the family's reference gave the layer's own
    outputs on a live call."""

    engine_class: str  # the engine's layer class, e.g. "RMSNorm" (vLLM) or "QKVParallelLinear"
    module_class: str = ""  # the module whose calls a trace shows for it, when another ("Attention" for its backend)
    family: str
    init_args: list[Any]
    dtype: str
    input_shapes: list[list[int]]  # the kernel's inputs at the most rows the engine ran
    calls: int
    rows: dict[str, int] = Field(default_factory=dict)  # rows (tokens) → calls, as continuous batching produced them
    shapes: dict[str, list[list[int]]] = Field(default_factory=dict)  # rows → the inputs' largest dims at those rows
    agrees: bool | None = None  # None: not checked (the variant is refused, or no call ran the engine's path)
    why: str = ""  # why the variant cannot take a kernel, or why the reference did not agree
    kernel: str = ""  # the pack kernel (candidate id) that ran these calls; "": the engine's own path ran them. A
    # trace shows a kernel's calls under its own label, so only own-path variants share their class's traced time
    within: str = ""  # the hooked layer class whose own path made these calls (a gated MLP's projections): a trace
    # shows them inside that layer, not among their own class's calls


class GenericCapture(BaseModel):
    """A call of an engine layer that no family covers, as the engine ran it (engine/generic_layers.py, capture mode):
    the layer's class and attributes, the call's signature, and the task's reference, extracted in the engine's own
    process from the layer's native (pure PyTorch) forward and checked there against the engine's own output."""

    engine_class: str
    variant: str  # the layer's own attributes (JSON): layers built alike compute alike
    dtype: str
    signature: CallSignature
    calls: int = 0
    reference: str = ""  # the reference.py of a task for this call; empty when `why` says why there is none
    why: str = ""


class PluginReport(BaseModel):
    """What kernelbot's plugin saw in one engine process: hooks installed, calls into each pack kernel, fallbacks by
    reason, pack entries no layer takes, and (capturing) the layer variants the engine ran."""

    pid: int
    rank: int | None
    engine: str
    run_id: str = ""
    pack_dir: str = ""
    hooked: list[str] = Field(default_factory=list)
    custom: dict[str, KernelCalls] = Field(default_factory=dict)  # candidate id → calls
    fallback: dict[str, dict[str, int]] = Field(default_factory=dict)  # layer class → reason → calls
    unrouted: list[dict[str, str]] = Field(default_factory=list)
    captures: list[LayerCapture] = Field(default_factory=list)
    generic: list[GenericCapture] = Field(default_factory=list)  # calls of layers no family covers
    # the most tokens the engine's scheduler puts in one step (vLLM's max_num_batched_tokens): a prefill chunk's rows
    # can reach it whatever the profiled load ran; None where the plugin does not read it
    step_rows: int | None = None


class ServingMetrics(BaseModel):
    """One serving workload against a running engine."""

    source: str  # "kernelbot generator" or "sglang.bench_serving"
    requests: int
    output_tokens: int
    duration_s: float
    output_throughput: float  # tokens/s
    mean_ttft_ms: float
    median_ttft_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    p99_ttft_ms: float | None = None
    p99_itl_ms: float | None = None
    telemetry: dict[str, Any] = Field(default_factory=dict)  # GPU clocks/temperature/power/throttling, or absent
    round_throughputs: list[float] = Field(default_factory=list)  # every round's tok/s, when this is the median one


class ServedCeiling(BaseModel):
    """What kernels can gain at most on this server (engine/serving/ceiling.py): a decode step's forward and LM head
    (the engine in one process on the worker's cores, the same model and load) against the served step (the stock
    server's ITL p50), and a plain read of the weights that step streams."""

    step_ms: float
    forward_ms: float  # the model's forward and its LM head
    share: float  # of the step
    max_gain: float | None  # the step over the step without the forward (None: the forward took all of it)
    cores: list[int] = Field(default_factory=list)  # where the forward was timed: the server's worker's (all: empty)
    read_ms: float | None = None  # a plain read of every weight the step streams, on those cores
    read_gbps: float | None = None
    read_gain: float | None = None  # the step over the step whose forward took only the read
    load_read_gain: float | None = None  # the load's throughput so: decode steps at read_gain, the rest as measured

    def summary(self) -> str:
        free = f"{self.max_gain:.2f}x" if self.max_gain is not None else "unbounded"
        where = f" on the worker's {len(self.cores)} core{'s' if len(self.cores) != 1 else ''}" if self.cores else ""
        text = (f"the model's forward and LM head take {self.forward_ms:.1f} ms of the {self.step_ms:.1f} ms served "
                f"decode step{where} ({self.share:.0%}); with the whole forward free the step would be {free} faster")
        if self.read_gain is not None and self.read_ms is not None:
            text += (f"; with the forward only reading its weights ({self.read_ms:.1f} ms, a plain read at "
                     f"{self.read_gbps} GB/s) {self.read_gain:.2f}x a step, {self.load_read_gain or 1.0:.2f}x the "
                     f"load's throughput (prefill and scheduling as measured)")
        return text


class ServedComparison(BaseModel):
    """The served A/B: the stock engine and the engine with the pack, the same model and load, both servers started
    the same way and up together, interleaved rounds (the order alternating)."""

    engine: str
    version: str
    command: str  # how the packed server was started, its kernelbot environment included
    stock: ServingMetrics  # the median round of each
    with_pack: ServingMetrics
    stock_rounds: list[ServingMetrics]
    pack_rounds: list[ServingMetrics]
    throughput_gain: float | None  # claimed only when the pack ran in every engine process that ran layers
    beyond_noise: bool  # every round of one server beat every round of the other
    engaged: bool
    processes: list[PluginReport]  # each engine process's plugin counters
    notes: list[str] = Field(default_factory=list)
    host: HostLoad | None = None  # over the rounds
    ceiling: ServedCeiling | None = None  # measured after the rounds (vLLM)


class WorkloadFloor(BaseModel):
    """The workload's roofline floor on this device from its measured peaks: every decode step streams the weights
    (the embedding's rows aside) and the KV cache read so far; prefill does 2 FLOPs per weight per prompt token, plus
    attention. Each variant's share is floor / its measured time (1.0 would be the roofline)."""

    weight_bytes: float
    kv_bytes_per_token: float  # per sequence, all layers, K and V
    prefill_gflop: float
    decode_gb: float  # bytes streamed over all decode steps, in GB
    floor_ms: float
    shares: dict[str, float] = Field(default_factory=dict)  # variant → floor_ms / its median time

    def summary(self) -> str:
        shares = ", ".join(f"{k} {v:.1%}" for k, v in self.shares.items())
        return (f"roofline floor {self.floor_ms:.2f} ms ({self.prefill_gflop:.2f} GFLOP prefill, {self.decode_gb:.3f} "
                f"GB streamed over decode); share of the floor reached: {shares}")
