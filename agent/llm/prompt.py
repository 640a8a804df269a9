"""The prompt for one task: what to replace, where it runs, the rules, examples, and what was tried before."""

from __future__ import annotations

import functools
import importlib.metadata
import re
from dataclasses import dataclass, field

import torch

from kernelbot.agent.llm.hardware import hardware_lines
from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.base import ROOT
from kernelbot.kernel_library.identity import imported_sources
from kernelbot.records import Device, Hotspot, Task

EXAMPLE_CHARS = 5000  # per library example
CODE_CHARS = 6000  # per previous attempt's code shown
REPORT_CHARS = 2500  # per previous attempt's report
SHOWN_ATTEMPTS = 4  # most recent attempts reported; only the last two with their code

SYSTEM = (
    "You are an expert performance engineer who writes fast, correct compute kernels for PyTorch models. "
    "You answer with exactly one complete Python file in a single ```python fenced block, and nothing the "
    "file needs is left out."
)


@dataclass
class Attempt:
    candidate_id: str
    code: str | None  # None when the answer had no usable code
    report: str  # what the verifier and the benchmark said, or why nothing could be run


@dataclass
class PromptContext:
    device: Device
    backend: str  # "cpp" or "triton"
    hotspot: Hotspot | None = None
    extra_rules: list[str] = field(default_factory=list)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def backend_rules(backend: str) -> list[str]:
    common = [
        "Define `class ModelNew(nn.Module)` whose __init__ takes exactly the reference Model's arguments and "
        "creates the same parameters and buffers under the same names: the reference's state_dict is loaded "
        "into it with strict=True.",
        "forward() takes the same inputs and returns an output of the same shape and dtype, within the dtype's "
        "tolerance of a float64 reference.",
        "Your own kernel must do the work. Returning the reference's result computed with PyTorch ops (or "
        "torch.nn.functional, torch.compile, cuBLAS/cuDNN calls) is rejected.",
        "Never modify the inputs; return a freshly allocated output that does not alias an input; write every "
        "output element; two runs on the same inputs must give bit-identical outputs.",
        "The dims listed as variable change between calls (the verifier tries 1, 3, 7, 13, 31 and the observed "
        "sizes): handle every size, with masks or tails, not only the observed shape.",
        "No file, network, environment or subprocess access other than building your kernel; the candidate runs "
        "in a sandbox that records such attempts and fails the candidate for them.",
    ]
    if backend == "triton":
        return [
            f"Backend: Triton {_version('triton')} (torch {torch.__version__}). Write @triton.jit kernels and launch "
            "them from forward(); pick block sizes with triton.next_power_of_2 and mask the tails.",
            "Allocating the output (torch.empty*) and computing launch grids in Python is fine; the arithmetic "
            "must happen in the Triton kernel.",
            *common,
        ]
    return [
        f"Backend: C++ on the CPU, built with torch.utils.cpp_extension.load_inline (torch {torch.__version__}). "
        "Build once in __init__ (cpp_sources=..., functions=[...], extra_cflags=['-O3', '-mavx2', '-mfma', "
        "'-fopenmp'], extra_ldflags=['-fopenmp']), never inside forward().",
        "The C++ must compute in its own loops over raw pointers (at::parallel_for or OpenMP for threads, "
        "`#pragma omp simd` or intrinsics for vectors); allocate outputs with at::empty/at::empty_like; do not "
        "call ATen compute ops (at::matmul, at::mm, at::softmax, tensor arithmetic) for the work.",
        "Dispatch on the input dtype (float32, and bfloat16/float16 where the task uses them); accumulate "
        "reductions in float32.",
        *common,
    ]


_ATEN_CALL = re.compile(r"torch\.ops\.aten\.(\w+)\.")
_TORCH_CALL = re.compile(r"(?:\btorch|\bF|\bnn\.functional)\.(\w+)\(|\.(\w+)\(")
_ATEN_AS_TORCH = {"addmm": "linear", "mm": "linear", "t": "linear", "bmm": "matmul", "_to_copy": "to"}


@functools.cache
def _family_calls(name: str) -> frozenset[str]:
    """The torch functions and tensor methods a family's reference calls."""
    text = FAMILIES[name].reference_path.read_text()
    return frozenset(a or b for a, b in _TORCH_CALL.findall(text)) - {"__init__", "Parameter", "ones", "super"}


def nearest_family(reference: str) -> str:
    """The family whose reference calls the ops most like this generic reference's ATen graph (Jaccard)."""
    ops = frozenset(_ATEN_AS_TORCH.get(op, op) for op in _ATEN_CALL.findall(reference))

    def likeness(name: str) -> float:
        theirs = _family_calls(name)
        return len(ops & theirs) / len(ops | theirs) if ops | theirs else 0.0

    return max(FAMILIES, key=likeness)


def library_examples(task: Task, backend: str, reference: str = "") -> list[tuple[str, str]]:
    """Accepted kernels from kernel_library: the task's own family, or for a generic task the family whose
    reference is most like its graph."""
    family = FAMILIES.get(task.family) or FAMILIES[nearest_family(reference)]
    folder = ROOT / family.name
    files = [folder / "triton_kernel.py"] if backend == "triton" else [*sorted(folder.glob("*.cpp")),
                                                                         folder / "cpp.py"]
    return [(f"kernel_library/{family.name}/{p.name}", p.read_text()[:EXAMPLE_CHARS]) for p in files if p.is_file()]


def reference_helpers(reference: str) -> list[tuple[str, str]]:
    """The library's own modules (not a family's folder) that the reference imports, with their text: the prompt
    shows them beside the reference, so the model reads every function the reference calls."""
    root = ROOT.resolve()
    return [(f"kernel_library/{p.name}", p.read_text()) for p in dict.fromkeys(imported_sources(reference))
            if p.parent == root]


def _fence(path: str) -> str:
    return "cpp" if path.endswith(".cpp") else "python"


def _task_lines(task: Task, ctx: PromptContext) -> list[str]:
    variable = [[f"dim {d}" for d in free] for free in task.free_dims]
    lines = [
        f"Task id: {task.id}",
        f"Replaces: {task.module_class} ({task.family or 'custom op'}) in the model being optimised.",
        f"Observed input shapes: {task.input_shapes}; dtype: {task.dtype}; variable dims per input: {variable}.",
        f"Constructor arguments (get_init_inputs): {task.init_args!r}.",
    ]
    if task.region:
        lines.append(f"Region: {task.region}. The reference's forward() is this call's ATen graph, extracted from "
                     "the model; its parameters and buffers are registered under the module's own names.")
    if task.share:
        lines.append(f"Share of the profiled forward time: {task.share:.1%}.")
    if task.floor_us:
        lines.append(f"Roofline floor per call on this device: {task.floor_us:.2f} µs (FLOPs or bytes over the "
                     "device's peaks): no kernel can be faster than this.")
    h = ctx.hotspot
    if h is not None and h.calls:
        lines.append(f"Profiled: {h.calls} calls, {h.total_us / h.calls:.1f} µs per call now "
                     f"({h.flops / h.calls:.3g} FLOPs, {h.bytes / h.calls:.3g} bytes moved per call).")
    return lines


def _attempt_sections(attempts: list[Attempt]) -> list[str]:
    shown = attempts[-SHOWN_ATTEMPTS:]
    out = ["## Previous attempts (most recent last)", "",
           "Fix what the reports say; keep what worked. If an attempt was correct but slow, make it faster."]
    for i, a in enumerate(shown, start=len(attempts) - len(shown) + 1):
        out += ["", f"### Attempt {i} ({a.candidate_id})", "", "Report:", "```text",
                strip_fences(a.report[:REPORT_CHARS]), "```"]
        if a.code and a in shown[-2:]:
            out += ["Its code:", "```python", strip_fences(a.code[:CODE_CHARS]).rstrip(), "```"]
    # Older attempts beyond SHOWN_ATTEMPTS still count, so the step a scripted or real model sees is honest.
    out += [f"### Attempt {j} (summarised)" for j in range(1, len(attempts) - len(shown) + 1)]
    return out


def build_messages(task: Task, reference: str, ctx: PromptContext, attempts: list[Attempt]) -> list[dict[str, str]]:
    parts = [
        "Write a faster drop-in replacement for the PyTorch module below, as a KernelBench candidate.",
        "",
        "## Task",
        *_task_lines(task, ctx),
        "",
        "## Reference (KernelBench format: Model, get_inputs, get_init_inputs)",
        "```python",
        reference.rstrip(),
        "```",
    ]
    for path, text in reference_helpers(reference):
        parts += ["", f"It imports `{path}`:", "```python", text.rstrip(), "```"]
    parts += [
        "",
        "## Hardware",
        *hardware_lines(ctx.device),
        "",
        "## Rules",
        *[f"- {rule}" for rule in backend_rules(ctx.backend) + ctx.extra_rules],
        "",
        "## Accepted kernels from this project (for style; they use an internal loader, you must use the "
        "public API named above)",
    ]
    for path, text in library_examples(task, ctx.backend, reference):
        parts += ["", f"`{path}`:", f"```{_fence(path)}", text.rstrip(), "```"]
    if attempts:
        parts += ["", *_attempt_sections(attempts)]
    parts += ["", "Answer with the complete candidate file (imports, kernel source, ModelNew) in one ```python "
                  "block."]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(parts)}]


def strip_fences(text: str) -> str:
    return re.sub(r"```+", "'''", text)
