from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)


@dataclass
class SandboxResult:
    status: Literal["ok", "timeout", "crash", "error"]
    seconds: float
    returncode: int | None
    detail: str  # last lines of the child's stderr, or its own error report
    payload: dict[str, Any] | None  # what the worker wrote to result.json


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k)}
    env.update(extra or {})
    return env


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_job(job: dict[str, Any], workdir: Path, timeout: float, env: dict[str, str] | None = None) -> SandboxResult:
    """Run one worker job in a fresh child process; whatever happens, nothing it started survives."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "job.json").write_text(json.dumps(job))
    result_path = workdir / "result.json"
    result_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(workdir / "stderr.txt", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "kernelbot.sandbox.worker", "job.json"], cwd=workdir,
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=child_env(env),
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc.pid)  # the child leads its own group: this ends it and anything it spawned
            proc.wait()
    seconds = time.perf_counter() - t0
    tail = (workdir / "stderr.txt").read_text(errors="replace")[-2000:]
    if timed_out:
        return SandboxResult("timeout", seconds, None, f"no result after {timeout:.0f} s", None)
    payload = json.loads(result_path.read_text()) if result_path.exists() else None
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return SandboxResult("crash", seconds, proc.returncode, f"killed by {name}\n{tail}", payload)
    if payload is None or proc.returncode != 0:
        return SandboxResult("crash", seconds, proc.returncode, f"exit code {proc.returncode}, no result\n{tail}",
                             payload)
    if payload.get("error"):
        return SandboxResult("error", seconds, proc.returncode, payload["error"], payload)
    return SandboxResult("ok", seconds, proc.returncode, tail, payload)
