"""Code out of a model's answer: fenced blocks, several blocks, no fences, prose around it, a cut-off answer."""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^[ \t]*\1[ \t]*$|\Z)", re.M | re.S)
_PY_LANGS = {"", "python", "py", "python3", "py3"}
_CODE_START = re.compile(r"^(import |from \S+ import |@triton|class |def |[A-Z_]+ = )")


@dataclass
class Extraction:
    code: str | None
    problem: str = ""  # why there is no code, when there is none
    blocks: int = 0  # fenced blocks seen


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
        return True
    except (SyntaxError, ValueError):
        return False


def _unfenced(text: str) -> str | None:
    """Code written without fences: from the first line that starts code to the last line that keeps it parsing."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    if start is None:
        return None
    body = lines[start:]
    for end in range(len(body), 0, -1):  # drop trailing prose, one line at a time
        code = "\n".join(body[:end])
        if "ModelNew" in code and _parses(code):
            return code.strip() + "\n"
    return "\n".join(body).strip() + "\n"  # does not parse: let the verifier's compile check say why


def extract_code(text: str | None) -> Extraction:
    if not text or not text.strip():
        return Extraction(None, "empty answer")
    blocks = [(m.group(2).lower(), m.group(3)) for m in _FENCE.finditer(text)]
    python = [body for lang, body in blocks if lang in _PY_LANGS]
    with_model = [body for body in python if re.search(r"\bclass\s+ModelNew\b", body)]
    if with_model:
        index = max(i for i, body in enumerate(python) if re.search(r"\bclass\s+ModelNew\b", body))
        chosen = python[index]  # a model that revises itself within one answer puts the final version last
        # Kernels in one block and the module in a later one: bring in the earlier blocks it leans on.
        wanted = _free_names(chosen)
        helpers = [b for b in python[:index] if "ModelNew" not in b and wanted & _defined_names(b)]
        code = "\n\n".join([*helpers, chosen])
        return Extraction(code.strip() + "\n", blocks=len(blocks))
    if blocks:
        if python:
            return Extraction(None, f"{len(blocks)} code block(s), none defines class ModelNew", len(blocks))
        return Extraction(None, f"{len(blocks)} code block(s), none in Python "
                                f"({', '.join(sorted({lang or 'plain' for lang, _ in blocks}))})", len(blocks))
    code = _unfenced(text)
    if code and re.search(r"\bclass\s+ModelNew\b", code):
        return Extraction(code)
    return Extraction(None, "no code in the answer" if code is None else "the code in the answer defines no ModelNew")


def _defined_names(code: str) -> set[str]:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _free_names(code: str) -> set[str]:
    """Names a block reads but never binds (builtins aside)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return set()
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - _defined_names(code) - set(dir(builtins))
