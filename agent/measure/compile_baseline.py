"""torch.compile of a task's own region, timed beside eager: what a user would get from compiling that region instead
of taking kernelbot's kernel for it.

The reference is trusted code (kernelbot wrote it, or it came from the model), so it is compiled and timed here, in
the agent's process, with the one timing protocol (agent/measure/timing.py): fresh inputs each call, every output
checked against eager, the host's load beside the numbers. A candidate's gain over compile is then its benchmarked gain
over eager divided by compile's gain over eager on the same task; the two timings come from different harnesses, so the
report says "estimated".
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from pydantic import BaseModel

from kernelbot.agent.measure.timing import Timing, WrongOutputError, time_callable
from kernelbot.agent.verify.cases import inputs_at
from kernelbot.agent.verify.numerics import compare
from kernelbot.agent.verify.run import load_reference
from kernelbot.hardware.device import DeviceChoice
from kernelbot.records import Task

INPUT_SETS = 3
CALLS = 30


class RegionCompile(BaseModel):
    """Eager and torch.compile of one task's reference at its own shapes, interleaved in one process."""

    task_id: str
    eager: Timing | None = None
    compiled: Timing | None = None
    compile_s: float | None = None  # the first compiled call: tracing and code generation
    error: str = ""  # why compile could not be timed (an op Dynamo cannot trace, a wrong output)

    @property
    def speedup(self) -> float | None:
        """Compile's gain over eager on this region (above 1: compile is faster)."""
        if self.eager is None or self.compiled is None or self.compiled.median_us <= 0:
            return None
        return round(self.eager.median_us / self.compiled.median_us, 3)


def time_region_compile(task: Task, reference_path: Path, device: DeviceChoice, *, seed: int = 0) -> RegionCompile:
    """Time the reference eager and under torch.compile (static shapes: the task's own), every compiled output
    checked against eager's; failures become the record's error, never the run's."""
    result = RegionCompile(task_id=task.id)
    try:
        reference = load_reference(reference_path)
        torch.manual_seed(seed)
        model = reference.Model(*task.init_args).eval().to(device.torch_device)
        input_sets = [[x.to(device.torch_device) if isinstance(x, torch.Tensor) else x
                       for x in inputs_at(reference, task, seed + k)] for k in range(INPUT_SETS)]
        with torch.inference_mode():
            want = [model(*inputs) for inputs in input_sets]
            compiled = torch.compile(model, dynamic=False)
            start = time.perf_counter()
            compiled(*input_sets[0])
            device.synchronize()
            result.compile_s = round(time.perf_counter() - start, 2)

            def check(k: int, out: object) -> str | None:
                return _differs(out, want[k])

            result.eager = time_callable(model, input_sets, device, check=lambda k, out: None, calls=CALLS)
            result.compiled = time_callable(compiled, input_sets, device, check=check, calls=CALLS)
    except WrongOutputError as exc:
        result.error = f"compiled output differs from eager: {exc}"[:300]
    except Exception as exc:  # an op torch.compile cannot handle is a finding about compile, not a failed run
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    return result


def _differs(got: object, want: object) -> str | None:
    gots = list(got) if isinstance(got, (tuple, list)) else [got]
    wants = list(want) if isinstance(want, (tuple, list)) else [want]
    if len(gots) != len(wants):
        return f"{len(gots)} outputs, eager gave {len(wants)}"
    for g, w in zip(gots, wants, strict=True):
        if isinstance(w, torch.Tensor):
            problem = compare(g, w, w) if isinstance(g, torch.Tensor) else "not a tensor"
            if problem:
                return problem
    return None
