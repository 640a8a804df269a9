"""What a candidate could read of its process to tell a verification (or a benchmark) from serving, made to say
nothing about kernelbot: the call stack, the loaded modules, the command line, the environment, its own module's
name, and (with clocks.py) the time since it loaded.

- The stack: every function of the harness's modules (kernelbot.agent.*, kernelbot.sandbox.*, the benchmark's clock)
  runs neutral code: file "<string>", a name f<n> (`neutral_code`, once when the job's process starts, before the
  harness's first call, and in the runner for a module it imports later). So the frames below a candidate's call
  name no kernelbot file or function however they are read: faulthandler's dump, a warning's or a log record's
  stacklevel, tracemalloc, a C extension walking frames (reading frame objects from Python is a violation anyway:
  confine.py). The harness's own tracebacks are translated back (`readable`). The job starts as `python -c` (box.py),
  so no harness module is __main__ or the bottom frame.
- The process (`conceal`, in the runner just before the candidate loads): the harness's modules leave sys.modules
  (and the import caches), sys.argv and sys.orig_argv read `-c`, /proc/self/cmdline and /proc/self/environ are
  overwritten in place, and variables only a verification job has are removed from the environment.
- The candidate's module is named as an engine names a pack's kernel (`module_name`), not kb_modelnew.

So harness code that runs in a runner after the load must not import a harness module inside a function: the import
would load a fresh copy of it (cuda_check binds what it needs when it is installed).

Out of scope (docs/verification.md "Verification told from use"): what tells a sandboxed run from serving at all
(Landlock, seccomp, the pid namespace, the box's paths, poisoned allocations), and library functions the harness
wraps, which are not the library's own code.
"""

from __future__ import annotations

import contextlib
import ctypes
import linecache
import os
import re
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from types import CodeType, FunctionType, ModuleType
from typing import Any

from kernelbot.agent.verify import clocks

NEUTRAL_FILE = "<string>"
HARNESS_PACKAGES = ("kernelbot.agent", "kernelbot.sandbox")  # their code renamed, left out of sys.modules
RENAMED_TOO = ("kernelbot.hardware.device",)  # the benchmark's clock (timed_call, below a timed call): renamed, hidden
# Variables only a sandboxed job's harness sets: the GPU target of a verification's builds, a sanitizer's ports, the
# audit channel's fd (already out of os.environ, still in /proc/self/environ)
JOB_VARIABLES = ("KERNELBOT_GPU_TARGET", "KERNELBOT_LOOPBACK_PORTS", "KERNELBOT_AUDIT_FD")
_REAL: dict[str, tuple[str, str]] = {}  # neutral name -> (file, qualified name)
_RENAMED: dict[CodeType, CodeType] = {}
_NEUTRAL_FRAME = re.compile(r'File "<string>", line (\d+), in (f\d+)')


# ---------------------------------------------------------------- the stack

def harness_modules() -> list[ModuleType]:
    """The loaded modules whose code is the harness's."""
    return [m for name, m in list(sys.modules.items()) if isinstance(m, ModuleType) and (
        name.startswith(tuple(p + "." for p in HARNESS_PACKAGES)) or name in HARNESS_PACKAGES or name in RENAMED_TOO)]


def neutral_code(modules: list[ModuleType] | None = None) -> None:
    """Every function and method of `modules` (else harness_modules()) whose code is in the module's own file, nested
    code included, renamed to neutral code: file NEUTRAL_FILE, name f<n>; lines and behaviour unchanged. Idempotent.
    Run before anything binds or seals the harness's code (the runner's seal compares code objects)."""
    for module in harness_modules() if modules is None else modules:
        file = getattr(module, "__file__", None)
        for value in list(vars(module).values()):
            members = list(vars(value).values()) if isinstance(value, type) and value.__module__ == module.__name__ \
                else [value]
            for fn in filter(None, map(_function_of, members)):
                if fn.__code__.co_filename == file:  # its own attributes stay (confine.harness_code reads them)
                    fn.__code__ = _renamed(fn.__code__)


def _function_of(value: Any) -> FunctionType | None:
    """The Python function behind a module's or class's member: itself, a static or class method's, a property's
    getter, or what a functools wrapper (functools.cache) wraps."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    elif callable(value) and type(value).__module__ == "functools":
        value = getattr(value, "__wrapped__", None)
    return value if isinstance(value, FunctionType) else None


def _renamed(code: CodeType) -> CodeType:
    if code not in _RENAMED:
        name = f"f{len(_REAL)}"
        _REAL[name] = (code.co_filename, getattr(code, "co_qualname", code.co_name))
        consts = tuple(_renamed(c) if isinstance(c, CodeType) else c for c in code.co_consts)
        names = {"co_qualname": name} if hasattr(code, "co_qualname") else {}
        _RENAMED[code] = code.replace(co_filename=NEUTRAL_FILE, co_name=name, co_consts=consts, **names)
    return _RENAMED[code]


def like(wrapper: FunctionType, original: Any) -> FunctionType:
    """`wrapper`, installed in place of a library's `original`, named as it is (module, name, qualified name, doc):
    a patched attribute whose __module__ names kernelbot would tell."""
    for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(wrapper, attribute, getattr(original, attribute))
    return wrapper


def readable(text: str) -> str:
    """A traceback of renamed code with the real files and names put back (for the harness's own error reports)."""
    def real(m: re.Match) -> str:
        file, name = _REAL.get(m.group(2), (NEUTRAL_FILE, m.group(2)))
        return f'File "{file}", line {m.group(1)}, in {name}'
    return _NEUTRAL_FRAME.sub(real, text)


# ---------------------------------------------------------------- the process

def module_name(path: str) -> str:
    """The name an engine gives a pack's kernel module (kb_pack_<task>__<candidate> in process, kb_served_... in a
    served engine), from the candidate's folders (<task>/candidates/<candidate>/candidate.py), at random of the two."""
    where = Path(path).resolve()
    task, candidate = where.parents[2].name if len(where.parents) > 2 else "task", where.parent.name
    kind = "pack" if secrets.randbelow(2) else "served"
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"kb_{kind}_{task}__{candidate}")


def conceal() -> None:
    """Just before the candidate loads: the harness's modules out of sys.modules and the import caches, a neutral
    command line, the job's own variables out of the environment; /proc/self's copies of both overwritten."""
    hidden = harness_modules()
    folders = {os.path.dirname(f) for m in hidden if isinstance(f := getattr(m, "__file__", None), str)}
    for module in hidden:
        sys.modules.pop(module.__name__, None)
    for module in hidden:  # nor an attribute of a package still loaded (kernelbot.agent, kernelbot.hardware.device)
        parent, _, name = module.__name__.rpartition(".")
        if parent in sys.modules:
            with contextlib.suppress(AttributeError):
                delattr(sys.modules[parent], name)
    for key in [k for k in sys.path_importer_cache if k in folders]:
        del sys.path_importer_cache[key]
    for key in [k for k in linecache.cache if os.path.dirname(k) in folders]:
        del linecache.cache[key]
    sys.argv, sys.orig_argv = ["-c"], [sys.orig_argv[0] if sys.orig_argv else sys.executable, "-c", ""]
    for name in JOB_VARIABLES:
        os.environ.pop(name, None)
    preload = os.environ.pop(clocks.PRELOAD, None)
    kept = " ".join(p for p in (preload or "").replace(":", " ").split() if not clocks.own_library(p))
    if kept:  # someone else's preloaded library stays (not in /proc/self/environ: a fresh copy of the entry)
        os.environ[clocks.PRELOAD] = kept
    _overwrite_proc_self(sys.orig_argv, {*JOB_VARIABLES, clocks.PRELOAD} if preload else set(JOB_VARIABLES))


def _overwrite_proc_self(argv: list[str], removed: set[str]) -> None:
    """/proc/self/cmdline and /proc/self/environ are the process's first bytes of stack (their bounds are fields
    48-51 of /proc/self/stat): the command line rewritten as `argv` (NUL-padded), the entries of `removed` zeroed
    (libc no longer points at them: os.environ.pop unset them)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        arg_start, arg_end, env_start, env_end = (int(x) for x in fields[45:49])
    except (OSError, ValueError, IndexError):
        return
    if 0 < arg_start < arg_end:
        line = b"\0".join(a.encode() for a in argv)[:arg_end - arg_start - 1] + b"\0"
        ctypes.memmove(arg_start, line, len(line))
        ctypes.memset(arg_start + len(line), 0, arg_end - arg_start - len(line))
    if 0 < env_start < env_end:
        offset = 0
        for entry in ctypes.string_at(env_start, env_end - env_start).split(b"\0"):
            if entry.split(b"=", 1)[0].decode(errors="replace") in removed:
                ctypes.memset(env_start + offset, 0, len(entry))
            offset += len(entry) + 1


@contextlib.contextmanager
def loading(facts: dict[str, list[str]], shown: list[str]) -> Iterator[None]:
    """Around the candidate's import and construction: the process concealed first, the clocks shifted (clocks.py:
    H hours back while it loads, CPU clocks ahead after). `shown` gets the protection's description; a shift the
    candidate disturbed is a tamper finding."""
    conceal()
    shift = clocks.Shift.draw()
    shown.append(shift.before_load())
    try:
        yield
    finally:
        facts["tamper"] += shift.after_load()
