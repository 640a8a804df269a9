"""Fusion planning: which nodes one loop nest computes, over which domain (rows x last dim)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

import torch.fx as fx

from kernelbot.agent.propose.aten_cpp.graph import Traced
from kernelbot.agent.propose.aten_cpp.loop_ops import FusionOp, fusion_op
from kernelbot.agent.propose.aten_cpp.lowering import is_mutating

MAX_GROUP_OPERANDS = 24  # external tensors one fused loop reads; more and the group stops growing
MAX_FUSED_RANK = 8  # KB_MAX_RANK in the generated C++


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
