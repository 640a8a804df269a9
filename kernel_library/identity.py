"""A kernel source's identity: one hash of the source and every library file it includes, so that a build, a
candidate's journal key and a stored kernel all change when anything they are made from changes.

What a source includes, followed transitively: a C++ file (or CUDA, or a header), every header it names with
`#include "..."`, found beside it as the compiler finds it; Python (a file, or a candidate's text), every
`kernelbot.kernel_library` module it imports, where a module inside a family's folder brings the whole folder (a
family's wrapper loads its C++ by path, not by import: gated MLP runs linear's `linear.cpp`, which includes
`small_m_gemm.h`, which includes `lanes.h`). Files are named relative to the library, so a copy of the library or an
installed wheel has the identity of the checkout.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).parent  # the library the imports resolve in (tests point it at a copy)
PACKAGE = "kernelbot.kernel_library"
SOURCE_SUFFIXES = (".py", ".cpp", ".h", ".cu", ".cuh")
_C_SUFFIXES = SOURCE_SUFFIXES[1:]
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)
_IMPORT = re.compile(rf"^[ \t]*(?:from|import)[ \t]+{re.escape(PACKAGE)}((?:\.\w+)*)", re.M)


def source_identity(*sources: Path | str, salt: str = "") -> str:
    """16 hex digits of sha256 over `sources` (files, or texts such as a candidate's), every library file they
    include (transitively) and `salt` (what else decides the result, e.g. compiler flags)."""
    digest = hashlib.sha256(salt.encode())
    texts = [s for s in sources if isinstance(s, str)]
    files = [s for s in sources if isinstance(s, Path)]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"no such source file: {', '.join(missing)}")
    for text in texts:
        digest.update(b"\0text\0" + text.encode())
    for path in _closure(files, texts):
        digest.update(b"\0" + _label(path).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _closure(files: Iterable[Path], texts: Iterable[str]) -> list[Path]:
    """The files and everything they and the texts include, each once, in a fixed order."""
    seen: set[Path] = set()
    todo = [p.resolve() for p in files] + [p for text in texts for p in imported_sources(text)]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        text = path.read_text(errors="replace")
        todo += imported_sources(text) if path.suffix == ".py" else []
        todo += _included(text, path.parent) if path.suffix in _C_SUFFIXES else []
    return sorted(seen, key=_label)


def _included(text: str, folder: Path) -> list[Path]:
    return [(folder / name).resolve() for name in _INCLUDE.findall(text)]


def imported_sources(text: str) -> list[Path]:
    """The library files the Python `text` imports: a family's whole folder, or a module of the library's own."""
    found: list[Path] = []
    for dotted in _IMPORT.findall(text):
        parts = [p for p in dotted.split(".") if p]
        if not parts:
            found.append(ROOT / "__init__.py")
        elif (ROOT / parts[0]).is_dir():
            found += [p for p in (ROOT / parts[0]).rglob("*") if p.suffix in SOURCE_SUFFIXES
                      and "__pycache__" not in p.parts]
        else:
            found.append(ROOT / f"{parts[0]}.py")
    return [p.resolve() for p in found]


def _label(path: Path) -> str:
    """The file's name in the hash: relative to the library when inside it, so the identity is the same anywhere."""
    root = ROOT.resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
