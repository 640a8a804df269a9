"""The SGLang adapter's parts that need neither a GPU nor sglang: telemetry, switches, claims, the CLI guard."""

from __future__ import annotations

import gzip
import json

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


def _metrics(tput: float) -> ServingMetrics:
    return ServingMetrics(source="t", requests=1, output_tokens=10, duration_s=1.0, output_throughput=tput,
                          mean_ttft_ms=1.0, median_ttft_ms=1.0, mean_itl_ms=2.0, median_itl_ms=2.0)


def test_no_gain_is_claimed_when_the_pack_did_not_engage():
    not_engaged = Engagement(engaged=False, per_rank={}, notes=["rank 0: the pack's kernels ran zero times"])
    out = compare(_metrics(100.0), _metrics(150.0), not_engaged, [])
    assert out["throughput_gain"] is None and "no gain is claimed" in out["notes"][-1]
    out = compare(_metrics(100.0), _metrics(150.0), Engagement(True, {}, []), [])
    assert out["throughput_gain"] == 1.5


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
