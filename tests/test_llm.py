"""The LLM path: extraction, redaction, the litellm client against a local OpenAI-compatible server (retries,
fallback, cost), budgets, and the generate-verify-repair loop with the real verifier on real C kernels."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from llm_scripted import Reply, Script, ScriptedServer, fenced, kernel, rmsnorm_conversation

from kernelbot.agent.llm.budget import Budget, Ledger
from kernelbot.agent.llm.client import EndpointDown, LLMClient
from kernelbot.agent.llm.extract import extract_code
from kernelbot.agent.llm.llm_options import LLMOptions
from kernelbot.agent.llm.loop import LLMSession, run_task
from kernelbot.agent.llm.prompt import PromptContext, build_messages
from kernelbot.agent.llm.redact import MASK, redact
from kernelbot.agent.tasks.references import reference_source, write_task
from kernelbot.agent.verify.evaluate import evaluate
from kernelbot.records import Device, Task

SECRET = "sk-kbtest-0123456789abcdefSECRET"
MODEL = "openai/kb-scripted-coder"
DEVICE = Device(kind="cpu", name="test cpu", threads=2, peak_gflops=100.0, peak_gbps=10.0, peaks_source="test")


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


def _task(tmp_path: Path, name: str) -> tuple[Task, Path]:
    task = Task(id=f"h9-rmsnorm-{name}-4x8x64", hotspot_id="h9", family="rmsnorm", module_class="LlamaRMSNorm",
                dtype="float32", input_shapes=[[4, 8, 64]], free_dims=[[0, 1]], init_args=[64, 1e-6], share=0.2,
                floor_us=0.4)
    task_dir = tmp_path / "run" / "tasks" / task.id
    write_task(task, task_dir)
    return task, task_dir


def _session(tmp_path: Path, api_base: str, lines: list[str], **kw) -> LLMSession:
    budget = kw.pop("budget", Budget())
    opts = LLMOptions(model=MODEL, api_base=api_base, budget=budget, backoff=0.01, **kw)
    return LLMSession(opts, tmp_path / "run", lines.append)


def _run(session: LLMSession, task: Task, task_dir: Path):
    ctx = PromptContext(DEVICE, "cpp")
    ev = functools.partial(evaluate, task, task_dir, device="cpu", seed=0, timeout=120, bench_rounds=9)
    return run_task(session, task, task_dir, ctx, ev)


def _no_secret_under(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_the_prompt_shows_the_library_helpers_a_reference_imports_beside_it():
    task = Task(id="h3-decode_attention-2x5x128", hotspot_id="h3", family="decode_attention",
                module_class="LlamaAttention", dtype="float32",
                input_shapes=[[2, 5, 128], [1, 5, 32], [1, 5, 32], [2, 2, 11, 32], [2, 2, 11, 32]],
                free_dims=[[0, 1], [0, 1], [0, 1], [0, 2], [0, 2]], init_args=[128, 4, 2, 32, False, "float32"],
                share=0.3, floor_us=1.0)
    reference = reference_source(task)
    assert "causal_mask(" in reference and "def causal_mask" not in reference
    prompt = build_messages(task, reference, PromptContext(DEVICE, "cpp"), [])[1]["content"]
    shown = prompt.split("## Hardware")[0]
    assert "It imports `kernel_library/attention_reference.py`" in shown
    assert all(f"def {name}(" in shown for name in ("causal_mask", "rotate_half", "step_inputs"))
    twice = reference + "\nfrom kernelbot.kernel_library.attention_reference import step_inputs\n"
    prompt = build_messages(task, twice, PromptContext(DEVICE, "cpp"), [])[1]["content"]
    assert prompt.count("It imports `kernel_library/attention_reference.py`") == 1


# --- extraction -------------------------------------------------------------------------------------------

MODULE = ("import torch\nfrom torch import nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
          "        return x\n")


def test_extract_picks_the_last_modelnew_block_and_drops_prose():
    text = f"First try:\n```python\n{MODULE.replace('return x', 'return 1')}```\nBetter:\n```py\n{MODULE}```\nDone."
    assert extract_code(text).code == MODULE


def test_extract_joins_a_kernel_block_the_module_block_needs():
    kernels = "import triton\n\n\n@triton.jit\ndef _k(x):\n    pass\n"
    module = "class ModelNew:\n    def forward(self, x):\n        _k[(1,)](x)\n        return x\n"
    code = extract_code(f"Kernel:\n```python\n{kernels}```\nModule:\n```python\n{module}```").code
    assert code is not None and code.index("def _k") < code.index("class ModelNew")


def test_extract_without_fences_and_with_trailing_prose():
    code = extract_code(f"Sure! Here it is.\n\n{MODULE}\nThis version fuses the loops.\n").code
    assert code is not None and code.startswith("import torch") and "fuses" not in code
    compile(code, "c", "exec")


def test_extract_unclosed_fence_and_failures():
    assert extract_code(f"```python\n{MODULE}").code == MODULE  # answer cut off at max_tokens
    assert extract_code("I cannot help with that.").code is None
    assert "none in Python" in extract_code("```cpp\nint main() {}\n```").problem
    assert "ModelNew" in extract_code("```python\nimport torch\nx = 1\n```").problem
    assert extract_code("").problem == "empty answer"


# --- redaction and keys -----------------------------------------------------------------------------------

def test_redact_masks_env_values_and_key_shapes(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-abcdefgh-1234")
    data = {"a": f"key {SECRET} here", "b": ["Authorization: Bearer abc.def-ghi_123", "tok-abcdefgh-1234"],
            "c": "hf_" + "x" * 30, "n": 3}
    out = redact(data)
    assert SECRET not in json.dumps(out) and "tok-abcdefgh-1234" not in json.dumps(out)
    assert "abc.def-ghi_123" not in out["b"][0] and out["c"] == MASK and out["n"] == 3
    assert redact("sorted(xs, key=lambda v: v)  # max_tokens=4096") == "sorted(xs, key=lambda v: v)  # max_tokens=4096"


def test_keys_never_reach_the_sandbox():
    from kernelbot.sandbox.runner import child_env

    assert "OPENAI_API_KEY" not in child_env() and SECRET not in json.dumps(child_env())


# --- the client against a local OpenAI-compatible server --------------------------------------------------

def test_rate_limit_then_success_and_the_key_reaches_the_endpoint():
    script = Script({"t": [[Reply('{"error": {"message": "slow down"}}', 429, {"retry-after": "0"}),
                            Reply("hello")]]})
    with ScriptedServer(script) as server:
        client = LLMClient(MODEL, server.api_base, backoff=0.01, max_retries=3)
        answer = client.complete([{"role": "user", "content": "Task id: t-1"}], 64)
    assert answer.text == "hello" and answer.attempts == 2 and not answer.error
    assert len(script.requests) == 2 and script.requests[-1]["authorization"] == f"Bearer {SECRET}"
    assert answer.prompt_tokens > 0 and answer.completion_tokens == len("hello") // 4


def test_server_error_storm_raises_endpoint_down_after_retries():
    script = Script({"t": [Reply('{"error": {"message": "overloaded"}}', 500)]})
    with ScriptedServer(script) as server:
        client = LLMClient(MODEL, server.api_base, backoff=0.01, max_retries=2)
        with pytest.raises(EndpointDown, match="3 tries"):
            client.complete([{"role": "user", "content": "Task id: t-1"}], 64)
    assert len(script.requests) == 3


def test_a_malformed_response_is_a_failed_request_not_a_crash():
    script = Script({"t": [Reply("<html>this is not a chat completion</html>", raw=True)]})
    with ScriptedServer(script) as server:
        client = LLMClient(MODEL, server.api_base, backoff=0.01, max_retries=0)
        answer = client.complete([{"role": "user", "content": "Task id: t-1"}], 64)
    assert answer.text == "" and answer.error and answer.attempts == 1


def test_cost_from_litellm_price_table_and_unknown_price():
    client = LLMClient(MODEL, "http://127.0.0.1:9/v1")
    assert client.cost(1000, 1000) == (0.0, False)  # no price known for a self-hosted model
    client.litellm.register_model({"openai/kb-priced-coder": {
        "input_cost_per_token": 2e-6, "output_cost_per_token": 8e-6, "litellm_provider": "openai", "mode": "chat"}})
    priced = LLMClient("openai/kb-priced-coder", "http://127.0.0.1:9/v1")
    cost, known = priced.cost(1000, 500)
    assert known and cost == pytest.approx(1000 * 2e-6 + 500 * 8e-6)
    assert LLMClient(MODEL, "http://127.0.0.1:9/v1", price=(1.0, 3.0)).cost(10**6, 10**6) == (4.0, True)


# --- budgets ----------------------------------------------------------------------------------------------

def test_ledger_stops_before_a_call_could_overspend():
    ledger = Ledger(Budget(max_tokens=3000, max_cost=0.01, max_calls_per_task=2, max_answer_tokens=1000))
    assert ledger.answer_tokens(3000) == 1000 and ledger.stop_reason(3000, 0.004) is None
    ledger.charge("t", 1800, 0.007)
    assert ledger.answer_tokens(300) == 1000 and "cost budget" in ledger.stop_reason(300, 0.004)
    assert "token budget" in ledger.stop_reason(3000, 0.0)  # 1800 + 1000 prompt leaves < 512 for an answer
    ledger.charge("t", 0, 0.0)
    assert "per-task cap" in ledger.task_capped("t") and ledger.task_capped("u") is None
    assert "wall-time" in Ledger(Budget(max_seconds=1e-9)).stop_reason(0, 0.0)


# --- the loop, with the real verifier on real C kernels ---------------------------------------------------

@pytest.mark.slow  # 40 s: three verifications and a benchmark; the loop's other cases stay fast
def test_repair_loop_ends_with_the_correct_kernel_and_records_both_failures(tmp_path):
    task, task_dir = _task(tmp_path, "repair")
    script = Script({"-repair-": rmsnorm_conversation()})
    lines: list[str] = []
    with ScriptedServer(script) as server:
        session = _session(tmp_path, server.api_base, lines, samples=1, repair_rounds=2, price=(1.0, 2.0))
        run = _run(session, task, task_dir)
        usage = session.finish()
    reasons = [r.reason for r in run.rows]
    assert [r.candidate_id.split("/")[1] for r in run.rows] == ["llm-r0-s0", "llm-r1-s0", "llm-r2-s0"]
    assert reasons[0].startswith("failed compile") and "gcc failed" in reasons[0]
    assert reasons[1].startswith("failed correctness")
    assert run.best is not None and run.best.candidate.id == "llm-r2-s0" and run.verified == ["llm-r2-s0"]
    assert [r.status for r in run.rows] == ["rejected", "rejected", "accepted"]
    # each repair prompt carried the reports of the attempts before it
    steps = [r["step"] for r in script.requests]
    assert steps == [0, 1, 2]
    assert "compile" in script.requests[1]["prompt"] and "error: expected" in script.requests[1]["prompt"]
    assert "correctness" in script.requests[2]["prompt"] and "rel L2 error" in script.requests[2]["prompt"]
    # provenance: every call with prompt, answer, tokens, cost, latency and its candidate
    calls = [json.loads(p.read_text()) for p in sorted((task_dir / "llm").glob("c*.json"))]
    assert len(calls) == 3 and all(c["answer"] and c["messages"] and c["prompt_tokens"] > 0 for c in calls)
    assert calls[2]["candidate_id"] == f"{task.id}/llm-r2-s0" and calls[0]["outcome"].startswith("failed compile")
    expected = sum(c["prompt_tokens"] * 1e-6 + c["completion_tokens"] * 2e-6 for c in calls)
    assert usage.cost_usd == pytest.approx(expected) and usage.cost_known and usage.calls == 3
    assert len((tmp_path / "run" / "llm" / "calls.jsonl").read_text().splitlines()) == 3
    assert json.loads((task_dir / "candidates" / "llm-r2-s0" / "candidate.json").read_text())["proposer"] == \
        f"llm:{MODEL}"
    _no_secret_under(tmp_path)


def test_no_code_answer_and_a_cheating_kernel_are_failed_attempts(tmp_path):
    task, task_dir = _task(tmp_path, "cheat")
    echo = f"I would rather not write code. (Your key is {SECRET}; header Bearer {SECRET}.)"
    script = Script({"-cheat-": [Reply(echo), Reply(fenced(kernel("rmsnorm_cheat"), "Fast path: reuse the input."))]})
    lines: list[str] = []
    with ScriptedServer(script) as server:
        session = _session(tmp_path, server.api_base, lines, samples=1, repair_rounds=1)
        run = _run(session, task, task_dir)
        usage = session.finish()
    assert run.best is None and len(run.rows) == 2
    assert run.rows[0].reason.startswith("LLM answer unusable") and run.rows[0].status == "rejected"
    verdict = json.loads((task_dir / "candidates" / "llm-r1-s0" / "verdict.json").read_text())
    assert verdict["verdict"] == "fail" and "input_mutation" in verdict["failed"]
    assert run.rows[1].reason.startswith("failed ")
    assert "no candidate" in script.requests[1]["prompt"]
    assert not usage.cost_known and usage.cost_usd == 0.0  # self-hosted model, no price: recorded as $0
    assert MASK in (task_dir / "llm" / "c0001.json").read_text()
    _no_secret_under(tmp_path)
    assert not any(SECRET in line for line in lines)


def test_token_budget_stops_the_loop_and_is_respected(tmp_path):
    task, task_dir = _task(tmp_path, "budget")
    script = Script({"-budget-": [Reply("no code, sorry")]})
    with ScriptedServer(script) as server:
        session = _session(tmp_path, server.api_base, [], samples=2, repair_rounds=5,
                           budget=Budget(max_tokens=9000, max_answer_tokens=1000))
        run = _run(session, task, task_dir)
        usage = session.finish()
    assert usage.stop_reason.startswith("token budget") and not session.active
    assert 1 <= usage.calls < 12 and usage.prompt_tokens + usage.completion_tokens <= 9000
    assert len(run.rows) == usage.calls


def test_endpoint_down_falls_back_to_the_builtin_proposer(tmp_path, monkeypatch):
    from kernelbot.agent import generate
    from kernelbot.agent.journal.db import Journal
    from kernelbot.agent.journal.run_state import Clock, RunState
    from kernelbot.agent.optimize import OptimizeOptions
    from kernelbot.agent.stages import Stages

    task, task_dir = _task(tmp_path, "down")
    fallback: list[str] = []
    monkeypatch.setattr(generate, "try_candidates",
                        lambda task, *a, **k: (fallback.append(task.id), generate.Tried([], None))[1])
    script = Script({"-down-": [Reply('{"error": {"message": "internal"}}', 500)]})
    with ScriptedServer(script) as server, Journal(tmp_path / "run") as journal:
        llm = LLMOptions(model=MODEL, api_base=server.api_base, max_retries=2, backoff=0.01)
        stages = Stages(__import__("rich.console").console.Console(quiet=True), tmp_path / "run")
        state = RunState(journal, Clock(journal, None), None, "")
        generation = generate.Generation(OptimizeOptions(llm=llm), tmp_path / "run", state, stages, DEVICE)
        generated = generation.generate([task], [], {})
    kernels, accepted, usage, notes = generated.rows, generated.accepted, generated.usage, generated.notes
    assert fallback == [task.id] and kernels == [] and accepted == []
    assert usage is not None and usage.fallback.startswith("endpoint down") and usage.failed_calls == 1
    assert len(script.requests) == 3
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "is down" in log and "built-in proposer takes over" in log
    assert any("built-in proposer" in n for n in notes)
