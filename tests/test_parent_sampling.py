"""CPU samples taken and attributed by a process other than the one sampled (sampling.py, parent_sampling.py): the
harness samples its runner's threads from outside, follows threads started meanwhile, and counts a Triton launch window
the runner reported only inside the calls it sampled and only for code a launch runs. The end-to-end cases (an honest
C++ kernel, a forged launch window, a raw write into the runner's tools) are in test_verify_round4.py and
test_anticheat.py."""

import os
import select
import subprocess
import sys

import pytest
import torch

from kernelbot.agent.verify import parent_sampling, sampling
from kernelbot.agent.verify.messages import Profile, TritonLaunch

# A process of its own: sorts with numpy (numpy's own code, `other`) on its main thread or on a thread it starts,
# between a "go" and a "done" line, then waits to be told to exit.
CHILD = """
import sys, threading, time
import numpy as np

data = np.random.default_rng(0).random(1 << 16)


def work():
    end = time.perf_counter() + 0.2
    while time.perf_counter() < end:
        np.sort(data)


print("ready", flush=True)
sys.stdin.readline()
if sys.argv[1] == "main":
    work()
else:
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
print("done", flush=True)
sys.stdin.readline()
"""


def _sampled_child(mode: str, poll: bool) -> tuple[dict, set[int]]:
    """The child's work, sampled from this process (polled while it runs, or not at all): what was measured, and the
    threads the sampler followed beyond those it opened on."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None and child.stdin is not None
    child.stdout.readline()

    followed: set[int] = set()

    def run(sampler: sampling.Sampler) -> int:
        opened = set(sampler.events)
        sampler.enable()
        child.stdin.write("go\n")
        child.stdin.flush()
        while poll and not select.select([child.stdout], [], [], 0.005)[0]:
            sampler.poll()
        child.stdout.readline()
        sampler.disable()
        followed.update(set(sampler.events) - opened)
        return 1

    try:
        return sampling.measure(child.pid, run, (), ()), followed
    finally:
        child.stdin.write("end\n")
        child.stdin.close()
        child.wait(timeout=30)


def _perf_or_skip() -> None:
    probe = sampling.Sampler(os.getpid())
    if not probe.open():
        pytest.skip(f"perf events unavailable here: {probe.problem}")
    probe.close()


def test_another_processs_threads_are_sampled_from_outside_and_placed_by_their_code():
    _perf_or_skip()
    found, _ = _sampled_child("main", poll=True)
    places, total = found["places"], sum(found["places"].values())
    assert total >= 100  # 0.2 s of CPU, one sample per 50 µs
    assert places["other"] >= 0.6 * total and places["own"] == places["torch"] == 0, places


@pytest.mark.parametrize("poll", [True, False], ids=["followed", "never_followed"])
def test_a_thread_started_during_the_pass_counts_as_the_library_it_ran_not_as_nobodys(poll):
    """Followed from the first look at /proc/<pid>/task after it started; or, where the sampler never looked while it
    ran, its CPU (the process's clock beyond the followed threads') is counted as `other`."""
    _perf_or_skip()
    found, followed = _sampled_child("thread", poll=poll)
    places, total = found["places"], sum(found["places"].values())
    assert total >= 100 and places["other"] >= 0.6 * total, places
    assert len(followed) == poll  # the worker, found while it ran; or never looked for


def test_a_launch_window_makes_only_code_a_launch_runs_the_candidates_own():
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    numpy_code = os.path.join(sampling.interpreter_dirs()[0], "_core", "_multiarray_umath.so")
    maps = [(0x1000, 0x2000, torch_lib), (0x2000, 0x3000, numpy_code), (0x3000, 0x4000, "/usr/lib/libpython3.11.so"),
            (0x4000, 0x5000, "/usr/lib/x86_64-linux-gnu/libopenblas.so")]
    samples = [(address + 8, 7, 150) for address in (0x1000, 0x2000, 0x3000, 0x4000)]
    inside = sampling.places(samples, [maps], (), (), windows=[(7, 100, 200)])
    # numpy and the interpreter; never torch (with no native code of its own: the interpreter's copies, nobody's)
    assert inside == {"own": 2, "torch": 0, "other": 1, "neutral": 1}
    outside = sampling.places(samples, [maps], (), (), windows=[(8, 100, 200), (7, 160, 200)])
    assert outside == {"own": 0, "torch": 1, "other": 2, "neutral": 1}
    # a candidate with native code of its own (a .so under its box) could call torch's kernels beneath the dispatcher
    native = sampling.places([*samples, (0x5008, 7, 150)], [[*maps, (0x5000, 0x6000, "/box/k.so")]], ("/box/",), (),
                             windows=[(7, 100, 200)])
    assert native == {"own": 3, "torch": 1, "other": 1, "neutral": 0}


def test_the_op_log_leaves_out_only_the_interpreters_copies_inside_a_launch():
    """A window is the runner's word: a softmax inside one (a forged launch event around torch's op) still counts as
    PyTorch's work; the copies Triton's interpreter makes of a launch's arguments do not."""
    from kernelbot.agent.verify.probes import SENTINEL_SHAPE, _outside_launches, work_from_events

    events = [(1, 110, 120, "aten::copy_", [[64, 64], [64, 64]], 0), (1, 130, 150, "aten::_softmax", [[64, 64]], 0),
              (1, 300, 310, "aten::bitwise_xor", [SENTINEL_SHAPE, SENTINEL_SHAPE], 0)]
    kept = _outside_launches(events, 99, [(99, 0, 0, 100, 200)])
    assert [e[3] for e in kept] == ["aten::_softmax", "aten::bitwise_xor"]
    assert work_from_events(kept).compute == {"_softmax": 4096.0}


def test_launch_windows_outside_the_sampled_calls_or_over_each_other_are_dropped_and_reported():
    reported = [(7, 150, 160), (7, 50, 60), (7, 155, 170), (8, 110, 120), (7, 190, 260)]
    kept, problems = sampling.checked_windows(reported, spans=[(100, 200)], seen={7})
    assert kept == [(7, 150, 160)]  # thread 8 was never sampled: its window explains no sample
    assert len(problems) == 1 and "launch windows were forged" in problems[0]
    assert sampling.checked_windows([(7, 150, 160), (7, 170, 180)], [(100, 200)], {7}) == (
        [(7, 150, 160), (7, 170, 180)], [])


def test_code_mapped_over_another_librarys_range_during_the_pass_is_no_ones_own():
    before = [(0x1000, 0x2000, "/opt/torch/lib/libtorch_cpu.so")]
    after = [(0x1000, 0x2000, "/box/mine.so")]
    counts = sampling.places([(0x1800, 1, 5)], [before, after], ("/box/",), ())
    assert counts["other"] == 1 and counts["own"] == 0
    assert sampling.places([(0x1800, 1, 5)], [after, after], ("/box/",), ())["own"] == 1


def test_what_a_runner_replies_about_sampling_is_replaced_by_what_the_harness_measured():
    forged = Profile(places={"own": 900, "torch": 0, "other": 0, "neutral": 0}, calls=1000, period_ns=50_000,
                     intact=True, own_kernels=["mine.kernel"])
    measured = {"places": {"own": 3, "torch": 200, "other": 0, "neutral": 40}, "calls": 12, "period_ns": 50_000}
    parent_sampling.Sampled(fields=measured).into(forged)
    assert (forged.places, forged.calls, forged.period_ns) == (measured["places"], 12, 50_000)
    assert forged.own_kernels == ["mine.kernel"]  # the op log's findings are the runner's still
    unsampled = Profile(places={"own": 900}, calls=5, period_ns=1)
    parent_sampling.Sampled().into(unsampled)  # a GPU job: nothing sampled, nothing taken from the runner
    assert (unsampled.places, unsampled.calls, unsampled.problem) == ({}, 0, None)


def test_a_sampling_mark_out_of_order_breaks_the_channels_protocol():
    watcher = parent_sampling.Watcher(sampling.Sampler(os.getpid()))
    with pytest.raises(ValueError, match="out of order"):
        watcher.mark("end")
    watcher.mark("start")
    with pytest.raises(ValueError, match="out of order"):
        watcher.mark("start")
    watcher.mark("end")
    assert watcher.phase == "done" and len(watcher.sampler.spans) == 1


def test_a_runner_the_harness_cannot_sample_while_it_samples_itself_is_tampering():
    _perf_or_skip()
    assert "made unreadable" in parent_sampling._refused("perf events unavailable (Permission denied)")[0]


def test_program_orders_varied_before_any_launch_was_streamed_are_tampering():
    """Launch windows forged in the runner's own list steer it to vary program orders instead of thread counts (so the
    thread-count race runs are skipped); the harness knows whether it ever saw a launch."""
    from kernelbot.agent.verify import harness

    launch = TritonLaunch(kernel="k", programs=1, order="natural", asked="natural")
    assert "never streamed a Triton launch" in harness._schedule_unexplained([], "main", "program order")[0]
    assert harness._schedule_unexplained([launch], "main", "program order") == []  # a launch in an earlier request
    assert harness._schedule_unexplained([], "main", "thread count") == []
