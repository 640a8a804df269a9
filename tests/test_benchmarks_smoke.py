"""Every script in benchmarks/ runs, at its smallest size, the way its docstring says to run it (`python
benchmarks/NAME.py ...`, which puts benchmarks/ first on the import path): what it prints is checked for shape,
never for speed (speed is what the scripts measure, not what a test may assert). gpu_check has tests of its own."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_engine import LIBRARY_NORM, _norm_pack
from test_rank import small_trace, write
from test_sglang_plugin import SGLANG_PY
from test_vllm_served import VLLM_PY

from kernelbot.engine import builtin_spec
from kernelbot.loading import load_module
from kernelbot.rundir import write_record

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
FAMILIES = ("rmsnorm", "linear", "gated_mlp", "silu_and_mul", "rotary_embedding")  # family_kernels.py's, in order


def _run(script: str, *args: str, cwd: Path, python: Path | str = sys.executable, timeout: float = 600,
         env: dict[str, str] | None = None) -> str:
    """The script's output; fails with its stderr's tail when it exits with an error."""
    done = subprocess.run([str(python), str(BENCHMARKS / script), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def _finished_run(run_dir: Path) -> Path:
    """A finished run's directory as end_to_end.py reads it: the model's spec and a one-kernel pack (the library's
    C++ RMSNorm at the micro model's decode shape)."""
    spec, _ = builtin_spec("llama-micro", dtype="float32", batch=2, prompt_len=5, decode_steps=3)
    (run_dir / "pack").mkdir(parents=True)
    write_record(run_dir / "model.json", spec)
    pack, pack_dir = _norm_pack(run_dir / "pack", LIBRARY_NORM, "float32", [2, 1, 128])
    write_record(pack_dir / "manifest.json", pack)
    return run_dir


def test_no_benchmark_script_takes_the_name_of_a_module_this_python_imports():
    # run as a script, benchmarks/kernels.py was imported by transformers as the `kernels` package
    taken = [p.name for p in sorted(BENCHMARKS.glob("*.py")) if importlib.util.find_spec(p.stem) is not None]
    assert taken == []


def test_end_to_end_retimes_a_finished_runs_pack(tmp_path):
    out = _run("end_to_end.py", str(_finished_run(tmp_path / "run")), "--rounds", "1", "--no-compile", cwd=tmp_path)
    assert "llama-micro float32, batch 2, 5+3 tokens; pack test (1 kernels); 1 interleaved rounds" in out
    assert [line.split()[0] for line in out.splitlines() if "median" in line] == ["eager", "kernelbot"]
    assert "host over the rounds: load average" in out


@pytest.mark.slow
def test_end_to_end_times_torch_compile_beside_the_pack(tmp_path):
    out = _run("end_to_end.py", str(_finished_run(tmp_path / "run")), "--rounds", "1", cwd=tmp_path)
    assert [line.split()[0] for line in out.splitlines() if "median" in line] == ["eager", "kernelbot", "compiled"]
    assert "kernelbot vs torch.compile:" in out


def test_end_to_end_without_a_finished_run_says_what_to_do(tmp_path, monkeypatch, capsys):
    script = load_module(BENCHMARKS / "end_to_end.py", "kb_bench_end_to_end")
    monkeypatch.setattr(sys, "argv", ["end_to_end.py", str(tmp_path / "no-run")])
    assert script.main() == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no finished run found; run `kernelbot optimize` first or pass RUN_DIR" in err


def test_family_kernels_times_each_family_once(tmp_path):
    out = _run("family_kernels.py", "--rounds", "1", cwd=tmp_path)
    assert [line.split()[0] for line in out.splitlines()] == list(FAMILIES)
    assert all("kernelbot cpp" in line or "no float32 C++ kernel" in line for line in out.splitlines())


def test_sandbox_overhead_runs_one_empty_job(tmp_path):
    out = _run("sandbox_overhead.py", "--jobs", "1", cwd=tmp_path)
    assert "protections (default runner):" in out and "bare python + torch" in out
    assert "overhead per candidate beyond starting Python with torch (sandboxed empty job):" in out


def test_rank_vs_hta_runs_on_a_small_trace_and_a_doubled_one(tmp_path):
    """HTA itself is not installed here (it pulls jupyterlab): a stand-in with its entry points takes its side, so
    what runs is the script and kernelbot's side of it, real."""
    (tmp_path / "trace").mkdir()
    trace = write(tmp_path / "trace" / "rank0.json.gz", small_trace())
    standin = tmp_path / "standin" / "hta"
    standin.mkdir(parents=True)
    (standin / "__init__.py").write_text("")
    (standin / "trace_analysis.py").write_text(
        "class TraceAnalysis:\n    def __init__(self, trace_dir):\n        self.trace_dir = trace_dir\n\n"
        "    def get_gpu_kernel_breakdown(self, visualize=False):\n        return None\n")
    env = {**os.environ, "PYTHONPATH": str(standin.parent)}
    out = _run("rank_vs_hta.py", str(trace), "--scale", "2", "--rounds", "1", cwd=tmp_path, env=env)
    assert "kernelbot scan:" in out
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["1x", "2x"]


@pytest.mark.slow
def test_verify_kernelbench_checks_one_problem(tmp_path, shared_data):
    out_file = tmp_path / "out.json"
    out = _run("verify_kernelbench.py", str(shared_data / "kernelbench" / "level1"), "--only", "19",
               "--out", str(out_file), cwd=tmp_path)
    rows = json.loads(out_file.read_text())
    assert [(r["problem"], r["as_expected"]) for r in rows] == [("19_ReLU", True)]
    assert "1 references:" in out


@pytest.mark.slow
def test_cluster_throughput_runs_one_candidate_on_one_worker(tmp_path):
    pytest.importorskip("ray")
    out = _run("cluster_throughput.py", "--candidates", "1", "--workers", "1", "--hidden", "128", cwd=tmp_path)
    assert "1 candidates of bench-rmsnorm-8x1x128 (float32, cpu)" in out
    assert "cluster, 1 worker" in out and "overhead per candidate (1 worker vs local):" in out


@pytest.mark.slow
@pytest.mark.skipif(not SGLANG_PY.exists(), reason=f"no SGLang test environment at {SGLANG_PY.parent.parent} "
                                                   "(create it with .ci/sglang_env.sh)")
def test_sglang_plugin_benchmark_calls_through_the_pack(tmp_path):
    out = _run("sglang_plugin.py", "--rounds", "1", "--iters", "2", cwd=tmp_path, python=SGLANG_PY)
    calls = json.loads(out.split("calls into the pack:", 1)[1])
    assert sorted(calls) == sorted(f"{f}_{rows}" for f in ("rmsnorm", "silu_and_mul", "rotary_embedding")
                                   for rows in (4, 32))
    assert all(n > 0 for n in calls.values())


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PY.exists(), reason=f"no vLLM engine environment at {VLLM_PY.parent.parent} "
                                                 "(create it with .ci/vllm_env.sh)")
def test_served_runs_its_smallest_loop_on_vllm(tmp_path):
    out = _run("served.py", "--smallest", "--rounds", "5", "--engine-python", str(VLLM_PY), "--out",
               str(tmp_path / "runs"), cwd=tmp_path, timeout=3600)
    rows = [line for line in out.splitlines() if line.startswith("| llama-micro |")]
    assert len(rows) == 1 and (tmp_path / "runs" / "llama-micro" / "report.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PY.exists(), reason=f"no vLLM engine environment at {VLLM_PY.parent.parent} "
                                                 "(create it with .ci/vllm_env.sh)")
def test_served_ceiling_measures_the_smallest_model_on_vllm(tmp_path):
    out = _run("served_ceiling.py", "--smallest", "--engine-python", str(VLLM_PY), cwd=tmp_path, python=VLLM_PY)
    rows = [line for line in out.splitlines() if line.startswith("| llama-micro |")]
    assert len(rows) == 1 and rows[0].count("|") == 12 and rows[0].endswith("x |")


@pytest.mark.slow
def test_architectures_runs_the_smallest_gpt2(tmp_path):
    out = _run("architectures.py", "--smallest", "--models", "gpt2", "--out", str(tmp_path / "runs"), cwd=tmp_path,
               timeout=1800)
    rows = [line for line in out.splitlines() if line.startswith("| gpt2 |")]
    assert len(rows) == 1 and rows[0].count("|") == 9 and "x |" in rows[0]
    assert (tmp_path / "runs" / "run-gpt2" / "report.json").exists()


@pytest.mark.slow
def test_real_scale_runs_its_smallest_in_process_row(tmp_path):
    out = _run("real_scale.py", "--smallest", "--engines", "in-process", "--out", str(tmp_path / "runs"),
               cwd=tmp_path, timeout=1800)
    rows = [line for line in out.splitlines() if line.startswith("| in-process |")]
    assert len(rows) == 1 and rows[0].count("|") == 13, rows
    assert (tmp_path / "runs" / "in-process" / "report.json").exists()


def test_real_scale_kernels_times_each_kernel_against_its_floor_at_the_smallest_sizes(tmp_path):
    out = _run("real_scale_kernels.py", "--smallest", cwd=tmp_path)
    rows = [line for line in out.splitlines() if line.startswith("| ") and "µs" not in line and "---" not in line]
    labels = {row.split(" | ")[0].removeprefix("| ") for row in rows}
    assert {"o_proj, decode", "gated MLP, prefill", "LM head, decode", "attention, prefill of 16"} <= labels, labels
    assert all(row.count("|") == 10 and row.rstrip().endswith("% |") for row in rows), rows
    assert "peaks" in out and "bfloat16 GEMM" in out and "host over the run" in out


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PY.exists(), reason=f"no vLLM engine environment at {VLLM_PY.parent.parent} "
                                                 "(create it with .ci/vllm_env.sh)")
def test_served_attention_times_vllms_kernel_beside_kernelbots_and_the_floor(tmp_path):
    out = _run("served_attention.py", "--smallest", cwd=tmp_path, python=VLLM_PY)
    rows = [line for line in out.splitlines() if line.startswith("| 256 |")]
    assert len(rows) == 1 and rows[0].count("|") == 10 and rows[0].rstrip().endswith("% |"), rows
    assert "host over the run" in out
