"""`kernelbot status RUN_DIR`: what a run is doing, read from its journal without disturbing it."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from kernelbot import KernelbotError
from kernelbot.agent.journal.db import Journal, lock_owner
from kernelbot.records import KernelOutcome, KernelResult


def _tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def run_status(run_dir: Path) -> dict[str, Any]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise KernelbotError(f"{run_dir}: no such run directory")
    try:
        journal = Journal(run_dir, readonly=True)
        try:
            state = journal.meta("state", "?")
            stage = journal.meta("stage", {}) or {}
            options = journal.meta("options", {}) or {}
            elapsed = float(journal.meta("elapsed_s", 0.0))
            sessions = int(journal.meta("sessions", 0))
            candidates = journal.records("candidate")
            llm = journal.records("llm")
            cluster = journal.meta("cluster")
        finally:
            journal.db.close()
    except sqlite3.DatabaseError as exc:
        raise KernelbotError(f"{run_dir}: the journal cannot be read ({exc})") from None
    owner = lock_owner(run_dir)
    if state == "running" and owner is None:
        state = "stopped (killed or crashed; continue with kernelbot optimize --resume)"
    rows = [c["row"] for _, c in candidates]
    faster = (KernelOutcome.ACCEPTED, KernelOutcome.FASTER, KernelOutcome.OUTPACED)
    accepted = sorted((r for r in rows if KernelResult.model_validate(r).outcome in faster),
                      key=lambda r: -(r.get("speedup") or 0))
    answers = [a["answer"] for _, a in llm]
    return {
        "run_dir": str(run_dir), "state": state, "pid": owner, "stage": stage, "sessions": sessions,
        "elapsed_s": elapsed, "budget_hours": options.get("budget_hours"),
        "candidates": len(rows), "verified": sum(1 for _, c in candidates if (c.get("verdict") or {}).get(
            "verdict") == "pass"),
        "faster": [{"candidate": r["candidate_id"], "speedup": r["speedup"]} for r in accepted[:5]],
        "llm": {"calls": len(answers), "tokens": sum(a["prompt_tokens"] + a["completion_tokens"] for a in answers),
                "cost_usd": round(sum(a["cost_usd"] for a in answers), 6)},
        "recent": _tail(run_dir / "log.txt", 5),
        "cluster": cluster,  # optimize --cluster: the queue and what each worker is doing (agent/cluster.py)
    }


def render_status(s: dict[str, Any]) -> str:
    stage = s["stage"]
    where = stage.get("stage", "starting")
    if "task" in stage:
        where += f" — task {stage['task']} ({stage.get('done', 0)} of {stage.get('planned', '?')} done)"
    budget = f" of {s['budget_hours']:.2f} h" if s["budget_hours"] else ""
    lines = [
        f"run       {s['run_dir']}",
        f"state     {s['state']}" + (f" (pid {s['pid']})" if s["pid"] else ""),
        f"stage     {where}, iteration {stage.get('iteration', 0) + 1}",
        f"time      {s['elapsed_s'] / 3600:.3f} h{budget}, {s['sessions']} session(s)",
        f"progress  {s['candidates']} candidates evaluated, {s['verified']} verified",
        f"spend     LLM {s['llm']['calls']} calls, {s['llm']['tokens']} tokens, ${s['llm']['cost_usd']:.4f}",
        "best      " + (", ".join(f"{b['candidate']} {b['speedup']:.2f}x" for b in s["faster"]) or "none yet"),
        *_cluster_lines(s.get("cluster")),
        f"log       tail -f {Path(s['run_dir']) / 'log.txt'}",
        *[f"          {line}" for line in s["recent"]],
    ]
    return "\n".join(lines)


def _cluster_lines(progress: dict[str, Any] | None) -> list[str]:
    """The cluster's queue and workers as the driver last recorded them (a run without --cluster has none)."""
    if not progress:
        return []
    from kernelbot.agent.journal.progress import ClusterProgress

    record = ClusterProgress.model_validate(progress)
    first, *rest = record.lines()
    age = time.time() - record.updated
    return [f"cluster   {first.removeprefix('cluster ')} ({age:.0f} s ago)", *[f"         {line}" for line in rest]]
