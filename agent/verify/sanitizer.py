"""On a GPU: the candidate under compute-sanitizer (memcheck, racecheck, synccheck, initcheck), its text report
turned into the verifier's checks."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from kernelbot.agent.verify.judge import check, not_run
from kernelbot.agent.verify.messages import SanitizeJob
from kernelbot.records import Check
from kernelbot.sandbox import run_job
from kernelbot.sandbox.gpu import assigned_gpu

_SUMMARY = re.compile(r"=+ ERROR SUMMARY: (\d+) errors?")
_ERROR = re.compile(r"=+ ((?:Invalid|Race|Uninitialized|Barrier|Misaligned|Out-of-range|Program hit|"
                    r"Leaked|Malloc|Error)[^\n]*)")


def parse_summary(text: str) -> tuple[int | None, str]:
    """(number of errors, or None when there is no summary; the first error line)."""
    counts = _SUMMARY.findall(text)
    if not counts:
        return None, ""
    first = _ERROR.search(text)
    return int(counts[-1]), first.group(1).strip() if first else ""


# A CUDA API call that fails is not the kernel's error: torch and Triton probe the driver and handle the answer.
SANITIZER_COMMAND = ("compute-sanitizer", "--print-limit", "20", "--report-api-errors", "no")
SANITIZER_TOOLS = {"memcheck": "out_of_bounds", "racecheck": "race", "synccheck": "race",
                   "initcheck": "unwritten_output"}


def sanitize(job: SanitizeJob, workdir: Path, timeout: float, env: dict[str, str]) -> list[Check]:
    """On a GPU: the main case once under each compute-sanitizer tool; its report becomes checks."""
    if not shutil.which("compute-sanitizer"):
        return [not_run(cid, "compute-sanitizer not found") for cid in sorted(set(SANITIZER_TOOLS.values()))]
    found: dict[str, list[str]] = {cid: [] for cid in SANITIZER_TOOLS.values()}
    for tool, cid in SANITIZER_TOOLS.items():
        result = run_job(job.model_dump(mode="json"), workdir / f"sanitize_{tool}", timeout=timeout * 4,
                         env={**env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, gpu=assigned_gpu(),
                         wrapper=[*SANITIZER_COMMAND, "--tool", tool])
        errors, first = parse_summary(result.detail)
        if errors is None:
            found[cid].append(f"compute-sanitizer {tool}: no report ({result.status})")
        elif errors:
            found[cid].append(f"compute-sanitizer {tool}: {errors} error(s), first: {first}")
    return [check(cid, problems, "compute-sanitizer " + "/".join(t for t, c in SANITIZER_TOOLS.items() if c == cid)
                   + ": no errors") for cid, problems in found.items()]
