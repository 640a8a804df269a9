"""The only place candidate code runs: a child process per job, with a timeout and its own process group.

It hands back outputs and timings, never verdicts; judging happens in the trusted parent.
"""

from kernelbot.sandbox.runner import SandboxResult, run_job

__all__ = ["SandboxResult", "run_job"]
