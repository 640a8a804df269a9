"""The whole loop on the micro model (one family, to stay quick) and, marked slow, on the default."""

import json
import subprocess
import sys

import pytest

from kernelbot.agent.optimize import OptimizeOptions, optimize
from kernelbot.records import Pack, Verdict

REPORT_KEYS = {"run_id", "model", "device", "baseline_ms", "optimized_ms", "compiled_ms", "speedup", "fidelity",
               "kernels"}
KERNEL_KEYS = {"op", "module", "backend", "shapes", "status", "reason", "speedup", "calls"}


def _check_run(run_dir, report: dict) -> list[dict]:
    assert REPORT_KEYS <= set(report)
    assert {"max_abs_logit_diff", "greedy_match"} <= set(report["fidelity"])
    fid = report["fidelity"]
    # identical greedy tokens, or changes only where the pack moved logits less than the dtype's own error
    assert fid["greedy_match"] is True or fid["within_noise"] is True, fid
    assert fid["dtype_noise"] is not None and fid["pack_error"] <= max(2 * fid["dtype_noise"], 1e-3)
    assert report["kernels"] and all(KERNEL_KEYS <= set(k) for k in report["kernels"])
    for name in ("trace.json.gz", "trace_after.json.gz", "hotspots.json", "hotspots_after.json", "report.md",
                 "log.txt", "pack/manifest.json"):
        assert (run_dir / name).exists(), name
    pack = Pack.model_validate_json((run_dir / "pack" / "manifest.json").read_text())
    accepted = [k for k in report["kernels"] if k["status"] == "accepted"]
    assert len(pack.entries) == len(accepted)
    for k in accepted:
        task, cand = k["candidate_id"].split("/")
        verdict = Verdict.model_validate_json((run_dir / "tasks" / task / "candidates" / cand / "verdict.json")
                                              .read_text())
        assert verdict.verdict == "pass"
        assert k["calls"] > 0, f"{k['candidate_id']} accepted but never called"
        assert (run_dir / "tasks" / task / "reference.py").exists()
    for k in report["kernels"]:
        assert k["reason"], k
    return accepted


@pytest.mark.slow  # a full loop; the fast suite runs the loop in other tests
def test_optimize_micro_rmsnorm(tmp_path):
    run_dir = tmp_path / "run"
    report = optimize(OptimizeOptions(model="llama-micro", batch=4, prompt_len=8, decode_steps=4, run_dir=run_dir,
                                      e2e_rounds=3, bench_rounds=9, compile=False, families=["rmsnorm"]))
    data = json.loads((run_dir / "report.json").read_text())
    assert data["run_id"] == report.run_id == "run"
    accepted = _check_run(run_dir, data)
    assert {k["op"] for k in data["kernels"]} == {"rmsnorm"}
    assert {k["backend"] for k in data["kernels"]} == {"cpp"}  # a Triton kernel could not join a CPU pack
    assert data["compiled_ms"] is None
    if accepted:  # every timed round with the pack decoded the tokens of its first
        assert data["fidelity"]["rounds_agree"] is True
    # decode and prefill RMSNorm are separate tasks; at most one winner each
    assert len(accepted) <= 2
    # whatever the timings, the library's own kernels verify in the model's dtype (bf16 where the CPU has it)
    for task_dir in (run_dir / "tasks").iterdir():
        verdicts = [Verdict.model_validate_json((c / "verdict.json").read_text())
                    for c in (task_dir / "candidates").iterdir()]
        assert verdicts and all(v.verdict == "pass" for v in verdicts), (task_dir.name, [v.failed for v in verdicts])


@pytest.mark.slow
def test_optimize_default_from_the_command_line(tmp_path):
    run_dir = tmp_path / "default"
    proc = subprocess.run([sys.executable, "-m", "kernelbot.cli", "optimize", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((run_dir / "report.json").read_text())
    accepted = _check_run(run_dir, data)
    assert len(accepted) >= 2
    assert data["compiled_ms"] and data["baseline_ms"] and data["optimized_ms"]
    assert "kernelbot" in proc.stdout and "report" in proc.stdout
