"""A pack kernel's gain alone beside its gain in the model: the saving its benchmark predicts against the gate's
leave-one-out measurement, judged only beyond the rounds' noise, and where they disagree, what the kernel's time a
call in the packed model's profile says of why."""

from __future__ import annotations

from pathlib import Path

from finished_run import fake_run

from kernelbot.agent.measure.alone_vs_model import alone_vs_model
from kernelbot.agent.report.report import render_markdown
from kernelbot.records import EndToEndTimes, Hotspot, KernelOutcome, KernelResult


def _row(cid: str, ref_us: float, kernel_us: float, calls: int) -> KernelResult:
    return KernelResult(op="gelu", module="GELUActivation", backend="cpp", shapes=[[8, 1, 512]], reason="verified",
                        speedup=ref_us / kernel_us, outcome=KernelOutcome.ACCEPTED, reference_us=ref_us,
                        time_us=kernel_us, calls=calls, candidate_id=cid)


def _times(pack_ms: float) -> EndToEndTimes:
    return EndToEndTimes(eager=[200.0] * 5, kernelbot=[pack_ms - 1, pack_ms, pack_ms, pack_ms + 1, pack_ms])


def _in_model(cid: str, us_a_call: float, calls: int) -> Hotspot:
    return Hotspot(id="h0", module_class="GELUActivation", module_paths=["m"], family=None, input_dims=[[8, 1, 512]],
                   dtype="bfloat16", calls=calls, total_us=us_a_call * calls, share=0.1,
                   kernel=cid.replace("/", "__"))


def test_a_kernel_whose_model_saving_matches_its_benchmark_agrees():
    rows = [_row("t1/cpp-0", 50.0, 10.0, 400)]  # predicts 16 ms a workload
    [c] = alone_vs_model(rows, {"t1/cpp-0": (_times(100.0), _times(115.0))}, [_in_model("t1/cpp-0", 11.0, 400)])
    assert c.predicted_ms == 16.0 and c.measured_ms == 15.0 and c.judged and not c.disagrees and c.cause == ""


def test_a_kernel_five_times_faster_alone_that_slows_the_model_is_flagged_with_its_calls_in_the_model():
    rows = [_row("t1/cpp-0", 50.0, 10.0, 400)]
    slow_in_model = _in_model("t1/cpp-0", 90.0, 400)  # 90 us a call in the model against 10 in its benchmark
    [c] = alone_vs_model(rows, {"t1/cpp-0": (_times(120.0), _times(100.0))}, [slow_in_model])
    assert c.disagrees and c.measured_ms == -20.0 and "90.0 us each in the model against 10.0 us" in c.cause
    [c] = alone_vs_model(rows, {"t1/cpp-0": (_times(120.0), _times(100.0))}, [_in_model("t1/cpp-0", 10.5, 400)])
    assert c.disagrees and "the rest of the model ran slower beside it" in c.cause


def test_a_kernel_the_model_runs_faster_than_its_benchmark_timed_it_says_the_benchmark_was_slow():
    rows = [_row("t1/cpp-0", 580.0, 490.0, 128)]  # predicts 11.5 ms; the model saved 50 ms at 135 us a call
    [c] = alone_vs_model(rows, {"t1/cpp-0": (_times(150.0), _times(100.0))}, [_in_model("t1/cpp-0", 135.0, 128)])
    assert c.disagrees and "135.0 us each in the model against 490.0 us in its benchmark" in c.cause
    assert "timed it slower than the model runs it" in c.cause


def test_savings_within_the_rounds_noise_get_no_verdict_and_the_report_shows_the_table(tmp_path: Path):
    rows = [_row("t1/cpp-0", 12.0, 10.0, 100)]  # predicts 0.2 ms of a 100 ms round
    [c] = alone_vs_model(rows, {"t1/cpp-0": (_times(100.0), _times(100.5))}, [])
    assert not c.judged and not c.disagrees and c.model_call_us is None
    text = render_markdown(fake_run(tmp_path).model_copy(update={"alone_vs_model": [c]}))
    assert "## Alone vs in the model" in text and "| t1/cpp-0 | 1.20x | 100 | 0.2 | 0.5 |" in text
    assert "within the rounds' noise" in text
