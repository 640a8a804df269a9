"""GEMMs in the `fused` translation: the matrix products whose right operand is a parameter, run by the project's
own small-M kernels (kernel_library/small_m_gemm.h) with ATen's op as the run-time fallback."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from kernelbot.agent.propose.aten_cpp.graph import Traced, op_label
from kernelbot.agent.propose.aten_cpp.lowering import OpsLowering

aten = torch.ops.aten

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


def inlined_header(path: Path, seen: set[Path]) -> str:
    """A library header's text for a one-string extension: the library headers it includes inlined where it includes
    them (each once: `seen` holds those already in the text, and gains these), `extension.h` and
    torch/extension.h dropped (the extension includes ATen's headers itself)."""
    seen.add(path.resolve())
    keep = []
    for line in path.read_text().splitlines():
        text = line.strip()
        included = re.match(r'#include\s+"([^"]+)"', text)
        if included:
            header = (path.parent / included.group(1)).resolve()
            if header not in seen and header.name != "extension.h":
                keep.append(inlined_header(header, seen))
        elif text != "#pragma once" and not re.match(r"#include\s+<torch/extension\.h>", text):
            keep.append(line)
    return "\n".join(keep)
