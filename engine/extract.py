"""A module call no family covers → a self-contained KernelBench reference extracted from the model itself.

The call is captured at run time (its arguments as the model passed them), flattened into tensors and constants,
and traced with make_fx in fake mode into a straight-line graph of ATen ops over (parameters, buffers, inputs).
Fake tracing fails on control flow that depends on values (`.item()`, `nonzero`, `if tensor`), so a graph that
traces is valid for any values at the traced shapes. The graph is then checked against the live module on every
captured call with the same signature before it becomes a task. The reference holds the graph as Python code, the
parameters' names, shapes and dtypes (small tensors exactly, large ones as seeded draws with the live tensors'
mean and std: a kernel must be right for any weights), and get_inputs() drawing inputs like the observed ones.
"""

from __future__ import annotations

import base64
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from kernelbot import KernelbotError
from kernelbot.kernel_library.base import dtype_name
from kernelbot.records import CallSignature, TensorSpec

EXACT_NUMEL = 4096  # parameters, buffers and int inputs up to this size are written out exactly
CONSTANT_TYPES = (type(None), bool, int, float, str, torch.dtype, torch.device)


class NotExtractable(KernelbotError):
    """The call cannot be made a pure function of tensors (the reason says why)."""


@dataclass
class Call:
    """One captured call: its arguments as passed (tensors cloned before the call) and its output."""

    args: tuple
    kwargs: dict
    output: Any = None


@dataclass
class Extracted:
    signature: CallSignature
    graph_code: str  # `def graph(p0, ..., x0, ...)` returning a tuple of tensors
    param_names: list[str]
    params: list[torch.Tensor]
    inputs: list[torch.Tensor]  # one observed call's tensors, for drawing inputs like them
    call: Call  # that call
    samples: list[list[torch.Tensor]] = field(default_factory=list)  # every observed call with this signature


class _Enough(BaseException):  # not an Exception: a model that catches those must not swallow it
    """Raised from a hook to end the workload once enough calls are captured."""


def capture(module: torch.nn.Module, run: Callable[[], Any], limit: int = 64, shape: list[int] | None = None,
            enough: int = 16) -> list[Call]:
    """The first `limit` calls of `module` while `run()` runs, arguments cloned before the call; the workload is cut
    short once `enough` calls passed a tensor of `shape` (the profiled one): extracting a decode step's call at real
    scale would otherwise run the whole workload (minutes) for each generic task."""
    calls: list[Call] = []
    matching = 0

    def pre(_mod, args, kwargs):
        nonlocal matching
        if len(calls) < limit:
            clone = lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x  # noqa: E731
            calls.append(Call(pytree.tree_map(clone, args), pytree.tree_map(clone, kwargs)))
            leaves = pytree.tree_flatten((args, kwargs))[0]
            matching += shape is not None and any(isinstance(x, torch.Tensor) and list(x.shape) == shape
                                                  for x in leaves)

    def post(_mod, _args, _kwargs, output):
        if calls and calls[-1].output is None:
            calls[-1].output = pytree.tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x,
                                               output)
            if matching >= enough or len(calls) >= limit:
                raise _Enough

    handles = [module.register_forward_pre_hook(pre, with_kwargs=True),
               module.register_forward_hook(post, with_kwargs=True)]
    try:
        run()
    except _Enough:
        pass
    finally:
        for h in handles:
            h.remove()
    return calls


def signature_of(args: tuple, kwargs: dict) -> CallSignature:
    """Tensors (shape, dtype) and constants of a call, with the structure that rebuilds it (a pytree spec)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    tensors, constants = [], []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            tensors.append(TensorSpec(index=i, shape=list(leaf.shape), dtype=dtype_name(leaf.dtype)))
        elif isinstance(leaf, CONSTANT_TYPES):
            constants.append([i, repr(leaf)])
        else:
            raise NotExtractable(f"its call carries a {type(leaf).__name__} (state the call may change), "
                                 "not only tensors and constants")
    return CallSignature(spec=pytree.treespec_dumps(spec), tensors=tensors, constants=constants)


def _rebuild(sig: CallSignature, tensors: list[torch.Tensor], leaves: list[Any]) -> tuple[tuple, dict]:
    leaves = list(leaves)
    for t, value in zip(sig.tensors, tensors, strict=True):
        leaves[t.index] = value
    return pytree.tree_unflatten(leaves, pytree.treespec_loads(sig.spec))


def state_of(module: torch.nn.Module) -> tuple[list[str], list[torch.Tensor]]:
    """Every parameter and buffer (non-persistent ones too), each tensor once, by its first name."""
    named = dict(module.named_parameters(remove_duplicate=True))
    named.update((n, b) for n, b in module.named_buffers(remove_duplicate=True) if n not in named)
    return list(named), list(named.values())


def trace(module: torch.nn.Module, call: Call) -> tuple[torch.fx.GraphModule, CallSignature, list[str]]:
    """The call as a graph over (parameters and buffers, input tensors) → tuple of output tensors."""
    from torch.fx.experimental.proxy_tensor import make_fx

    sig = signature_of(call.args, call.kwargs)
    leaves, _ = pytree.tree_flatten((call.args, call.kwargs))
    names, state = state_of(module)
    out_spec: list[Any] = []

    def pure(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args, kwargs = _rebuild(sig, list(flat[len(names):]), leaves)
        out = torch.func.functional_call(module, dict(zip(names, flat[:len(names)], strict=True)), args, kwargs,
                                         strict=True)
        out_leaves, spec = pytree.tree_flatten(out)
        if any(not isinstance(o, torch.Tensor | type(None)) for o in out_leaves):
            raise NotExtractable("it returns values that are neither tensors nor None")
        out_spec[:] = [spec, [o is None for o in out_leaves]]
        return tuple(o for o in out_leaves if o is not None)

    inputs = [leaves[t.index] for t in sig.tensors]
    try:
        with torch.no_grad():
            gm = make_fx(pure, tracing_mode="fake")(*state, *inputs)
    except NotExtractable:
        raise
    except Exception as exc:  # data-dependent control flow, an op without a fake kernel, Python side effects
        gm = _traced_for_real(pure, state, inputs, exc)
    spec, nones = out_spec
    sig.output_spec, sig.output_none = pytree.treespec_dumps(spec), nones
    return gm, sig, names


def _traced_for_real(pure: Callable[..., Any], state: list[torch.Tensor], inputs: list[torch.Tensor],
                     why: Exception) -> torch.fx.GraphModule:
    """Some ops have no fake kernel for these dtypes (grouped_mm on a CPU): trace on the real tensors instead,
    refusing graphs that read a value into Python (`.item()`); extract() then checks the graph on every observed
    call, which catches routing or sizes baked in from the traced call's values."""
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        with torch.no_grad():
            gm = make_fx(pure, tracing_mode="real")(*state, *inputs)
    except Exception:
        first = str(why).strip().splitlines()[0] if str(why).strip() else ""
        raise NotExtractable(f"it does not trace to a fixed graph ({type(why).__name__}: {first[:160]})") from None
    for node in gm.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "") in VALUE_READS:
            raise NotExtractable(f"its control flow depends on values ({node.target} in its graph)")
    return gm


ALIASES = ("alias.default", "view.default", "clone.default", "detach.default", "_unsafe_view.default")


def computes_nothing(gm: torch.fx.GraphModule) -> bool:
    """Is every output of the graph one of its inputs, as is or through views and copies that change nothing?"""
    def source(node: Any) -> Any:
        while isinstance(node, torch.fx.Node) and node.op == "call_function" and \
                getattr(node.target, "__name__", "") in ALIASES and node.args and \
                isinstance(node.args[0], torch.fx.Node) and _same_meta(node, node.args[0]):
            node = node.args[0]
        return node

    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    leaves = [o for o in pytree.tree_flatten(outputs)[0] if isinstance(o, torch.fx.Node)]
    return bool(leaves) and all(source(o).op == "placeholder" for o in leaves)


def _same_meta(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    ta, tb = a.meta.get("val"), b.meta.get("val")
    return ta is None or tb is None or (ta.shape == tb.shape and ta.dtype == tb.dtype)


VALUE_READS = ("_local_scalar_dense.default", "item.default", "nonzero.default", "unique.default")


def graph_source(gm: torch.fx.GraphModule, n_state: int, n_inputs: int) -> str:
    """The graph as `def graph(p0.., x0..)`: plain Python over torch.ops.aten, no GraphModule needed."""
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            raise NotExtractable(f"its graph holds a tensor constant ({node.target}) made inside forward")
    code = gm.code
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    names = [f"p{i}" for i in range(n_state)] + [f"x{i}" for i in range(n_inputs)]
    body = code.split(":\n", 1)[1]  # after `def forward(self, ...):`
    for old, new in zip(placeholders, names, strict=True):
        body = re.sub(rf"\b{re.escape(old)}\b", new, body)
    return f"def graph({', '.join(names)}):\n{body.rstrip()}\n"


def _exec_graph(source: str) -> Callable[..., tuple[torch.Tensor, ...]]:
    scope: dict[str, Any] = {"torch": torch, "device": torch.device, "inf": float("inf"), "nan": float("nan")}
    exec(compile(source, "<kernelbot graph>", "exec"), scope)  # noqa: S102 (our own traced code)
    return scope["graph"]


def extract(module: torch.nn.Module, calls: list[Call], shape: list[int] | None = None) -> Extracted:
    """The most frequent signature among the calls (among those with a tensor of `shape`, the profiled one, when
    any has it), traced and checked against every call that has it."""
    if not calls:
        raise NotExtractable("it was not called during the workload")
    sigs = [signature_of(c.args, c.kwargs) for c in calls]
    keys = [s.model_dump_json() for s in sigs]
    profiled = [k for k, sig in zip(keys, sigs, strict=True) if any(t.shape == shape for t in sig.tensors)]
    top = Counter(profiled or keys).most_common(1)[0][0]
    same = [c for c, k in zip(calls, keys, strict=True) if k == top]
    gm, sig, names = trace(module, same[0])
    if computes_nothing(gm):
        raise NotExtractable("it computes nothing at this call (its outputs are its inputs, e.g. dropout in eval "
                             "mode): the op costs only its call, so skip it rather than write a kernel for it")
    _, state = state_of(module)
    samples = [[leaf for leaf in pytree.tree_flatten((c.args, c.kwargs))[0] if isinstance(leaf, torch.Tensor)]
               for c in same]
    source = graph_source(gm, len(state), len(sig.tensors))
    graph = _exec_graph(source)
    for call, inputs in zip(same, samples, strict=True):
        with torch.no_grad():
            got = graph(*state, *inputs)
        want = [o for o in pytree.tree_flatten(call.output)[0] if o is not None]
        if len(got) != len(want) or not all(_same(g, w) for g, w in zip(got, want, strict=True)):
            raise NotExtractable("its traced graph does not reproduce the module's own outputs on the observed "
                                 "calls (state or randomness outside its arguments)")
    return Extracted(signature=sig, graph_code=source, param_names=names, params=list(state), inputs=samples[0],
                     call=same[0], samples=samples)


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to the dtype's rounding (the graph's decomposed ops, e.g. linear as addmm, may round apart)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if not got.is_floating_point():
        return torch.equal(got, want)
    tol = 1e-4 if got.dtype in (torch.float32, torch.float64) else 3e-2
    return torch.allclose(got.double(), want.double(), rtol=tol, atol=tol, equal_nan=True)


def _tensor_literal(t: torch.Tensor) -> str:
    raw = base64.b64encode(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()).decode()
    return f'_exact("{raw}", {list(t.shape)}, "{dtype_name(t.dtype)}")'


def _draw(t: torch.Tensor) -> str:
    """How the reference makes a tensor like `t`: exactly when small, else a seeded draw with its statistics."""
    if t.numel() <= EXACT_NUMEL:
        return _tensor_literal(t)
    if t.is_floating_point():
        f = t.detach().double()
        return f'_like({list(t.shape)}, "{dtype_name(t.dtype)}", {float(f.mean()):.6g}, {float(f.std()):.6g})'
    if t.dtype == torch.bool:
        return f'_bools({list(t.shape)}, {float(t.double().mean()):.6g})'
    return f'_ints({list(t.shape)}, "{dtype_name(t.dtype)}", {int(t.min())}, {int(t.max())})'


def _input_draw(observed: list[torch.Tensor]) -> str:
    """Inputs vary between draws (the verifier needs that): floats drawn with the observed statistics, integer ids
    and positions over every value observed at this signature (from 0 when none was negative), bool masks as
    observed."""
    t = observed[0]
    if t.dtype == torch.bool:
        return _tensor_literal(t)
    if not t.is_floating_point():
        lo, hi = min(int(x.min()) for x in observed), max(int(x.max()) for x in observed)
        return f'_ints({list(t.shape)}, "{dtype_name(t.dtype)}", {min(lo, 0)}, {hi})'
    f = t.detach().double()
    std = float(f.std()) if t.numel() > 1 else 1.0
    return f'_like({list(t.shape)}, "{dtype_name(t.dtype)}", {float(f.mean()):.6g}, {std or 1.0:.6g})'


HELPERS = '''

def _exact(data, shape, dtype):
    raw = bytearray(base64.b64decode(data))
    return torch.frombuffer(raw, dtype=torch.uint8).view(getattr(torch, dtype)).reshape(shape).clone()


def _like(shape, dtype, mean, std):
    return (torch.randn(shape, dtype=torch.float64) * std + mean).to(getattr(torch, dtype))


def _ints(shape, dtype, low, high):
    return torch.randint(low, high + 1, shape, dtype=getattr(torch, dtype))


def _bools(shape, share):
    return torch.rand(shape) < share


def _register(root, name, value, parameter):
    *path, leaf = name.split(".")
    for part in path:
        if not hasattr(root, part):
            root.add_module(part, nn.Module())
        root = getattr(root, part)
    if parameter:
        root.register_parameter(leaf, nn.Parameter(value, requires_grad=False))
    else:
        root.register_buffer(leaf, value)
'''


def reference_source(ex: Extracted, module: torch.nn.Module, title: str, dtype: str) -> str:
    """The KernelBench-format reference.py for an extracted call."""
    parameters = {id(p) for p in module.parameters()}
    entries = [(n, list(t.shape), dtype_name(t.dtype), "parameter" if id(t) in parameters else "buffer")
               for n, t in zip(ex.param_names, ex.params, strict=True)]
    draws = "".join(f"\n        {_draw(t)}," for t in ex.params)
    inputs = "".join(f"\n        {_input_draw([sample[i] for sample in ex.samples])},"
                     for i in range(len(ex.inputs)))
    xs = ", ".join(f"x{i}" for i in range(len(ex.inputs)))
    return f'''"""kernelbot generic task: {title}.

Extracted from the model at the observed call (make_fx, fake mode): forward() is the call's own ATen graph over
the module's parameters and buffers and the call's tensors; constants of the call are baked into the graph.
"""

import base64

import torch
from torch import device, nn  # noqa: F401  (the graph may name devices)

inf, nan = float("inf"), float("nan")
DTYPE = torch.{dtype}
INPUT_SHAPES = {[t.shape for t in ex.signature.tensors]!r}
INPUT_DTYPES = {[t.dtype for t in ex.signature.tensors]!r}
INIT_ARGS = []
PARAMS = {entries!r}
{HELPERS}

{ex.graph_code}

def _values():
    return [{draws}
    ]


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        for (name, _shape, _dtype, kind), value in zip(PARAMS, _values()):
            _register(self, name, value, kind == "parameter")

    def params(self):
        return [self.get_parameter(n) if kind == "parameter" else self.get_buffer(n) for n, _s, _d, kind in PARAMS]

    def forward(self, {xs}):
        out = graph(*self.params(), {xs})
        return out[0] if len(out) == 1 else out


def get_inputs():
    return [{inputs}
    ]


def get_init_inputs():
    return list(INIT_ARGS)
'''
