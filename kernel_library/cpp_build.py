"""Build C++ CPU kernels once per source hash and reuse the build across runs and processes."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

# Imported now, in the main thread and before anything can import the standard library's distutils: torch's
# extension builder (and Inductor's) import setuptools later, and setuptools refuses a process whose distutils came
# from the standard library first (seen intermittently in the test process: "AssertionError: .../distutils/core.py").
with contextlib.suppress(ImportError):  # without setuptools there is no extension builder to protect
    import setuptools  # noqa: F401

from kernelbot.kernel_library.identity import source_identity
from kernelbot.loading import load_module
from kernelbot.paths import CACHE_ENV, cache_dir

CFLAGS = ["-O3", "-mavx2", "-mfma", "-fno-math-errno", "-fno-trapping-math", "-fopenmp"]  # no flag changes results
# AddressSanitizer builds: a second build of the same source, loaded instead of the plain one in a process whose
# environment names it (verification's ASan job, which runs with the ASan runtime preloaded): every load and store
# the kernel makes is checked against the allocations' bounds
SANITIZE_ENV = "KERNELBOT_CPP_SANITIZE"
ASAN = "address"
ASAN_SUFFIX = "_asan"
# -O1 after -O3: builds faster; -U: the source cannot test for the sanitizer with the preprocessor
ASAN_FLAGS = ["-fsanitize=address", "-fno-omit-frame-pointer", "-O1", "-U__SANITIZE_ADDRESS__"]
ASAN_EXIT = 86  # how a process ends when AddressSanitizer found an invalid access
PRECOMPILED_LIST = "precompiled.txt"  # beside a generated build: the headers it was given to precompile
_loaded: dict[str, ModuleType] = {}


def sanitizing() -> bool:
    """Whether this process loads the AddressSanitizer builds (SANITIZE_ENV=address)."""
    return os.environ.get(SANITIZE_ENV) == ASAN


def cache_root() -> Path:
    return cache_dir("cpp")


def source_hash(source: Path | str) -> str:
    """Of the source (a file, or generated text), every header it includes (kernel_library/identity.py) and the
    flags."""
    return source_identity(source, salt=" ".join(CFLAGS))


def _library_sources() -> list[Path]:
    return sorted(Path(__file__).parent.glob("*/*.cpp"))


def _build_of(path: Path) -> tuple[str, Path]:
    """The extension's module name for this source, and where its cached build lives."""
    name = f"kb_{path.stem}_{source_hash(path)}"
    return name, cache_root() / name / f"{name}.so"


def unbuilt_library() -> list[Path]:
    """The library's C++ sources that have no cached build yet (what prebuild_library would compile)."""
    return [source for source in _library_sources() if not _build_of(source)[1].exists()]


def prebuild_library() -> dict[str, str]:
    """Build every kernel_library C++ source now, in the trusted process: candidates that use them run in a
    sandbox whose filesystem is read-only, so they can load the builds but not make (or tamper with) them.
    Returns the environment that points a sandboxed child at those builds. Sources with no build yet are compiled
    side by side first, as many at once as the host has cores."""
    unbuilt = unbuilt_library()
    if len(unbuilt) > 1 and (os.cpu_count() or 1) > 1 and not sanitizing():
        _build_side_by_side(unbuilt)
    for source in _library_sources():
        load_cpp(source)
    return {CACHE_ENV: str(cache_dir().resolve())}


def _build_side_by_side(sources: list[Path]) -> None:
    """Each source built in a child process of its own (one compiler job each), cores' worth at a time: on a fresh
    machine the library's first build takes the time of its slowest sources, not their sum. A build that fails here
    is left to the caller's own load, which builds it again and raises with the compiler's message."""
    from concurrent.futures import ThreadPoolExecutor

    code = ("import sys, pathlib; from kernelbot.kernel_library.cpp_build import load_cpp; "
            "load_cpp(pathlib.Path(sys.argv[1]))")

    def build(source: Path) -> None:
        subprocess.run([sys.executable, "-c", code, str(source)], capture_output=True, timeout=1200, check=False)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(build, sources))


class LibraryEnv(NamedTuple):
    """What a sandboxed job gets for the library's C++ builds: the environment pointing it at them, and why the build
    failed here (None when it did not, or was not needed)."""
    env: dict[str, str]
    problem: str | None = None


# what torch's extension builder raises without ninja or a compiler, or for a source that does not compile
BUILD_ERRORS = (RuntimeError, OSError, subprocess.SubprocessError, ImportError)


def build_problem(exc: BaseException) -> str:
    """One line: the library's C++ build failed, why, and the fix."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return (f"the kernel library's C++ build failed here ({type(exc).__name__}: {first}); candidates that load it "
            "cannot run: install ninja and a C++ compiler (pip install ninja; apt-get install g++)")


def library_env(device: str, runs_cpp: bool = True) -> LibraryEnv:
    """The environment a sandboxed job on `device` needs for the library's C++ builds: built first where C++
    candidates run (a CPU job that may run one, `runs_cpp`); elsewhere (a GPU job, or the interpreter's re-check of a
    GPU candidate on the node's CPU) nothing is built (minutes on a first run) and nothing is passed. A build that
    fails is no exception here: the job still gets the cache, `problem` says what failed, and a candidate that loads
    the library fails its own compile check."""
    if device != "cpu" or not runs_cpp:
        return LibraryEnv({})
    try:
        return LibraryEnv(prebuild_library())
    except BUILD_ERRORS as exc:
        return LibraryEnv({CACHE_ENV: str(cache_dir().resolve())}, build_problem(exc))


def load_cpp(path: Path) -> ModuleType:
    """Compile `path` as a torch extension (first call: tens of seconds) or load the cached build; where
    `sanitizing()`, its AddressSanitizer build (in a temporary directory when the cache has none and is read-only)."""
    name, built = _build_of(path)
    if sanitizing():
        name += ASAN_SUFFIX
        built = cache_root() / name / f"{name}.so"
        if not built.exists() and not _writable(built.parent):
            built = Path(tempfile.mkdtemp(prefix="kb_cpp_")) / name / built.name
    if name in _loaded:
        return _loaded[name]
    if not built.exists():
        _build(path, name, built.parent, built, _flavour_flags())
    import torch  # noqa: F401  (the extension links against libtorch, which must be loaded first)

    module = load_module(built, name)  # the .so suffix selects the extension-module loader
    _loaded[name] = module
    return module


def load_cpp_source(source: str, name: str, precompiled: Sequence[str] = ()) -> ModuleType:
    """Compile C++ given as text (a generated kernel) or load its build: cached by the hash of the text and the flags,
    in the same cache as load_cpp, so the trusted parent builds it and a sandboxed candidate only loads it. Where the
    cache holds no build and cannot be written (a read-only sandbox), it is built in a temporary directory.
    `precompiled`: headers the source includes that are worth a precompiled header (ATen's Tensor.h and pybind
    are most of a small extension's compile time); it is made once per cache, after the first build, and is only
    an accelerator: without it (or with one the compiler finds stale) the build is the same, only slower.
    Where `sanitizing()`, the source's AddressSanitizer build (module name suffixed ASAN_SUFFIX) is loaded instead."""
    module_name = f"kb_{name}_{source_hash(source)}" + (ASAN_SUFFIX if sanitizing() else "")
    if module_name in _loaded:
        return _loaded[module_name]
    build_dir = cache_root() / module_name
    built = build_dir / f"{module_name}.so"
    if not built.exists():
        if not _writable(build_dir):  # checked without writing: a sandbox records attempted writes
            build_dir = Path(tempfile.mkdtemp(prefix="kb_cpp_")) / module_name
            built = build_dir / f"{module_name}.so"
        build_dir.mkdir(parents=True, exist_ok=True)
        path = build_dir / f"{module_name}.cpp"
        if not path.exists() or path.read_text() != source:
            staged = path.with_suffix(f".{os.getpid()}.tmp")
            staged.write_text(source)
            os.replace(staged, path)  # a concurrent builder never reads a half-written file
        (build_dir / PRECOMPILED_LIST).write_text("\n".join(precompiled))  # for build_sanitized
        pch = _precompiled_header(precompiled)
        _build(path, module_name, build_dir, built, [*_flavour_flags(), *(["-include", str(pch)] if pch else [])])
        if precompiled and pch is None:
            _make_precompiled_header(precompiled, build_dir / "build.ninja")
    import torch  # noqa: F401  (the extension links against libtorch, which must be loaded first)

    module = load_module(built, module_name)
    _loaded[module_name] = module
    return module


def _flavour_flags() -> list[str]:
    return ASAN_FLAGS if sanitizing() else []


def build_sanitized(name: str) -> bool:
    """Build (once, cached) the AddressSanitizer build of generated C++ whose plain build is module `name` (its text
    and precompiled headers are in the cache): what a sandboxed ASan job then only loads. Built in a child process
    with the ASan runtime preloaded (torch's builder imports what it builds, and an instrumented extension aborts a
    process without that runtime). False when the cache holds no such source or the build failed."""
    asan = name + ASAN_SUFFIX
    if (cache_root() / asan / f"{asan}.so").exists():
        return True
    plain = cache_root() / name
    match = re.fullmatch(r"kb_(\w+)_([0-9a-f]{16})", name)
    runtime = asan_environment()
    if match is None or not (plain / f"{name}.cpp").is_file() or not runtime:
        return False
    listed = plain / PRECOMPILED_LIST
    headers = listed.read_text().split() if listed.is_file() else []
    code = ("import sys; from kernelbot.kernel_library.cpp_build import load_cpp_source; "
            "load_cpp_source(open(sys.argv[1]).read(), sys.argv[2], sys.argv[3:])")
    done = subprocess.run([sys.executable, "-c", code, str(plain / f"{name}.cpp"), match.group(1), *headers],
                          capture_output=True, env={**os.environ, **runtime}, timeout=600)
    return done.returncode == 0 and (cache_root() / asan / f"{asan}.so").exists()


@functools.cache
def asan_runtime() -> str | None:
    """The compiler's AddressSanitizer runtime (libasan.so), or None when the compiler has none."""
    try:
        found = subprocess.run(["c++", "-print-file-name=libasan.so"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    path = found.stdout.strip()
    return os.path.realpath(path) if found.returncode == 0 and os.path.isabs(path) and os.path.exists(path) else None


def asan_environment() -> dict[str, str]:
    """The environment a process needs to run AddressSanitizer builds: the runtime preloaded, leak checking off
    (Python never frees everything), the first error ends the process with exit code ASAN_EXIT; {} without a runtime."""
    runtime = asan_runtime()
    if runtime is None:
        return {}
    options = f"detect_leaks=0:halt_on_error=1:exitcode={ASAN_EXIT}:symbolize=0:detect_odr_violation=0"
    return {"LD_PRELOAD": runtime, "ASAN_OPTIONS": options, SANITIZE_ENV: ASAN}


def _writable(path: Path) -> bool:
    """Whether `path` could be created: its nearest existing ancestor is writable."""
    while not path.exists():
        path = path.parent
    return os.access(path, os.W_OK)


def _pch_path(headers: Sequence[str]) -> Path:
    import torch

    key = hashlib.sha256("\n".join([*headers, *CFLAGS, *_flavour_flags(), torch.__version__]).encode()).hexdigest()[:16]
    return cache_root() / f"pch_{key}" / "kb_precompiled.h"


def _precompiled_header(headers: Sequence[str]) -> Path | None:
    """The header to force-include when its precompiled form (.gch beside it) exists."""
    if not headers:
        return None
    header = _pch_path(headers)
    return header if header.with_name(header.name + ".gch").exists() else None


def _make_precompiled_header(headers: Sequence[str], ninja: Path) -> None:
    """Precompile `headers` with the exact flags torch's builder just compiled an extension with (read from its
    build.ninja, so the compiler accepts the result for later builds). Any failure only leaves builds slower."""
    header = _pch_path(headers)
    if not headers or not ninja.exists() or not _writable(header.parent):
        return
    text = ninja.read_text()
    cxx, cflags = re.search(r"^cxx = (.+)$", text, re.M), re.search(r"^cflags = (.+)$", text, re.M)
    if not cxx or not cflags:
        return
    flags = [f for f in cflags.group(1).split() if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    header.parent.mkdir(parents=True, exist_ok=True)
    with open(header.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        gch = header.with_name(header.name + ".gch")
        if gch.exists():
            return
        header.write_text("".join(f"#include <{h}>\n" for h in headers))
        staged = gch.with_suffix(f".{os.getpid()}.tmp")
        done = subprocess.run([cxx.group(1), *flags, "-x", "c++-header", str(header), "-o", str(staged)],
                              capture_output=True)
        if done.returncode == 0:
            os.replace(staged, gch)
        else:
            staged.unlink(missing_ok=True)


def _build(path: Path, name: str, build_dir: Path, built: Path, cflags: Sequence[str] = ()) -> None:
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ".lock", "w") as lock:  # one builder at a time; the others wait and reuse
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            from torch.utils.cpp_extension import load

            ldflags = ["-fopenmp", *(f for f in cflags if f.startswith("-fsanitize"))]
            load(name, [str(path)], extra_cflags=[*CFLAGS, *cflags], extra_ldflags=ldflags,
                 build_directory=str(build_dir), verbose=False)

