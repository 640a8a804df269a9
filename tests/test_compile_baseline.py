"""torch.compile of a task's own region, timed beside eager in the agent's process
(agent/measure/compile_baseline.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from kernelbot.agent.measure.compile_baseline import time_region_compile
from kernelbot.agent.tasks.references import write_task
from kernelbot.hardware.device import pick_device
from kernelbot.records import Task


def _task(tmp_path: Path) -> tuple[Task, Path]:
    task = Task(id="h3-rmsnorm-4x8x64", hotspot_id="h3", family="rmsnorm", module_class="LlamaRMSNorm",
                dtype="float32", input_shapes=[[4, 8, 64]], free_dims=[[0, 1]], init_args=[64, 1e-6], share=0.2,
                floor_us=0.4)
    write_task(task, tmp_path / task.id)
    return task, tmp_path / task.id


def test_compile_of_a_region_is_timed_beside_eager_with_every_output_checked(tmp_path):
    task, task_dir = _task(tmp_path)
    result = time_region_compile(task, task_dir / "reference.py", pick_device("cpu"))
    assert result.error == ""
    assert result.eager is not None and result.compiled is not None and result.compile_s is not None
    assert result.eager.calls == result.compiled.calls > 0 and result.compiled.median_us > 0
    assert result.speedup == round(result.eager.median_us / result.compiled.median_us, 3)


def test_a_compiled_region_that_computes_something_else_is_reported_not_timed(tmp_path, monkeypatch):
    task, task_dir = _task(tmp_path)
    monkeypatch.setattr(torch, "compile", lambda model, **kw: lambda *xs: model(*xs) * 1.5)
    result = time_region_compile(task, task_dir / "reference.py", pick_device("cpu"))
    assert result.compiled is None and result.speedup is None
    assert result.error.startswith("compiled output differs from eager")
