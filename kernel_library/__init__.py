"""Parameterised kernels, one folder per op family, each in a C++ (CPU) and a Triton backend.

Importing this package imports every family folder (each subpackage, found by walking this folder), and each one
registers its `FAMILY` with `registry.register`; `FAMILIES` is that registry, in name order."""

import importlib
import pkgutil
from collections.abc import Mapping

import torch

from kernelbot.kernel_library.base import Family
from kernelbot.kernel_library.registry import FAMILIES, register

__all__ = ["FAMILIES", "Family", "classes_covered", "family_for", "register"]


def _import_families() -> None:
    """Import each subpackage of this folder, in name order: each family's `__init__.py` registers itself."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.ispkg:
            importlib.import_module(f"{__name__}.{info.name}")


_import_families()


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
