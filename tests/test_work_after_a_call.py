"""The side-stream check's reading of the pause after a verified call: an OpenMP pool's spin, stretched by a busy host
into the pause's second half, is no work going on (it failed an honest kernel in CI); work that goes on still is.
The runner's clock and CPU readings are scripted here, so each case reads the same every time."""

from types import SimpleNamespace

from kernelbot.agent.verify.runner import OUTSIDE_NS, SPIN_NS, _threads_after, _work_after

MS = 1_000_000


def _tools(cpu_ns_at):
    """Stand-ins for the runner's sleep and CPU reading: a clock that moves only when slept, and the candidate's
    threads' CPU as `cpu_ns_at(elapsed_ns)`."""
    now = [0]

    def sleep(seconds: float) -> None:
        now[0] += round(seconds * 1e9)

    def cpu_since(mark, known):
        used = cpu_ns_at(now[0])
        return (0 if mark is None else used - mark), used

    return SimpleNamespace(sleep=sleep, cpu_since=cpu_since)


def test_a_spin_a_busy_host_stretched_into_the_pauses_second_half_has_ended_a_half_later():
    spin = _tools(lambda t: min(t, 9 * MS))  # 9 ms of spin right after the call, then asleep
    working = _work_after(spin, 0.010, frozenset())  # the shortest pause: 4 ms of the spin fall in its second half
    assert working == 0
    assert _threads_after(working, "after the call returned", frozenset()) == []


def test_work_that_goes_on_through_the_pause_is_read_and_named():
    steady = _tools(lambda t: t // 2)  # half a core, all the while
    working = _work_after(steady, 0.010, frozenset())
    assert SPIN_NS < working
    assert "work goes on while no call runs" in _threads_after(working, "after the call returned", frozenset())[0]


def test_more_work_than_any_spin_in_the_second_half_is_not_looked_at_again():
    heavy = _tools(lambda t: 0 if t <= 5 * MS else min(t - 5 * MS, 5 * MS) * 5)  # 25 ms of CPU, five threads, then done
    working = _work_after(heavy, 0.010, frozenset())
    assert working > OUTSIDE_NS
