"""Parameterised kernels, one folder per op family, each in a C++ (CPU) and a Triton backend."""

from collections.abc import Mapping

import torch

from kernelbot.kernel_library.add_rmsnorm import FAMILY as ADD_RMSNORM
from kernelbot.kernel_library.alibi_attention import FAMILY as ALIBI_ATTENTION
from kernelbot.kernel_library.base import Family
from kernelbot.kernel_library.decode_attention import FAMILY as DECODE_ATTENTION
from kernelbot.kernel_library.fused_attention import FAMILY as FUSED_ATTENTION
from kernelbot.kernel_library.gated_mlp import FAMILY as GATED_MLP
from kernelbot.kernel_library.linear import FAMILY as LINEAR
from kernelbot.kernel_library.moe_experts import FAMILY as MOE_EXPERTS
from kernelbot.kernel_library.neox_attention import FAMILY as NEOX_ATTENTION
from kernelbot.kernel_library.paged_attention import FAMILY as PAGED_ATTENTION
from kernelbot.kernel_library.rmsnorm import FAMILY as RMSNORM
from kernelbot.kernel_library.rotary_embedding import FAMILY as ROTARY_EMBEDDING
from kernelbot.kernel_library.silu_and_mul import FAMILY as SILU_AND_MUL
from kernelbot.kernel_library.sparse_moe import FAMILY as SPARSE_MOE

FAMILIES: dict[str, Family] = {f.name: f for f in (RMSNORM, ADD_RMSNORM, GATED_MLP, LINEAR, SILU_AND_MUL,
                                                     ROTARY_EMBEDDING, DECODE_ATTENTION, FUSED_ATTENTION,
                                                     NEOX_ATTENTION, ALIBI_ATTENTION, PAGED_ATTENTION, SPARSE_MOE,
                                                     MOE_EXPERTS)}


def family_for(module_class: str, covered: Mapping[str, str] | None = None, by_name: bool = True) -> Family | None:
    """The family that replaces modules of this class: in `covered`, by live modules of the class that a family's
    structural test accepts (see classes_covered), else (`by_name`) by the family's known transformers class names.
    A served engine's classes are other classes under the same names (vLLM's LlamaMLP is not transformers'): there
    only what its plugin found counts."""
    if covered and module_class in covered:
        return FAMILIES[covered[module_class]]
    if not by_name:
        return None
    return next((f for f in FAMILIES.values() if module_class in f.module_classes), None)


def classes_covered(model: torch.nn.Module) -> dict[str, str]:
    """Class name → family for the live modules a family's structural test accepts."""
    found: dict[str, str] = {}
    for module in model.modules():
        name = type(module).__name__
        if name not in found:
            family = next((f for f in FAMILIES.values() if f.covers is not None and f.covers(module)), None)
            if family is not None:
                found[name] = family.name
    return found
