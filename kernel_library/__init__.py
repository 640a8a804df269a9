"""Parameterised kernels, one folder per op family, each in a C++ (CPU) and a Triton backend."""

from kernelbot.kernel_library.base import Family
from kernelbot.kernel_library.gated_mlp import FAMILY as GATED_MLP
from kernelbot.kernel_library.linear import FAMILY as LINEAR
from kernelbot.kernel_library.rmsnorm import FAMILY as RMSNORM
from kernelbot.kernel_library.rotary_embedding import FAMILY as ROTARY_EMBEDDING
from kernelbot.kernel_library.silu_and_mul import FAMILY as SILU_AND_MUL

FAMILIES: dict[str, Family] = {f.name: f for f in (RMSNORM, GATED_MLP, LINEAR, SILU_AND_MUL, ROTARY_EMBEDDING)}


def family_for(module_class: str) -> Family | None:
    return next((f for f in FAMILIES.values() if module_class in f.module_classes), None)
