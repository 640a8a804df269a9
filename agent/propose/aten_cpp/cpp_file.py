"""The C++ file for one config: the includes, the preludes (C++ in templates/), the inlined library headers, and
`kb_run`, whose body walks the graph: GEMMs, fused groups where their last node was, `_ops` calls for the rest."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import torch
import torch.fx as fx
from pydantic import BaseModel

from kernelbot.agent.propose.aten_cpp.decompose import decomposed
from kernelbot.agent.propose.aten_cpp.emitter import GroupEmitter
from kernelbot.agent.propose.aten_cpp.fusion_plan import FusionPlan
from kernelbot.agent.propose.aten_cpp.gemm import GEMM_HEADERS, PACK_SLOTS, gemm_nodes, gemm_statement, inlined_header
from kernelbot.agent.propose.aten_cpp.graph import Traced, Unsupported, graph_outputs
from kernelbot.agent.propose.aten_cpp.lowering import OpsLowering, var_name
from kernelbot.agent.propose.aten_cpp.values import Kind
from kernelbot.kernel_library.base import ROOT as LIBRARY_ROOT

# headers every generated extension includes, precompiled once per build cache (they are most of the compile time)
PRECOMPILED = ("ATen/core/Tensor.h", "ATen/core/List.h", "ATen/EmptyTensor.h", "ATen/Parallel.h",
               "torch/csrc/utils/pybind.h", "algorithm", "cmath", "limits", "tuple", "vector")
TEMPLATES = Path(__file__).parent / "templates"


def template(name: str) -> str:
    """A file of templates/ (C++ preludes, the candidate's Python), read when the package is imported."""
    return (TEMPLATES / name).read_text()


PRELUDE = template("prelude.h")  # wrapped numbers, optional-tensor lists, Python's // and % on ints
FUSED_PRELUDE = template("fused_prelude.h")  # what fused loops call: NaN-keeping min/max, the domain, operand checks
GEMM_PRELUDE = template("gemm_prelude.h")  # kb_gemm: the weight packed once, then small_m_gemm.h's kernels


class Mode(str, Enum):
    OPS = "ops"
    FUSED = "fused"


class GenericConfig(BaseModel):
    mode: Mode
    grain: int = 16384  # elements per at::parallel_for chunk in fused loops (rows are never split)


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
             *[f"#include <{h}>" for h in [*PRECOMPILED, *headers]], "", PRELUDE]
    inlined: set[Path] = set()
    if fused:
        lanes = (LIBRARY_ROOT / "lanes.h").read_text().replace("#pragma once\n", "")
        inlined.add((LIBRARY_ROOT / "lanes.h").resolve())
        parts += ["// kernel_library/lanes.h, inlined (the candidate's C++ is one string)", lanes, "", FUSED_PRELUDE]
    if packs:
        parts += ["// kernel_library/small_m_gemm.h and the library headers it includes, inlined",
                  inlined_header(LIBRARY_ROOT / "small_m_gemm.h", inlined), "", GEMM_PRELUDE]
    parts.append("std::vector<at::Tensor> kb_run(std::vector<at::Tensor> args, std::vector<at::Tensor> packs) {")
    parts += ["  " + line for line in body]
    parts.append("}")
    # `packs`: how many tensors the caller keeps for the GEMMs' packed weights and passes back on every call
    parts.append(f'\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n  m.def("run", &kb_run);\n'
                 f'  m.attr("packs") = {packs};\n}}\n')
    return "\n".join(parts)
