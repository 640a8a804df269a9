"""The reference's graph: a generic reference's `graph()` read from its source into an fx graph, run once on the
reference's own parameters and inputs for an example value of every node."""

from __future__ import annotations

import ast
import inspect
import operator
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.fx as fx

from kernelbot import KernelbotError
from kernelbot.loading import load_module


class Unsupported(KernelbotError):
    """The graph uses something this generator cannot translate (the reason names it)."""


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
            values = run_graph(gm.graph, args)
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


def run_graph(graph: fx.Graph, args: list[Any]) -> dict[fx.Node, Any]:
    """Each node's value, the graph run on `args`."""
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


def graph_outputs(traced: Traced) -> list[fx.Node | Any]:
    """What graph() returns, as a list."""
    output = next(n for n in traced.graph.nodes if n.op == "output")
    outs = output.args[0]
    return list(outs) if isinstance(outs, (tuple, list)) else [outs]
