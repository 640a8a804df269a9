"""Candidates: the reference's own text plus the C++ as a string and a `ModelNew` (templates/candidate.py.txt), one
per config; the extension built by the trusted parent (`generate`, `prebuild`) so the sandboxed candidate only loads
it."""

from __future__ import annotations

import ast
from pathlib import Path

from kernelbot import KernelbotError
from kernelbot.agent.propose.aten_cpp.cpp_file import PRECOMPILED, GenericConfig, Mode, cpp_source, template
from kernelbot.agent.propose.aten_cpp.graph import Unsupported, load_generic_reference, trace_reference
from kernelbot.kernel_library.cpp_build import load_cpp_source

EXTENSION_NAME = "aten_cpp"
CONFIGS = (GenericConfig(mode=Mode.OPS), GenericConfig(mode=Mode.FUSED))
# what the optimize loop proposes: an all-ATen function leaves the work to ATen, which the verifier's
# reference_fallback check rejects by design, so it only runs inside fused code, for the ops no loop covers
PROPOSED = (GenericConfig(mode=Mode.FUSED),)
CANDIDATE = template("candidate.py.txt")  # str.format fields: config, source, mode, name, precompiled


def candidate_source(reference_text: str, cpp: str, config: GenericConfig) -> str:
    """The reference's own text (Model, graph and params identical), then the C++ and ModelNew."""
    readable = "'''" not in cpp and not cpp.endswith("\\")  # then a raw string shows the C++ as it is
    literal = f"r'''{cpp}'''" if readable else repr(cpp)
    return reference_text.rstrip("\n") + "\n\n\n" + CANDIDATE.format(
        config=config.model_dump(mode="json"), source=literal, mode=config.mode.value, name=EXTENSION_NAME,
        precompiled=PRECOMPILED)


def generate(reference_path: Path, *, prebuild: bool = True,
             configs: tuple[GenericConfig, ...] = PROPOSED) -> list[tuple[dict, str]]:
    """(config, candidate source) for each config. Raises Unsupported when the graph uses something that cannot
    be translated, KernelbotError when the file is not a generic reference. With `prebuild`, each extension is
    built now (in this trusted process, into the shared cache) so the sandboxed candidate only loads it; a config
    whose C++ does not build is left out (Unsupported when none builds)."""
    module = load_generic_reference(reference_path)
    traced = trace_reference(module)
    text = reference_path.read_text()
    out, failures = [], []
    for config in configs:
        cpp = cpp_source(traced, config)
        if prebuild:
            try:
                load_cpp_source(cpp, EXTENSION_NAME, PRECOMPILED)
            except Exception as exc:  # a generator bug for some op: the other config may still build
                failures.append(f"{config.mode.value}: {_first_error(str(exc))}")
                continue
        out.append((config.model_dump(mode="json"), candidate_source(text, cpp, config)))
    if not out:
        raise Unsupported(f"the generated C++ does not build ({'; '.join(failures)})"[:500])
    return out


def _first_error(log: str) -> str:
    errors = [line.strip() for line in log.splitlines() if "error:" in line]
    return (errors[0] if errors else log.strip().splitlines()[-1] if log.strip() else "no output")[:300]


def prebuild(candidate: str) -> None:
    """Build the extension a generated candidate's text carries (its KB_CPP_SOURCE literal, read without running
    the candidate), into the shared cache."""
    for statement in ast.parse(candidate).body:
        targets = [getattr(t, "id", None) for t in statement.targets] if isinstance(statement, ast.Assign) else []
        if targets == ["KB_CPP_SOURCE"]:
            if isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str):
                load_cpp_source(statement.value.value, EXTENSION_NAME, PRECOMPILED)
                return
    raise KernelbotError("prebuild: not an aten_cpp candidate (no KB_CPP_SOURCE string); regenerate it with generate()")
