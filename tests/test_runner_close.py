"""How the harness ends a runner: one still serving when the job is over is ended at once (it used to be polled for
half a second first, on every verification and twice on every benchmark); one whose end of the channel closed is
waited for, so a runner that died on its own is reported with how it ended. No assertion here reads a clock."""

import os
import select
import time

from kernelbot.agent.verify import harness
from kernelbot.agent.verify.harness import Runner


def _child(exit_after_s: float, hang_up: bool) -> Runner:
    """A process standing in for a runner, on the harness's two pipes: it exits with code 5 after `exit_after_s`,
    having closed its end of the channel first where `hang_up`."""
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(down_w)
            os.close(up_r)
            if hang_up:
                os.close(up_w)
            time.sleep(exit_after_s)
        finally:
            os._exit(5)
    os.close(down_r)
    os.close(up_w)
    return Runner(pid, down_w, up_r)


def test_a_runner_still_serving_when_the_job_ends_is_ended_not_waited_for(monkeypatch):
    runner = _child(exit_after_s=60, hang_up=False)
    pauses: list[float] = []
    monkeypatch.setattr(harness.time, "sleep", pauses.append)  # the harness's polling, counted instead of slept
    assert runner.close() is None
    assert pauses == []  # no polling: it was ended at once
    assert not os.path.exists(f"/proc/{runner.pid}")  # and reaped


def test_a_runner_that_hung_up_is_waited_for_and_how_it_ended_is_reported():
    runner = _child(exit_after_s=0.1, hang_up=True)
    assert select.select([runner.from_runner], [], [], 30)[0]  # its end of the channel closed (before it exits)
    assert runner.hung_up()
    assert runner.close() == "the candidate's process exited (code 5) in the middle of a call"
