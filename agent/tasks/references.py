"""Hotspot → self-contained task in KernelBench format (reference.py with Model, get_inputs, get_init_inputs):
a family's reference at the observed shapes, or, for any other module, a reference extracted from the model."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kernelbot.engine import extract
from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.base import GENERIC
from kernelbot.records import GenericCapture, Hotspot, Task

OWN_OPS = " (own ops)"


def skip_reason(hotspot: Hotspot, min_share: float) -> str | None:
    """Why a hotspot gets no task, or None when it does (generic hotspots may still fail extraction)."""
    if hotspot.share < min_share:
        return f"share {hotspot.share:.1%} below the {min_share:.1%} threshold"
    if hotspot.family is None:
        return None
    family = FAMILIES[hotspot.family]
    if len(hotspot.input_dims) < family.inputs:
        return f"the profile does not show the {family.name} call's {family.inputs} inputs"
    if not any(hotspot.dtype in d for d in family.dtypes.values()):
        return f"no {family.name} kernel takes {hotspot.dtype}"
    return None


def make_tasks(hotspot: Hotspot, model: torch.nn.Module) -> list[Task]:
    """One task per set of arguments the hotspot's modules are built with, in model order: layers of one class
    and shapes may differ in what the kernel must honour (Gemma-2's sliding and full attention layers, a window),
    and a pack entry is routed only to modules built with its own arguments. Later variants' ids end in -v2, -v3..."""
    family = FAMILIES[hotspot.family or ""]
    variants: list[list] = []
    for m in model.modules():
        if type(m).__name__ == hotspot.module_class and family.matches(m, hotspot.input_dims):
            args = family.init_args(m)
            if args not in variants:
                variants.append(args)
    if not variants:
        raise LookupError(f"no {hotspot.module_class} in the model matches {hotspot.input_dims}")
    tasks = [task_for(hotspot, args) for args in variants]
    return [t if i == 0 else t.model_copy(update={"id": f"{t.id}-v{i + 1}"}) for i, t in enumerate(tasks)]


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


def module_labels(model: torch.nn.Module, run: Callable[[], Any]) -> dict[str, str]:
    """Trace labels (`Class_N`, numbered per class in the order modules are first called, as torch.profiler
    numbers them) → dotted module names in the live model."""
    order: list[str] = []
    names = {id(m): n for n, m in model.named_modules()}
    seen: set[int] = set()

    def pre(mod, _args):
        if id(mod) not in seen:
            seen.add(id(mod))
            order.append(names[id(mod)])

    handles = [m.register_forward_pre_hook(pre) for m in model.modules()]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    counters: dict[str, int] = {}
    labels = {}
    for name in order:
        cls = type(model.get_submodule(name)).__name__
        labels[f"{cls}_{counters.get(cls, 0)}"] = name
        counters[cls] = counters.get(cls, 0) + 1
    return labels


def make_generic_task(hotspot: Hotspot, model: torch.nn.Module, labels: dict[str, str],
                      run: Callable[[], Any]) -> tuple[Task, str]:
    """A task for a module no family covers (or a module's own ops: then the module whole) and its reference's
    source, extracted from the model at its profiled call. Raises extract.NotExtractable with the reason."""
    cls = hotspot.module_class.removesuffix(OWN_OPS)
    names = [labels[p.rsplit("/", 1)[-1]] for p in hotspot.module_paths if p.rsplit("/", 1)[-1] in labels]
    if not names:
        raise extract.NotExtractable("its modules are not found in the live model")
    if names[0] == "":
        raise extract.NotExtractable("it is the model's top-level forward (it builds caches and masks)")
    module = model.get_submodule(names[0])
    shape = hotspot.input_dims[0] if hotspot.input_dims else None
    ex = extract.extract(module, extract.capture(module, run, shape=shape), shape)
    same = [n for n in _siblings(model, module) if _computes(model.get_submodule(n), ex)]
    shapes = [t.shape for t in ex.signature.tensors]
    dtype = next((t.dtype for t in ex.signature.tensors if t.dtype in ("float32", "bfloat16", "float16")),
                 hotspot.dtype or "float32")
    slug = re.sub(r"[^a-z0-9]+", "_", cls.lower()).strip("_")
    task = Task(
        id=f"{hotspot.id}-{slug}-{'x'.join(map(str, shapes[0])) if shapes and shapes[0] else 'call'}",
        hotspot_id=hotspot.id, family=GENERIC, module_class=cls, dtype=dtype, input_shapes=shapes,
        free_dims=[[] for _ in shapes], init_args=[], share=hotspot.share,
        floor_us=hotspot.floor_us / max(hotspot.calls, 1), profiled_dims=hotspot.input_dims,
        signature=ex.signature, module_paths=same,
        region=f"{cls} at {names[0]}, whole call" + (" (children included: its own ops are the hotspot)"
                                                      if hotspot.module_class.endswith(OWN_OPS) else ""))
    return task, extract.reference_source(ex, module, task.region, dtype)


def served_generic_task(hotspot: Hotspot, capture: GenericCapture) -> Task:
    """A task for a served layer no family covers, from a call the engine's plugin captured and extracted."""
    shapes = [t.shape for t in capture.signature.tensors]
    slug = re.sub(r"[^a-z0-9]+", "_", capture.engine_class.lower()).strip("_")
    return Task(
        id=f"{hotspot.id}-{slug}-{'x'.join(map(str, shapes[0])) if shapes and shapes[0] else 'call'}",
        hotspot_id=hotspot.id, family=GENERIC, module_class=capture.engine_class, dtype=capture.dtype or hotspot.dtype,
        input_shapes=shapes, free_dims=[[] for _ in shapes], init_args=[], share=hotspot.share,
        floor_us=hotspot.floor_us / max(hotspot.calls, 1), profiled_dims=hotspot.input_dims,
        signature=capture.signature, layer_variant=capture.variant,
        region=f"{capture.engine_class} in the engine's process, its native forward at one captured call signature")


def _siblings(model: torch.nn.Module, module: torch.nn.Module) -> list[str]:
    """Modules of the same class whose parameters and buffers have the same names, shapes and dtypes."""
    def layout(m: torch.nn.Module) -> list[tuple]:
        names, state = extract.state_of(m)
        return [(n, tuple(t.shape), t.dtype) for n, t in zip(names, state, strict=True)]

    want = layout(module)
    return [n for n, m in model.named_modules() if type(m) is type(module) and layout(m) == want]


def _computes(module: torch.nn.Module, ex: extract.Extracted) -> bool:
    """Does this module trace to the same graph for the same call (its constants, eps, flags the same)?"""
    try:
        gm, _, _ = extract.trace(module, ex.call)
        return extract.graph_source(gm, len(ex.params), len(ex.inputs)) == ex.graph_code
    except extract.NotExtractable:
        return False


def reference_source(task: Task) -> str:
    """The family's reference Model plus the task's observed shapes, KernelBench style. A family whose inputs are
    not all random floats (positions, ids) defines get_inputs() in its reference, reading these constants."""
    body = FAMILIES[task.family].reference_path.read_text()
    constants = (f"\n\nINPUT_SHAPES = {task.input_shapes!r}\nDTYPE = torch.{task.dtype}\n"
                 f"INIT_ARGS = {task.init_args!r}\n")
    return body + constants + ("" if "\ndef get_inputs(" in body else DEFAULT_INPUTS)


def write_task(task: Task, task_dir: Path, reference: str | None = None) -> None:
    """The task's record and reference: the given source (a generic task's), else its family's."""
    task_dir.mkdir(parents=True, exist_ok=True)
    (task_dir / "reference.py").write_text(reference if reference is not None else reference_source(task))
    (task_dir / "task.json").write_text(task.model_dump_json(indent=2))
