"""`kernelbot optimize --llm` end to end against a local OpenAI-compatible server, and its bad-input errors."""

from __future__ import annotations

import json

import pytest
from llm_scripted import Script, ScriptedServer, rmsnorm_conversation

from kernelbot.agent.llm.flags import llm_options
from kernelbot.agent.optimize import OptimizeOptions, optimize
from kernelbot.cli import build_parser, main

SECRET = "sk-kbtest-cli-0123456789abcdefSECRET"


@pytest.mark.parametrize("argv, message", [
    (["--api-base", "http://127.0.0.1:1/v1"], "--api-base needs --llm"),
    (["--llm", "openai/x", "--samples", "0"], "--samples must be at least 1"),
    (["--llm", "openai/x", "--max-cost", "-1"], "--max-cost must be positive"),
    (["--llm", "openai/x", "--llm-price", "cheap"], "--llm-price wants IN,OUT"),
    (["--llm", "openai/x", "--api-base", "localhost:30000"], "--api-base must be an http(s) URL"),
])
def test_bad_llm_flags_are_one_line_errors(argv, message, capsys, tmp_path):
    assert main(["optimize", "--run-dir", str(tmp_path / "r"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_optimize_with_a_local_llm_endpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    run_dir = tmp_path / "run"
    script = Script({"rmsnorm": rmsnorm_conversation()})
    with ScriptedServer(script) as server:
        args = build_parser().parse_args([
            "optimize", "--llm", "openai/kb-scripted-coder", "--api-base", server.api_base, "--samples", "1",
            "--repair-rounds", "2", "--max-tokens", "60000", "--max-cost", "0.5", "--llm-price", "1,2",
            "--max-llm-seconds", "900"])
        # min_share 0 and one task: RMSNorm's share of the micro model hovers near the default threshold; fp32, the
        # dtype the scripted kernels are written for, whatever this CPU would pick
        optimize(OptimizeOptions(model="llama-micro", dtype="float32", batch=4, prompt_len=8, decode_steps=4,
                                 run_dir=run_dir, e2e_rounds=3, compile=False, families=["rmsnorm"], min_share=0.0,
                                 max_tasks=1, llm=llm_options(args)))
    report = json.loads((run_dir / "report.json").read_text())
    llm = report["llm"]
    assert llm["calls"] >= 3 and llm["accepted"] >= 1 and llm["fallback"] == ""
    assert llm["prompt_tokens"] + llm["completion_tokens"] <= 60000 and llm["cost_usd"] <= 0.5 and llm["cost_known"]
    accepted = [k for k in report["kernels"] if k["status"] == "accepted"]
    assert accepted and all(k["candidate_id"].endswith("llm-r2-s0") and k["calls"] > 0 for k in accepted)
    assert report["fidelity"]["greedy_match"] is True or report["fidelity"]["within_noise"] is True
    assert len((run_dir / "llm" / "calls.jsonl").read_text().splitlines()) == llm["calls"]
    out = capsys.readouterr().out
    assert "LLM openai/kb-scripted-coder:" in out and SECRET not in out
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
