"""The dry run's stand-ins for the GPU check's steps (driver.py --dry-run): each writes, without a GPU, what its step
writes on a GPU node, through the same records kernelbot writes them with. The dry run then walks every step's
plumbing (its process and timeout, its outputs, the summary written after it, the expectations read from them) in
seconds; a record whose fields changed under the expectations shows up there, not on the node.

  python stub_step.py smoke OUT.json
  python stub_step.py verify correct|racy        (the verdict on stdout, as `kernelbot verify --json` prints it)
  python stub_step.py optimize RUN_DIR            (report.json and log.txt, as `kernelbot optimize` writes them)
"""

from __future__ import annotations

import sys
from pathlib import Path

from kernelbot.agent.verify.sanitizer import SANITIZER_TOOLS
from kernelbot.records import (
    Check,
    Device,
    Fidelity,
    InterpreterCoverage,
    KernelOutcome,
    KernelResult,
    ModelSpec,
    Report,
    SanitizerRun,
    Verdict,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))  # steps run with PYTHONSAFEPATH: this folder is not on it
from smoke import Smoke, SmokeRun  # noqa: E402

SANITIZED = {"out_of_bounds": "memcheck", "race": "racecheck/synccheck", "unwritten_output": "initcheck"}
INTERPRETED = ("race", "out_of_bounds")  # merged with the interpreter's job on the node's CPU
INTERPRETER = "Triton interpreter on the node's CPU at small sizes (stub)"


def smoke(out: Path) -> None:
    runs = [SmokeRun(what=what, ok=True, seconds=0.0, detail="stub: no GPU in a dry run")
            for what in ("CUDA starts in a sandboxed job's own process",
                         "CUDA starts in runners forked by the sandboxed harness (bench job)",
                         "compute-sanitizer reaches the sandboxed job it launches (memcheck)")]
    out.write_text(Smoke(runs=runs, cuda_ok=True).model_dump_json(indent=2))


def verdict(candidate: str) -> Verdict:
    """As a GPU node is expected to write it: the racy kernel fails correctness on the GPU (programs read each other's
    sums, or the NaN-filled slot) and race in the interpreter on the node's CPU; racecheck, which watches shared
    memory only, finds nothing."""
    racy = candidate == "racy"
    checks = [Check(id="compile", status="pass", detail="stub"),
              Check(id="correctness", status="fail" if racy else "pass",
                    detail="stub: NaN in 256 of 256 rows" if racy else "stub")]
    for cid, tools in SANITIZED.items():
        detail = f"compute-sanitizer {tools}: no errors"
        if cid in INTERPRETED:
            detail += f"; {INTERPRETER}: " + ("write-write at 4 byte(s), scratch_ptr+0" if racy and cid == "race" else
                                             "none")
        checks.append(Check(id=cid, status="fail" if racy and cid == "race" else "pass", detail=detail))
    failed = [c.id for c in checks if c.status == "fail"]
    return Verdict(candidate_id=candidate, verdict="fail" if failed else "pass", failed=failed, checks=checks,
                   shapes=[[[256, 512]]], seconds=0.0, notes=["stub: no GPU in a dry run"],
                   sanitizer_runs=[SanitizerRun(tool=tool, ran=True) for tool in SANITIZER_TOOLS],
                   interpreter_race=InterpreterCoverage.CHECKED)


def report(run_dir: Path) -> Report:
    kernel = KernelResult(op="rmsnorm", module="LlamaRMSNorm", backend="triton", shapes=[[8, 1, 512]],
                          outcome=KernelOutcome.ACCEPTED, reason="verified; 2.00x beyond noise (stub)", speedup=2.0)
    return Report(run_id=run_dir.name, model=ModelSpec(name="llama-tiny", vocab=4000, dtype="bfloat16", batch=8,
                                                       prompt_len=32, decode_steps=32),
                  device=Device(kind="cuda", name="stub GPU", threads=132, peak_gflops=1.0, peak_gbps=1.0,
                                peaks_source="stub"),
                  baseline_ms=10.0, optimized_ms=7.0, compiled_ms=None, speedup=1.43, speedup_vs_compiled=None,
                  timing_rounds=3, graph_decode_ms=8.0,
                  fidelity=Fidelity(max_abs_logit_diff=0.0, greedy_match=True, token_agreement=1.0),
                  kernels=[kernel], hotspots_before=[], hotspots_after=[], notes=["stub: no GPU in a dry run"])


def main(argv: list[str]) -> int:
    step, target = argv[0], argv[1]
    if step == "smoke":
        smoke(Path(target))
    elif step == "verify":
        print(verdict(target).model_dump_json(indent=2))
        return 1 if target == "racy" else 0  # `kernelbot verify` exits 1 on a failing verdict
    elif step == "optimize":
        run_dir = Path(target)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "report.json").write_text(report(run_dir).model_dump_json(indent=2))
        (run_dir / "log.txt").write_text("stub: no GPU in a dry run\n")
    else:
        print(f"stub_step: unknown step {step!r}; use smoke, verify or optimize", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
