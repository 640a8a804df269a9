"""Emission: the C++ of one fused group (its run-time check, its loop nest over rows, its `_ops` fallback) and the
conversions between a loop's fp32 values and the tensors' dtypes."""

from __future__ import annotations

import torch
import torch.fx as fx

from kernelbot.agent.propose.aten_cpp.fusion_plan import FusionPlan, Group, Pattern, member_pattern, varies_along_rows
from kernelbot.agent.propose.aten_cpp.loop_ops import INT_DTYPES, RAW_TYPES, REDUCTION_INIT, Compute, f32
from kernelbot.agent.propose.aten_cpp.lowering import OpsLowering, var_name
from kernelbot.agent.propose.aten_cpp.values import SCALAR_TYPES, CppValue, Kind


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
