"""Candidates evaluated on a Ray cluster (`kernelbot optimize --cluster ADDRESS`).

The agent loop (budgets, journal, LLM calls, pack, end-to-end timing) stays in the driver; each candidate becomes
one Ray task that runs `agent/verify/evaluate.evaluate` on whichever worker has the resources: one GPU per
candidate when candidates are timed on a GPU, one CPU when they are compiled, interpreted and timed on a CPU. Nothing is
shared through the filesystem: the task's reference and the candidate's source travel to the worker as text, the worker
evaluates them in a directory of its own, and the same records (row, verdict, benchmark, report, error file) come
back with the node, worker and device that produced them.

Ray retries a candidate whose worker or node died (`MAX_RETRIES` more times, on what is alive); one that is still
lost after that comes back as a harness error row, never silently dropped. The driver records each candidate in the
journal once, when its result arrives, so `optimize --resume` reconnects and replays it.

Ray is imported only in here, and only once `connect` is called: without --cluster nothing of Ray is loaded.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from kernelbot import KernelbotError
from kernelbot.agent.journal.progress import ClusterProgress, Running
from kernelbot.records import Bench, Candidate, KernelOutcome, KernelResult, Placement, Task, Verdict

if TYPE_CHECKING:
    from kernelbot.outcomes import Outcome

MAX_RETRIES = 2  # further tries of a candidate whose worker or node died, wherever Ray finds room
PROGRESS_S = 5.0  # how often the driver refreshes the progress line (and the journal's copy of it)
TASK_DIR_MARK = "<kernelbot-task-dir>"  # a worker's task directory in what it sends back, the driver's put back
RETURNED_FILES = ("error.txt",)  # a candidate's files besides its records that the driver keeps
MAX_FILE_CHARS = 200_000
LOOPBACK = ("127.0.0.1", "localhost", "::1")
INSTALL_HINT = "pip install 'kernelbot[ray]'"


class ShippedJob(BaseModel):
    """What a worker needs to evaluate one candidate: everything travels as text, nothing as a path."""

    key: str  # task id / candidate id: the progress board's name for it
    task: Task
    reference: str
    candidate: Candidate
    source: str
    device_kind: str
    seed: int
    timeout: float
    bench_rounds: int


class ShippedResult(BaseModel):
    """An evaluation as it comes back from a worker (paths under its task directory written as TASK_DIR_MARK)."""

    row: KernelResult
    verdict: Verdict | None = None
    bench: Bench | None = None
    accepted: bool = False
    report: str = ""
    placement: Placement
    seconds: float
    files: dict[str, str] = Field(default_factory=dict)


@dataclass
class Job:
    """One candidate of one task, written under the driver's run directory."""

    task: Task
    task_dir: Path
    candidate: Candidate
    path: Path

    @property
    def key(self) -> str:
        return f"{self.task.id}/{self.candidate.id}"


# -- the worker's side ---------------------------------------------------------------------------------------------
def _device_name(kind: str) -> str:
    """This worker's device model as the driver names its own: the CPU's model name, or the assigned GPU's."""
    if kind == "cpu":
        from kernelbot.hardware.device import cpu_model_name

        return f"cpu:{cpu_model_name()}"
    import torch

    return f"cuda:{torch.cuda.get_device_name(0)}"  # Ray shows a task only the GPU it was given


def _placement(kind: str) -> Placement:
    import ray

    ctx = ray.get_runtime_context()
    if kind == "cuda":
        gpus = ray.get_gpu_ids()
        if gpus:  # Ray made only this task's GPUs visible: the first (index 0; the sandbox maps it through
            os.environ["KERNELBOT_GPU"] = "0"  # CUDA_VISIBLE_DEVICES to the GPU Ray gave) runs the candidate
    return Placement(node=ctx.get_node_id(), node_ip=ray.util.get_node_ip_address(), worker=ctx.get_worker_id(),
                     device=_device_name(kind))


def _tell(board: Any, method: str, *args: Any) -> Any:
    """A progress report to the driver's board; progress never fails a candidate."""
    import ray

    try:
        return ray.get(getattr(board, method).remote(*args), timeout=30)
    except Exception:
        return None


def evaluate_shipped(job: ShippedJob, board: Any) -> str:
    """Runs on a worker: the candidate through the same sandbox, verifier and benchmark as a local run."""
    from kernelbot.agent.propose.proposer import write_candidate
    from kernelbot.agent.verify.evaluate import evaluate

    placement = _placement(job.device_kind)
    tries = _tell(board, "started", job.key, placement.model_dump()) or 1
    placement = placement.model_copy(update={"attempts": tries})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kernelbot-") as tmp:
        task_dir = Path(tmp) / job.task.id
        task_dir.mkdir()
        (task_dir / "reference.py").write_text(job.reference)
        path = write_candidate(job.candidate, job.source, task_dir)
        out = evaluate(job.task, task_dir, job.candidate, path, job.device_kind, seed=job.seed, timeout=job.timeout,
                       bench_rounds=job.bench_rounds)
        files = {name: (path.parent / name).read_text(errors="replace")[:MAX_FILE_CHARS]
                 for name in RETURNED_FILES if (path.parent / name).is_file()}
        result = ShippedResult(row=out.row, verdict=out.verdict, bench=out.bench, accepted=out.accepted is not None,
                               report=out.report, placement=placement, seconds=round(time.perf_counter() - t0, 3),
                               files=files)
        text = result.model_dump_json()
        for where in {str(task_dir.resolve()), str(task_dir)}:
            text = text.replace(where, TASK_DIR_MARK)
    _tell(board, "finished", job.key)
    return text


class Board:
    """Driver-side actor (no CPU) the workers tell when they start and finish a candidate: what each worker is
    doing, and how many tries each candidate took."""

    def __init__(self) -> None:
        self.running: dict[str, dict[str, Any]] = {}
        self.tries: Counter[str] = Counter()

    def started(self, key: str, placement: dict[str, Any]) -> int:
        self.tries[key] += 1
        self.running[key] = {**placement, "candidate": key, "attempt": self.tries[key], "since": time.time()}
        return self.tries[key]

    def finished(self, key: str) -> None:
        self.running.pop(key, None)

    def snapshot(self) -> list[dict[str, Any]]:
        return list(self.running.values())


# -- the driver's side ---------------------------------------------------------------------------------------------
def comparable(out: Outcome, target_device: str) -> Outcome:
    """A benchmark counts only on the device model the pack is built and measured for: a candidate timed on
    another model keeps its numbers in its row but is not ranked against the others."""
    placement = out.row.placement
    timed_on = placement.device if placement else target_device
    if out.bench is None or timed_on == target_device:
        return out
    row = out.row.model_copy(update={"outcome": KernelOutcome.NOT_TIMED, "reason": (
        f"verified; {out.bench.speedup:.2f}x on {timed_on}, not ranked: the pack is for {target_device}, "
        "and benchmarks compare only on one device model")})
    return replace(out, row=row, accepted=None)


def outcome_from(text: str, job: Job, target_device: str) -> Outcome:
    """A worker's result as the driver's Outcome, its records and files written in the driver's candidate
    directory exactly where a local evaluation writes them."""
    from kernelbot.outcomes import Accepted, Outcome
    from kernelbot.rundir import write_record

    result = ShippedResult.model_validate_json(text.replace(TASK_DIR_MARK, str(job.task_dir.resolve())))
    cdir = job.path.parent
    if result.verdict is not None:
        write_record(cdir / "verdict.json", result.verdict)
    if result.bench is not None:
        write_record(cdir / "bench.json", result.bench)
    for name, content in result.files.items():
        if name in RETURNED_FILES:
            (cdir / name).write_text(content)
    write_record(cdir / "placement.json", result.placement)
    won = result.accepted and result.verdict is not None and result.bench is not None
    out = Outcome(result.row.model_copy(update={"placement": result.placement}), result.verdict, result.bench,
                  Accepted(job.task, job.candidate, job.path, result.verdict, result.bench) if won else None,
                  result.report)
    return comparable(out, target_device)


def lost_outcome(job: Job, error: BaseException, *, raised: bool) -> Outcome:
    """A candidate no worker finished: its worker or node died on every try, or the worker's own code raised
    (`raised`: kernelbot missing or broken on that node; the candidate itself never raises out of evaluate)."""
    from kernelbot.outcomes import Outcome, new_row

    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    where = "the worker failed" if raised else f"lost on the cluster after {1 + MAX_RETRIES} tries"
    reason = f"harness error: {where} ({type(error).__name__}: {first})"[:400]
    (job.path.parent / "error.txt").write_text(f"{type(error).__name__}: {error}\n")
    return Outcome(new_row(job.task, job.candidate, KernelOutcome.HARNESS_ERROR, reason), report=reason)


def require_ray() -> None:
    """One line naming the fix when Ray is not installed (checked before a run directory is made)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise KernelbotError(f"--cluster needs Ray, which is not installed: {INSTALL_HINT}")


def _import_ray(address: str) -> Any:
    host = address.rsplit("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host in LOOPBACK and "ray" not in __import__("sys").modules:
        # Ray replaces a loopback address by this machine's outward IP unless told it runs on one machine; a
        # cluster bound to 127.0.0.1 (tests, a laptop) is then unreachable
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise KernelbotError(f"--cluster needs Ray: {INSTALL_HINT}") from None
    return ray


@dataclass
class ClusterExecutor:
    """The driver's connection to the cluster, for the length of one optimize session."""

    address: str
    device_kind: str
    seed: int
    timeout: float
    bench_rounds: int
    cpus_per_candidate: float = 1.0
    target_device: str = ""  # "<kind>:<model>" the pack is for; benchmarks from other models are not ranked
    max_slots: int | None = None  # at most this many candidates at once (None: as many as the cluster holds)
    ray: Any = None
    board: Any = None
    owned: bool = False  # this executor called ray.init (and so calls ray.shutdown)
    retried: int = 0
    _remote: Any = field(default=None, repr=False)

    def connect(self) -> ClusterExecutor:
        ray = self.ray = _import_ray(self.address)
        if not ray.is_initialized():
            import logging

            try:
                ray.init(address=self.address, namespace="kernelbot", log_to_driver=False,
                         logging_level=logging.WARNING)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise KernelbotError(f"--cluster {self.address}: cannot connect to a Ray cluster there "
                                     f"({str(exc).strip().splitlines()[0][:200]}); start one with `ray start "
                                     "--head` or give its address (auto, host:port, ray://host:port)") from None
            self.owned = True
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        # the board lives beside the driver (soft: a ray:// client's node is the head's), never on a worker node
        # whose death would take the progress of every candidate with it
        strategy = NodeAffinitySchedulingStrategy(node_id=here, soft=True) if here else None
        self.board = ray.remote(num_cpus=0, max_restarts=-1)(Board).options(
            scheduling_strategy=strategy).remote()
        resources = {"num_gpus": 1, "num_cpus": 1} if self.device_kind == "cuda" else \
            {"num_cpus": self.cpus_per_candidate}
        self._remote = ray.remote(evaluate_shipped).options(
            max_retries=MAX_RETRIES, retry_exceptions=False, scheduling_strategy="SPREAD", **resources)
        if self.slots() < 1:
            raise KernelbotError(f"--cluster {self.address}: no node has the "
                                 f"{'GPU' if self.device_kind == 'cuda' else 'CPU'} a candidate needs; add one, or "
                                 "run without --cluster")
        return self

    def close(self) -> None:
        if self.ray is not None and self.owned and self.ray.is_initialized():
            self.ray.shutdown()
        self.owned = False

    def alive_nodes(self) -> list[dict[str, Any]]:
        return [n for n in self.ray.nodes() if n.get("Alive")]

    def slots(self) -> int:
        """Candidates the live nodes hold at once."""
        total = Counter()
        for node in self.alive_nodes():
            total.update(node.get("Resources", {}))
        held = int(total["GPU"]) if self.device_kind == "cuda" else int(total["CPU"] // self.cpus_per_candidate)
        return held if self.max_slots is None else min(held, self.max_slots)

    def _ship(self, job: Job) -> Any:
        shipped = ShippedJob(key=job.key, task=job.task, reference=(job.task_dir / "reference.py").read_text(),
                             candidate=job.candidate, source=job.path.read_text(), device_kind=self.device_kind,
                             seed=self.seed, timeout=self.timeout, bench_rounds=self.bench_rounds)
        return self._remote.remote(shipped, self.board)

    def _result(self, ref: Any, job: Job) -> Outcome:
        try:
            return outcome_from(self.ray.get(ref), job, self.target_device)
        except self.ray.exceptions.RayError as exc:  # every try died (worker, node) or the task itself failed
            return lost_outcome(job, exc, raised=isinstance(exc, self.ray.exceptions.RayTaskError))

    def progress(self, waiting: int, in_flight: int, done: int, total: int) -> ClusterProgress:
        """`waiting`: not yet handed to Ray; `in_flight`: handed over, started (on the board) or queued there."""
        nodes = self.alive_nodes()
        alive = {n["NodeID"] for n in nodes}
        try:
            running = self.ray.get(self.board.snapshot.remote(), timeout=10)
        except Exception:
            running = []
        running = [Running.model_validate(r) for r in running if r.get("node") in alive]
        queued = waiting + max(0, in_flight - len(running))
        return ClusterProgress(address=self.address, nodes=len(nodes), slots=self.slots(), queued=queued,
                               running=running, done=done, total=total,
                               retried=self.retried + sum(r.attempt > 1 for r in running), updated=time.time())

    def run(self, jobs: list[Job], done: Callable[[Job, Outcome], None],
            may_start: Callable[[Job], bool], report: Callable[[ClusterProgress], None]) -> list[Job]:
        """Every job, as many at once as the cluster holds; `done` gets each outcome as it arrives (in the
        driver's thread). A job `may_start` refuses (a budget) is not started; those come back."""
        pending: deque[Job] = deque(jobs)
        in_flight: dict[Any, Job] = {}
        refused: list[Job] = []
        finished, last = 0, 0.0
        while pending or in_flight:
            room = max(self.slots(), 1) - len(in_flight)
            while pending and room > 0:
                job = pending.popleft()
                if not may_start(job):
                    refused.append(job)
                    continue
                in_flight[self._ship(job)] = job
                room -= 1
            if not in_flight:
                break
            ready, _ = self.ray.wait(list(in_flight), num_returns=1, timeout=PROGRESS_S)
            for ref in ready:
                job = in_flight.pop(ref)
                out = self._result(ref, job)
                if out.row.placement and out.row.placement.attempts > 1:
                    self.retried += 1
                finished += 1
                done(job, out)
            if time.monotonic() - last >= PROGRESS_S and (pending or in_flight):
                last = time.monotonic()
                report(self.progress(len(pending), len(in_flight), finished, len(jobs)))
        if jobs:
            report(self.progress(0, 0, finished, len(jobs)))
        return refused

    def evaluator(self, task: Task, task_dir: Path) -> Callable[[Candidate, Path], Outcome]:
        """One candidate at a time on the cluster, for loops that need each result before the next candidate
        (the LLM's repair rounds, the kernel store's incumbents)."""

        def run(cand: Candidate, path: Path) -> Outcome:
            job = Job(task, task_dir, cand, path)
            return self._result(self._ship(job), job)

        return run


@contextlib.contextmanager
def connected(address: str, device_kind: str, *, seed: int, timeout: float,
              bench_rounds: int) -> Iterator[ClusterExecutor]:
    executor = ClusterExecutor(address, device_kind, seed, timeout, bench_rounds).connect()
    try:
        yield executor
    finally:
        executor.close()
