"""C++ signatures of ATen's typed entry points (`at::_ops::<op>::call`), read from torch's own headers."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from kernelbot.agent.propose.aten_cpp.graph import Unsupported, op_label

OPS_HEADERS = Path(torch.__file__).parent / "include" / "ATen" / "ops"


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
