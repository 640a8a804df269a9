"""Python values as C++ expressions: what the C++ calls each graph value, literals, and arguments converted to a
parameter's C++ type."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
import torch.fx as fx

from kernelbot.agent.propose.aten_cpp.graph import Unsupported


class Kind(str, Enum):
    TENSOR = "tensor"
    TENSORS = "tensors"  # std::vector<at::Tensor>
    TUPLE = "tuple"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    NONE = "none"


@dataclass
class CppValue:
    expr: str
    kind: Kind


SCALAR_TYPES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}
LAYOUTS = {torch.strided: "Strided", torch.sparse_coo: "Sparse"}
MEMORY_FORMATS = {torch.contiguous_format: "Contiguous", torch.preserve_format: "Preserve",
                  torch.channels_last: "ChannelsLast", torch.channels_last_3d: "ChannelsLast3d"}


def kind_of(value: Any) -> Kind:
    if isinstance(value, torch.Tensor):
        return Kind.TENSOR
    if isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value):
        return Kind.TENSORS
    if isinstance(value, tuple):
        return Kind.TUPLE
    if isinstance(value, bool):
        return Kind.BOOL
    if isinstance(value, int):
        return Kind.INT
    if isinstance(value, float):
        return Kind.FLOAT
    if value is None:
        return Kind.NONE
    raise Unsupported(f"a graph value of type {type(value).__name__}")


def int_literal(value: int) -> str:
    if value == -(2**63):
        return "std::numeric_limits<int64_t>::min()"
    return f"int64_t({value}LL)" if abs(value) > 2**31 - 1 else str(value)


def float_literal(value: float) -> str:
    if math.isnan(value):
        return "std::numeric_limits<double>::quiet_NaN()"
    if math.isinf(value):
        return ("-" if value < 0 else "") + "std::numeric_limits<double>::infinity()"
    text = repr(float(value))
    return text if any(c in text for c in ".en") else text + ".0"


def string_literal(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Values:
    """What the C++ calls each graph value, and conversions of arguments to a parameter's C++ type."""

    def __init__(self) -> None:
        self.names: dict[fx.Node, CppValue] = {}

    def get(self, node: fx.Node) -> CppValue:
        if node not in self.names:
            raise Unsupported(f"graph value {node.name} is used before it is computed")
        return self.names[node]

    def scalar(self, value: Any, what: str) -> tuple[str, Kind]:
        """A number (constant or int/float/bool graph value) as a C++ expression."""
        if isinstance(value, fx.Node):
            v = self.get(value)
            if v.kind not in (Kind.INT, Kind.FLOAT, Kind.BOOL):
                raise Unsupported(f"{what}: a {v.kind.value} where a number is expected")
            return v.expr, v.kind
        if isinstance(value, bool):
            return ("true" if value else "false"), Kind.BOOL
        if isinstance(value, int):
            return int_literal(value), Kind.INT
        if isinstance(value, float):
            return float_literal(value), Kind.FLOAT
        raise Unsupported(f"{what}: {value!r} where a number is expected")

    def convert(self, value: Any, ctype: str, what: str) -> str:
        """`value` (a node, constant or list of them) as an argument of C++ type `ctype`."""
        if ctype.startswith("::std::optional<") and ctype.endswith(">"):
            return f"{ctype}()" if value is None else f"{ctype}({self.convert(value, ctype[16:-1], what)})"
        if ctype in ("at::OptionalIntArrayRef", "at::OptionalSymIntArrayRef"):
            inner = "at::IntArrayRef" if ctype == "at::OptionalIntArrayRef" else "c10::SymIntArrayRef"
            return f"{ctype}()" if value is None else f"{ctype}({inner}({self.convert(value, inner, what)}))"
        if ctype == "at::Tensor":
            return self.tensor(value, what)
        if ctype in ("at::TensorList", "at::ITensorListRef"):
            items = ", ".join(self.tensor(v, what) for v in self._items(value, what))
            vector = f"std::vector<at::Tensor>({{{items}}})"
            return vector if ctype == "at::TensorList" else f"at::TensorList({vector})"
        if ctype == "c10::List<::std::optional<at::Tensor>>":
            items = ", ".join("::std::optional<at::Tensor>()" if v is None else
                              f"::std::optional<at::Tensor>({self.tensor(v, what)})" for v in self._items(value, what))
            return f"kb_optional_tensors({{{items}}})"
        if ctype in ("int64_t", "c10::SymInt"):
            expr, kind = self.scalar(value, what)
            if kind is Kind.FLOAT:
                raise Unsupported(f"{what}: a float where an int is expected")
            return expr if ctype == "int64_t" else f"c10::SymInt({expr})"
        if ctype in ("at::IntArrayRef", "c10::SymIntArrayRef"):
            element = "int64_t" if ctype == "at::IntArrayRef" else "c10::SymInt"
            items = ", ".join(self.convert(v, element, what) for v in self._items(value, what))
            return f"std::vector<{element}>({{{items}}})"
        if ctype == "double":
            expr, kind = self.scalar(value, what)
            return expr if kind is Kind.FLOAT else f"static_cast<double>({expr})"
        if ctype == "bool":
            expr, kind = self.scalar(value, what)
            return expr if kind is Kind.BOOL else f"static_cast<bool>({expr})"
        if ctype == "at::Scalar":
            expr, kind = self.scalar(value, what)
            cast = {Kind.INT: "int64_t", Kind.FLOAT: "double", Kind.BOOL: "bool"}[kind]
            return f"at::Scalar(static_cast<{cast}>({expr}))"
        if ctype == "at::ScalarType":
            return self._enum(value, SCALAR_TYPES, "at::ScalarType", what)
        if ctype == "at::Layout":
            return self._enum(value, LAYOUTS, "at::Layout", what)
        if ctype == "at::MemoryFormat":
            return self._enum(value, MEMORY_FORMATS, "at::MemoryFormat", what)
        if ctype == "at::Device":
            if isinstance(value, str):
                value = torch.device(value)
            if not isinstance(value, torch.device):
                raise Unsupported(f"{what}: {value!r} where a device is expected")
            return f"at::Device({string_literal(str(value))})"
        if ctype in ("c10::string_view", "::std::string_view", "std::string_view"):
            if not isinstance(value, str):
                raise Unsupported(f"{what}: {value!r} where a string is expected")
            return f"{ctype}({string_literal(value)})"
        raise Unsupported(f"{what}: arguments of C++ type {ctype}")

    def tensor(self, value: Any, what: str) -> str:
        """A tensor argument; a Python number there becomes a wrapped-number tensor, as Python's op call makes."""
        if isinstance(value, fx.Node) and self.get(value).kind is Kind.TENSOR:
            return self.get(value).expr
        expr, kind = self.scalar(value, what)
        cast = {Kind.INT: "int64_t", Kind.FLOAT: "double", Kind.BOOL: "bool"}[kind]
        return f"kb_wrapped(static_cast<{cast}>({expr}))"

    @staticmethod
    def _items(value: Any, what: str) -> list[Any]:
        if isinstance(value, (list, tuple)):
            return list(value)
        if isinstance(value, (int, fx.Node)) and not isinstance(value, bool):
            return [value]  # int[1] arguments take a bare int
        raise Unsupported(f"{what}: {value!r} where a list is expected")

    @staticmethod
    def _enum(value: Any, names: dict[Any, str], ctype: str, what: str) -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            return f"static_cast<{ctype}>({value})"
        if value not in names:
            raise Unsupported(f"{what}: {value!r} has no {ctype}")
        return f"{ctype}::{names[value]}"
