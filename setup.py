"""Lists kernelbot's packages for setuptools: every package under the folders that pyproject.toml's
`[tool.setuptools] package-dir` maps to `kernelbot.<part>`.

Everything else (metadata, dependencies, the mapping itself, package data) is in pyproject.toml. This file exists
because setuptools' declarative `find` names packages after their folders and cannot add the `kernelbot.` prefix, so
without it each subpackage (each kernel family's folder) would have to be listed by hand.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import find_packages, setup

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent


def package_dir() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


def packages(mapping: dict[str, str]) -> list[str]:
    """Each mapped package and, found by setuptools in its folder, every subpackage under its dotted name."""
    names = []
    for package, folder in mapping.items():
        names.append(package)
        names += [f"{package}.{sub}" for sub in find_packages(where=str(ROOT / folder))]
    return sorted(set(names))


setup(packages=packages(package_dir()))
