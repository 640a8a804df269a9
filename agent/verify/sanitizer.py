"""On a GPU: the candidate under compute-sanitizer (memcheck, racecheck, synccheck, initcheck), its text report
turned into the verifier's checks.

compute-sanitizer's front end talks to the process it launches over TCP on loopback, so each tool's job gets
loopback ports of its own (box.LOOPBACK_PORTS_ENV: its network namespace's loopback up, and Landlock letting it
bind and connect on those ports only). The four tools run side by side within one budget, the job's timeout. A tool
counts only when its job finished and it printed its summary: a missing or empty report is a failure to run
(`not_run`), never a pass, and never the candidate's fault.
"""

from __future__ import annotations

import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from kernelbot.agent.verify.judge import not_run
from kernelbot.agent.verify.messages import SanitizeJob
from kernelbot.records import Check, SanitizerRun
from kernelbot.sandbox import SandboxResult, run_job
from kernelbot.sandbox.box import STDERR, loopback_env

# racecheck ends with a summary of its own (H200 node, 2026-12-04: "RACECHECK SUMMARY: 0 hazards displayed (0 errors,
# 0 warnings)"), the other tools with "ERROR SUMMARY: n errors"
_SUMMARY = re.compile(r"=+ (?:ERROR SUMMARY: (\d+) errors?|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?)")
_ERROR = re.compile(r"=+ ((?:Invalid|Race|Uninitialized|Barrier|Misaligned|Out-of-range|Program hit|"
                    r"Leaked|Malloc|Error)[^\n]*)")
# said when the target never reached CUDA: a summary after it checked nothing
_NOTHING_CHECKED = ("Target application terminated before first instrumented API call",
                    "Target application returned an error", "Unable to connect", "Device not supported")

BASE_PORT = 49152  # compute-sanitizer's default base port
PORTS_PER_TOOL = 10  # its default --max-connections
# A CUDA API call that fails is not the kernel's error: torch and Triton probe the driver and handle the answer.
# The target starts Python, torch and the candidate before CUDA: give it longer than the 10 s default to connect.
SANITIZER_COMMAND = ("compute-sanitizer", "--print-limit", "20", "--report-api-errors", "no", "--launch-timeout", "120")
SANITIZER_TOOLS = {"memcheck": "out_of_bounds", "racecheck": "race", "synccheck": "race",
                   "initcheck": "unwritten_output"}


class ToolRun(NamedTuple):
    tool: str
    errors: int | None  # None: it did not run, or checked nothing
    text: str  # the first error, or why it did not run


def parse_summary(text: str) -> tuple[int | None, str]:
    """(number of errors, or None when there is no summary; the first error line)."""
    counts = _SUMMARY.findall(text)
    if not counts:
        return None, ""
    first = _ERROR.search(text)
    return int("".join(counts[-1])), first.group(1).strip() if first else ""


def tool_ports(index: int) -> range:
    """The loopback ports of the index-th tool. Each job has a network namespace of its own (the runners give ports
    to no other), so these never meet another job's; tools side by side get different ones all the same."""
    start = BASE_PORT + index * PORTS_PER_TOOL
    return range(start, start + PORTS_PER_TOOL)


def tool_command(tool: str, ports: range) -> list[str]:
    return [*SANITIZER_COMMAND, "--port", str(ports.start), "--max-connections", str(len(ports)), "--tool", tool]


def read_run(tool: str, result: SandboxResult, workdir: Path) -> ToolRun:
    """What one tool's run showed. Errors found count whatever became of the job; no errors count only when the job
    finished and the report says the target was instrumented."""
    log = workdir / STDERR
    text = log.read_text(errors="replace") if log.is_file() else result.detail
    errors, first = parse_summary(text)
    if errors:
        return ToolRun(tool, errors, first)
    blocked = next((line for line in text.splitlines() if any(s in line for s in _NOTHING_CHECKED)), None)
    if errors is None or blocked or result.status != "ok":
        why = blocked or ("no report" if errors is None else "its summary covers a job that did not finish")
        error = (result.payload or {}).get("error")  # the harness's own report says more than the tool's last line
        tail = [str(error)] if error else result.detail.strip().splitlines()[-1:]
        return ToolRun(tool, None, f"{why} (job {result.status}{': ' + tail[0][:300] if tail else ''})")
    return ToolRun(tool, 0, "")


def run_tool(job: SanitizeJob, workdir: Path, index: int, tool: str, deadline: float, env: dict[str, str],
             gpu: int) -> ToolRun:
    """One tool's run of the job (the index-th tool's ports) on GPU `gpu`, within what is left until `deadline`."""
    left = deadline - time.monotonic()
    if left < 1:
        return ToolRun(tool, None, "no time left in the sanitizer's budget")
    where, ports = workdir / f"sanitize_{tool}", tool_ports(index)
    result = run_job(job.model_dump(mode="json"), where, timeout=left,
                     env={**env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", **loopback_env(ports)}, gpu=gpu,
                     wrapper=tool_command(tool, ports))
    return read_run(tool, result, where)


def combine(cid: str, runs: list[ToolRun]) -> Check:
    """One check from the tools that cover it: any error fails it; a tool that did not run leaves it not_run."""
    found = [f"compute-sanitizer {r.tool}: {r.errors} error(s), first: {r.text}" for r in runs if r.errors]
    if found:
        return Check(id=cid, status="fail", detail="; ".join(found)[:1500])
    missing = [f"compute-sanitizer {r.tool} did not run: {r.text}" for r in runs if r.errors is None]
    if missing:
        return not_run(cid, "; ".join(missing)[:1500])
    return Check(id=cid, status="pass", detail=f"compute-sanitizer {'/'.join(r.tool for r in runs)}: no errors")


class Sanitized(NamedTuple):
    checks: list[Check]  # one per check id the tools answer
    runs: list[SanitizerRun]  # one per tool, in SANITIZER_TOOLS' order


def sanitize(job: SanitizeJob, workdir: Path, timeout: float, env: dict[str, str], gpu: int) -> Sanitized:
    """On a GPU: the main case once under each compute-sanitizer tool, side by side, all within `timeout`."""
    ids = sorted(set(SANITIZER_TOOLS.values()))
    if not shutil.which("compute-sanitizer"):
        return Sanitized([not_run(cid, "compute-sanitizer not found") for cid in ids],
                         [SanitizerRun(tool=tool, ran=False) for tool in SANITIZER_TOOLS])
    deadline = time.monotonic() + timeout
    with ThreadPoolExecutor(max_workers=len(SANITIZER_TOOLS)) as pool:
        runs = list(pool.map(lambda it: run_tool(job, workdir, it[0], it[1], deadline, env, gpu),
                             enumerate(SANITIZER_TOOLS)))
    return Sanitized([combine(cid, [r for r in runs if SANITIZER_TOOLS[r.tool] == cid]) for cid in ids],
                     [SanitizerRun(tool=r.tool, ran=r.errors is not None, errors=r.errors or 0) for r in runs])
