"""Build C++ CPU kernels once per source hash and reuse the build across runs and processes."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path
from types import ModuleType

from kernelbot.loading import load_module

CFLAGS = ["-O3", "-mavx2", "-mfma", "-fno-math-errno", "-fno-trapping-math", "-fopenmp"]  # no flag changes results
_loaded: dict[str, ModuleType] = {}


def cache_root() -> Path:
    root = os.environ.get("KERNELBOT_CACHE") or Path.home() / ".cache" / "kernelbot"
    return Path(root) / "cpp"


def source_hash(path: Path) -> str:
    """Of the source, the library's shared headers (which sources include by relative path) and the flags."""
    headers = b"".join(h.read_bytes() for h in sorted(Path(__file__).parent.glob("*.h")))
    return hashlib.sha256(path.read_bytes() + headers + " ".join(CFLAGS).encode()).hexdigest()[:16]


def prebuild_library() -> dict[str, str]:
    """Build every kernel_library C++ source now, in the trusted process: candidates that use them run in a
    sandbox whose filesystem is read-only, so they can load the builds but not make (or tamper with) them.
    Returns the environment that points a sandboxed child at those builds."""
    for source in sorted(Path(__file__).parent.glob("*/*.cpp")):
        load_cpp(source)
    return {"KERNELBOT_CACHE": str(cache_root().parent.resolve())}


def load_cpp(path: Path) -> ModuleType:
    """Compile `path` as a torch extension (first call: tens of seconds) or load the cached build."""
    digest = source_hash(path)
    name = f"kb_{path.stem}_{digest}"
    if name in _loaded:
        return _loaded[name]
    build_dir = cache_root() / name
    built = build_dir / f"{name}.so"
    if not built.exists():
        _build(path, name, build_dir, built)
    import torch  # noqa: F401  (the extension links against libtorch, which must be loaded first)

    module = load_module(built, name)  # the .so suffix selects the extension-module loader
    _loaded[name] = module
    return module


def _build(path: Path, name: str, build_dir: Path, built: Path) -> None:
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ".lock", "w") as lock:  # one builder at a time; the others wait and reuse
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            from torch.utils.cpp_extension import load

            load(name, [str(path)], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"],
                 build_directory=str(build_dir), verbose=False)
