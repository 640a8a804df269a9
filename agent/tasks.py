"""Hotspot → self-contained task in KernelBench format (reference.py with Model, get_inputs, get_init_inputs)."""

from __future__ import annotations

from pathlib import Path

import torch

from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.base import rows
from kernelbot.records import Hotspot, Task


def skip_reason(hotspot: Hotspot, min_share: float) -> str | None:
    """Why a hotspot gets no task, or None when it does."""
    if hotspot.family is None:
        return "no kernel family covers this module yet"
    family = FAMILIES[hotspot.family]
    if len(hotspot.input_dims) < family.inputs:
        return f"the profile does not show the {family.name} call's {family.inputs} inputs"
    if hotspot.share < min_share:
        return f"share {hotspot.share:.1%} below the {min_share:.1%} threshold"
    if family.max_rows is not None and rows(hotspot.input_dims[0]) > family.max_rows:
        return f"{rows(hotspot.input_dims[0])} rows: the {family.name} kernels are built for at most {family.max_rows}"
    if not any(hotspot.dtype in d for d in family.dtypes.values()):
        return f"no {family.name} kernel takes {hotspot.dtype}"
    return None


def make_task(hotspot: Hotspot, model: torch.nn.Module) -> Task:
    family = FAMILIES[hotspot.family or ""]
    live = next((m for m in model.modules() if type(m).__name__ == hotspot.module_class
                 and family.matches(m, hotspot.input_dims)), None)
    if live is None:
        raise LookupError(f"no {hotspot.module_class} in the model matches {hotspot.input_dims}")
    return task_for(hotspot, family.init_args(live))


def task_for(hotspot: Hotspot, init_args: list) -> Task:
    """The task for a hotspot whose module is built with init_args (read from a live module, or from the
    served model's config when the model runs in another process)."""
    family = FAMILIES[hotspot.family or ""]
    shapes = hotspot.input_dims[:family.inputs]
    return Task(
        id=f"{hotspot.id}-{family.name}-{'x'.join(map(str, shapes[0]))}", hotspot_id=hotspot.id, family=family.name,
        module_class=hotspot.module_class, dtype=hotspot.dtype, input_shapes=shapes, free_dims=family.free_dims(shapes),
        init_args=init_args, share=hotspot.share, floor_us=hotspot.floor_us / max(hotspot.calls, 1),
        profiled_dims=hotspot.input_dims)


DEFAULT_INPUTS = """

def get_inputs():
    return [torch.randn(s, dtype=DTYPE) for s in INPUT_SHAPES]


def get_init_inputs():
    return list(INIT_ARGS)
"""


def reference_source(task: Task) -> str:
    """The family's reference Model plus the task's observed shapes, KernelBench style. A family whose inputs are
    not all random floats (positions, ids) defines get_inputs() in its reference, reading these constants."""
    body = FAMILIES[task.family].reference_path.read_text()
    constants = (f"\n\nINPUT_SHAPES = {task.input_shapes!r}\nDTYPE = torch.{task.dtype}\n"
                 f"INIT_ARGS = {task.init_args!r}\n")
    return body + constants + ("" if "\ndef get_inputs(" in body else DEFAULT_INPUTS)


def write_task(task: Task, task_dir: Path) -> None:
    task_dir.mkdir(parents=True, exist_ok=True)
    (task_dir / "reference.py").write_text(reference_source(task))
    (task_dir / "task.json").write_text(task.model_dump_json(indent=2))
