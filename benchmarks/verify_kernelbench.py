"""Every KernelBench reference verified against itself as `ModelNew`, at scaled shapes.

A reference copied as the candidate computes exactly what the reference does, with PyTorch ops and no
kernel of its own, so the verifier must fail it on `reference_fallback` and nothing else; a reference whose
output barely depends on its inputs must be refused as a weak task. Anything else is a verifier bug.

    python benchmarks/verify_kernelbench.py [../shared/data/kernelbench/level1] [--out runs/kernelbench_level1.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from kernelbot import KernelbotError
from kernelbot.agent.verify.run import task_from_reference, verify

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "kernelbench" / "level1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, nargs="?", default=DEFAULT)
    parser.add_argument("--out", type=Path, default=Path("runs/kernelbench_level1.json"))
    parser.add_argument("--only", default="", help="comma-separated problem numbers")
    args = parser.parse_args()
    files = sorted(args.folder.glob("*.py"), key=lambda p: int(p.name.split("_")[0]))
    if args.only:
        files = [f for f in files if f.name.split("_")[0] in args.only.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ref in files:
            cand = Path(tmp) / ref.stem / "candidate.py"
            cand.parent.mkdir()
            cand.write_text(ref.read_text() + "\n\nModelNew = Model\n")
            t0 = time.perf_counter()
            try:
                verdict = verify(task_from_reference(ref), ref, cand, cand.parent / "work", timeout=600)
                row = {"problem": ref.stem, "outcome": "checked", "failed": verdict.failed,
                       "not_run": verdict.not_run, "notes": verdict.notes}
            except KernelbotError as exc:
                row = {"problem": ref.stem, "outcome": "refused", "reason": str(exc)}
            row["seconds"] = round(time.perf_counter() - t0, 1)
            expected = row.get("failed") == ["reference_fallback"] or row["outcome"] == "refused"
            row["as_expected"] = expected
            rows.append(row)
            print(f"{row['seconds']:6.1f}s {'ok ' if expected else 'BAD'} {ref.stem}: "
                  f"{row.get('failed', row.get('reason'))}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    checked = [r for r in rows if r["outcome"] == "checked"]
    refused = [r for r in rows if r["outcome"] == "refused"]
    print(f"\n{len(rows)} references: {sum(r['failed'] == ['reference_fallback'] for r in checked)} failed only "
          f"reference_fallback, {len(refused)} refused, {sum(not r['as_expected'] for r in rows)} unexpected")
    for r in refused:
        print(f"  refused {r['problem']}: {r['reason']}")
    times = [r["seconds"] for r in checked]
    if times:
        print(f"verification time: median {statistics.median(times):.1f} s, max {max(times):.1f} s")


if __name__ == "__main__":
    main()
