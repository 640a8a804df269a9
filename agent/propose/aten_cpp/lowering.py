"""The `ops` translation: each graph node as one call of ATen's typed entry point, in the graph's order with the
graph's arguments (the fused translation's fallback too)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from kernelbot.agent.propose.aten_cpp.graph import Traced, Unsupported, op_label
from kernelbot.agent.propose.aten_cpp.signatures import cpp_signature
from kernelbot.agent.propose.aten_cpp.values import CppValue, Kind, Values, kind_of

aten = torch.ops.aten

INT_OPERATORS: dict[Callable[..., Any], str] = {
    operator.add: "({0} + {1})", operator.sub: "({0} - {1})", operator.mul: "({0} * {1})",
    operator.floordiv: "kb_floordiv({0}, {1})", operator.mod: "kb_mod({0}, {1})", operator.neg: "(-{0})",
    operator.truediv: "(static_cast<double>({0}) / static_cast<double>({1}))",
}
SIZE_QUERIES = {aten.sym_size.int: "{0}.size({1})", aten.sym_stride.int: "{0}.stride({1})",
                aten.sym_numel.default: "{0}.numel()", aten.sym_storage_offset.default: "{0}.storage_offset()"}
CPP_TYPES = {Kind.INT: "int64_t", Kind.FLOAT: "double", Kind.BOOL: "bool"}


def bind_arguments(node: fx.Node) -> list[Any]:
    """The node's arguments in schema order, defaults filled in."""
    op = node.target
    schema = op._schema
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(node.args) > len(positional):
        raise Unsupported(f"{op_label(op)}: more positional arguments than its schema has")
    bound = []
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            bound.append(node.args[i])
        elif arg.name in node.kwargs:
            bound.append(node.kwargs[arg.name])
        elif arg.has_default_value():
            bound.append(arg.default_value)
        else:
            raise Unsupported(f"{op_label(op)}: no value for its argument `{arg.name}`")
    return bound


def is_mutating(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable


class OpsLowering:
    """C++ statements for graph nodes, each as ATen's own call. Collects the headers those calls need."""

    def __init__(self, traced: Traced) -> None:
        self.traced = traced
        self.values = Values()
        self.headers: set[str] = set()

    def value_of(self, node: fx.Node) -> Any:
        return self.traced.values[node]

    def declare(self, node: fx.Node, var: str) -> None:
        self.values.names[node] = CppValue(var, kind_of(self.value_of(node)))

    def statement(self, node: fx.Node, var: str) -> list[str]:
        """The C++ that computes `node` into a new variable `var` (recorded as the node's name)."""
        target = node.target
        if target is operator.getitem:
            return self._getitem(node, var)
        if target in INT_OPERATORS:
            return self._int_operator(node, var)
        if target in SIZE_QUERIES:
            tensor = self.values.tensor(node.args[0], op_label(target))
            extra = [self.values.scalar(a, op_label(target))[0] for a in node.args[1:]]
            self.declare(node, var)
            return [f"const int64_t {var} = {SIZE_QUERIES[target].format(tensor, *extra)};"]
        if not isinstance(target, torch._ops.OpOverload):
            raise Unsupported(f"{op_label(target)}: not an ATen op")
        if target.namespace != "aten":
            raise Unsupported(f"{op_label(target)}: only aten ops are translated")
        return self._op_call(node, var)

    def _op_call(self, node: fx.Node, var: str) -> list[str]:
        op = node.target
        label = op_label(op)
        sig = cpp_signature(op)
        self.headers.add(sig.header)
        args = [self.values.convert(value, ctype, f"{label} argument `{arg.name}`")
                for value, ctype, arg in zip(bind_arguments(node), sig.params, op._schema.arguments, strict=True)]
        call = f"at::_ops::{sig.struct}::call({', '.join(args)})"
        value = self.value_of(node)
        if sig.returns == "void" or value is None:
            self.values.names[node] = CppValue("", Kind.NONE)
            return [f"{call};"]
        kind = kind_of(value)
        if kind not in (Kind.TENSOR, Kind.TENSORS, Kind.TUPLE):
            raise Unsupported(f"{label}: returns a {type(value).__name__}, not tensors")
        self.values.names[node] = CppValue(var, kind)
        return [f"auto {var} = {call};"]

    def _getitem(self, node: fx.Node, var: str) -> list[str]:
        source, index = node.args
        if not isinstance(source, fx.Node) or not isinstance(index, int):
            raise Unsupported("operator.getitem: only constant indices into op results are translated")
        src = self.values.get(source)
        if src.kind is Kind.TUPLE:
            expr = f"std::get<{index}>({src.expr})"
        elif src.kind is Kind.TENSORS:
            expr = f"{src.expr}[{index}]"
        else:
            raise Unsupported(f"operator.getitem on a {src.kind.value}")
        self.declare(node, var)
        return [f"auto {var} = {expr};"]

    def _int_operator(self, node: fx.Node, var: str) -> list[str]:
        label = op_label(node.target)
        operands = [self.values.scalar(a, label)[0] for a in node.args]
        kind = kind_of(self.value_of(node))
        if kind not in CPP_TYPES:
            raise Unsupported(f"{label} giving a {kind.value}")
        self.declare(node, var)
        return [f"const {CPP_TYPES[kind]} {var} = {INT_OPERATORS[node.target].format(*operands)};"]


def var_name(node: fx.Node) -> str:
    return f"v_{node.name}"
