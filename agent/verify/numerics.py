"""How close is close enough: candidate outputs against a float64 reference, with tolerances by dtype.

Tolerances (relative L2 error, absolute error as a fraction of max|ref|, relative error per element):
  float32   1e-5  1e-5  1e-4
  float16   1e-3  1e-3  5e-3
  bfloat16  8e-3  8e-3  2e-2
Errors are measured against the reference computed in float64 on the same (upcast) inputs. A candidate
is also allowed 4x the error the reference itself makes in the task's dtype, since no kernel in that dtype
can do much better; on inputs scaled far from the reference's own draws, where moving the inputs by half an ulp of
their dtype moves the float64 reference beyond the tolerance, also 4x that movement (at large scales an attention's
scores are so far apart that rounding alone picks a different key: the problem, not the kernel, is ill-conditioned
there). NaN and Inf must sit exactly where the reference has them, in the task's dtype or in float64 (either one:
float32's erf-GELU gives NaN at +inf, float64's the exact +inf). Integer and boolean outputs must match exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kernelbot.agent.verify.messages import output_leaves
from kernelbot.kernel_library.base import dtype_name

TOLERANCES = {
    "float32": (1e-5, 1e-5, 1e-4),
    "float16": (1e-3, 1e-3, 5e-3),
    "bfloat16": (8e-3, 8e-3, 2e-2),
}
LOWER_PRECISIONS = {"float32": (torch.bfloat16, torch.float16), "float64": (torch.float32,)}
# float64 runs on rounding-moved inputs per rescaled case: a near tie that one such rounding flips in about every
# other draw is missed by all of them about once in 250
JITTER_DRAWS = 8
WEAK_TASK_SPREAD = 1e-2  # outputs of two independent input draws closer than this (relative): a weak task


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ over finite elements, in float64."""
    a, b = a.double(), b.double()
    finite = torch.isfinite(a) & torch.isfinite(b)
    a, b = a[finite], b[finite]
    if b.numel() == 0:
        return 0.0
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def compare(out: object, native: torch.Tensor, exact: torch.Tensor, jittered: Sequence[torch.Tensor] = (),
            ) -> str | None:
    """None when `out` is within tolerance of the float64 reference `exact`, else what is wrong.
    `native` is the reference computed in the task's own dtype: its error sets the floor, as does, element by element,
    the largest of `jittered`'s (the float64 reference on inputs moved by their dtype's rounding) where given."""
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, expected a tensor"
    if tuple(out.shape) != tuple(native.shape) or out.dtype != native.dtype:
        return f"output {tuple(out.shape)} {out.dtype}, expected {tuple(native.shape)} {native.dtype}"
    if not native.is_floating_point():
        wrong = int((out != native).sum())
        return f"{wrong} of {out.numel()} elements differ (exact match required for {out.dtype})" if wrong else None
    o, n, e = out.double(), native.double(), exact.double()
    rel_tol, atol, rtol = TOLERANCES.get(dtype_name(native.dtype), TOLERANCES["float32"])
    # a draw where rounding the inputs alone moves the float64 reference beyond the tolerance shows the problem is
    # ill-conditioned there: element by element, its error joins the native run's as the floor
    for j in (j.double() for j in jittered if j.shape == native.shape):
        if rel_l2(j, e) > rel_tol:
            n = torch.where(torch.isfinite(j) & ((j - e).abs() > (n - e).abs()) & torch.isfinite(n), j, n)
    if n.dim() and n.shape[-1]:
        # rows where the reference has no finite value at all (NaN fed in, spread by its own arithmetic, e.g.
        # through masked scores) say nothing: a kernel that contains the NaN better is not wrong there
        rows = torch.isfinite(n).reshape(-1, n.shape[-1]).any(-1)
        if not bool(rows.all()):
            o, n, e = (t.reshape(-1, t.shape[-1])[rows] for t in (o, n, e))
    # a special value (or a finite one) is right where the reference in the task's dtype or in float64 has one too:
    # erf-GELU's float32 path gives NaN at +inf where the exact answer, and float64's, is +inf
    if not bool((_same_kind(o, n) | _same_kind(o, e)).all()):
        return (f"NaN/Inf in {int((~torch.isfinite(o)).sum())} places, reference in "
                f"{int((~torch.isfinite(n)).sum())} ({int((~torch.isfinite(e)).sum())} in float64): positions "
                "must match one of them")
    finite = torch.isfinite(e) & torch.isfinite(o)
    o, n, e = o[finite], n[finite], e[finite]
    if e.numel() == 0:
        return None
    # where the native run has no finite value the float64 one does, only the tolerance bounds the candidate
    ref_err, err = torch.where(torch.isfinite(n), n - e, 0).abs(), (o - e).abs()
    norm = e.norm().clamp_min(1e-300)
    rel = float(err.norm() / norm)
    allowed = max(rel_tol, 4 * float(ref_err.norm() / norm))
    bound = atol * float(e.abs().max()) + rtol * e.abs() + 4 * float(ref_err.max())
    bad = int((err > bound).sum())
    if rel > allowed or bad:
        worst = int(torch.argmax(err - bound))
        return (f"rel L2 error {rel:.2e} (allowed {allowed:.1e}); {bad} of {err.numel()} elements out of tolerance, "
                f"worst {float(o[worst]):.6g} vs {float(e[worst]):.6g}")
    return None


def _same_kind(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per element: both NaN, both the same infinity, or both finite."""
    return (torch.isnan(a) & torch.isnan(b)) | (torch.isinf(a) & (a == b)) | (torch.isfinite(a) & torch.isfinite(b))


def downcast_finding(cand_err: float, native_err: float, lower_errs: dict[str, float]) -> str | None:
    """A candidate whose error matches computing in a lower precision (bf16, fp16: also TF32-like matmuls)
    rather than the task's dtype. None when it does not."""
    if not lower_errs:
        return None
    name, lower = min(lower_errs.items(), key=lambda kv: kv[1])
    if cand_err > 10 * max(native_err, 1e-9) and cand_err >= 0.3 * lower and lower > 30 * max(native_err, 1e-12):
        return (f"rel L2 error {cand_err:.1e} is at {name} level ({lower:.1e}); the reference in the task's dtype "
                f"errs {native_err:.1e}")
    return None


def spread(a: torch.Tensor, b: torch.Tensor) -> float:
    """How much a reference's output moves between two independent input draws (0: not at all)."""
    if a.is_floating_point():
        if not torch.isfinite(a).any() or not a.double().nan_to_num(0, 0, 0).norm():
            return 0.0  # all NaN/Inf, or all zero: nothing a constant could not match
        return rel_l2(a, b)
    return float((a != b).double().mean()) if a.numel() else 0.0


def same_bits(a: object, b: object) -> bool:
    """Bit-identical tensors (NaN payloads included); plain equality for anything else."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def outs(value: Any) -> list[Any]:
    """A model's outputs as a flat list (messages.output_leaves: the runner reads the candidate's alike)."""
    return output_leaves(value)


def jittered_outputs(exact_model: torch.nn.Module | None, inputs: list[Any], native: list[Any],
                     draws: int = JITTER_DRAWS) -> list[list[torch.Tensor]]:
    """Per output, the float64 reference on inputs each moved by up to half an ulp of its dtype (seeded draws),
    rounded back to the native output's dtype: how far rounding alone moves the answer. Empty where the twin cannot
    run or the output is not a tensor."""
    found: list[list[torch.Tensor]] = [[] for _ in native]
    if exact_model is None:
        return found
    gen = torch.Generator().manual_seed(0)

    def moved(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return x
        wobble = torch.rand(x.shape, generator=gen, dtype=torch.float64).to(x.device) * 2 - 1
        return x.double() * (1 + wobble * torch.finfo(x.dtype).eps / 2)

    try:
        with torch.inference_mode():
            for _ in range(draws):
                for i, (g, n) in enumerate(zip(outs(exact_model(*[moved(x) for x in inputs])), native, strict=True)):
                    if isinstance(g, torch.Tensor) and isinstance(n, torch.Tensor):
                        found[i].append(g.to(n.dtype))
    except Exception:
        return [[] for _ in native]
    return found


def reference_outputs(model: torch.nn.Module, exact_model: torch.nn.Module | None,
                      inputs: list[Any]) -> tuple[list[Any], list[Any]]:
    """The reference's outputs in the task's dtype and, from its float64 twin on the same inputs (rounded back to that
    dtype's type), the exact ones; the native ones stand in where the twin cannot run."""
    with torch.inference_mode():
        native = outs(model(*inputs))
        if exact_model is None:
            return native, native
        try:
            up = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
            exact = [e.to(n.dtype) if isinstance(e, torch.Tensor) and isinstance(n, torch.Tensor) else e
                     for e, n in zip(outs(exact_model(*up)), native, strict=True)]
        except Exception:
            exact = native
    return native, exact
