"""LLM calls through the journal, with the real litellm client against the local scripted server: a resumed run
replays every recorded answer instead of asking (and paying) again, and continues with new calls after them."""

from __future__ import annotations

from pathlib import Path

import pytest
from llm_scripted import Reply, Script, ScriptedServer

from kernelbot.agent.journal.db import Journal
from kernelbot.agent.llm.budget import Budget
from kernelbot.agent.llm.client import LLMClient
from kernelbot.agent.llm.llm_options import LLMOptions
from kernelbot.agent.llm.loop import LLMSession, run_task
from kernelbot.agent.llm.prompt import PromptContext
from kernelbot.agent.llm.replay import JournaledClient
from kernelbot.agent.tasks.references import write_task
from kernelbot.records import Device, Task

MODEL = "openai/kb-scripted-coder"
DEVICE = Device(kind="cpu", name="test cpu", threads=2, peak_gflops=100.0, peak_gbps=10.0, peaks_source="test")


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-kbtest-journal-0123456789")


def _session(run_dir: Path, journal: Journal, api_base: str, repair_rounds: int) -> tuple[LLMSession, JournaledClient]:
    opts = LLMOptions(model=MODEL, api_base=api_base, samples=2, repair_rounds=repair_rounds, backoff=0.01,
                      price=(1.0, 2.0), budget=Budget(max_answer_tokens=600))
    client = JournaledClient(LLMClient(MODEL, api_base, price=opts.price, backoff=0.01), journal)
    return LLMSession(opts, run_dir, lambda _: None, client=client), client


def _no_evaluation(*_: object) -> None:
    raise AssertionError("no answer has code, so nothing is evaluated")


def test_a_resumed_run_replays_recorded_answers_and_pays_only_for_new_ones(tmp_path):
    run_dir = tmp_path / "run"
    task = Task(id="h9-rmsnorm-replay-4x8x64", hotspot_id="h9", family="rmsnorm", module_class="LlamaRMSNorm",
                dtype="float32", input_shapes=[[4, 8, 64]], free_dims=[[0, 1]], init_args=[64, 1e-6], share=0.2,
                floor_us=0.4)
    task_dir = run_dir / "tasks" / task.id
    write_task(task, task_dir)
    # a different answer at every step, so a replayed answer cannot pass for a fresh one
    script = Script({"-replay-": [Reply(f"step {i}: no code, sorry") for i in range(4)]})
    ctx = PromptContext(DEVICE, "cpp")
    with ScriptedServer(script) as server:
        with Journal(run_dir) as journal:
            session, client = _session(run_dir, journal, server.api_base, repair_rounds=1)
            first = run_task(session, task, task_dir, ctx, _no_evaluation)
            usage_1 = session.finish().model_copy()
        assert len(script.requests) == 4 and client.paid == 4 and usage_1.calls == 4
        calls_1 = (run_dir / "llm" / "calls.jsonl").read_text()

        (run_dir / "llm" / "calls.jsonl").unlink()  # what optimize does on resume: the replay rewrites it
        with Journal(run_dir) as journal:  # resume: same options
            session, client = _session(run_dir, journal, server.api_base, repair_rounds=1)
            again = run_task(session, task, task_dir, ctx, _no_evaluation)
            usage_2 = session.finish()
        assert len(script.requests) == 4, "a recorded answer was asked for again"
        assert client.replayed == 4 and client.paid == 0
        assert [r.reason for r in again.rows] == [r.reason for r in first.rows]
        assert (usage_2.calls, usage_2.prompt_tokens, usage_2.completion_tokens, usage_2.cost_usd) == (
            usage_1.calls, usage_1.prompt_tokens, usage_1.completion_tokens, usage_1.cost_usd)
        assert (run_dir / "llm" / "calls.jsonl").read_text() == calls_1

        (run_dir / "llm" / "calls.jsonl").unlink()
        with Journal(run_dir) as journal:  # resumed with one more repair round: 4 replayed, 2 new
            session, client = _session(run_dir, journal, server.api_base, repair_rounds=2)
            more = run_task(session, task, task_dir, ctx, _no_evaluation)
        assert len(script.requests) == 6 and client.replayed == 4 and client.paid == 2
        assert [r.reason for r in more.rows[:4]] == [r.reason for r in first.rows]
        assert len(more.rows) == 6
