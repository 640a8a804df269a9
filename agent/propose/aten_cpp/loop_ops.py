"""What a fused loop computes: the pointwise ops and last-dim reductions it covers, their C++ formulas over fp32
values, and `fusion_op`, which says how a loop computes a node (or that it cannot)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
import torch.fx as fx

from kernelbot.agent.propose.aten_cpp.lowering import bind_arguments
from kernelbot.agent.propose.aten_cpp.values import float_literal

aten = torch.ops.aten

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
RAW_TYPES = {torch.float32: "float", torch.bfloat16: "uint16_t", torch.float16: "c10::Half", torch.bool: "bool",
             torch.int64: "int64_t", torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
             torch.uint8: "uint8_t"}


class Compute(str, Enum):
    ARITH = "arith"  # operands converted to the result dtype, fp32 math, the result rounded to its dtype
    COMPARE = "compare"  # operands converted to their promoted dtype, then compared
    CAST = "cast"  # the operand converted to the result dtype
    WHERE = "where"  # a bool condition picks one of two operands, each converted to the result dtype
    LOGICAL = "logical"  # operands as bools


Formula = Callable[[list[str], dict[str, Any]], str]


@dataclass(frozen=True)
class Pointwise:
    operands: tuple[str, ...]  # schema arguments that hold tensors (or Python numbers standing for them)
    formula: Formula  # C++ over the converted operands and the op's constant arguments
    compute: Compute = Compute.ARITH
    accepts: Callable[[dict[str, Any]], bool] = lambda args: True
    # Python numbers among the operands get the compute dtype's rounding (TensorIterator casts them); add, sub,
    # mul and div on CPU use them at fp32 instead (ATen's opmath scalar path)
    scalar_rounds: bool = True


def f32(value: float | int | bool) -> str:
    return f"static_cast<float>({float_literal(float(value))})"


def _template(text: str) -> Formula:
    return lambda ops, args: text.format(*ops)


def _alpha(sign: str) -> Formula:
    def formula(ops: list[str], args: dict[str, Any]) -> str:
        alpha = args.get("alpha", 1)
        return f"({ops[0]} {sign} {ops[1]})" if alpha == 1 else f"({ops[0]} {sign} {f32(alpha)} * {ops[1]})"
    return formula


POW_SPECIAL = {0: "1.f", 1: "{0}", 2: "({0} * {0})", 3: "({0} * {0} * {0})", 0.5: "std::sqrt({0})",
               -0.5: "(1.f / std::sqrt({0}))", -1: "(1.f / {0})", -2: "(1.f / ({0} * {0}))"}


def _pow(ops: list[str], args: dict[str, Any]) -> str:
    exponent = args["exponent"]  # ATen's CPU pow takes these exponents by their own formulas
    return POW_SPECIAL.get(exponent, "std::pow({0}, " + f32(exponent) + ")").format(ops[0])


def _gelu(ops: list[str], args: dict[str, Any]) -> str:
    x = ops[0]
    if args["approximate"] == "tanh":
        return f"(0.5f * {x} * (1.f + std::tanh(0.7978845608028654f * ({x} + 0.044715f * ({x} * {x} * {x})))))"
    return f"({x} * 0.5f * (1.f + std::erf({x} * 0.70710678118654752f)))"


def _clamp(ops: list[str], args: dict[str, Any]) -> str:
    lo = "-std::numeric_limits<float>::infinity()" if args.get("min") is None else f32(args["min"])
    hi = "std::numeric_limits<float>::infinity()" if args.get("max") is None else f32(args["max"])
    return f"kb_clamp({ops[0]}, {lo}, {hi})"


def _plain_copy(args: dict[str, Any]) -> bool:
    return (args.get("layout") in (None, torch.strided) and args.get("device") in (None, torch.device("cpu"))
            and not args.get("pin_memory") and not args.get("non_blocking")
            and args.get("memory_format") in (None, torch.preserve_format, torch.contiguous_format))


def _constant(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda args: isinstance(args.get(name), (int, float)) and not isinstance(args.get(name), bool)


UNARY = {
    aten.neg: "(-{0})", aten.exp: "std::exp({0})", aten.log: "std::log({0})", aten.log1p: "std::log1p({0})",
    aten.expm1: "std::expm1({0})", aten.sqrt: "std::sqrt({0})", aten.rsqrt: "(1.f / std::sqrt({0}))",
    aten.tanh: "std::tanh({0})", aten.sigmoid: "(1.f / (1.f + std::exp(-{0})))",
    aten.silu: "({0} / (1.f + std::exp(-{0})))", aten.sin: "std::sin({0})", aten.cos: "std::cos({0})",
    aten.abs: "std::fabs({0})", aten.reciprocal: "(1.f / {0})", aten.erf: "std::erf({0})",
    aten.relu: "kb_relu({0})", aten.floor: "std::floor({0})", aten.ceil: "std::ceil({0})",
    aten.trunc: "std::trunc({0})", aten.round: "std::nearbyint({0})", aten.square: "({0} * {0})",
}
COMPARISONS = {aten.eq: "==", aten.ne: "!=", aten.lt: "<", aten.le: "<=", aten.gt: ">", aten.ge: ">="}
SELF_OTHER = ("self", "other")

POINTWISE: dict[torch._ops.OpOverload, Pointwise] = {
    **{packet.default: Pointwise(("self",), _template(text)) for packet, text in UNARY.items()},
    **{getattr(packet, overload): Pointwise(SELF_OTHER, _template("({0} " + sign + " {1})"), Compute.COMPARE)
       for packet, sign in COMPARISONS.items() for overload in ("Tensor", "Scalar")},
    aten.add.Tensor: Pointwise(SELF_OTHER, _alpha("+"), scalar_rounds=False),
    aten.add.Scalar: Pointwise(SELF_OTHER, _alpha("+"), scalar_rounds=False),
    aten.sub.Tensor: Pointwise(SELF_OTHER, _alpha("-"), scalar_rounds=False),
    aten.sub.Scalar: Pointwise(SELF_OTHER, _alpha("-"), scalar_rounds=False),
    aten.mul.Tensor: Pointwise(SELF_OTHER, _template("({0} * {1})"), scalar_rounds=False),
    aten.mul.Scalar: Pointwise(SELF_OTHER, _template("({0} * {1})"), scalar_rounds=False),
    aten.div.Tensor: Pointwise(SELF_OTHER, _template("({0} / {1})"), scalar_rounds=False),
    aten.div.Scalar: Pointwise(SELF_OTHER, _template("({0} / {1})"), scalar_rounds=False),
    aten.maximum.default: Pointwise(SELF_OTHER, _template("kb_fmax({0}, {1})")),
    aten.minimum.default: Pointwise(SELF_OTHER, _template("kb_fmin({0}, {1})")),
    aten.pow.Tensor_Scalar: Pointwise(("self",), _pow, accepts=_constant("exponent")),
    aten.pow.Tensor_Tensor: Pointwise(("self", "exponent"), _template("std::pow({0}, {1})")),
    aten.gelu.default: Pointwise(("self",), _gelu, accepts=lambda a: a["approximate"] in ("none", "tanh")),
    aten.clamp.default: Pointwise(("self",), _clamp,
                                  accepts=lambda a: all(a[k] is None or _constant(k)(a) for k in ("min", "max"))),
    aten.clamp_min.default: Pointwise(("self",), lambda ops, a: _clamp(ops, {"min": a["min"]}),
                                      accepts=_constant("min")),
    aten.clamp_max.default: Pointwise(("self",), lambda ops, a: _clamp(ops, {"max": a["max"]}),
                                      accepts=_constant("max")),
    aten.where.self: Pointwise(("condition", "self", "other"), _template("({0} ? {1} : {2})"), Compute.WHERE),
    aten._to_copy.default: Pointwise(("self",), _template("{0}"), Compute.CAST, accepts=_plain_copy),
    aten.clone.default: Pointwise(("self",), _template("{0}"), Compute.CAST, accepts=_plain_copy),
    aten.logical_not.default: Pointwise(("self",), _template("(!{0})"), Compute.LOGICAL),
    aten.logical_and.default: Pointwise(SELF_OTHER, _template("({0} && {1})"), Compute.LOGICAL),
    aten.logical_or.default: Pointwise(SELF_OTHER, _template("({0} || {1})"), Compute.LOGICAL),
}
REDUCTIONS = {aten.sum.dim_IntList: "sum", aten.mean.dim: "mean", aten.amax.default: "amax",
              aten.amin.default: "amin"}
REDUCTION_INIT = {"sum": "0.f", "mean": "0.f", "amax": "-std::numeric_limits<float>::infinity()",
                  "amin": "std::numeric_limits<float>::infinity()"}


@dataclass
class FusionOp:
    """A node a loop can compute: its operands (nodes or Python numbers) and how."""

    node: fx.Node
    operands: list[Any]
    dtype: torch.dtype  # of the result
    compute_dtype: torch.dtype
    spec: Pointwise | None = None
    args: dict[str, Any] = field(default_factory=dict)
    reduction: str | None = None


def fusion_op(node: fx.Node, values: dict[fx.Node, Any]) -> FusionOp | None:
    """How a loop computes `node`, or None when it cannot (the node then runs as its `_ops` call)."""
    op, result = node.target, values.get(node)
    if not isinstance(result, torch.Tensor) or (op not in POINTWISE and op not in REDUCTIONS):
        return None
    args = {a.name: v for a, v in zip(op._schema.arguments, bind_arguments(node), strict=True)}
    if op in REDUCTIONS:
        return _reduction_op(node, args, values)
    spec = POINTWISE[op]
    operands = [args[name] for name in spec.operands]
    if any(isinstance(v, fx.Node) for k, v in args.items() if k not in spec.operands) or not spec.accepts(args):
        return None
    for v in operands:
        if isinstance(v, fx.Node):
            t = values.get(v)
            if not isinstance(t, torch.Tensor) or t.dtype not in RAW_TYPES:
                return None
        elif not isinstance(v, (int, float)):
            return None
    compute = result.dtype
    if spec.compute is Compute.COMPARE:
        compute = torch.result_type(*[values[v] if isinstance(v, fx.Node) else v for v in operands])
    needs_float = spec.compute in (Compute.ARITH, Compute.COMPARE, Compute.WHERE)
    if (needs_float and compute not in FLOAT_DTYPES) or result.dtype not in FLOAT_DTYPES + (torch.bool,):
        return None
    condition = operands[0]
    if spec.compute is Compute.WHERE and not (isinstance(condition, fx.Node) and values[condition].dtype == torch.bool):
        return None
    return FusionOp(node, operands, result.dtype, compute, spec, args)


def _reduction_op(node: fx.Node, args: dict[str, Any], values: dict[fx.Node, Any]) -> FusionOp | None:
    source, dims = args["self"], args["dim"]
    if not isinstance(source, fx.Node) or not isinstance(values.get(source), torch.Tensor):
        return None
    x = values[source]
    dims = [dims] if isinstance(dims, int) else dims
    if x.dim() == 0 or x.dtype not in FLOAT_DTYPES or not args.get("keepdim"):
        return None
    if args.get("dtype") not in (None, x.dtype):
        return None
    if not isinstance(dims, (list, tuple)) or len(dims) != 1 or dims[0] not in (-1, x.dim() - 1):
        return None
    return FusionOp(node, [source], x.dtype, x.dtype, reduction=REDUCTIONS[node.target])
