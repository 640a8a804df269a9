"""Child side of the sandbox: load a candidate, run it on inputs the parent prepared, write what it saw.

Jobs (job.json in the working directory):
  outputs: run ModelNew on every input set twice; save outputs and the inputs as they were afterwards.
  bench:   time Model (reference) and ModelNew side by side in interleaved rounds.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from kernelbot.loading import load_module
from kernelbot.sandbox.confine import confine


class LoadError(Exception):
    """The candidate did not import, build or construct: reported as the `compile` check."""


def _build(path: str, cls: str, job: dict[str, Any]) -> torch.nn.Module:
    try:
        model = getattr(load_module(path, f"kb_{cls.lower()}"), cls)(*job["init_args"])
        model.load_state_dict(torch.load(job["state_dict"]), strict=True)
    except Exception as exc:
        raise LoadError(f"{type(exc).__name__}: {exc}") from exc
    return model.eval()


def _outputs(job: dict[str, Any]) -> dict[str, Any]:
    model = _build(job["candidate"], "ModelNew", job)
    input_sets = torch.load(job["inputs"])
    # Fresh allocations come back NaN-filled, so an output element the kernel never wrote stays NaN.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    runs = []
    with torch.inference_mode():
        for inputs in input_sets:
            first = model(*inputs)
            second = model(*[x.clone() for x in inputs])
            runs.append({"out": _as_list(first), "again": _as_list(second), "inputs_after": inputs})
    torch.save(runs, "outputs.pt")
    return {"outputs": "outputs.pt"}


def _as_list(out) -> list[torch.Tensor]:
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outs]


def _bench(job: dict[str, Any]) -> dict[str, Any]:
    reference = _build(job["reference"], "Model", job)
    candidate = _build(job["candidate"], "ModelNew", job)
    inputs = torch.load(job["inputs"])[0]
    models = [reference, candidate]
    with torch.inference_mode():
        for m in models:
            for _ in range(3):
                m(*inputs)
        t0 = time.perf_counter()
        reference(*inputs)
        iters = max(1, min(200, int(job.get("round_seconds", 0.02) / max(time.perf_counter() - t0, 1e-6))))
        times: list[list[float]] = [[], []]
        for r in range(job["rounds"]):
            order = (0, 1) if r % 2 == 0 else (1, 0)  # alternate who goes first: drift hits both alike
            for i in order:
                t0 = time.perf_counter()
                for _ in range(iters):
                    models[i](*inputs)
                times[i].append((time.perf_counter() - t0) / iters * 1e6)
    return {"reference_us": times[0], "candidate_us": times[1], "iters": iters}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    protections = confine(Path.cwd())  # before any candidate code is imported
    try:
        result = {"outputs": _outputs, "bench": _bench}[job["kind"]](job)
    except Exception as exc:  # the candidate's failure is a result, reported to the parent
        message = str(exc) if isinstance(exc, LoadError) else f"{type(exc).__name__}: {exc}"
        result = {"error": message.strip()[:1500], "stage": "compile" if isinstance(exc, LoadError) else "run",
                  "traceback": traceback.format_exc()[-3000:]}
    result["protections"] = protections
    Path("result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
