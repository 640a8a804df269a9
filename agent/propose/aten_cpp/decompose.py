"""Softmax and layer norm over the last dim spelled as the fp32 ops ATen computes them with, so fused loops can take
them."""

from __future__ import annotations

import copy
import operator
from typing import Any

import torch
import torch.fx as fx

from kernelbot.agent.propose.aten_cpp.graph import Traced, run_graph
from kernelbot.agent.propose.aten_cpp.loop_ops import FLOAT_DTYPES

aten = torch.ops.aten


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
        return Traced(gm, traced.args, run_graph(gm.graph, traced.args), traced.title, traced.n_params)


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
