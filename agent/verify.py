"""Verification, first version: the one entry point `verify()`; the hardened verifier replaces its inside.

The candidate runs in the sandbox on inputs made here; the reference, the comparison and the verdict
are computed here, in a process the candidate never runs in.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch

from kernelbot import KernelbotError
from kernelbot.kernel_library.cpp_build import prebuild_library
from kernelbot.loading import load_module
from kernelbot.records import Check, Task, Verdict
from kernelbot.sandbox import run_job

# dtype -> (relative L2 error, absolute error as a fraction of max|ref|, relative error per element).
# Errors are measured against a float64 reference; a candidate is also allowed 4x the error the
# reference itself makes in the task's dtype, since no kernel in that dtype can do much better.
TOLERANCES = {
    "float32": (1e-5, 1e-5, 1e-4),
    "float16": (1e-3, 1e-3, 5e-3),
    "bfloat16": (8e-3, 8e-3, 2e-2),
}
# Input scales every task is checked with: ordinary values, tiny ones (where a missing epsilon shows)
# and large ones (where missing max-subtraction or overflow shows).
INPUT_SCALES = {"normal": 1.0, "tiny": 1e-3, "large": 1e3}
FUZZ_SIZES = (1, 3, 7, 13, 31)  # 1, primes, non-multiples of every block size


def load_reference(path: Path):
    return load_module(path, f"kb_reference_{abs(hash(str(path)))}")


def task_from_reference(path: Path) -> Task:
    """A task for a standalone KernelBench reference: its get_inputs() shapes, leading dims free."""
    if not path.is_file():
        raise KernelbotError(f"{path}: no such reference file")
    try:
        module = load_reference(path)
        inputs, init_args = module.get_inputs(), list(module.get_init_inputs())
    except Exception as exc:
        raise KernelbotError(f"{path}: cannot load the reference ({type(exc).__name__}: {exc})") from None
    if not inputs or not all(isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs):
        raise KernelbotError(f"{path}: get_inputs() must return floating-point tensors (others not supported yet)")
    shapes = [list(x.shape) for x in inputs]
    return Task(id=path.stem, hotspot_id="", family="", module_class="Model",
                dtype=str(inputs[0].dtype).removeprefix("torch."), input_shapes=shapes,
                free_dims=[list(range(len(s) - 1)) for s in shapes], init_args=init_args, share=0.0, floor_us=0.0)


def shape_sets(task: Task) -> list[list[list[int]]]:
    """The observed shapes, then each fuzz size in the first free dim (other free dims at 1), then a mix."""
    sets = [task.input_shapes]
    for size in FUZZ_SIZES:
        sets.append([[size if i == free[0] else (1 if i in free else d) for i, d in enumerate(shape)] if free
                     else list(shape) for shape, free in zip(task.input_shapes, task.free_dims, strict=True)])
    mixed = [[(5 if i == free[-1] else 3) if i in free else d for i, d in enumerate(shape)]
             for shape, free in zip(task.input_shapes, task.free_dims, strict=True)]
    if mixed not in sets:
        sets.append(mixed)
    return sets


def make_inputs(shapes: list[list[int]], dtype: torch.dtype, scale: float, gen: torch.Generator):
    return [(torch.randn(s, generator=gen, dtype=torch.float64) * scale).to(dtype) for s in shapes]


def _compare(out: torch.Tensor, native: torch.Tensor, exact: torch.Tensor, dtype: str) -> str | None:
    """None when `out` is within tolerance of the float64 reference, else what is wrong."""
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, expected a tensor"
    if tuple(out.shape) != tuple(native.shape) or out.dtype != native.dtype:
        return f"output {tuple(out.shape)} {out.dtype}, expected {tuple(native.shape)} {native.dtype}"
    o, n, e = out.double(), native.double(), exact.double()
    if not torch.equal(torch.isfinite(o), torch.isfinite(n)) or not torch.equal(o[~torch.isfinite(o)],
                                                                              n[~torch.isfinite(n)]):
        return f"NaN/Inf in {int((~torch.isfinite(o)).sum())} places, reference in {int((~torch.isfinite(n)).sum())}"
    finite = torch.isfinite(e) & torch.isfinite(o)
    o, n, e = o[finite], n[finite], e[finite]
    if e.numel() == 0:
        return None
    rel_l2_tol, atol, rtol = TOLERANCES.get(dtype, TOLERANCES["float32"])
    ref_err = (n - e).abs()
    err = (o - e).abs()
    rel_l2 = float(err.norm() / e.norm().clamp_min(1e-300))
    allowed_l2 = max(rel_l2_tol, 4 * float(ref_err.norm() / e.norm().clamp_min(1e-300)))
    bound = atol * float(e.abs().max()) + rtol * e.abs() + 4 * float(ref_err.max())
    bad = int((err > bound).sum())
    if rel_l2 > allowed_l2 or bad:
        return f"rel L2 error {rel_l2:.2e} (allowed {allowed_l2:.1e}); {bad} of {err.numel()} elements out of tolerance"
    return None


def verify(task: Task, reference_path: Path, candidate_path: Path, workdir: Path, *, seed: int = 0,
           timeout: float = 300.0, env: dict[str, str] | None = None) -> Verdict:
    t0 = time.perf_counter()
    workdir.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, task.dtype)
    torch.manual_seed(seed)
    reference = load_reference(reference_path).Model(*task.init_args).eval()
    torch.save(reference.state_dict(), workdir / "state_dict.pt")
    gen = torch.Generator().manual_seed(seed + 1)
    sets = shape_sets(task)
    cases = [(shapes, "normal") for shapes in sets] + [(task.input_shapes, k) for k in INPUT_SCALES if k != "normal"]
    inputs = [make_inputs(shapes, dtype, INPUT_SCALES[kind], gen) for shapes, kind in cases]
    torch.save(inputs, workdir / "inputs.pt")
    job = {"kind": "outputs", "candidate": str(candidate_path.resolve()), "init_args": task.init_args,
           "state_dict": str((workdir / "state_dict.pt").resolve()),
           "inputs": str((workdir / "inputs.pt").resolve())}
    result = run_job(job, workdir, timeout=timeout, env={**prebuild_library(), **(env or {})})

    checks: list[Check] = []
    if result.violations:
        tried = "; ".join(f"{v.get('kind')}: {v.get('detail')}" for v in result.violations[:5])
        checks.append(Check(id="sandbox_violation", status="fail", detail=tried[:1000]))
    if result.status == "timeout":
        checks.append(Check(id="timeout", status="fail", detail=result.detail))
    elif result.status == "crash":
        checks.append(Check(id="crash", status="fail", detail=result.detail[-800:]))
    elif result.status == "error" and result.payload and result.payload.get("stage") == "compile":
        checks.append(Check(id="compile", status="fail", detail=result.detail))
    elif result.status == "error":
        checks += [Check(id="compile", status="pass"), Check(id="crash", status="fail", detail=result.detail)]
    else:
        checks += [Check(id="compile", status="pass"), Check(id="timeout", status="pass"),
                   Check(id="crash", status="pass")]
        if not result.violations:
            checks.append(Check(id="sandbox_violation", status="pass", detail="nothing refused was attempted"))
        runs = torch.load(workdir / "outputs.pt", weights_only=True)  # written by the candidate: no pickled code
        checks += _judge(reference, dtype, task.dtype, cases, inputs, runs)
    failed = [c.id for c in checks if c.status == "fail"]
    return Verdict(candidate_id=candidate_path.parent.name, verdict="fail" if failed else "pass", failed=failed,
                   checks=checks, shapes=[shapes for shapes, _ in cases], seconds=round(time.perf_counter() - t0, 2),
                   protections=result.protections)


def same_bits(a, b) -> bool:
    """Bit-identical tensors (NaN payloads included); plain equality for anything else."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _judge(reference, dtype, dtype_name, cases, inputs, runs) -> list[Check]:
    exact_model = copy.deepcopy(reference).double()
    native_model = reference.to(dtype)
    wrong, unwritten, nondet, mutated = [], [], [], []
    with torch.inference_mode():
        for (shapes, kind), sent, run in zip(cases, inputs, runs, strict=True):
            where = f"{kind} inputs {shapes}"
            native = native_model(*sent)
            exact = exact_model(*[x.double() for x in sent]).to(native.dtype)
            out = run["out"][0] if len(run["out"]) == 1 else run["out"]
            problem = _compare(out, native, exact, dtype_name)
            if problem:
                wrong.append(f"{where}: {problem}")
                # On ordinary inputs a NaN where the reference is finite is the poison left in place: an output
                # element the kernel never wrote. (On extreme inputs NaN may be honest arithmetic, e.g. inf/inf.)
                if kind == "normal" and isinstance(out, torch.Tensor) and out.shape == native.shape:
                    holes = int((torch.isnan(out) & torch.isfinite(native)).sum())
                    if holes:
                        unwritten.append(f"{where}: {holes} elements never written (still NaN)")
            if not all(same_bits(a, b) for a, b in zip(run["out"], run["again"], strict=True)):
                nondet.append(where)
            if not all(same_bits(a, b) for a, b in zip(run["inputs_after"], sent, strict=True)):
                mutated.append(where)

    def check(cid: str, problems: list[str], ok: str) -> Check:
        return Check(id=cid, status="fail" if problems else "pass",
                     detail="; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
                     if problems else ok)

    n = len(cases)
    return [
        check("correctness", wrong, f"{n} input sets within {dtype_name} tolerance of a float64 reference"),
        check("unwritten_output", unwritten, "outputs poisoned with NaN before each run; all written"),
        check("nondeterminism", nondet, "two runs on the same inputs bit-identical"),
        check("input_mutation", mutated, "inputs unchanged"),
    ]
