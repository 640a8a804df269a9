"""A pack kernel's gain alone beside its gain in the model: the saving its benchmark predicts against the gate's
leave-one-out measurement (in-process), judged only beyond the rounds' noise, or against the profiles before and after
the pack (a pack the gate left whole), or against the plugin's timing of the kernel beside the engine's own op
(served); where they disagree, what the per-call times say of why."""

from __future__ import annotations

from pathlib import Path

from finished_run import fake_run

from kernelbot.agent.measure.alone_vs_model import alone_vs_engine, alone_vs_model, alone_vs_profiles
from kernelbot.agent.report.markdown import render_markdown
from kernelbot.records import (
    EndToEndTimes,
    Hotspot,
    InModelSource,
    KernelCalls,
    KernelOutcome,
    KernelResult,
    PluginReport,
)


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
    assert "## Alone vs in the model" in text and "| t1/cpp-0 | 1.20x | 100 | 0.2 | 0.5 | 12.0, 10.0 | —, — |" in text
    assert "within the rounds' noise" in text


def _process(pid: int, cid: str, calls: int, timed: int, kernel_us: float | None, engine_us: float | None
             ) -> PluginReport:
    return PluginReport(pid=pid, rank=None, engine="vllm", custom={cid: KernelCalls(
        calls=calls, timed=timed, kernel_us=kernel_us, engine_us=engine_us)})


def test_a_served_kernel_timed_against_a_slow_reference_is_flagged_with_the_engines_faster_op(tmp_path: Path):
    # as measured: 7.41x over the family's PyTorch reference (2625 us), 1.07x over vLLM's own kernel (393 us)
    rows = [_row("h00-paged/cpp-0", 2625.0, 354.1, 0)]
    processes = [_process(1, "h00-paged__cpp-0", 0, 0, None, None),
                 _process(2, "h00-paged__cpp-0", 66456, 16, 367.3, 393.1)]
    [c] = alone_vs_engine(rows, processes)
    assert c.source is InModelSource.ENGINE_TIMING and c.candidate_id == "h00-paged/cpp-0" and c.calls == 66456
    assert c.model_op_us == 393.1 and c.model_call_us == 367.3 and c.judged and c.disagrees
    assert "1.07x in the engine against 7.41x" in c.cause and "the engine runs a faster op" in c.cause
    assert "the kernel takes" not in c.cause  # its own time a call agrees with its benchmark's
    text = render_markdown(fake_run(tmp_path).model_copy(update={"alone_vs_model": [c]}))
    assert "| 2625.0, 354.1 | 393.1, 367.3 | engine timing | **disagree**" in text


def test_a_served_kernel_whose_gain_in_the_engine_matches_its_benchmark_agrees_and_untimed_ones_are_left_out():
    rows = [_row("t1/cpp-0", 40.0, 20.0, 0), _row("t2/cpp-0", 40.0, 20.0, 0)]
    processes = [_process(1, "t1__cpp-0", 1000, 16, 22.0, 41.0), _process(1, "t2__cpp-0", 1000, 0, None, None)]
    [c] = alone_vs_engine(rows, processes)
    assert c.candidate_id == "t1/cpp-0" and not c.disagrees and c.cause == "" and c.measured_ms == 19.0


def test_a_served_kernel_slower_in_the_engine_than_in_its_benchmark_says_so():
    rows = [_row("t1/cpp-0", 40.0, 10.0, 0)]
    [c] = alone_vs_engine(rows, [_process(1, "t1__cpp-0", 500, 16, 45.0, 40.0)])
    assert c.disagrees and c.measured_ms < 0 and "45.0 us a call in the engine against 10.0 us" in c.cause


def _profiled(hid: str, us_a_call: float, calls: int, kernel: str = "") -> Hotspot:
    return Hotspot(id=hid, module_class="LlamaRMSNorm", module_paths=["m"], family="rmsnorm",
                   input_dims=[[8, 512, 896]], dtype="bfloat16", calls=calls, total_us=us_a_call * calls, share=0.1,
                   kernel=kernel)


def test_a_pack_left_whole_gets_each_kernels_gain_from_the_profiles_before_and_after_it():
    # as measured on the Qwen2.5-0.5B shape: prefill attention 1.91x alone and 1.92x in the profiles (agree); a
    # prefill RMSNorm 3.87x alone, 10.2x in the profiles (eager's op in the model was slower than the benchmark's)
    rows = [_row("h03/cpp-2", 73625.1, 38570.7, 24).model_copy(update={"hotspot_id": "h03"}),
            _row("h05/cpp-1", 2664.6, 689.1, 49).model_copy(update={"hotspot_id": "h05"}),
            _row("h06/cpp-0", 45.0, 22.5, 6272).model_copy(update={"hotspot_id": "h06"}),
            _row("h07/cpp-0", 27.0, 22.5, 100).model_copy(update={"hotspot_id": "h07"})]
    before = [_profiled("h03", 75962.7, 24), _profiled("h05", 9558.3, 49), _profiled("h06", 65.1, 6272),
              _profiled("h07", 30.0, 100)]
    after = [_profiled("a0", 39486.5, 24, "h03__cpp-2"), _profiled("a1", 939.1, 49, "h05__cpp-1"),
             _profiled("a2", 31.1, 6272, "h06__cpp-0"), _profiled("a3", 40.0, 100, "h07__cpp-0")]
    found = {c.candidate_id: c for c in alone_vs_profiles(rows, before, after, skip={"h06/cpp-0"})}
    assert set(found) == {"h03/cpp-2", "h05/cpp-1", "h07/cpp-0"}  # h06's saving was measured by a gate trial
    attention, norm, slower = found["h03/cpp-2"], found["h05/cpp-1"], found["h07/cpp-0"]
    assert attention.source is InModelSource.PROFILES and not attention.disagrees and attention.model_op_us == 75962.7
    assert norm.disagrees and "10.18x in the model's profiles against 3.87x" in norm.cause
    assert "the op takes 9558.3 us a call in the model against the reference's 2664.6 us" in norm.cause
    assert not slower.disagrees and slower.measured_ms < 0  # 1.2x alone, 0.75x in the model: within 2x, yet slower
