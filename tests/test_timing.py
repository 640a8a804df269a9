"""The timing protocol (agent/measure/timing.py) and the host's load beside it (hardware/host.py),
against the CPU clock."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from kernelbot import KernelbotError
from kernelbot.agent.measure.timing import WrongOutputError, compare, time_callable, time_once
from kernelbot.hardware import host
from kernelbot.hardware.device import DeviceChoice, GpuState, HostStopwatch, pick_device

CPU = pick_device("cpu")
SETS = [(0,), (1,), (2,)]


def doubled(k: int, out: Any) -> str | None:
    return None if out == 2 * SETS[k][0] else f"expected {2 * SETS[k][0]}, got {out}"


def test_a_callable_that_sleeps_a_known_time_is_measured_within_tolerance() -> None:
    def nap(x: int) -> int:
        time.sleep(0.02)
        return 2 * x

    timing = time_callable(nap, SETS, CPU, check=doubled, calls=5, warmup=1)
    # sleep never returns early; a busy host may wake it late, not by 15 ms at the median
    assert 20_000 <= timing.median_us < 35_000
    assert timing.p25_us <= timing.median_us <= timing.p75_us
    assert len(timing.per_call_us) == 5 and min(timing.per_call_us) == timing.min_us >= 20_000
    assert timing.clock == "perf_counter_ns" and timing.l2_flushed is False and timing.device == "cpu"
    assert 20.0 <= time_once(lambda: time.sleep(0.02), CPU) < 35.0


def test_a_callable_wrong_on_its_third_timed_call_is_caught() -> None:
    calls = []

    def wrong_on_third_timed(x: int) -> int:
        calls.append(x)
        return 2 * x + (1 if len(calls) == 2 + 3 else 0)  # 2 warm-up calls, then the third timed one

    with pytest.raises(WrongOutputError) as err:
        time_callable(wrong_on_third_timed, SETS, CPU, check=doubled, calls=6, warmup=2)
    assert err.value.call == "timed call 3" and err.value.input_set == (2 + 2) % len(SETS)
    assert "timed call 3 (input set 1): expected 2, got 3" in str(err.value)
    assert len(calls) == 5  # stopped at the wrong call


def test_each_call_gets_fresh_inputs_from_the_cycled_pool() -> None:
    seen: list[int] = []

    def record(x: int) -> int:
        seen.append(x)
        return 2 * x

    timing = time_callable(record, SETS, CPU, check=doubled, calls=7, warmup=2)
    assert len(seen) == 9
    assert all(a != b for a, b in zip(seen, seen[1:], strict=False))  # no call saw its predecessor's inputs
    assert set(seen) == {0, 1, 2}
    assert timing.input_order == seen[2:] and timing.input_sets == 3


def test_one_input_set_is_refused_because_calls_would_repeat_inputs() -> None:
    with pytest.raises(KernelbotError, match="at least 2 input sets"):
        time_callable(lambda x: 2 * x, [(1,)], CPU, check=lambda k, out: None)


def test_the_host_load_is_recorded_before_and_after() -> None:
    def spin(x: int) -> int:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.02:
            pass
        return 2 * x

    timing = time_callable(spin, SETS, CPU, check=doubled, calls=5, warmup=1)
    for telemetry in (timing.before, timing.after):
        load = telemetry.host
        assert load.load_1m is not None and load.load_1m >= 0 and load.cpu_count >= 1
        assert load.window_s is not None and load.window_s > 0
        assert load.own_cores is not None and load.others_cores is not None
        assert telemetry.gpu is None and telemetry.contended == load.contended
    # the timed window saw our own busy loop, counted as ours
    assert timing.after.host.own_cores > 0.1
    assert timing.contended == (timing.before.contended or timing.after.contended)


def test_contention_is_load_beyond_our_own_over_half_the_cores() -> None:
    assert not host.is_contended(3.0, 4, own_cores=1.0, others_cores=0.0)
    assert host.is_contended(3.5, 4, own_cores=1.0, others_cores=0.0)
    assert host.is_contended(0.0, 4, own_cores=0.0, others_cores=2.5)  # seen in the window, before the average
    assert not host.is_contended(None, 4, own_cores=None, others_cores=None)


def test_a_proc_stat_line_is_read_even_when_the_name_has_spaces_and_parentheses() -> None:
    fields = " ".join(str(i) for i in range(3, 20))  # state=3, ppid=4, ..., utime=14, stime=15
    assert host.read_stat(f"4242 (odd) name) {fields}") == ("odd) name", 4, 14 + 15)


def test_our_process_tree_holds_descendants_only() -> None:
    parents = {10: 1, 11: 10, 12: 11, 20: 1, 21: 20}
    assert host.own_tree(parents, 10) == {10, 11, 12}


def test_a_gain_is_claimed_only_beyond_the_measured_noise() -> None:
    def nap(seconds: float):
        def call(x: int) -> int:
            time.sleep(seconds)
            return 2 * x
        return call

    slow = time_callable(nap(0.03), SETS, CPU, check=doubled, calls=5, warmup=0)
    fast = time_callable(nap(0.01), SETS, CPU, check=doubled, calls=5, warmup=0)
    gain = compare(slow, fast)
    assert gain.speedup > 1.5 and gain.beyond_noise
    assert not compare(fast, slow).beyond_noise
    same = compare(slow, slow)
    assert same.speedup == 1.0 and not same.beyond_noise


def test_end_to_end_timing_keeps_its_rounds_in_ms_per_engine(tmp_path) -> None:
    from kernelbot.agent.measure.end_to_end import time_end_to_end
    from kernelbot.engine import TorchEngine
    from kernelbot.engine.models import resolve_spec
    from kernelbot.records import Pack

    spec, _ = resolve_spec("llama-micro", dtype="float32", batch=1, prompt_len=3, decode_steps=2)
    engine = TorchEngine(spec)
    engine.run_workload = lambda: (time.sleep(0.02), torch.zeros(3))[1]  # a workload of known length
    times = time_end_to_end(engine, Pack(version="empty", run_id="r", device="cpu", entries=[]), tmp_path, 3, None)
    assert len(times.eager) == len(times.kernelbot) == 3 and times.compiled == []
    assert all(20.0 <= t < 35.0 for t in times.eager + times.kernelbot)  # in ms
    assert times.host is not None and times.host.window_s is not None and times.host.window_s >= 0.1  # the rounds'


def test_the_packs_timed_rounds_are_held_and_a_later_change_of_answer_fails_fidelity(tmp_path) -> None:
    from kernelbot.agent.measure.end_to_end import time_end_to_end
    from kernelbot.engine import TorchEngine
    from kernelbot.engine.models import resolve_spec
    from kernelbot.records import Fidelity, Pack

    spec, _ = resolve_spec("llama-micro", dtype="float32", batch=1, prompt_len=3, decode_steps=2)
    engine = TorchEngine(spec)
    state = {"pack": False, "calls": 0}
    engine.apply_pack = lambda pack, pack_dir: state.update(pack=True)
    engine.remove_pack = lambda: state.update(pack=False)

    def workload() -> torch.Tensor:  # with the pack, right for two rounds (as many as a fidelity check runs)
        state["calls"] += state["pack"]
        return torch.tensor([5, 6, 8 if state["pack"] and state["calls"] > 2 else 7])

    engine.run_workload = workload
    times = time_end_to_end(engine, Pack(version="v", run_id="r", device="cpu", entries=[]), tmp_path, 4, None)
    assert (times.eager_rounds_differ, times.pack_rounds_differ) == ([], [2, 3])
    fid = Fidelity(max_abs_logit_diff=0.0, greedy_match=True, token_agreement=1.0)
    assert fid.passed and not fid.model_copy(update={"rounds_agree": False}).passed


def test_a_report_timed_on_a_busy_host_says_so_at_the_top(tmp_path) -> None:
    from finished_run import fake_run

    from kernelbot.agent.report.markdown import render_markdown
    from kernelbot.hardware.host import BusyProcess, HostLoad

    quiet = fake_run(tmp_path)
    assert "host was busy" not in render_markdown(quiet)
    busy = quiet.model_copy(update={"host": HostLoad(load_1m=3.1, cpu_count=2, others_cores=1.2, contended=True,
                                                     busiest=[BusyProcess(pid=7, name="cc1plus", cores=1.1)])})
    text = render_markdown(busy)
    banner = text.index("host was busy")
    assert banner < text.index("## End to end") and "cc1plus 1.1" in text[banner:banner + 300]


class StandInGpu(DeviceChoice):
    """A GPU as timing.py sees one, run on the host: counts L2 flushes, reports another process on the GPU."""

    flushes: list[int] = []

    @property
    def is_gpu(self) -> bool:
        return True

    @property
    def clock(self) -> str:
        return "device events"

    def synchronize(self) -> None:
        pass

    def l2_flusher(self):
        return lambda: self.flushes.append(len(self.flushes))

    def stopwatch(self):
        return HostStopwatch()

    def gpu_state(self, own_pids=()) -> GpuState:
        return GpuState(available=True, sm_clock_mhz=1980, other_processes=[4242])


def test_on_a_gpu_the_l2_is_flushed_before_every_timed_call_and_a_shared_gpu_is_contended() -> None:
    gpu = StandInGpu(kind="cuda", name="stand-in", reason="test", flushes=[])
    seen: list[int] = []

    def record(x: int) -> int:
        seen.append(len(gpu.flushes))  # flushes done before this call
        return 2 * x

    timing = time_callable(record, SETS, gpu, check=doubled, calls=4, warmup=2)
    assert seen == [0, 0, 1, 2, 3, 4]  # none before the warm-up calls, one before each timed call
    assert timing.l2_flushed and timing.clock == "device events"
    assert timing.before.gpu.sm_clock_mhz == 1980 and timing.contended
    assert any("other processes on the GPU: [4242]" in n for n in timing.after.notes)


def test_a_child_that_ended_inside_the_window_counts_as_our_own_work_not_contention() -> None:
    import subprocess
    import sys

    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    start = host.sample()
    child = subprocess.Popen([sys.executable, "-c", spin])  # CPU-bound, ended and waited for inside the window
    assert child.wait() == 0
    load = host.host_load(start)
    assert load.own_cores is not None and load.window_s is not None
    assert load.own_cores * load.window_s >= 0.4  # its CPU time is ours
    assert child.pid not in [b.pid for b in load.busiest]  # and not another process's (whatever else the host runs)


class MarkedStopwatch:
    """A stopwatch that notes its marks in a shared log and says 7 µs passed between them, as device events do."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def start(self) -> None:
        self.log.append("start")

    def stop(self) -> None:
        self.log.append("stop")

    def elapsed_ns(self) -> int:
        self.log.append("elapsed")
        return 7000


def test_one_timed_call_flushes_first_and_takes_the_devices_stopwatch_not_the_hosts_clock() -> None:
    from kernelbot.hardware.device import timed_call

    log: list[str] = []
    us, out = timed_call(lambda x: log.append("call") or 2 * x, [21], MarkedStopwatch(log), lambda: log.append("flush"))
    assert (us, out) == (7.0, 42)
    assert log == ["flush", "start", "call", "stop", "elapsed"]
    log.clear()
    assert timed_call(lambda: log.append("call") or 1, [], MarkedStopwatch(log)) == (7.0, 1)
    assert log == ["start", "call", "stop", "elapsed"]  # a CPU: nothing to flush


def test_the_benchmarks_timed_call_flushes_then_times_between_the_devices_stopwatch_marks() -> None:
    from types import SimpleNamespace

    from kernelbot.agent.verify import runner
    from kernelbot.hardware.device import timed_call

    log: list[str] = []
    fields = {name: (lambda *a, **k: None) for name in runner.Tools._fields}
    tools = runner.Tools(**{**fields, "timed_call": timed_call, "stopwatch": lambda: MarkedStopwatch(log),
                             "flush": lambda: log.append("flush")})
    watch = SimpleNamespace(tools=tools, setup=SimpleNamespace(device="cuda"))
    x = torch.ones(3)
    us, out = runner._op_timed_call(watch, lambda t: log.append("call") or t * 2, (x,), [(0, 1, 5.0)])
    assert us == 7.0 and out.tolist() == [2.0, 10.0, 2.0]  # the perturbation is in place before the call
    assert log == ["flush", "start", "call", "stop", "elapsed"]


def test_the_benchmark_records_the_gpus_state_beside_its_timings_and_nothing_on_a_cpu(monkeypatch) -> None:
    from kernelbot.agent.verify import bench

    throttled = GpuState(available=True, sm_clock_mhz=900, throttle_reasons=["hw_thermal_slowdown"], throttled=True)
    seen: list[int] = []
    monkeypatch.setattr(DeviceChoice, "gpu_state", lambda self, own=(): seen.append(self.index) or throttled)
    assert bench.gpu_state(None) is None and seen == []
    assert bench.gpu_state(3) == throttled and seen == [3]
