"""The registry of op families (after vLLM's `CustomOp.register` and Liger-Kernel's kernel registry): each family's
package calls `register(FAMILY)` when it is imported, and `kernel_library/__init__.py` imports every family folder, so
a new folder whose `__init__.py` registers its record is all a family takes. `FAMILIES` is the live mapping, kept in
name order whatever order the folders were imported in."""

from __future__ import annotations

from kernelbot.kernel_library.base import Family

FAMILIES: dict[str, Family] = {}


class DuplicateFamilyError(ValueError):
    """A second family registered under a name already taken."""


def register(family: Family) -> Family:
    """Add `family` to FAMILIES under its name and return it; a name already registered is refused in one line."""
    if family.name in FAMILIES:
        raise DuplicateFamilyError(f"kernel family {family.name!r} is registered twice: family names must be unique")
    FAMILIES[family.name] = family
    for name in sorted(FAMILIES):  # re-insert in name order: lookups never depend on which folder came first
        FAMILIES[name] = FAMILIES.pop(name)
    return family
