"""Candidates per minute on a Ray cluster with 1, 2 and 4 workers, and what the cluster adds per candidate over
evaluating it in-process (`kernelbot optimize` without --cluster).

    python benchmarks/cluster_throughput.py [--candidates 8] [--workers 1,2,4] [--device cpu|cuda]
                                            [--cluster ADDRESS] [--hidden 4096] [--dtype float32]

The workload is the built-in proposer's candidates for one RMSNorm task (batch 8, one token, `--hidden` wide),
repeated until there are `--candidates`; every candidate goes through the same verify and benchmark as in a run.
First they are evaluated one after another in this process (the local path), then through the cluster with at most
W candidates at once for each W of `--workers`. Without `--cluster`, a cluster of this machine's own is started for
the measurement (a head without CPUs and one node per worker, all on 127.0.0.1; with --device cuda one node holding
max(W) GPUs) and shut down at the end; with `--cluster`, that cluster is used as it is.

Printed: per W, wall seconds, candidates per minute and the speed-up over the local path; and the overhead per
candidate: (cluster wall time with one worker - local wall time) / candidates. Run it on a quiet machine: every
candidate is also a benchmark, and a busy host slows both paths unevenly.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from kernelbot.agent.cluster import ClusterExecutor, Job
from kernelbot.agent.propose.proposer import available_backends, propose, write_candidate
from kernelbot.agent.tasks.references import write_task
from kernelbot.agent.verify.evaluate import evaluate
from kernelbot.records import Task

SEED, TIMEOUT, BENCH_ROUNDS = 0, 300.0, 9


def rmsnorm_task(hidden: int, dtype: str) -> Task:
    return Task(id=f"bench-rmsnorm-8x1x{hidden}", hotspot_id="h", family="rmsnorm", module_class="LlamaRMSNorm",
                dtype=dtype, input_shapes=[[8, 1, hidden]], free_dims=[[0]], init_args=[hidden, 1e-6, dtype],
                share=0.1, floor_us=1.0)


def jobs_for(task: Task, task_dir: Path, count: int, device: str) -> list[Job]:
    """`count` candidates: the proposer's for the task, repeated under new ids (each is evaluated in full)."""
    write_task(task, task_dir)
    proposed = [(c, s) for c, s in propose(task, available_backends(device), task_dir / "reference.py")
                if c.backend == ("cpp" if device == "cpu" else "triton")]
    if not proposed:
        raise SystemExit(f"the built-in proposer has no {device} candidate for {task.id}")
    jobs = []
    for i in range(count):
        cand, source = proposed[i % len(proposed)]
        cand = cand.model_copy(update={"id": f"{cand.id}-n{i}"})
        jobs.append(Job(task, task_dir, cand, write_candidate(cand, source, task_dir)))
    return jobs


def local_seconds(jobs: list[Job], device: str) -> float:
    t0 = time.perf_counter()
    for job in jobs:
        evaluate(job.task, job.task_dir, job.candidate, job.path, device, seed=SEED, timeout=TIMEOUT,
                 bench_rounds=BENCH_ROUNDS)
    return time.perf_counter() - t0


def cluster_seconds(address: str, jobs: list[Job], device: str, workers: int) -> tuple[float, int]:
    """Wall seconds for every job with at most `workers` at once, and how many nodes ran them."""
    executor = ClusterExecutor(address, device, SEED, TIMEOUT, BENCH_ROUNDS, max_slots=workers).connect()
    executor.target_device = "any"  # nothing is ranked here
    nodes: set[str] = set()
    try:
        t0 = time.perf_counter()
        executor.run(jobs, lambda job, out: nodes.add(out.row.placement.node if out.row.placement else "?"),
                     lambda job: True, lambda progress: None)
        return time.perf_counter() - t0, len(nodes)
    finally:
        executor.close()


@contextlib.contextmanager
def own_cluster(workers: int, device: str) -> Iterator[str]:
    """A cluster on this machine for the measurement, shut down afterwards."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep 127.0.0.1 (read when Ray is imported)
    from ray.cluster_utils import Cluster

    node = {"node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "num_cpus": 0, "include_dashboard": False})
    try:
        if device == "cuda":
            cluster.add_node(**node, num_cpus=workers, num_gpus=workers)
        else:
            for _ in range(workers):
                cluster.add_node(**node, num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--cluster", default=None, help="an existing cluster's address (default: start one here)")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    counts = sorted({int(w) for w in args.workers.split(",")})
    if args.candidates < 1 or not counts or counts[0] < 1:
        raise SystemExit("--candidates and every --workers count must be at least 1")
    task = rmsnorm_task(args.hidden, args.dtype)
    tmp = Path(tempfile.mkdtemp(prefix="kb-cluster-bench-"))
    try:
        # the first evaluation builds the shared extensions and header: done once before anything is timed
        local_seconds(jobs_for(task, tmp / "warm" / task.id, 1, args.device), args.device)
        local = local_seconds(jobs_for(task, tmp / "local" / task.id, args.candidates, args.device), args.device)
        rows = []
        with contextlib.nullcontext(args.cluster) if args.cluster else own_cluster(max(counts), args.device) as addr:
            for w in counts:
                jobs = jobs_for(task, tmp / f"w{w}" / task.id, args.candidates, args.device)
                rows.append((w, *cluster_seconds(addr, jobs, args.device, w)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = args.candidates
    print(f"{n} candidates of {task.id} ({args.dtype}, {args.device}), {BENCH_ROUNDS} benchmark rounds each")
    print(f"{'path':18s}{'wall s':>9s}{'cand/min':>10s}{'vs local':>10s}{'nodes':>7s}")
    print(f"{'local (in-process)':18s}{local:9.1f}{60 * n / local:10.2f}{1.0:10.2f}{1:7d}")
    for w, seconds, nodes in rows:
        print(f"{f'cluster, {w} worker' + ('s' if w > 1 else ''):18s}{seconds:9.1f}{60 * n / seconds:10.2f}"
              f"{local / seconds:10.2f}{nodes:7d}")
    one = next((s for w, s, _ in rows if w == 1), None)
    if one is not None:
        print(f"overhead per candidate (1 worker vs local): {(one - local) / n:+.2f} s")


if __name__ == "__main__":
    main()
