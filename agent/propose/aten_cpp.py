"""Candidates for any generic task without an LLM: the reference's ATen graph translated to one C++ function.

A generic task's reference (written by engine/extract.py) computes `graph(*params, *inputs)`, a straight-line graph
of `torch.ops.aten.*` calls printed from make_fx. `generate()` turns it into candidates, one per config:

- `ops`: every node becomes a call of ATen's typed entry point `at::_ops::<op>_<overload>::call(...)`, in the
  graph's order with the graph's arguments, so the results are bitwise the graph's. What it saves is the Python
  dispatch of each op, which dominates small decode-time ops on a CPU.
- `fused`: the same, except that groups of pointwise ops and last-dim reductions (sum, mean, amax, amin; softmax
  and layer norm over the last dim are first spelled as those, in fp32 as ATen computes them) over one domain
  (rows x last dim) become one loop nest: at::parallel_for over rows, an inner loop per reduction level, fp32 math,
  and rounding to bf16/fp16 exactly where the graph's op rounds (each op's result in its own dtype). Operands are
  read through their strides, so broadcasts and views need no copies. At run time a group checks that its operands
  have the dtypes, layout and shapes it was built for; if not, it runs its ops through `_ops`, so every input the
  graph accepts stays correct. Matrix products whose right operand is a view of a parameter (`mm`, `addmm`: a
  Linear's `t(weight)`, a GPT-2 `Conv1D`'s weight as it is) run the project's own small-M GEMMs
  (kernel_library/small_m_gemm.h, the linear family's kernels) with the bias added in the GEMM's epilogue: the
  weight is packed into panels on the first call and kept by the candidate, repacked when the weight is replaced or
  written in place.

The candidate file is the reference's own text plus the C++ as a string and a `ModelNew(Model)` that calls the
built extension with `[*self.params(), *inputs]`. Candidates run in a sandbox whose filesystem is read-only, so the
trusted parent builds the extension first: `generate()` does (through cpp_build.load_cpp_source, into the shared
build cache); `prebuild(candidate_source)` does it for a candidate text kept from earlier.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import math
import operator
import re
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.fx as fx
from pydantic import BaseModel

from kernelbot import KernelbotError
from kernelbot.kernel_library.base import ROOT as LIBRARY_ROOT
from kernelbot.kernel_library.cpp_build import load_cpp_source
from kernelbot.loading import load_module

aten = torch.ops.aten
OPS_HEADERS = Path(torch.__file__).parent / "include" / "ATen" / "ops"
EXTENSION_NAME = "aten_cpp"
# headers every generated extension includes, precompiled once per build cache (they are most of the compile time)
PRECOMPILED = ("ATen/core/Tensor.h", "ATen/core/List.h", "ATen/EmptyTensor.h", "ATen/Parallel.h",
               "torch/csrc/utils/pybind.h", "algorithm", "cmath", "limits", "tuple", "vector")
MAX_GROUP_OPERANDS = 24  # external tensors one fused loop reads; more and the group stops growing
MAX_FUSED_RANK = 8  # KB_MAX_RANK in the generated C++


class Unsupported(KernelbotError):
    """The graph uses something this generator cannot translate (the reason names it)."""


class Mode(str, Enum):
    OPS = "ops"
    FUSED = "fused"


class GenericConfig(BaseModel):
    mode: Mode
    grain: int = 16384  # elements per at::parallel_for chunk in fused loops (rows are never split)


CONFIGS = (GenericConfig(mode=Mode.OPS), GenericConfig(mode=Mode.FUSED))
# what the optimize loop proposes: an all-ATen function leaves the work to ATen, which the verifier's
# reference_fallback check rejects by design, so it only runs inside fused code, for the ops no loop covers
PROPOSED = (GenericConfig(mode=Mode.FUSED),)


# ---------------------------------------------------------------------------------------------------------------
# The reference's graph, with an example value for every node


@dataclass
class Traced:
    module: fx.GraphModule
    args: list[Any]  # the reference's own parameters and inputs
    values: dict[fx.Node, Any]  # each node's value on them
    title: str  # the reference docstring's first line
    n_params: int  # how many of `args` (the first) are the reference's parameters and buffers

    @property
    def graph(self) -> fx.Graph:
        return self.module.graph


def load_generic_reference(path: Path) -> ModuleType:
    module = load_module(path, f"kb_generic_{abs(hash(str(path.resolve())))}")
    for name in ("graph", "Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, name):
            raise KernelbotError(f"{path}: not a generic task reference (no `{name}`); make it with "
                                 "engine/extract.py")
    return module


def trace_reference(module: ModuleType) -> Traced:
    """`graph` as an fx graph (read from its source: ops whose arguments are all constants, such as `full` or
    `arange`, stay ops, and sym_size nodes and integer arithmetic stay nodes), with example values from a run on
    the reference's own parameters and inputs."""
    gm = fx.GraphModule(torch.nn.Module(), GraphReader(module).read())
    gm.graph.eliminate_dead_code()  # unused getitems of multi-output ops, and the like
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        try:
            model = module.Model(*module.get_init_inputs()).eval()
            params = list(model.params())
            args = [*params, *module.get_inputs()]
            values = _run(gm.graph, args)
        except Unsupported:
            raise
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"[:300]
            raise KernelbotError(f"the reference's graph does not run on its own inputs ({why}); regenerate "
                                 "the reference") from None
    doc = (module.__doc__ or "").strip().splitlines()
    return Traced(gm, args, values, doc[0] if doc else "", len(params))


BINARY_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
                    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


class GraphReader:
    """The fx graph of a printed straight-line `def graph(...)`: assignments of calls, getitems and integer
    arithmetic, `a = b = None` (dropped references), and a return."""

    def __init__(self, module: ModuleType) -> None:
        self.scope = vars(module)
        try:
            self.function = ast.parse(textwrap.dedent(inspect.getsource(module.graph))).body[0]
        except (OSError, TypeError, SyntaxError) as exc:
            raise Unsupported(f"graph() has no readable source ({exc})") from None
        self.graph = fx.Graph()
        self.env: dict[str, fx.Node] = {}

    def read(self) -> fx.Graph:
        if not isinstance(self.function, ast.FunctionDef):
            raise Unsupported("graph is not a function")
        for arg in self.function.args.args:
            self.env[arg.arg] = self.graph.placeholder(arg.arg)
        for statement in self.function.body:
            if isinstance(statement, ast.Assign) and all(isinstance(t, ast.Name) for t in statement.targets):
                if isinstance(statement.value, ast.Constant) and statement.value.value is None:
                    continue
                value = self.expression(statement.value, statement.targets[0].id)
                for target in statement.targets:
                    self.env[target.id] = value
            elif isinstance(statement, ast.Return) and statement.value is not None:
                self.graph.output(self.expression(statement.value))
                return self.graph
            elif not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)):
                raise Unsupported(f"graph() statement `{ast.unparse(statement)[:100]}` (straight-line code only)")
        raise Unsupported("graph() has no return")

    def expression(self, expr: ast.expr, name: str | None = None) -> Any:
        if isinstance(expr, ast.Name) and expr.id in self.env:
            return self.env[expr.id]
        if isinstance(expr, (ast.List, ast.Tuple)):
            items = [self.expression(e) for e in expr.elts]
            return items if isinstance(expr, ast.List) else tuple(items)
        if isinstance(expr, ast.Call):
            target = self.constant(expr.func)
            args = [self.expression(a) for a in expr.args]
            kwargs = {k.arg: self.expression(k.value) for k in expr.keywords if k.arg}
            if isinstance(target, torch._ops.OpOverload) or _has_node((args, kwargs)):
                return self.graph.create_node("call_function", target, tuple(args), kwargs, name=name)
            return target(*args, **kwargs)  # a constant, such as torch.device('cpu')
        if isinstance(expr, ast.Subscript):
            source, index = self.expression(expr.value), self.expression(expr.slice)
            if isinstance(source, fx.Node):
                return self.graph.create_node("call_function", operator.getitem, (source, index), {}, name=name)
            return source[index]
        if isinstance(expr, (ast.BinOp, ast.UnaryOp)):
            if isinstance(expr, ast.UnaryOp) and type(expr.op) in (ast.USub, ast.UAdd):
                fn, args = (operator.neg if isinstance(expr.op, ast.USub) else operator.pos), [expr.operand]
            elif isinstance(expr, ast.BinOp) and type(expr.op) in BINARY_OPERATORS:
                fn, args = BINARY_OPERATORS[type(expr.op)], [expr.left, expr.right]
            else:
                raise Unsupported(f"graph() expression `{ast.unparse(expr)[:100]}`")
            values = [self.expression(a) for a in args]
            if _has_node(values):
                return self.graph.create_node("call_function", fn, tuple(values), {}, name=name)
            return fn(*values)
        return self.constant(expr)

    def constant(self, expr: ast.expr) -> Any:
        """An expression over the module's names only (torch.ops.aten.add.Tensor, torch.float32, inf)."""
        names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
        if names & set(self.env):
            raise Unsupported(f"graph() expression `{ast.unparse(expr)[:100]}`")
        try:
            return eval(compile(ast.Expression(expr), "<graph>", "eval"), self.scope)  # noqa: S307 (trusted code)
        except Exception as exc:
            raise Unsupported(f"graph() expression `{ast.unparse(expr)[:100]}` ({type(exc).__name__})") from None


def _has_node(value: Any) -> bool:
    found: list[fx.Node] = []
    fx.node.map_arg(value, found.append)
    return bool(found)


def _run(graph: fx.Graph, args: list[Any]) -> dict[fx.Node, Any]:
    values: dict[fx.Node, Any] = {}
    inputs = iter(args)
    for node in graph.nodes:
        if node.op == "placeholder":
            values[node] = next(inputs)
        elif node.op == "call_function":
            call_args, call_kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
            values[node] = node.target(*call_args, **call_kwargs)
        elif node.op == "output":
            values[node] = fx.node.map_arg(node.args[0], lambda n: values[n])
        else:
            raise Unsupported(f"graph node {node.name}: {node.op} {node.target} (only ATen calls are translated)")
    return values


def op_label(target: Any) -> str:
    """aten.add.Tensor for an OpOverload, the function's name otherwise."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[1]}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


# ---------------------------------------------------------------------------------------------------------------
# C++ signatures of ATen's typed entry points, read from torch's own headers


@dataclass(frozen=True)
class CppSignature:
    struct: str  # at::_ops::<struct>::call
    header: str  # include path, ATen/ops/<stem>_ops.h
    returns: str
    params: tuple[str, ...]  # C++ types, const and & removed, in schema order


def struct_name(op: torch._ops.OpOverload) -> str:
    name, overload = op._schema.name.split("::")[1], op._schema.overload_name
    return f"{name}_{overload}" if overload else name


@functools.cache
def _struct_index() -> dict[str, Path]:
    """Every `struct TORCH_API x` in ATen/ops/*_ops.h: the fallback for ops whose header stem is not their name
    (aten::__and__ lives in and_ops.h)."""
    index = {}
    for header in OPS_HEADERS.glob("*_ops.h"):
        for struct in re.findall(r"^struct TORCH_API (\w+) \{", header.read_text(), re.M):
            index.setdefault(struct, header)
    return index


@functools.cache
def cpp_signature(op: torch._ops.OpOverload) -> CppSignature:
    struct = struct_name(op)
    base = op._schema.name.split("::")[1]
    pattern = re.compile(rf"^struct TORCH_API {re.escape(struct)} \{{\n(.*?)^\}};", re.M | re.S)
    headers = [OPS_HEADERS / f"{stem}_ops.h" for stem in dict.fromkeys([base, base.rstrip("_"), base.strip("_")])]
    found = None
    for header in [h for h in headers if h.is_file()] + [p for p in [_struct_index().get(struct)] if p]:
        found = pattern.search(header.read_text())
        if found:
            break
    if found is None:
        raise Unsupported(f"{op_label(op)}: no C++ entry point at::_ops::{struct} in torch's headers")
    call = re.search(r"static (.+?) call\((.*)\);", found.group(1))
    if call is None:
        raise Unsupported(f"{op_label(op)}: at::_ops::{struct} has no call()")
    params = tuple(_plain_type(p) for p in _split_params(call.group(2)))
    if len(params) != len(op._schema.arguments):
        raise Unsupported(f"{op_label(op)}: its C++ call takes {len(params)} arguments, its schema "
                          f"{len(op._schema.arguments)}")
    return CppSignature(struct, f"ATen/ops/{header.name}", call.group(1).strip(), params)


def _split_params(text: str) -> list[str]:
    """`const at::Tensor & self, ::std::optional<at::Tensor> x` → each parameter's type (name dropped)."""
    params, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            part = text[start:i].strip()
            if part:
                params.append(part.rsplit(" ", 1)[0])
            start = i + 1
    return params


def _plain_type(ctype: str) -> str:
    return re.sub(r"\s+", " ", ctype.replace("const ", "").replace("&", "")).strip().replace(" >", ">")


# ---------------------------------------------------------------------------------------------------------------
# Python values → C++ expressions


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


# ---------------------------------------------------------------------------------------------------------------
# The `ops` translation: one `_ops` call per node


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


def graph_outputs(traced: Traced) -> list[fx.Node | Any]:
    output = next(n for n in traced.graph.nodes if n.op == "output")
    outs = output.args[0]
    return list(outs) if isinstance(outs, (tuple, list)) else [outs]


def var_name(node: fx.Node) -> str:
    return f"v_{node.name}"


# ---------------------------------------------------------------------------------------------------------------
# The `fused` translation: which ops a loop can compute, and how


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


def decomposed(traced: Traced) -> Traced:
    """A copy of the graph in which softmax and layer norm over the last dim are spelled as the fp32 ops ATen
    computes them with (one rounding, at the end), so that loops can fuse them; everything else is unchanged."""
    gm = copy.deepcopy(traced.module)
    values = dict(zip(gm.graph.nodes, traced.values.values(), strict=True))
    changed = False
    for node in list(gm.graph.nodes):
        if node.target is aten._softmax.default:
            changed |= _decompose_softmax(gm.graph, node, values)
        elif node.target is aten.native_layer_norm.default:
            changed |= _decompose_layer_norm(gm.graph, node, values)
    if not changed:
        return traced
    with torch.no_grad():
        return Traced(gm, traced.args, _run(gm.graph, traced.args), traced.title, traced.n_params)


def _last_dim_float(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dim() > 0 and x.dtype in FLOAT_DTYPES


def _decompose_softmax(graph: fx.Graph, node: fx.Node, values: dict[fx.Node, Any]) -> bool:
    x, dim, half_to_float = node.args
    if not _last_dim_float(values.get(x)) or dim not in (-1, values[x].dim() - 1) or half_to_float:
        return False
    dtype = values[x].dtype
    with graph.inserting_before(node):
        xf = x if dtype == torch.float32 else graph.call_function(aten._to_copy.default, (x,), {"dtype": torch.float32})
        top = graph.call_function(aten.amax.default, (xf, [-1], True))
        e = graph.call_function(aten.exp.default, (graph.call_function(aten.sub.Tensor, (xf, top)),))
        y = graph.call_function(aten.div.Tensor, (e, graph.call_function(aten.sum.dim_IntList, (e, [-1], True))))
        out = y if dtype == torch.float32 else graph.call_function(aten._to_copy.default, (y,), {"dtype": dtype})
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    return True


def _decompose_layer_norm(graph: fx.Graph, node: fx.Node, values: dict[fx.Node, Any]) -> bool:
    x, shape, weight, bias, eps = node.args
    users = list(node.users)
    if not _last_dim_float(values.get(x)) or list(shape) != [values[x].shape[-1]]:
        return False
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in users):
        return False  # mean and rstd are used: keep the op
    dtype = values[x].dtype
    call = graph.call_function
    with graph.inserting_before(node):
        xf = x if dtype == torch.float32 else call(aten._to_copy.default, (x,), {"dtype": torch.float32})
        d = call(aten.sub.Tensor, (xf, call(aten.mean.dim, (xf, [-1], True))))
        var = call(aten.mean.dim, (call(aten.mul.Tensor, (d, d)), [-1], True))
        y = call(aten.mul.Tensor, (d, call(aten.rsqrt.default, (call(aten.add.Tensor, (var, eps)),))))
        y = y if weight is None else call(aten.mul.Tensor, (y, weight))  # an fp32 op: no rounding of the weight
        y = y if bias is None else call(aten.add.Tensor, (y, bias))
        out = y if dtype == torch.float32 else call(aten._to_copy.default, (y,), {"dtype": dtype})
    for user in users:
        user.replace_all_uses_with(out)
        graph.erase_node(user)
    graph.erase_node(node)
    return True


class Pattern(str, Enum):
    """What a group member is over the group's domain (rows x n, n its last dim)."""

    FULL = "full"  # one value per element (shape == domain): computed in the loops over the row
    ROW = "row"  # one value per row (shape == domain[:-1] + [1]): computed once per row


def member_pattern(shape: Iterable[int], domain: tuple[int, ...]) -> Pattern | None:
    shape = tuple(shape)
    if shape == domain:
        return Pattern.FULL
    return Pattern.ROW if domain and shape == domain[:-1] + (1,) else None


def broadcasts(shape: Iterable[int], domain: tuple[int, ...]) -> bool:
    """Whether a tensor of `shape` broadcasts to `domain` (NumPy's rules)."""
    shape = tuple(shape)
    padded = (1,) * (len(domain) - len(shape)) + shape
    return len(shape) <= len(domain) and all(s in (1, d) for s, d in zip(padded, domain, strict=True))


def varies_along_rows(shape: Iterable[int], domain: tuple[int, ...]) -> bool:
    """Whether an operand changes along the last dim (read per element) or not (read once per row)."""
    shape = tuple(shape)
    return bool(domain) and bool(shape) and shape[-1] == domain[-1] != 1


@dataclass
class Group:
    domain: tuple[int, ...]
    nodes: list[fx.Node]
    closed: bool = False


class FusionPlan:
    """Groups of nodes that one loop nest computes. Nodes are taken in graph order; a fusable node joins an open
    group it can share a domain with (one that computes one of its inputs first). A group closes once anything
    outside it reads one of its values, or anything mutates memory, so emitting a group where its last node was
    keeps every value computed before it is read."""

    def __init__(self, traced: Traced) -> None:
        self.values = traced.values
        self.ops: dict[fx.Node, FusionOp] = {}
        self.groups: list[Group] = []
        self.group_of: dict[fx.Node, Group] = {}
        for node in traced.graph.nodes:
            if node.op == "call_function":
                self._visit(node)

    def _visit(self, node: fx.Node) -> None:
        fused = fusion_op(node, self.values)
        joined = self._join(node, fused) if fused else None
        for source in node.all_input_nodes:
            group = self.group_of.get(source)
            if group is not None and group is not joined:
                group.closed = True
        if is_mutating(node):
            for group in self.groups:
                group.closed = True

    def _join(self, node: fx.Node, fused: FusionOp) -> Group | None:
        self.ops[node] = fused
        open_groups = [g for g in reversed(self.groups) if not g.closed]
        producers = [g for g in open_groups if any(self.group_of.get(s) is g for s in node.all_input_nodes)]
        for group in producers + [g for g in open_groups if g not in producers]:
            for domain in self._domains(group, node, fused):
                if self._valid(domain, group.nodes + [node]):
                    group.domain = domain
                    group.nodes.append(node)
                    self.group_of[node] = group
                    return group
        domain = tuple(self.values[fused.operands[0]].shape) if fused.reduction else tuple(self.values[node].shape)
        if not self._valid(domain, [node]):
            return None
        group = Group(domain, [node])
        self.groups.append(group)
        self.group_of[node] = group
        return group

    def _domains(self, group: Group, node: fx.Node, fused: FusionOp) -> list[tuple[int, ...]]:
        """The group's domain, or the node's shape when the group so far is one value per row of it."""
        shape = tuple(self.values[node].shape)
        domains = [group.domain]
        if not fused.reduction and shape and group.domain == shape[:-1] + (1,) and shape[-1] != 1 \
                and not any(self.ops[m].reduction for m in group.nodes):
            domains.append(shape)
        return domains

    def _valid(self, domain: tuple[int, ...], nodes: list[fx.Node]) -> bool:
        """Every node is one value per element (FULL) or per row (ROW) of `domain`, reductions read a FULL value,
        and every other operand broadcasts to the domain (read through its strides; the run-time check also
        asks for a contiguous last dim)."""
        if len(domain) > MAX_FUSED_RANK:
            return False
        members = set(nodes)
        externals: set[fx.Node] = set()
        for node in nodes:
            fused = self.ops[node]
            kind = member_pattern(self.values[node].shape, domain)
            if kind is None:
                return False
            for v in fused.operands:
                if isinstance(v, fx.Node) and v not in members:
                    if not broadcasts(self.values[v].shape, domain):
                        return False
                    externals.add(v)
            if fused.reduction and (kind is not Pattern.ROW or tuple(self.values[fused.operands[0]].shape) != domain):
                return False
        return len(externals) <= MAX_GROUP_OPERANDS


def round_to(dtype: torch.dtype, expr: str) -> str:
    """A float rounded to `dtype`'s precision (and back to float)."""
    if dtype == torch.bfloat16:
        return f"BF::in(BF::out({expr}))"
    if dtype == torch.float16:
        return f"kb_half({expr})"
    return expr


def convert(expr: str, source: torch.dtype, target: torch.dtype) -> str:
    """A loop value of dtype `source` as `target` would hold it (ATen's casts: int→float rounds once)."""
    if source == target:
        return expr
    if target == torch.bool:
        return f"({expr} != 0)"
    if source == torch.bool:
        return f"({expr} ? 1.f : 0.f)"
    value = f"static_cast<float>({expr})" if source in INT_DTYPES else expr
    rounds = source in INT_DTYPES or source == torch.float32 or {source, target} == {torch.bfloat16, torch.float16}
    return round_to(target, value) if rounds else value


def load(dtype: torch.dtype, expr: str) -> str:
    if dtype == torch.bfloat16:
        return f"BF::in({expr})"
    if dtype == torch.float16:
        return f"static_cast<float>({expr})"
    return f"static_cast<int64_t>({expr})" if dtype in INT_DTYPES else expr


def store(dtype: torch.dtype, expr: str) -> str:
    if dtype == torch.bfloat16:
        return f"BF::out({expr})"
    return f"static_cast<c10::Half>({expr})" if dtype == torch.float16 else expr


def local_type(dtype: torch.dtype) -> str:
    return "bool" if dtype == torch.bool else "int64_t" if dtype in INT_DTYPES else "float"


class GroupEmitter:
    """The C++ for one group: a run-time check of its operands, the loop nest, and the `_ops` calls as fallback.

    Operands are read through their strides (broadcast dims have stride 0): a per-row offset, then [offset + i]
    for operands that vary along the row, [offset] for those that do not. The check asks for broadcastable
    shapes, the traced dtypes, a contiguous last dim, dims in row-major order (so ATen's results would be
    row-major, as the loop's are), and — through bitmasks of size-1 dims — that every output and every reduced
    value has the shape it had when traced (so, e.g., a batch of 1 that broadcasts where the trace had 8 rows
    falls back instead of writing a wrong shape)."""

    def __init__(self, group: Group, plan: FusionPlan, lowering: OpsLowering, grain: int) -> None:
        self.group, self.plan, self.lowering, self.grain = group, plan, lowering, grain
        self.values = plan.values
        self.rank = len(group.domain)
        self.members = group.nodes
        self.member_set = set(group.nodes)
        operands = [v for m in self.members for v in plan.ops[m].operands if isinstance(v, fx.Node)]
        self.externals: list[fx.Node] = list(dict.fromkeys(v for v in operands if v not in self.member_set))
        self.ext_index = {e: k for k, e in enumerate(self.externals)}
        self.varies = {e: varies_along_rows(self.values[e].shape, group.domain) for e in self.externals}
        self.outputs = [m for m in self.members if any(u not in self.member_set for u in m.users)]
        self.level: dict[fx.Node, int] = {}
        for m in self.members:
            below = [self.level[v] for v in plan.ops[m].operands if v in self.member_set]
            self.level[m] = max(below, default=0) + (1 if plan.ops[m].reduction else 0)

    def pattern_of(self, node: fx.Node) -> Pattern:
        found = member_pattern(self.values[node].shape, self.group.domain)
        assert found is not None
        return found

    def dtype_of(self, node: fx.Node) -> torch.dtype:
        return self.values[node].dtype

    def emit(self) -> list[str]:
        lines = [f"// fused: {', '.join(m.name for m in self.members)}"]
        lines += [f"at::Tensor {var_name(m)};" for m in self.outputs]
        tensors = [self.lowering.values.get(e).expr for e in self.externals]
        lines.append("{")
        shapes = ", ".join(f"{t}.sizes()" for t in tensors)
        lines.append(f"  const KbDomain dom = kb_domain({{{shapes}}}, {self.rank});")
        lines.append(f"  KbOperand {', '.join(f'op{k}' for k in range(len(tensors)))};")
        checks = ["dom.ok"] + [f"kb_operand({t}, dom, {'true' if self.varies[e] else 'false'}, "
                               f"at::ScalarType::{SCALAR_TYPES[self.dtype_of(e)]}, op{k})"
                               for k, (t, e) in enumerate(zip(tensors, self.externals, strict=True))]
        lines.append(f"  bool fast = {' && '.join(checks)};")
        lines.append("  if (fast) {")
        lines += ["    " + line for line in self._shape_checks()]
        lines.append("  }")
        lines.append("  if (fast) {")
        lines += ["    " + line for line in self._fast_path(tensors)]
        lines.append("  } else {")
        lines += ["    " + line for line in self._slow_path()]
        lines.append("  }")
        lines.append("}")
        for m in self.outputs:
            self.lowering.values.names[m] = CppValue(var_name(m), Kind.TENSOR)
        return lines

    def _shape_checks(self) -> list[str]:
        """Each member's size-1 dims (a bitmask): those all its operands share; a reduction adds the last dim."""
        last = f"(uint64_t(1) << {self.rank - 1})" if self.rank else "uint64_t(0)"
        lines = []
        for m in self.members:
            parts = [f"k_{v.name}" if v in self.member_set else f"op{self.ext_index[v]}.ones"
                     for v in self.plan.ops[m].operands if isinstance(v, fx.Node)]
            mask = " & ".join(parts) or "~uint64_t(0)"
            lines.append(f"const uint64_t k_{m.name} = {mask}{f' | {last}' if self.plan.ops[m].reduction else ''};")
        checks = [f"k_{m.name} == dom.ones" if self.pattern_of(m) is Pattern.FULL else
                  f"k_{m.name} == (dom.ones | {last})" for m in self.outputs]
        for m in self.members:
            source = self.plan.ops[m].operands[0]
            if self.plan.ops[m].reduction and source in self.member_set:
                checks.append(f"(k_{source.name} & {last}) == (dom.ones & {last})")
        return lines + [f"fast = {' && '.join(checks)};"]

    def _slow_path(self) -> list[str]:
        lines = []
        for m in self.members:
            lines += self.lowering.statement(m, f"s_{m.name}")
        return lines + [f"{var_name(m)} = s_{m.name};" for m in self.outputs]

    def _fast_path(self, tensors: list[str]) -> list[str]:
        lines = []
        for m in self.outputs:
            row = "true" if self.pattern_of(m) is Pattern.ROW else "false"
            lines.append(f"{var_name(m)} = kb_empty(dom, {row}, at::ScalarType::{SCALAR_TYPES[self.dtype_of(m)]});")
        for k, (t, e) in enumerate(zip(tensors, self.externals, strict=True)):
            raw = RAW_TYPES[self.dtype_of(e)]
            lines.append(f"const {raw}* e{k} = static_cast<const {raw}*>({t}.const_data_ptr());")
        for m in self.outputs:
            raw = RAW_TYPES[self.dtype_of(m)]
            lines.append(f"{raw}* o_{m.name} = static_cast<{raw}*>({var_name(m)}.data_ptr());")
        lines.append("const int64_t n = dom.n;")
        lines.append(f"at::parallel_for(0, dom.rows, kb_grain(n, {self.grain}), [&](int64_t r0, int64_t r1) {{")
        lines.append("  for (int64_t r = r0; r < r1; ++r) {")
        lines += ["    " + line for line in self._offsets() + self._row_body()]
        lines.append("  }")
        lines.append("});")
        return lines

    def _offsets(self) -> list[str]:
        """Where row r of each operand starts: the row's index over the leading dims, times the strides."""
        count = len(self.externals)
        if not count:
            return []
        lines = [f"int64_t {', '.join(f'w{k} = 0' for k in range(count))};"]
        if self.rank >= 2:
            lines.append(f"for (int64_t d = {self.rank - 2}, rest = r; d >= 0; --d) {{")
            lines.append("  const int64_t idx = rest % dom.full[d];")
            lines.append("  rest /= dom.full[d];")
            lines += [f"  w{k} += idx * op{k}.strides[d];" for k in range(count)]
            lines.append("}")
        return lines

    def _row_body(self) -> list[str]:
        lines = [f"const {local_type(self.dtype_of(e))} x{k} = {load(self.dtype_of(e), f'e{k}[w{k}]')};"
                 for k, e in enumerate(self.externals) if not self.varies[e]]
        row_members = [m for m in self.members if self.pattern_of(m) is Pattern.ROW]
        for level in range(max(self.level.values()) + 1):
            lines += [self._define(m) for m in row_members if self.level[m] == level and not self.plan.ops[m].reduction]
            lines += [f"o_{m.name}[r] = {store(self.dtype_of(m), 'f_' + m.name)};"
                      for m in self.outputs if m in row_members and self.level[m] == level]
            lines += self._elem_loop(level)
        return lines

    def _elem_loop(self, level: int) -> list[str]:
        """Loop `level` over the row: the elementwise outputs of this level, and the sums that the next level's
        row values need."""
        elem = [m for m in self.members if self.pattern_of(m) is Pattern.FULL]
        reductions = [m for m in self.members if self.plan.ops[m].reduction and self.level[m] == level + 1]
        stores = [m for m in self.outputs if m in elem and self.level[m] == level]
        if not reductions and not stores:
            return []
        needed: set[fx.Node] = set()
        pending = list(stores) + [self.plan.ops[m].operands[0] for m in reductions]
        while pending:
            v = pending.pop()
            if v in needed:
                continue
            needed.add(v)
            if v in self.member_set:
                pending += [o for o in self.plan.ops[v].operands if isinstance(o, fx.Node)
                            and (o not in self.member_set or self.pattern_of(o) is Pattern.FULL)]
        lines = [f"float acc_{m.name} = {REDUCTION_INIT[self.plan.ops[m].reduction]};" for m in reductions]
        sums = [f"acc_{m.name}" for m in reductions if self.plan.ops[m].reduction in ("sum", "mean")]
        if len(sums) == len(reductions):  # max/min keep NaNs, which an OpenMP max reduction does not
            lines.append("#pragma omp simd" + (f" reduction(+ : {', '.join(sums)})" if sums else ""))
        lines.append("for (int64_t i = 0; i < n; ++i) {")
        for k, e in enumerate(self.externals):
            if e in needed and self.varies[e]:
                value = load(self.dtype_of(e), f"e{k}[w{k} + i]")
                lines.append(f"  const {local_type(self.dtype_of(e))} x{k} = {value};")
        lines += ["  " + self._define(m) for m in elem if m in needed]
        for m in reductions:
            source = self._operand(self.plan.ops[m].operands[0])
            step = (f"acc_{m.name} += {source};" if self.plan.ops[m].reduction in ("sum", "mean") else
                    f"acc_{m.name} = kb_{'fmax' if self.plan.ops[m].reduction == 'amax' else 'fmin'}"
                    f"(acc_{m.name}, {source});")
            lines.append("  " + step)
        lines += [f"  o_{m.name}[r * n + i] = {store(self.dtype_of(m), 'f_' + m.name)};" for m in stores]
        lines.append("}")
        for m in reductions:
            total = f"acc_{m.name} / static_cast<float>(n)" if self.plan.ops[m].reduction == "mean" else f"acc_{m.name}"
            lines.append(f"const float f_{m.name} = {round_to(self.dtype_of(m), total)};")
        return lines

    def _operand(self, v: fx.Node) -> str:
        return f"f_{v.name}" if v in self.member_set else f"x{self.ext_index[v]}"

    def _define(self, m: fx.Node) -> str:
        """`const T f_<m> = <its value>;` for a non-reduction member."""
        fused = self.plan.ops[m]
        spec = fused.spec
        assert spec is not None
        if spec.compute is Compute.LOGICAL:
            target = torch.bool
        elif spec.compute is Compute.COMPARE:
            target = fused.compute_dtype
        else:
            target = fused.dtype
        ops = []
        for position, v in enumerate(fused.operands):
            want = torch.bool if spec.compute is Compute.WHERE and position == 0 else target
            if isinstance(v, fx.Node):
                ops.append(convert(self._operand(v), self.dtype_of(v), want))
            elif want == torch.bool:
                ops.append("true" if v else "false")
            else:
                ops.append(round_to(want, f32(v)) if spec.scalar_rounds else f32(v))
        expr = spec.formula(ops, fused.args)
        if spec.compute is Compute.ARITH:
            expr = round_to(fused.dtype, expr)
        return f"const {local_type(fused.dtype)} f_{m.name} = {expr};"


# ---------------------------------------------------------------------------------------------------------------
# The C++ file


PRELUDE = r"""
// A Python number passed where an op takes a tensor: the wrapped-number tensor Python's op call makes of it.
template <typename T>
static at::Tensor kb_wrapped_as(T value, at::ScalarType type) {
  at::Tensor t(at::detail::empty_cpu(at::IntArrayRef(), type, false, std::nullopt));
  *static_cast<T*>(t.data_ptr()) = value;
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}
static at::Tensor kb_wrapped(double v) { return kb_wrapped_as<double>(v, at::ScalarType::Double); }
static at::Tensor kb_wrapped(int64_t v) { return kb_wrapped_as<int64_t>(v, at::ScalarType::Long); }
static at::Tensor kb_wrapped(bool v) { return kb_wrapped_as<bool>(v, at::ScalarType::Bool); }

static c10::List<::std::optional<at::Tensor>> kb_optional_tensors(
    std::initializer_list<::std::optional<at::Tensor>> items) {
  c10::List<::std::optional<at::Tensor>> list;
  list.reserve(items.size());
  for (const auto& item : items) list.push_back(item);
  return list;
}

// Python's // and % on ints (floor semantics)
static int64_t kb_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static int64_t kb_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  return (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;
}
"""

FUSED_PRELUDE = r"""
using BF = Lanes<c10::BFloat16>;
static inline float kb_half(float v) { return static_cast<float>(static_cast<c10::Half>(v)); }
static inline float kb_fmax(float a, float b) { return a != a ? a : (b != b ? b : (a < b ? b : a)); }
static inline float kb_fmin(float a, float b) { return a != a ? a : (b != b ? b : (b < a ? b : a)); }
static inline float kb_relu(float a) { return a != a ? a : (a < 0.f ? 0.f : a); }
static inline float kb_clamp(float a, float lo, float hi) { return a != a ? a : std::min(std::max(a, lo), hi); }

// A fused loop's domain: its operands' shapes broadcast together, seen as rows x n (n: the last dim).
constexpr int64_t KB_MAX_RANK = 8;
struct KbDomain {
  bool ok = false;
  int64_t rank = 0, rows = 1, n = 1;
  int64_t full[KB_MAX_RANK] = {};
  uint64_t ones = 0;  // the dims of size 1
};
static KbDomain kb_domain(std::initializer_list<at::IntArrayRef> shapes, int64_t rank) {
  KbDomain d;
  d.rank = rank;
  for (int64_t k = 0; k < rank; ++k) d.full[k] = 1;
  for (const auto& s : shapes) {
    const int64_t pad = rank - static_cast<int64_t>(s.size());
    if (pad < 0) return d;
    for (size_t k = 0; k < s.size(); ++k) {
      int64_t& have = d.full[pad + k];
      if (s[k] == have || s[k] == 1) continue;
      if (have != 1) return d;
      have = s[k];
    }
  }
  for (int64_t k = 0; k < rank; ++k) {
    if (d.full[k] == 1) d.ones |= uint64_t(1) << k;
    if (k + 1 < rank) d.rows *= d.full[k];
  }
  d.n = rank ? d.full[rank - 1] : 1;
  d.ok = true;
  return d;
}
// An operand as the loop reads it: strides over the domain (0 where it broadcasts) and its size-1 dims. It must
// have the traced dtype, and its dims of size > 1 must be in row-major order: then ATen's TensorIterator gives
// every op's result row-major memory too (as the loop's outputs have), which later views of them rely on.
struct KbOperand {
  int64_t strides[KB_MAX_RANK] = {};
  uint64_t ones = 0;
};
static bool kb_operand(const at::Tensor& t, const KbDomain& d, bool varies, at::ScalarType dtype, KbOperand& op) {
  if (t.scalar_type() != dtype) return false;
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const int64_t pad = d.rank - static_cast<int64_t>(sizes.size());
  int64_t outer = std::numeric_limits<int64_t>::max();
  for (int64_t k = 0; k < d.rank; ++k) {
    const bool one = k < pad || sizes[k - pad] == 1;
    op.strides[k] = one ? 0 : strides[k - pad];
    if (one) op.ones |= uint64_t(1) << k;
    if (op.strides[k] == 0) continue;
    if (op.strides[k] >= outer) return false;
    outer = op.strides[k];
  }
  if (d.rank == 0) return !varies;
  const bool last_one = (op.ones >> (d.rank - 1)) & 1;
  return varies ? (last_one ? d.n == 1 : op.strides[d.rank - 1] == 1) : last_one;
}
static at::Tensor kb_empty(const KbDomain& d, bool per_row, at::ScalarType dtype) {
  std::vector<int64_t> shape(d.full, d.full + d.rank);
  if (per_row && !shape.empty()) shape.back() = 1;
  return at::Tensor(at::detail::empty_cpu(shape, dtype, false, std::nullopt));
}
static inline int64_t kb_grain(int64_t n, int64_t elements) {
  return std::max<int64_t>(1, elements / std::max<int64_t>(n, 1));
}
"""


def cpp_source(traced: Traced, config: GenericConfig) -> str:
    """The C++ extension for one config: `run(args, packs)` -> the graph's outputs, then the packs (GEMMs' packed
    weights) as they are after the call."""
    if config.mode is Mode.FUSED:
        traced = decomposed(traced)
    lowering = OpsLowering(traced)
    body: list[str] = []
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    body.append(f'TORCH_CHECK(args.size() == {len(placeholders)}, "run() takes {len(placeholders)} tensors, got ", '
                "args.size());")
    for i, node in enumerate(placeholders):
        if not isinstance(traced.values[node], torch.Tensor):
            raise Unsupported(f"graph argument {node.name} is not a tensor")
        lowering.declare(node, var_name(node))
        body.append(f"at::Tensor {var_name(node)} = args[{i}];")
    plan = FusionPlan(traced) if config.mode is Mode.FUSED else None
    gemms = {n: i * PACK_SLOTS for i, n in enumerate(gemm_nodes(traced))} if config.mode is Mode.FUSED else {}
    for node in traced.graph.nodes:
        if node.op != "call_function":
            continue
        group = plan.group_of.get(node) if plan else None
        if node in gemms:
            body += gemm_statement(lowering, node, var_name(node), gemms[node])
        elif group is None:
            body += lowering.statement(node, var_name(node))
        elif node is group.nodes[-1]:
            body += GroupEmitter(group, plan, lowering, config.grain).emit()
    outs = []
    for out in graph_outputs(traced):
        if not isinstance(out, fx.Node) or lowering.values.get(out).kind is not Kind.TENSOR:
            raise Unsupported(f"graph output {out!r} is not a tensor")
        outs.append(lowering.values.get(out).expr)
    body += [f"std::vector<at::Tensor> kb_out = {{{', '.join(outs)}}};",
             "kb_out.insert(kb_out.end(), packs.begin(), packs.end());  // the GEMMs' packed weights, kept by ModelNew",
             "return kb_out;"]
    headers = sorted(lowering.headers | (set(GEMM_HEADERS) if gemms else set()))
    return _assemble(traced, config, headers, body, packs=len(gemms) * PACK_SLOTS)


def _assemble(traced: Traced, config: GenericConfig, headers: list[str], body: list[str], *, packs: int) -> str:
    fused = config.mode is Mode.FUSED
    parts = [f"// kernelbot agent/propose/aten_cpp.py, config {config.model_dump(mode='json')}: {traced.title}",
             *[f"#include <{h}>" for h in [*PRECOMPILED, *headers]], PRELUDE]
    if fused:
        lanes = (LIBRARY_ROOT / "lanes.h").read_text().replace("#pragma once\n", "")
        parts += ["// kernel_library/lanes.h, inlined (the candidate's C++ is one string)", lanes, FUSED_PRELUDE]
    if packs:
        parts += ["// kernel_library/small_m_gemm.h, inlined", inlined_header(LIBRARY_ROOT / "small_m_gemm.h"),
                  GEMM_PRELUDE]
    parts.append("std::vector<at::Tensor> kb_run(std::vector<at::Tensor> args, std::vector<at::Tensor> packs) {")
    parts += ["  " + line for line in body]
    parts.append("}")
    # `packs`: how many tensors the caller keeps for the GEMMs' packed weights and passes back on every call
    parts.append(f'\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n  m.def("run", &kb_run);\n'
                 f'  m.attr("packs") = {packs};\n}}\n')
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# GEMMs in the `fused` translation: the project's own small-M kernels


GEMM_OPS = {aten.mm.default: 1, aten.addmm.default: 2}  # op → the index of its [K,N] right operand
WEIGHT_VIEWS = (aten.t.default, aten.transpose.int, aten.permute.default, aten.view.default,
                aten._unsafe_view.default, aten.alias.default, aten.detach.default)
PACK_SLOTS = 3  # a GEMM's entries in the candidate's packs: the weight view packed, its panels, the weight's version
GEMM_HEADERS = ("ATen/ops/constant_pad_nd.h", "ATen/ops/empty.h", "immintrin.h")


def _is_parameter_view(node: Any, traced: Traced) -> bool:
    """Is `node` one of the reference's parameters (or buffers), through views only? Only then may a packed copy be
    kept between calls: an activation's storage is reused by the allocator, a parameter's is not while it lives."""
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in WEIGHT_VIEWS:
        node = node.args[0]
    if not isinstance(node, fx.Node) or node.op != "placeholder":
        return False
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    return placeholders.index(node) < traced.n_params


def gemm_nodes(traced: Traced) -> list[fx.Node]:
    """The matrix products the project's GEMMs compute: float32 or bf16 `mm`/`addmm` (bias over the output columns,
    alpha = beta = 1) whose right operand is a parameter seen through views."""
    found = []
    for node in traced.graph.nodes:
        if node.op != "call_function" or node.target not in GEMM_OPS:
            continue
        value = traced.values.get(node)
        right = node.args[GEMM_OPS[node.target]]
        if not isinstance(value, torch.Tensor) or value.dtype not in (torch.float32, torch.bfloat16):
            continue
        if node.target is aten.addmm.default:
            bias = traced.values.get(node.args[0]) if isinstance(node.args[0], fx.Node) else None
            scales = [node.kwargs.get(k, 1) for k in ("beta", "alpha")] + list(node.args[3:])
            if not isinstance(bias, torch.Tensor) or bias.dim() != 1 or any(c != 1 for c in scales):
                continue
        if _is_parameter_view(right, traced):
            found.append(node)
    return found


def gemm_statement(lowering: OpsLowering, node: fx.Node, var: str, slot: int) -> list[str]:
    """`var` = the product by kb_gemm where its operands fit it at run time, else by ATen's own op (as `ops` does)."""
    label = op_label(node.target)
    aten_call = lowering.statement(node, var)  # declares `var` as the node's tensor
    assert len(aten_call) == 1 and aten_call[0].startswith(f"auto {var} = ")
    left, right = node.args[GEMM_OPS[node.target] - 1], node.args[GEMM_OPS[node.target]]
    a, b = lowering.values.tensor(left, label), lowering.values.tensor(right, label)
    bias = ("c10::nullopt" if node.target is aten.mm.default
            else f"c10::optional<at::Tensor>({lowering.values.tensor(node.args[0], label)})")
    return [f"at::Tensor {var};",
            f"if (kb_gemm_fits({a}, {b}, {bias})) {{",
            f"  {var} = kb_gemm(packs, {slot}, {a}, {b}, {bias});",
            "} else {",
            "  " + aten_call[0].replace(f"auto {var} = ", f"{var} = ", 1),
            "}"]


def inlined_header(path: Path) -> str:
    """A library header's text for a one-string extension: its own includes of the library and of torch/extension.h
    dropped (the extension includes ATen's headers itself)."""
    keep = [line for line in path.read_text().splitlines()
            if line.strip() != "#pragma once" and not re.match(r'#include\s+("|<torch/extension\.h>)', line.strip())]
    return "\n".join(keep)


GEMM_PRELUDE = r"""
// y = a @ b (+ bias) with b a view of a parameter: W = b^T ([N,K], read through b's strides) packed once into
// small_m_gemm.h's panels (bf16 [NP,1,K/2,16,2] on CPUs with avx512_bf16, else fp32 [NP,1,K,8], zero-padded) and
// kept in `packs` (PACK_SLOTS per GEMM: the view packed, its panels, the weight's version counter then); a weight
// replaced (another storage, sizes or strides) or written in place (its version moved) is packed again.
static bool kb_gemm_fits(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& bias) {
  const auto dt = a.scalar_type();
  if ((dt != at::kFloat && dt != at::kBFloat16) || b.scalar_type() != dt || a.dim() != 2 || b.dim() != 2) return false;
  if (!a.device().is_cpu() || !b.device().is_cpu() || a.size(1) != b.size(0)) return false;
  if (a.size(0) == 0 || b.size(0) == 0 || b.size(1) == 0) return false;
  return !bias.has_value() || (bias->dim() == 1 && bias->size(0) == b.size(1) && bias->scalar_type() == dt &&
                               bias->is_contiguous() && bias->device().is_cpu());
}

template <typename T, typename P, int LANES, int PAIR>
static at::Tensor kb_pack(const at::Tensor& b, at::ScalarType type) {
  const int64_t K = b.size(0), N = b.size(1), sk = b.stride(0), sn = b.stride(1);
  const int64_t NP = (N + LANES - 1) / LANES, KS = (K + PAIR - 1) / PAIR;
  at::Tensor panels = PAIR == 2 ? at::empty({NP, 1, KS, LANES, 2}, b.options().dtype(type))
                                : at::empty({NP, 1, KS, LANES}, b.options().dtype(type));
  const T* w = b.const_data_ptr<T>();
  P* p = panels.mutable_data_ptr<P>();
  at::parallel_for(0, NP, 1, [&](int64_t begin, int64_t end) {
    for (int64_t np = begin; np < end; ++np)
      for (int64_t ks = 0; ks < KS; ++ks)
        for (int64_t j = 0; j < LANES; ++j)
          for (int64_t t = 0; t < PAIR; ++t) {
            const int64_t n = np * LANES + j, k = ks * PAIR + t;
            p[((np * KS + ks) * LANES + j) * PAIR + t] = (n < N && k < K) ? static_cast<P>(w[k * sk + n * sn])
                                                                         : static_cast<P>(0.f);
          }
  });
  return panels;
}

static at::Tensor kb_gemm(std::vector<at::Tensor>& packs, size_t slot, const at::Tensor& a, const at::Tensor& b,
                          const c10::optional<at::Tensor>& bias) {
  const bool bf16 = a.scalar_type() == at::kBFloat16 && has_avx512_bf16();
  at::Tensor &source = packs[slot], &panels = packs[slot + 1], &version = packs[slot + 2];
  const bool fresh = source.numel() > 0 && source.data_ptr() == b.data_ptr() && source.sizes() == b.sizes() &&
                     source.strides() == b.strides() && source.scalar_type() == b.scalar_type() &&
                     version.numel() == 1 && version.const_data_ptr<int64_t>()[0] == b._version() &&
                     panels.dim() == (bf16 ? 5 : 4);
  if (!fresh) {
    if (bf16) {
      panels = kb_pack<c10::BFloat16, c10::BFloat16, 16, 2>(b, at::kBFloat16);
    } else if (b.scalar_type() == at::kBFloat16) {
      panels = kb_pack<c10::BFloat16, float, 8, 1>(b, at::kFloat);
    } else {
      panels = kb_pack<float, float, 8, 1>(b, at::kFloat);
    }
    version = at::empty({1}, b.options().dtype(at::kLong));
    version.mutable_data_ptr<int64_t>()[0] = b._version();
    source = b;
  }
  const int64_t N = b.size(1);
  if (a.is_contiguous() && bf16 && a.size(1) % 2 == 0) return small_m_linear_bf16(a, panels, bias, N, 4);
  if (a.is_contiguous() && a.scalar_type() == at::kFloat) return small_m_linear(a, panels, bias, N, 4);
  return small_m_project(a, panels, bias, N, 4);  // a conversion, padding or copy first
}
"""


# ---------------------------------------------------------------------------------------------------------------
# Candidates


CANDIDATE = '''

# ---- kernelbot agent/propose/aten_cpp.py candidate, config {config} ----
from kernelbot.kernel_library.cpp_build import load_cpp_source as _kb_load_cpp_source  # noqa: E402

KB_CPP_SOURCE = {source}


def _kb_slot(root, name, kind):
    \"\"\"The dict that holds a parameter or buffer, and its key: read at every call, so new values, `.to()` and
    reassignment are all seen, without params()' name walks.\"\"\"
    owner, _, leaf = name.rpartition(".")
    module = root.get_submodule(owner) if owner else root
    return (module._parameters if kind == "parameter" else module._buffers), leaf


class ModelNew(Model):
    \"\"\"graph() as one C++ function over ATen ({mode}); built by the trusted parent, only loaded here.\"\"\"

    def __init__(self, *args):
        super().__init__(*args)
        self._kb_extension = _kb_load_cpp_source(KB_CPP_SOURCE, {name!r}, {precompiled!r})
        self._kb_slots = [_kb_slot(self, name, kind) for name, _shape, _dtype, kind in PARAMS]
        # the GEMMs' weights as packed (filled by the first call), passed back on every call
        self._kb_packs = [torch.empty(0)] * self._kb_extension.packs

    def forward(self, *inputs):
        out = self._kb_extension.run([slots[key] for slots, key in self._kb_slots] + list(inputs), self._kb_packs)
        kept = len(out) - len(self._kb_packs)
        out, self._kb_packs = out[:kept], out[kept:]
        return out[0] if len(out) == 1 else tuple(out)
'''


def candidate_source(reference_text: str, cpp: str, config: GenericConfig) -> str:
    """The reference's own text (Model, graph and params identical), then the C++ and ModelNew."""
    readable = "'''" not in cpp and not cpp.endswith("\\")  # then a raw string shows the C++ as it is
    literal = f"r'''{cpp}'''" if readable else repr(cpp)
    return reference_text.rstrip("\n") + "\n" + CANDIDATE.format(
        config=config.model_dump(mode="json"), source=literal, mode=config.mode.value, name=EXTENSION_NAME,
        precompiled=PRECOMPILED)


def generate(reference_path: Path, *, prebuild: bool = True,
             configs: tuple[GenericConfig, ...] = PROPOSED) -> list[tuple[dict, str]]:
    """(config, candidate source) for each config. Raises Unsupported when the graph uses something that cannot
    be translated, KernelbotError when the file is not a generic reference. With `prebuild`, each extension is
    built now (in this trusted process, into the shared cache) so the sandboxed candidate only loads it; a config
    whose C++ does not build is left out (Unsupported when none builds)."""
    module = load_generic_reference(reference_path)
    traced = trace_reference(module)
    text = reference_path.read_text()
    out, failures = [], []
    for config in configs:
        cpp = cpp_source(traced, config)
        if prebuild:
            try:
                load_cpp_source(cpp, EXTENSION_NAME, PRECOMPILED)
            except Exception as exc:  # a generator bug for some op: the other config may still build
                failures.append(f"{config.mode.value}: {_first_error(str(exc))}")
                continue
        out.append((config.model_dump(mode="json"), candidate_source(text, cpp, config)))
    if not out:
        raise Unsupported(f"the generated C++ does not build ({'; '.join(failures)})"[:500])
    return out


def _first_error(log: str) -> str:
    errors = [line.strip() for line in log.splitlines() if "error:" in line]
    return (errors[0] if errors else log.strip().splitlines()[-1] if log.strip() else "no output")[:300]


def prebuild(candidate: str) -> None:
    """Build the extension a generated candidate's text carries (its KB_CPP_SOURCE literal, read without running
    the candidate), into the shared cache."""
    for statement in ast.parse(candidate).body:
        targets = [getattr(t, "id", None) for t in statement.targets] if isinstance(statement, ast.Assign) else []
        if targets == ["KB_CPP_SOURCE"]:
            if isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str):
                load_cpp_source(statement.value.value, EXTENSION_NAME, PRECOMPILED)
                return
    raise KernelbotError("prebuild: not an aten_cpp candidate (no KB_CPP_SOURCE string); regenerate it with generate()")
