"""Eager vs kernelbot vs torch.compile on the built-in model, with the pack of a finished run."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from kernelbot.agent.measure.end_to_end import time_end_to_end
from kernelbot.engine import TorchEngine
from kernelbot.records import EndToEndTimes, ModelSpec, Pack


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir", type=Path, nargs="?", help="a finished `kernelbot optimize` run")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    run_dir = args.run_dir or max((p for p in Path("runs").glob("*") if (p / "pack/manifest.json").exists()),
                                  key=lambda p: p.stat().st_mtime, default=None)
    if run_dir is None or not (run_dir / "pack/manifest.json").exists():
        print("benchmarks: no finished run found; run `kernelbot optimize` first or pass RUN_DIR", file=sys.stderr)
        return 2
    spec = ModelSpec.model_validate_json((run_dir / "model.json").read_text())
    pack = Pack.model_validate_json((run_dir / "pack/manifest.json").read_text())
    engine = TorchEngine(spec)
    compiled = None
    if not args.no_compile:
        compiled = engine.compiled()
        compiled.run_workload()
        compiled.run_workload()
    engine.apply_pack(pack, run_dir / "pack")
    engine.run_workload()
    engine.remove_pack()
    times = time_end_to_end(engine, pack, run_dir / "pack", args.rounds, compiled)
    print(f"{spec.name} {spec.dtype}, batch {spec.batch}, {spec.prompt_len}+{spec.decode_steps} tokens; "
          f"pack {pack.version} ({len(pack.entries)} kernels); {args.rounds} interleaved rounds")
    print_times(times)
    return 0


def print_times(times: EndToEndTimes) -> None:
    """Each variant's median, min and max, its ratio to eager, kernelbot's to torch.compile, and the host's load."""
    eager = statistics.median(times.eager)
    for name, xs in (("eager", times.eager), ("kernelbot", times.kernelbot), ("compiled", times.compiled),
                     ("graph decode", times.graph_decode)):
        if xs:
            med = statistics.median(xs)
            print(f"  {name:12s} median {med:8.1f} ms  min {min(xs):8.1f}  max {max(xs):8.1f}  "
                  f"eager/this {eager / med:5.2f}x")
    if times.compiled:
        ratio = statistics.median(times.compiled) / statistics.median(times.kernelbot)
        print(f"  kernelbot vs torch.compile: {ratio:.2f}x")
    if times.host is not None:
        doubt = "; contended: other processes' CPU time makes every ratio doubtful" if times.host.contended else ""
        print(f"  host over the rounds: {times.host.summary()}{doubt}")


if __name__ == "__main__":
    sys.exit(main())
