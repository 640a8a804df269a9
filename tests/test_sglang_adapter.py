"""The SGLang adapter's parts that need neither a GPU nor sglang: telemetry, switches, claims, the CLI guard."""

from __future__ import annotations

import gzip
import json

import torch

from kernelbot.agent.measure import served_fidelity
from kernelbot.agent.serve import served_init_args
from kernelbot.agent.tasks import skip_reason, task_for, write_task
from kernelbot.cli import main
from kernelbot.engine import telemetry
from kernelbot.engine.sglang_adapter import (
    Engagement,
    ServerConfig,
    ServingMetrics,
    compare,
    native_switches,
    trace_kernel_hits,
)
from kernelbot.records import Hotspot


def test_telemetry_is_absent_without_a_gpu_not_faked():
    snap = telemetry.snapshot()
    assert snap["available"] is False and snap["reason"]  # no NVML driver on this machine
    assert "gpus" not in snap


def test_throttle_reasons_decode():
    assert telemetry.decode_reasons(0x1) == ["gpu_idle"]
    assert telemetry.decode_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert telemetry.decode_reasons(0x10000) == ["unknown_0x10000"]


def test_native_switches_are_reported():
    cfg = ServerConfig(model_path="m", extra_args=["--enable-torch-compile"])
    notes = native_switches(cfg, {"SGLANG_FORCE_FUSED_OP_BACKEND": "torch"})
    assert len(notes) == 2 and "forward_native" in notes[0] and "SGLANG_FORCE_FUSED_OP_BACKEND=torch" in notes[1]
    assert native_switches(ServerConfig(model_path="m"), {}) == []


def _metrics(tput: float, rounds: list[float] | None = None) -> ServingMetrics:
    return ServingMetrics(source="t", requests=1, output_tokens=10, duration_s=1.0, output_throughput=tput,
                          mean_ttft_ms=1.0, median_ttft_ms=1.0, mean_itl_ms=2.0, median_itl_ms=2.0,
                          round_throughputs=rounds or [tput])


def test_no_gain_is_claimed_when_the_pack_did_not_engage():
    not_engaged = Engagement(engaged=False, per_rank={}, notes=["rank 0: the pack's kernels ran zero times"])
    out = compare(_metrics(100.0), _metrics(150.0), not_engaged, [])
    assert out["throughput_gain"] is None and "no gain is claimed" in out["notes"][-1]
    out = compare(_metrics(100.0), _metrics(150.0), Engagement(True, {}, []), [])
    assert out["throughput_gain"] == 1.5


def test_a_gain_inside_the_rounds_noise_says_so():
    engaged = Engagement(True, {}, [])
    apart = compare(_metrics(100.0, [96.0, 100.0, 103.0]), _metrics(120.0, [110.0, 120.0, 125.0]), engaged, [])
    assert apart["beyond_noise"] and not apart["notes"]
    overlap = compare(_metrics(100.0, [90.0, 100.0, 112.0]), _metrics(105.0, [95.0, 105.0, 110.0]), engaged, [])
    assert not overlap["beyond_noise"] and "within the rounds' noise" in overlap["notes"][0]


def _probe(ids: list[int], logprobs: list[float] | None = None) -> dict:
    return {"ids": ids, "logprobs": logprobs or [-1.0] * len(ids)}


def test_served_fidelity_compares_greedy_outputs():
    same = served_fidelity([_probe([5, 6, 7, 8])], [_probe([5, 6, 7, 8], [-1.0, -1.0, -1.001, -1.0])])
    assert same.greedy_match and same.token_agreement == 1.0 and abs(same.max_abs_logit_diff - 0.001) < 1e-9
    # after the first divergence the logprobs belong to different prefixes: not compared
    split = served_fidelity([_probe([5, 6, 7, 8])], [_probe([5, 9, 7, 8], [-1.0, -3.0, -9.0, -9.0])])
    assert not split.greedy_match and split.token_agreement == 0.25 and split.max_abs_logit_diff == 0.0
    varied = [_probe(list(range(20)))]
    collapsed = served_fidelity(varied, [_probe([0, 1] + [2] * 18)])
    assert collapsed.repetition_collapse and collapsed.distinct_3grams_after < 0.2
    assert not served_fidelity(varied, varied).repetition_collapse


def test_optimize_engine_sglang_bad_arguments_are_one_line(capsys):
    assert main(["optimize", "--engine", "sglang"]) == 2
    assert "needs --model" in capsys.readouterr().err
    assert main(["optimize", "--engine", "sglang", "--model", "m", "--launch-cmd", "x", "--llm", "openai/x"]) == 2
    assert "drop --llm" in capsys.readouterr().err
    assert main(["optimize", "--engine", "sglang", "--model", "m", "--launch-cmd", "x", "--concurrency", "0"]) == 2
    assert "--concurrency must be at least 1" in capsys.readouterr().err


def test_trace_kernel_hits_per_rank(tmp_path):
    for rank, n in ((0, 3), (1, 0)):
        events = [{"cat": "kernel", "name": "_rmsnorm_kernel", "ts": i} for i in range(n)]
        events += [{"cat": "kernel", "name": "RMSNormKernel<bf16>"}, {"cat": "cpu_op", "name": "_rmsnorm_kernel"}]
        with gzip.open(tmp_path / f"kernelbot-TP-{rank}.trace.json.gz", "wt") as f:
            json.dump({"traceEvents": events}, f)
    hits = trace_kernel_hits(sorted(tmp_path.glob("*.gz")), ["_rmsnorm_kernel"])
    assert hits == {"kernelbot-TP-0.trace.json.gz": 3, "kernelbot-TP-1.trace.json.gz": 0}


def test_optimize_engine_sglang_without_gpu_is_one_line(capsys):
    assert main(["optimize", "--engine", "sglang", "--model", "/models/llama"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a CUDA GPU" in err


def _rope_hotspot(dtype: str = "bfloat16") -> Hotspot:
    return Hotspot(id="h00", module_class="RotaryEmbedding", module_paths=["m"], family="rotary_embedding",
                   input_dims=[[6], [6, 512], [6, 128]], dtype=dtype, calls=1, total_us=10.0, share=0.5, flops=0.0,
                   bytes=0.0, floor_us=0.0, score_us=10.0)


def test_rotary_layer_arguments_come_from_the_config_as_sglang_builds_the_layer():
    llama = {"hidden_size": 512, "num_attention_heads": 8, "max_position_embeddings": 4096, "rope_theta": 500000.0}
    # the cache is fp32 on GPUs, the model's dtype on the CPU
    assert served_init_args("rotary_embedding", _rope_hotspot(), llama, "cuda") == [64, 64, 4096, 500000.0, True,
                                                                                     "float32"]
    assert served_init_args("rotary_embedding", _rope_hotspot(), llama, "cpu")[-1] == "bfloat16"
    partial = {**llama, "head_dim": 80, "partial_rotary_factor": 0.5}
    assert served_init_args("rotary_embedding", _rope_hotspot(), partial, "cuda")[:2] == [80, 40]
    scaled = {**llama, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    assert "scaled RoPE subclass" in served_init_args("rotary_embedding", _rope_hotspot(), scaled, "cuda")
    assert "does not give" in served_init_args("rotary_embedding", _rope_hotspot(), {"hidden_size": 512}, "cuda")


def test_a_rotary_task_draws_positions_inside_the_cache(tmp_path):
    from kernelbot.agent.verify.cases import inputs_at
    from kernelbot.agent.verify.run import load_reference

    hotspot = _rope_hotspot("float32")
    assert skip_reason(hotspot.model_copy(update={"input_dims": [[6]]}), 0.01) is not None  # no query, key
    task = task_for(hotspot, [64, 64, 32, 10000.0, True, "float32"])
    assert task.input_shapes == hotspot.input_dims and task.free_dims == [[0], [0], [0]]
    write_task(task, tmp_path)
    positions, query, key = inputs_at(load_reference(tmp_path / "reference.py"), task, seed=0)
    assert positions.dtype == torch.int64 and 0 <= int(positions.min()) and int(positions.max()) < 32
    assert [list(query.shape), list(key.shape)] == [[6, 512], [6, 128]] and query.dtype == torch.float32
