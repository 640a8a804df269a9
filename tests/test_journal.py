"""The crash-safe journal: kill -9 at random points and in the middle of a journal write, then resume to the same
final state without losing a recorded result or paying twice for a recorded LLM answer; one process per run."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from journal_workload import main as run_workload

from kernelbot.agent.journal.db import CRASH_ENV, JOURNAL, Journal, RunLocked, lock_owner

WORKLOAD = Path(__file__).with_name("journal_workload.py")
HERE = Path(__file__).parent


def _child(run_dir: Path, crash_at: int | None = None, step_s: float = 0.02) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    env["KB_WORKLOAD_STEP_S"] = str(step_s)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    if crash_at:
        env[CRASH_ENV] = str(crash_at)
    # its own process group, so the kill reaches exactly the process this test started
    return subprocess.Popen([sys.executable, str(WORKLOAD), str(run_dir)], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _integrity(run_dir: Path) -> None:
    db = sqlite3.connect(run_dir / JOURNAL)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()


def _paid(run_dir: Path) -> list[str]:
    path = run_dir / "paid.log"
    return path.read_text().split() if path.exists() else []


def test_put_get_meta_and_a_second_journal_is_refused(tmp_path):
    with Journal(tmp_path) as j:
        j.put("a", "stage", {"x": [1, 2]})
        j.set_meta("state", "running")
        assert j.get("a") == {"x": [1, 2]} and j.get("b") is None and j.meta("state") == "running"
        assert j.has("a%") and not j.has("z%")
        with pytest.raises(RunLocked, match=rf"in use by kernelbot process {os.getpid()}"):
            Journal(tmp_path)
    with Journal(tmp_path) as j:  # closed: free again, and durable
        assert j.records("stage") == [("a", {"x": [1, 2]})]


def test_two_processes_on_one_run_directory(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from kernelbot.agent.journal.db import Journal\n"
                               "j = Journal(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(120)", str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert lock_owner(tmp_path) == holder.pid
        with pytest.raises(RunLocked, match=rf"in use by kernelbot process {holder.pid}"):
            Journal(tmp_path)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    assert lock_owner(tmp_path) is None  # kill -9 leaves no stale lock
    Journal(tmp_path).close()


def test_killed_at_random_points_and_mid_write_resumes_to_the_same_final_state(tmp_path):
    reference = tmp_path / "reference"
    run_workload(reference)  # uninterrupted
    want = json.loads((reference / "final.json").read_text())
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    run_dir = tmp_path / "killed"

    # 1: SIGKILL in the middle of a journal write (row written, commit not yet): the torn write must vanish
    crash_at = rng.randint(3, 12)
    first = _child(run_dir, crash_at=crash_at)
    assert first.wait(timeout=300) == -signal.SIGKILL, (seed, first.stderr.read()[-2000:])
    _integrity(run_dir)
    with Journal(run_dir) as j:
        before = j.dump()["records"]
    assert len(before) < crash_at, seed  # the torn record is not there

    # 2: SIGKILL at a random moment once it is working again
    paid_1 = _paid(run_dir)
    second = _child(run_dir, step_s=0.1)
    deadline = time.monotonic() + 300
    while lock_owner(run_dir) != second.pid and second.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, 1.0))
    os.killpg(second.pid, signal.SIGKILL)
    second.wait()
    _integrity(run_dir)
    with Journal(run_dir) as j:
        middle = j.dump()["records"]
    for key, value in before.items():  # nothing recorded is lost or changed
        assert middle[key] == value, (seed, key)
    assert not set(_recorded_answers(before)) & set(_paid(run_dir)[len(paid_1):]), seed

    # 3: resume to the end
    paid_2 = _paid(run_dir)
    run_workload(run_dir)
    assert json.loads((run_dir / "final.json").read_text()) == want, seed
    with Journal(run_dir) as j:
        after = j.dump()["records"]
    for key, value in middle.items():
        assert after[key] == value, (seed, key)
    with Journal(reference) as j:
        assert set(after) == set(j.dump()["records"]), seed
    # a recorded answer is replayed, never paid for again; every answer was paid for at some point
    assert not set(_recorded_answers(middle)) & set(_paid(run_dir)[len(paid_2):]), seed
    assert set(_paid(run_dir)) == set(_paid(reference)), seed
    assert len(_recorded_answers(after)) == len(_paid(reference)), seed


def _recorded_answers(records: dict) -> list[str]:
    return [data["answer"]["text"] for key, (kind, data) in records.items() if kind == "llm"]
