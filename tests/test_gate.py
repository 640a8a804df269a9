"""The never-slower gate (agent/measure/gate.py): kernels that win their own benchmark and lose in the model are
dropped, with the reason, from a pack that is not faster and, where trials are cheap, from one that is; a pack that
is not faster as a whole ships nothing; a served pack first loses the kernels the engine timed no faster than its own
op."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kernelbot.agent.measure.end_to_end import Measured
from kernelbot.agent.measure.gate import (
    TAKE_APART_S,
    engine_losers,
    faster,
    leave_one_out_s,
    never_slower,
    ratio,
    with_baselines_of,
)
from kernelbot.records import EndToEndTimes, Fidelity, KernelCalls, PluginReport

EAGER = [100.0, 103.0, 99.0, 101.0, 102.0, 100.0, 98.0]
FID = Fidelity(max_abs_logit_diff=0.0, greedy_match=True, token_agreement=1.0)


def _kernel(name: str, alone: float, in_model_ms: float) -> SimpleNamespace:
    """A kernel faster `alone` in its benchmark that changes the model's round by `in_model_ms`."""
    return SimpleNamespace(name=name, bench=SimpleNamespace(speedup=alone), in_model_ms=in_model_ms)


def _measured(kernels: list[SimpleNamespace]) -> Measured:
    change = sum(k.in_model_ms for k in kernels)
    pack = [e + change + (0.3 if i % 2 else -0.3) for i, e in enumerate(EAGER)]  # a little noise per round
    return Measured(calls={}, fallbacks={}, fidelity=FID, times=EndToEndTimes(eager=list(EAGER), kernelbot=pack))


def test_a_kernel_faster_alone_and_slower_in_the_model_is_dropped_with_the_reason():
    helps, hurts, small = _kernel("helps", 2.0, -12.0), _kernel("hurts", 1.6, +15.0), _kernel("small", 1.2, -1.0)
    trials: list[list[str]] = []
    again: list[list[str]] = []

    def trial(subset, fresh):
        (again if fresh else trials).append(sorted(k.name for k in subset))
        return _measured(subset)

    full = _measured([helps, hurts, small])
    assert not faster(full.times)  # together they lose: 104 ms against 100
    gated = never_slower([helps, hurts, small], full, trial)
    assert [k.name for k in gated.kept] == ["helps", "small"]
    (dropped, why), = gated.dropped
    assert dropped is hurts and why.startswith("faster alone (1.60x), slower in the model")
    assert faster(gated.measured.times) and ratio(gated.measured.times) > 1.1
    assert sorted(trials) == [["helps", "hurts"], ["helps", "small"], ["hurts", "small"]]  # leave one out, once
    assert again == [["helps", "small"]]  # the subset kept, timed again: the best of noisy trials is biased upward
    assert "timed again" in why


def test_the_rounds_that_decide_are_the_kept_subsets_own_not_the_luckiest_trials():
    a, b = _kernel("a", 1.5, +1.0), _kernel("b", 1.3, +2.0)

    def trial(subset, fresh):  # a trial that drew lucky rounds, undone when the subset is timed again
        lucky = [e - 10.0 for e in EAGER]
        measured = _measured(subset)
        return measured if fresh else measured.model_copy(update={"times": EndToEndTimes(eager=list(EAGER),
                                                                                          kernelbot=lucky)})

    gated = never_slower([a, b], _measured([a, b]), trial)
    assert gated.kept == []  # the lucky trial chose a subset; its own rounds showed it was not faster


def test_a_pack_that_is_not_faster_as_a_whole_ships_nothing_and_reports_the_baseline():
    a, b = _kernel("a", 1.5, +1.0), _kernel("b", 1.3, +2.0)
    gated = never_slower([a, b], _measured([a, b]), lambda subset, fresh: _measured(subset))
    assert gated.kept == [] and {k.name for k, _ in gated.dropped} == {"a", "b"}
    assert gated.measured.times.kernelbot == gated.measured.times.eager and ratio(gated.measured.times) == 1.0


def test_taking_a_pack_apart_costs_at_most_two_trials_a_kernel():
    kernels = [_kernel(f"k{i}", 1.5, +1.0) for i in range(6)]  # each a little slower in the model
    subsets: list[list[str]] = []

    def trial(subset, fresh):
        subsets.append([k.name for k in subset])
        return _measured(subset)

    gated = never_slower(kernels, _measured(kernels), trial)
    assert len(subsets) <= 2 * len(kernels) and gated.kept == []


def test_a_pack_faster_beyond_noise_is_left_alone():
    a = _kernel("a", 1.5, -20.0)
    measured = _measured([a])

    def no_trials(subset, fresh):
        raise AssertionError("a faster pack is not taken apart")

    gated = never_slower([a], measured, no_trials)
    assert gated.kept == [a] and gated.dropped == [] and gated.measured is measured


def test_a_kernel_that_hurts_a_faster_pack_is_dropped_where_trials_are_cheap():
    helps, hurts, small = _kernel("helps", 2.0, -30.0), _kernel("hurts", 3.5, +8.0), _kernel("small", 1.2, -1.0)
    full = _measured([helps, hurts, small])
    assert faster(full.times)  # 77 ms against 100: faster, and faster still without `hurts`
    gated = never_slower([helps, hurts, small], full, lambda subset, fresh: _measured(subset), take_apart_faster=True)
    assert [k.name for k in gated.kept] == ["helps", "small"]
    (dropped, why), = gated.dropped
    assert dropped is hurts and why.startswith("faster alone (3.50x), slower in the model: the pack was 1.29x")
    untouched = never_slower([helps, hurts, small], full, lambda subset, fresh: _measured(subset))
    assert untouched.kept == [helps, hurts, small] and untouched.measured is full  # served: left whole


def test_a_faster_pack_keeps_a_kernel_whose_absence_gains_only_noise_or_not_again():
    a, b, c = _kernel("a", 2.0, -30.0), _kernel("b", 1.5, +0.5), _kernel("c", 1.4, -1.0)
    gated = never_slower([a, b, c], _measured([a, b, c]), lambda subset, fresh: _measured(subset),
                         take_apart_faster=True)
    assert gated.kept == [a, b, c] and gated.dropped == []  # 0.5 ms of 70: under the bar

    hurts = _kernel("hurts", 1.5, +8.0)

    def lucky_once(subset, fresh):  # the trial without `hurts` drew lucky rounds; timed again, no gain
        return _measured(subset if not fresh else [*subset, hurts])

    gated = never_slower([a, hurts, c], _measured([a, hurts, c]), lucky_once, take_apart_faster=True)
    assert gated.kept == [a, hurts, c] and gated.dropped == []


def test_a_faster_pack_is_taken_apart_where_its_trials_take_seconds_and_not_where_they_take_many_minutes():
    toy = EndToEndTimes(eager=[123.0] * 5, kernelbot=[43.0] * 5)  # ms a workload: llama-tiny's
    real = EndToEndTimes(eager=[17000.0] * 5, kernelbot=[7000.0] * 5)  # a 0.5B model at 8 x 512 + 128 tokens
    assert leave_one_out_s(toy, kernels=6, rounds=5) == pytest.approx(4.98) and 4.98 <= TAKE_APART_S
    assert leave_one_out_s(real, kernels=7, rounds=5) == pytest.approx(840.0) and 840.0 > TAKE_APART_S


def _served(task: str, alone: float) -> SimpleNamespace:
    return SimpleNamespace(task=SimpleNamespace(id=task), candidate=SimpleNamespace(id="cpp-0"),
                           bench=SimpleNamespace(speedup=alone), entry_id=f"{task}__cpp-0")


def test_a_served_kernel_the_engine_timed_no_faster_or_switched_off_is_named_and_a_faster_one_kept():
    attention, linear, norm, untimed = (_served("h00", 7.4), _served("h01", 2.0), _served("h02", 1.5),
                                        _served("h03", 1.2))
    processes = [
        PluginReport(pid=1, rank=None, engine="vllm", custom={"h00__cpp-0": KernelCalls(calls=3, timed=0)}),
        PluginReport(pid=2, rank=None, engine="vllm", custom={
            "h00__cpp-0": KernelCalls(calls=9000, timed=16, kernel_us=401.0, engine_us=393.0),
            "h01__cpp-0": KernelCalls(calls=9000, timed=16, kernel_us=615.0, engine_us=750.0),
            "h02__cpp-0": KernelCalls(calls=40, timed=16, kernel_us=9.0, engine_us=8.0,
                                      disabled="slower in the engine"),
            "h03__cpp-0": KernelCalls(calls=10, timed=0)})]
    losers = dict((a.task.id, why) for a, why in engine_losers([attention, linear, norm, untimed], processes))
    assert set(losers) == {"h00", "h02"}
    assert "401.0 against the engine's own 393.0 us" in losers["h00"] and "7.40x" in losers["h00"]
    assert "switched off in the engine: slower in the engine" in losers["h02"]


def test_the_gates_last_trial_keeps_the_first_measurements_compile_rounds_and_says_so():
    first = Measured(calls={}, fallbacks={}, fidelity=FID,
                     times=EndToEndTimes(eager=[100.0] * 3, kernelbot=[40.0] * 3, compiled=[90.0] * 3))
    trial = Measured(calls={}, fallbacks={}, fidelity=FID, times=EndToEndTimes(eager=[101.0] * 3, kernelbot=[38.0] * 3))
    final = with_baselines_of(trial, first)
    assert final.times.compiled == [90.0] * 3 and final.times.kernelbot == [38.0] * 3
    assert any("two measurements" in n for n in final.notes)
    assert with_baselines_of(first, first) is first  # nothing dropped: the first measurement, as it was
