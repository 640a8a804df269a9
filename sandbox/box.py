"""The box a job runs in, the same for both runners (process and docker): how it is made, what the child's
environment points into it, what comes back out of it, and how the outcome is read.

A box is a fresh directory of a random, unpredictable name under $KERNELBOT_BOX_ROOT (else the system's temporary
directory), holding job.json and tmp/: its path says nothing about the job, so a candidate cannot tell verification
from timing by it. Each runner only adds how the child is confined and started.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kernelbot.sandbox.confine import AUDIT_LOST, LOST_RECORDS, SECRET_NAME, lost_detail

MAX_PROCESSES = 256  # per job: a fork bomb hits this instead of the machine
MAX_FILE_BYTES = 2 << 30
OUTPUTS = ("result.json", "outputs.pt")  # what the parent takes out of the box before it is removed
STDERR = "stderr.txt"
BOX_ROOT_ENV = "KERNELBOT_BOX_ROOT"
AUDIT_LIMIT = 1 << 20  # bytes of audit records read back from a job
# The program a job runs, by module path (named, never imported here: the sandbox only starts it).
HARNESS = "kernelbot.agent.verify.harness"
# How Python starts it: `python -c`, not `-m`, so that neither the harness's module (as __main__) nor its file (the
# bottom frame) is on the stack of a candidate's call. The one expression binds no name in __main__, drops -c's
# current-directory entry from sys.path, renames the harness's code to neutral names (disguise.py) and runs main().
HARNESS_ARGS = ("-c", "(lambda s, h, d: (s.path.__setitem__(slice(None), [p for p in s.path if p]), d.neutral_code(), "
                      f"h.main()))(__import__('sys'), __import__('{HARNESS}', fromlist=['main']), "
                      "__import__('kernelbot.agent.verify.disguise', fromlist=['neutral_code']))")
# A job whose wrapper talks to it over loopback TCP (compute-sanitizer's front end and the target it launches) gets
# these ports, "first-last", and nothing else of the network: the runner brings loopback up in the job's own
# network namespace, and its Landlock layer allows TCP bind and connect on these ports only (landlock.restrict).
LOOPBACK_PORTS_ENV = "KERNELBOT_LOOPBACK_PORTS"


@dataclass
class SandboxResult:
    status: Literal["ok", "timeout", "crash", "error"]
    seconds: float
    returncode: int | None
    detail: str  # last lines of the child's stderr, or its own error report
    payload: dict[str, Any] | None  # what the harness wrote to result.json (read here: protections, error)
    violations: list[dict[str, str]] = field(default_factory=list)  # what the candidate tried and was refused
    protections: list[str] = field(default_factory=list)  # what was in force


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without anything named like a secret, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k)}
    env.update(extra or {})
    return env


def loopback_ports(env: Mapping[str, str]) -> range | None:
    """The ports LOOPBACK_PORTS_ENV gives a job, or None when it gives none."""
    value = env.get(LOOPBACK_PORTS_ENV)
    if not value:
        return None
    first, _, last = value.partition("-")
    if not (first.isdigit() and (last or first).isdigit()) or not 0 < int(first) <= int(last or first) < 65536:
        raise ValueError(f"{LOOPBACK_PORTS_ENV}={value!r}: expected FIRST-LAST, TCP ports such as 49152-49161")
    return range(int(first), int(last or first) + 1)


def loopback_env(ports: range) -> dict[str, str]:
    return {LOOPBACK_PORTS_ENV: f"{ports.start}-{ports.stop - 1}"}


def memory_limit() -> int:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(16 << 30, int(total * 0.6))


def random_name(prefix: str = "kb-") -> str:
    """A name no one can guess ahead (from the OS's secure random source) and that repeats with negligible odds."""
    return f"{prefix}{secrets.token_hex(8)}"


def open_box(job: dict[str, Any], workdir: Path) -> Path:
    """Make the work dir (clearing a previous job's outputs) and a fresh box holding job.json and tmp/; returns
    the box's resolved path."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name in OUTPUTS:
        (workdir / name).unlink(missing_ok=True)
    root = Path(os.environ.get(BOX_ROOT_ENV) or tempfile.gettempdir())
    while True:
        box = root / random_name()
        try:
            box.mkdir(mode=0o700)  # exclusive: a name already taken (or planted) is never reused
            break
        except FileExistsError:
            continue
    box = box.resolve()
    (box / "tmp").mkdir()
    (box / "job.json").write_text(json.dumps(job))
    return box


def box_env(box: Path) -> dict[str, str]:
    """Every place a library writes to by default, pointed into the box (the parent's own values, e.g. the
    TORCHINDUCTOR_CACHE_DIR that torch exports once it has used the cache, would lead outside it)."""
    return {"HOME": str(box), "TMPDIR": str(box / "tmp"), "PYTHONDONTWRITEBYTECODE": "1",
            "TORCHINDUCTOR_CACHE_DIR": str(box / "tmp" / "inductor"), "TRITON_CACHE_DIR": str(box / "tmp" / "triton"),
            "XDG_CACHE_HOME": str(box / "tmp" / "cache")}


def close_box(box: Path, workdir: Path) -> None:
    """Move the job's outputs (plain files only, never a link the candidate planted) to the work dir; remove the box."""
    for name in OUTPUTS:
        if (box / name).is_file() and not (box / name).is_symlink():
            shutil.move(box / name, workdir / name)
    shutil.rmtree(box, ignore_errors=True)


def drain_records(fd: int, stop: threading.Event, sink: bytearray) -> None:
    """Read audit records while the job runs (up to AUDIT_LIMIT kept), so that a flood of them cannot fill the pipe and
    block the process writing them; until the channel ends, or `stop` once nothing more is there."""
    while True:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if not ready:
            if stop.is_set():
                return
            continue
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            continue
        if not chunk:
            return  # every writer has ended
        sink += chunk[:max(0, AUDIT_LIMIT - len(sink))]


def parse_violations(records: bytes) -> list[dict[str, str]]:
    """The audit records, one JSON object a line; a line that is not one is kept as garbled."""
    violations = []
    for line in records[:AUDIT_LIMIT].decode(errors="replace").splitlines():
        try:
            violations.append(json.loads(line))
        except json.JSONDecodeError:
            violations.append({"kind": "garbled", "detail": line[:200]})
    return violations


def read_payload(workdir: Path) -> dict[str, Any] | None:
    """What the harness wrote to result.json, or None when it wrote nothing readable."""
    path = workdir / "result.json"
    try:
        payload = json.loads(path.read_text()) if path.exists() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


@dataclass
class Ending:
    """How the child ended, as a runner saw it."""
    timed_out: bool
    code: int | None  # exit status; negative: killed by that signal; 128 + n: a signal reported by unshare or docker
    seconds: float
    records: bytes  # the audit channel's contents
    killed_note: str = ""  # appended to "killed by SIGX" (the docker runner's " (out of memory)")


def outcome(workdir: Path, timeout: float, ending: Ending, protections: list[str]) -> SandboxResult:
    """The status both runners report for a job that has ended and whose box is closed: timeout, crash (by a
    signal, or without a result), error (the harness's own report) or ok; detail is the stderr tail or the error.
    A harness that ended with AUDIT_LOST (its audit hook could not write a record) adds a violation."""
    violations = parse_violations(ending.records)
    if ending.code == AUDIT_LOST:
        violations.append({"kind": LOST_RECORDS, "detail": lost_detail("the job's process")})
    tail = (workdir / STDERR).read_text(errors="replace")[-2000:] if (workdir / STDERR).exists() else ""
    payload = read_payload(workdir)
    if payload is not None:
        protections += [p for p in payload.get("protections", []) if isinstance(p, str)]

    def result(status: Literal["ok", "timeout", "crash", "error"], detail: str) -> SandboxResult:
        return SandboxResult(status, ending.seconds, ending.code, detail, payload, violations, protections)

    code = ending.code
    if ending.timed_out:
        return result("timeout", f"no result after {timeout:.0f} s")
    if code is not None and (code < 0 or code >= 128):
        sig = -code if code < 0 else code - 128
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return result("crash", f"killed by {name}{ending.killed_note}\n{tail}")
    if payload is None or code != 0:
        return result("crash", f"exit code {code}, no result\n{tail}")
    if payload.get("error"):
        return result("error", str(payload["error"]))
    return result("ok", tail)
