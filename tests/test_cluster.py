"""`optimize --cluster`: candidates evaluated on a real multi-node Ray cluster started on this machine
(`ray.cluster_utils.Cluster`, every node bound to 127.0.0.1, no dashboard, no usage stats), and what the driver
makes of them: the same records as a local run, placed on several nodes, a killed node's candidate redone elsewhere.
The cluster is this module's own and is shut down at its end; nothing else is touched."""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import write_module

from kernelbot.agent.cluster import ClusterExecutor, Job, comparable
from kernelbot.agent.propose.proposer import available_backends, propose, write_candidate
from kernelbot.agent.verify.evaluate import evaluate
from kernelbot.outcomes import Accepted, Outcome
from kernelbot.records import Bench, Candidate, KernelOutcome, KernelResult, Placement, Task, Verdict

RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0",
           # on one machine: Ray must not swap the nodes' 127.0.0.1 for the machine's outward address
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
TASK = Task(id="t", hotspot_id="h", family="", module_class="Model", dtype="float32", input_shapes=[[4, 32]],
            free_dims=[[0]], init_args=[], share=0.0, floor_us=0.0)
REFERENCE = """
import torch
from torch import nn

class Model(nn.Module):
    def forward(self, x):
        return torch.tanh(x)
"""
CANDIDATES = {
    "broken": "this is not python\n",
    "torch-tanh": "import torch\nfrom torch import nn\n\nclass ModelNew(nn.Module):\n"
                  "    def forward(self, x):\n        return torch.tanh(x)\n",
}
ARGS = ["--model", "llama-micro", "--batch", "4", "--prompt-len", "8", "--decode-steps", "4", "--families", "rmsnorm",
        "--no-compile", "--rounds", "3", "--min-share", "0", "--max-tasks", "2", "--iterations", "1", "--no-store"]


@pytest.fixture(scope="module")
def ray_cluster():
    """A head and two worker nodes, one CPU each, all on 127.0.0.1; yields (cluster, worker nodes)."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: pip install 'kernelbot[ray]'")
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)  # before Ray is imported: it reads them once
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    try:
        workers = [cluster.add_node(**NODE) for _ in range(2)]
        cluster.wait_for_nodes()
        yield cluster, workers
    finally:
        cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _jobs(tmp_path: Path, task_dir: Path) -> list[Job]:
    write_module(task_dir / "reference.py", REFERENCE)
    jobs = []
    for cid, source in CANDIDATES.items():
        cand = Candidate(id=cid, task_id=TASK.id, backend="cpp", proposer="test", config={}, source_hash=cid)
        jobs.append(Job(TASK, task_dir, cand, write_candidate(cand, source, task_dir)))
    return jobs


def test_candidates_evaluated_on_the_cluster_come_back_as_the_records_a_local_evaluation_makes(ray_cluster, tmp_path):
    cluster, _ = ray_cluster
    here = _jobs(tmp_path, tmp_path / "local" / TASK.id)
    local = {j.key: evaluate(TASK, j.task_dir, j.candidate, j.path, "cpu", seed=0, timeout=120, bench_rounds=5)
             for j in here}
    remote: dict[str, Outcome] = {}
    executor = ClusterExecutor(cluster.address, "cpu", seed=0, timeout=120, bench_rounds=5,
                               target_device="cpu:any").connect()
    seen = []
    try:
        jobs = _jobs(tmp_path, tmp_path / "run" / TASK.id)
        refused = executor.run(jobs, lambda job, out: remote.__setitem__(job.key, out), lambda job: True, seen.append)
        progress = executor.progress(0, 0, 0, 0)
    finally:
        executor.close()
    assert refused == [] and set(remote) == set(local)
    assert progress.nodes == 3 and progress.slots == 3
    assert seen and seen[-1].done == len(jobs) == seen[-1].total
    nodes = {n.node_id for n in [cluster.head_node, *cluster.worker_nodes]}
    for job in jobs:
        got, want = remote[job.key], local[job.key]
        assert got.row.outcome == want.row.outcome and got.row.candidate_id == want.row.candidate_id
        assert set(got.verdict.failed) == set(want.verdict.failed) and got.verdict.failed
        assert got.row.placement.node in nodes and got.row.placement.worker and got.row.placement.attempts == 1
        assert got.row.placement.device.startswith("cpu:")
        # the records sit where a local evaluation writes them, with the driver's paths in them
        written = Verdict.model_validate_json((job.path.parent / "verdict.json").read_text())
        assert written.failed == got.verdict.failed
        assert Placement.model_validate_json((job.path.parent / "placement.json").read_text()) == got.row.placement
        assert "kernelbot-" not in got.row.reason + got.report and "/tmp/kernelbot-" not in json.dumps(
            got.verdict.model_dump())


def _timed(device: str, speedup: float) -> Outcome:
    cand = Candidate(id="c", task_id="t", backend="cpp", proposer="test", config={}, source_hash="x")
    bench = Bench(candidate_id="t/c", rounds=5, reference_us=10.0, candidate_us=10.0 / speedup, reference_spread=0.01,
                  candidate_spread=0.01, speedup=speedup, significant=True)
    verdict = Verdict(candidate_id="t/c", verdict="pass", failed=[], checks=[], shapes=[], seconds=1.0)
    row = KernelResult(op="x", module="M", backend="cpp", shapes=[[1]], reason="verified; fast",
                       speedup=speedup, outcome=KernelOutcome.FASTER, candidate_id="t/c",
                       placement=Placement(node="n", node_ip="127.0.0.1", worker="w", device=device))
    return Outcome(row, verdict, bench, Accepted(TASK, cand, Path("c.py"), verdict, bench))


def test_a_benchmark_from_another_device_model_is_never_ranked_against_the_packs_device():
    other = comparable(_timed("cuda:NVIDIA A100-SXM4-80GB", 3.0), "cuda:NVIDIA H100 80GB HBM3")
    same = comparable(_timed("cuda:NVIDIA H100 80GB HBM3", 1.5), "cuda:NVIDIA H100 80GB HBM3")
    assert other.accepted is None and other.row.outcome is KernelOutcome.NOT_TIMED
    assert "A100" in other.row.reason and other.row.speedup == 3.0  # the numbers stay, for people
    assert same.accepted is not None and same.row.outcome is KernelOutcome.FASTER


def test_without_cluster_nothing_of_ray_is_imported():
    code = ("import sys; from kernelbot.cli import build_parser; import kernelbot.agent.optimize, "
            "kernelbot.agent.report.status; build_parser().parse_args(['optimize']); print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-1000:]


# -- the optimize loop through the cluster (slow: a few candidates of llama-micro, 2 cores shared by 3 nodes) ------
def _cli(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelbot.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _journal(run_dir: Path) -> tuple[dict[str, dict], dict | None]:
    """(candidate records by key, the driver's last cluster progress), read without disturbing the run."""
    db = sqlite3.connect(f"file:{run_dir / 'journal.sqlite'}?mode=ro", uri=True, timeout=5)
    try:
        records = {k: json.loads(d) for k, d in db.execute("SELECT key, data FROM records WHERE kind = 'candidate'")}
        row = db.execute("SELECT value FROM meta WHERE key = 'cluster'").fetchone()
        return records, json.loads(row[0]) if row else None
    except sqlite3.OperationalError:
        return {}, None
    finally:
        db.close()


def _expected_candidates(run_dir: Path) -> set[str]:
    """Every candidate the built-in proposer makes for the run's tasks (what a local run would try)."""
    found = set()
    for task_dir in (run_dir / "tasks").iterdir():
        task = Task.model_validate_json((task_dir / "task.json").read_text())
        found |= {f"{task.id}/{c.id}" for c, _ in propose(task, available_backends("cpu"), task_dir / "reference.py")}
    return found


def _check_cluster_run(run_dir: Path) -> tuple[dict, dict[str, dict]]:
    from test_optimize import _check_run

    report = json.loads((run_dir / "report.json").read_text())
    _check_run(run_dir, report)
    records, _ = _journal(run_dir)
    rows = [k for k in report["kernels"] if k.get("placement")]
    ids = [k["candidate_id"] for k in rows]
    assert len(ids) == len(set(ids)), "a candidate counted twice"
    # interpreted Triton of big calls is refused before any worker, as in a local run; the rest ran there
    assert set(ids) == {k["candidate_id"] for k in report["kernels"]} & _expected_candidates(run_dir)
    assert sorted(r["row"]["candidate_id"] for r in records.values()) == sorted(ids), "journal ≠ report"
    for k in rows:
        cand_dir = run_dir / "tasks" / k["candidate_id"].replace("/", "/candidates/")
        assert (cand_dir / "verdict.json").exists() and (cand_dir / "placement.json").exists()
    return report, {k["candidate_id"]: k for k in rows}


@pytest.mark.slow
def test_optimize_on_a_three_node_cluster_records_each_candidate_once_on_several_nodes(ray_cluster, tmp_path):
    cluster, _ = ray_cluster
    run_dir = tmp_path / "run"
    done = _cli("optimize", *ARGS, "--cluster", cluster.address, "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    report, rows = _check_cluster_run(run_dir)
    assert len({k["placement"]["node"] for k in rows.values()}) >= 2, "every candidate ran on one node"
    assert any(k["status"] == "accepted" for k in report["kernels"])
    assert "cluster 127.0.0.1" in (run_dir / "log.txt").read_text()
    status = _cli("status", str(run_dir), timeout=120)
    assert status.returncode == 0 and "cluster   " in status.stdout and "3 nodes" in status.stdout, status.stdout
    recorded, _ = _journal(run_dir)
    # the driver gone, the run resumes through the cluster: every candidate replayed, none evaluated again
    resumed = _cli("optimize", "--resume", str(run_dir), "--cluster", cluster.address)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _journal(run_dir)[0] == recorded
    again = json.loads((run_dir / "report.json").read_text())
    assert again["kernels"] == report["kernels"] and again["sessions"] == 2


@pytest.mark.slow
def test_a_node_killed_mid_candidate_has_its_candidate_redone_elsewhere_and_nothing_lost(ray_cluster, tmp_path):
    """Last in the module: it takes a worker node away from the shared cluster."""
    cluster, workers = ray_cluster
    run_dir = tmp_path / "run"
    driver = subprocess.Popen([sys.executable, "-m", "kernelbot.cli", "optimize", *ARGS, "--cluster", cluster.address,
                               "--run-dir", str(run_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    killed, victim = None, None
    deadline = time.monotonic() + 900
    try:
        while driver.poll() is None and time.monotonic() < deadline and killed is None:
            time.sleep(0.5)
            if not (run_dir / "journal.sqlite").exists():
                continue
            _, progress = _journal(run_dir)
            for running in (progress or {}).get("running", []):
                node = next((w for w in workers if w.node_id == running["node"]), None)
                if node is not None:  # a candidate on a worker node (the head holds the cluster's state)
                    cluster.remove_node(node, allow_graceful=False)
                    killed, victim = running["node"], running["candidate"]
                    break
        assert killed, "no candidate was seen running on a worker node"
        _, err = driver.communicate(timeout=max(60.0, deadline - time.monotonic()))
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, err[-3000:]
    _, rows = _check_cluster_run(run_dir)
    redone = rows[victim]["placement"]
    assert redone["node"] != killed and redone["attempts"] >= 2, redone
    assert rows[victim]["outcome"] != "harness_error", rows[victim]["reason"]
