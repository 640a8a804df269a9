"""How the harness ends a runner: one still serving when the job is over is ended at once (it used to be polled for
half a second first, on every verification and twice on every benchmark); one whose end of the channel closed is
waited for, so a runner that died on its own is reported with how it ended."""

import os
import time

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


def test_a_runner_still_serving_when_the_job_ends_is_ended_not_waited_for():
    runner = _child(exit_after_s=0.4, hang_up=False)  # polled for 0.5 s, it would be seen exiting with code 5
    assert runner.close() is None
    assert not os.path.exists(f"/proc/{runner.pid}")  # reaped


def test_a_runner_that_hung_up_is_waited_for_and_how_it_ended_is_reported():
    runner = _child(exit_after_s=0.1, hang_up=True)
    time.sleep(0.02)  # its end of the channel closed, the process not yet gone
    assert runner.hung_up()
    assert runner.close() == "the candidate's process exited (code 5) in the middle of a call"
