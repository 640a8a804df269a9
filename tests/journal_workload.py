"""A small run driven through optimize's own journal machinery (RunState.memo, the journaled evaluator, the journaled
LLM client), with a fake evaluator and a fake paid LLM, so tests can kill it anywhere and resume it in seconds.

python tests/journal_workload.py RUN_DIR  → RUN_DIR/final.json when it completes; RUN_DIR/paid.log gets one line per
answer the fake LLM was paid for."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from kernelbot.agent.journal.db import Journal
from kernelbot.agent.journal.run_state import Clock, RunState
from kernelbot.agent.llm.client import Answer
from kernelbot.agent.llm.replay import JournaledClient
from kernelbot.outcomes import Outcome, new_row
from kernelbot.records import Candidate, Task

CANDIDATES = 6
STEP_S = float(os.environ.get("KB_WORKLOAD_STEP_S", "0.02"))  # seconds per fake call or evaluation


class PaidLLM:
    model = "fake/paid"

    def __init__(self, log: Path) -> None:
        self.log = log

    def price_known(self) -> bool:
        return True

    def cost(self, p: int, c: int) -> tuple[float, float]:
        return (p + c) * 1e-6, True

    def complete(self, messages: list[dict[str, str]], max_tokens: int) -> Answer:
        time.sleep(STEP_S)
        text = hashlib.sha256(json.dumps(messages).encode()).hexdigest()
        with open(self.log, "a") as f:
            f.write(text + "\n")
        return Answer(text, 100, 50, 0.002, True, STEP_S, 1)


def fake_evaluate(task: Task, cand: Candidate, path: Path) -> Outcome:
    time.sleep(STEP_S)
    speedup = 1 + int(cand.source_hash[:4], 16) / 65536
    row = new_row(task, cand, reason=f"verified; {speedup:.3f}x").model_copy(update={"speedup": speedup})
    return Outcome(row, report=row.reason)


def main(run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with Journal(run_dir) as journal:
        state = RunState(journal, Clock(journal, None), None, "cpu:test")
        stage = state.memo("stage:profile", "stage", lambda: {"hotspots": [1, 2, 3], "t": 0})
        task = Task(id="t0", hotspot_id="h0", family="rmsnorm", module_class="RMSNorm", dtype="float32",
                    input_shapes=[[4, 8]], free_dims=[[0]], init_args=[8], share=0.5, floor_us=1.0)
        llm = JournaledClient(PaidLLM(run_dir / "paid.log"), journal)
        run = state.journaled(lambda c, p: fake_evaluate(task, c, p), task, {"share": 0.5})
        rows = []
        history = ""
        for i in range(CANDIDATES):
            answer = llm.complete([{"role": "user", "content": f"write kernel {i}; so far: {history}"}], 512)
            cand = Candidate(id=f"c{i}", task_id="t0", backend="cpp", proposer="llm:fake/paid", config={},
                             source_hash=answer.text[:16])
            path = run_dir / f"c{i}.py"
            path.write_text(f"# {answer.text}\n")
            out = run(cand, path)
            rows.append(out.row.model_dump())
            history += f"{cand.id}={out.row.speedup:.3f} "
        final = state.memo("stage:final", "stage", lambda: {"rows": rows, "stage": stage,
                                                           "best": max(r["speedup"] for r in rows)})
        (run_dir / "final.json").write_text(json.dumps(final, sort_keys=True))
        journal.set_meta("state", "done")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
