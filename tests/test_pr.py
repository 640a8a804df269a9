"""`kernelbot pr`: a branch adding the kernel pack, a patch series, and a description carrying the evidence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from finished_run import fake_run

from kernelbot.cli import main


def _repo(path: Path) -> Path:
    path.mkdir()
    for cmd in (["init", "-q", "-b", "main"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                                               "--allow-empty", "-m", "root"]):
        subprocess.run(["git", "-C", str(path), *cmd], check=True)
    return path


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def test_pr_branch_and_description_carry_the_evidence(tmp_path, capsys):
    run_dir = tmp_path / "run-42"
    fake_run(run_dir)
    repo = _repo(tmp_path / "repo")
    assert main(["pr", str(run_dir), "--repo", str(repo), "--no-open"]) == 0
    out = capsys.readouterr().out
    assert "branch       kernelbot/run-42" in out and str(run_dir / "pr" / "PR.md") in out
    assert _git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"  # the user's checkout is untouched
    files = _git(repo, "ls-tree", "-r", "--name-only", "kernelbot/run-42").split()
    assert "kernel_packs/run-42/manifest.json" in files and "kernel_packs/run-42/PR.md" in files
    assert any(f.endswith("h01-rmsnorm-4x1x128__llm-r0-s0/verdict.json") for f in files)
    assert list((run_dir / "pr" / "patches").glob("*.patch"))
    body = (run_dir / "pr" / "PR.md").read_text()
    assert body == _git(repo, "show", "kernelbot/run-42:kernel_packs/run-42/PR.md")
    for needle in (
            "h01", "share of profiled time 20.0%",  # the hotspot and its share
            "| race | pass | no overlapping writes", "- race: pass", "- out of bounds: pass",  # race / bounds
            "| sandbox_violation | pass |", "seed 424242", "3 input sets: observed; size 1; primes",
            "[1, 1, 128]", "relative L2 1e-05",  # shapes and tolerances
            "reference 10.00 µs (±4.0%)", "speedup 3.200x", "faster beyond noise: True",  # benchmark + noise
            "min 29.5 / max 31.0 ms",  # end-to-end noise
            "max |Δlogit| 2.00e-06", "greedy tokens identical: True", "passed: **True**",  # fidelity
            "LLM `openai/test-coder`", "1200 prompt + 800 completion tokens, $0.0028",  # provenance
            "built-in proposer", "failed race: program 1"):  # the built-in one, and a rejected candidate
        assert needle in body, needle
    # a second time: the branch exists, one line
    assert main(["pr", str(run_dir), "--repo", str(repo), "--no-open"]) == 2
    err = capsys.readouterr().err.strip()
    assert "already exists" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("case, message", [("no-run", "no such run directory"), ("no-repo", "not a git repository"),
                                           ("unfinished", "finish the run first")])
def test_pr_bad_input_is_one_line(tmp_path, capsys, case, message):
    run_dir = tmp_path / "run"
    if case != "no-run":
        fake_run(run_dir)
    if case == "unfinished":
        (run_dir / "report.json").unlink()
    repo = tmp_path / "plain"
    repo.mkdir()
    assert main(["pr", str(run_dir), "--repo", str(repo)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_pr_for_a_real_run_of_the_builtin_model(tmp_path):
    run_dir = tmp_path / "real"
    env_store = str(tmp_path / "store")
    proc = subprocess.run([sys.executable, "-m", "kernelbot.cli", "optimize", "--model", "llama-micro",
                           "--dtype", "float32", "--batch", "4", "--prompt-len", "8", "--decode-steps", "4",
                           "--families", "rmsnorm", "--no-compile",
                           "--rounds", "3", "--iterations", "2", "--store", env_store, "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((run_dir / "report.json").read_text())
    if not any(k["status"] == "accepted" for k in report["kernels"]):
        pytest.skip("no kernel beat the reference beyond noise on this machine in this run")
    repo = _repo(tmp_path / "repo")
    proc = subprocess.run([sys.executable, "-m", "kernelbot.cli", "pr", str(run_dir), "--repo", str(repo)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    body = (run_dir / "pr" / "PR.md").read_text()
    for needle in ("share of profiled time", "| correctness | pass |", "| race |", "| out_of_bounds |",
                   "tolerances (float32)", "faster beyond noise", "greedy tokens identical", "built-in proposer"):
        assert needle in body, needle
    assert "kernel_packs/real/PR.md" in _git(repo, "ls-tree", "-r", "--name-only", "kernelbot/real")
