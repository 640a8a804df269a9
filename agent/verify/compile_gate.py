"""The pre-GPU compile gate: a candidate's kernels compiled ahead of time for the GPU they are meant for, on any host.

Triton: each specialization a launch used (argument types, constexpr values, num_warps and num_stages) compiled by
Triton's own compiler for GPUTarget("cuda", capability, 32), and its PTX put through Triton's bundled ptxas -v for
registers, spills and static shared memory (Triton's dynamic shared memory is in the compiled kernel's metadata).
The kernel's module is candidate code, so this runs in the sandboxed runner, beside the interpreter: triton_check
calls compile_launch at a kernel's first launch with a new specialization. CUDA: cuda_check's nvcc -Xptxas -v report
(for the same target), read into the same records here.

The target: `--target` (sm_90 by default on a host without a GPU, for an H100/H200; on a GPU node the device's own),
handed to the box in TARGET_ENV. A kernel that does not compile for it, or needs more shared memory per block than it
has, fails `compile`; one that spills is said in the verdict's notes (slower there, not wrong).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kernelbot import KernelbotError
from kernelbot.records import Check, KernelBuild

DEFAULT_TARGET = "sm_90"
TARGET_ENV = "KERNELBOT_GPU_TARGET"
# The most shared memory one block may use (with the opt-in), per architecture: the CUDA C++ Programming Guide's
# table of compute capabilities (sm_90: 227 KiB of the SM's 228 KiB)
SHARED_LIMIT = {"sm_80": 166912, "sm_86": 101376, "sm_87": 166912, "sm_89": 101376, "sm_90": 232448,
                "sm_100": 232448, "sm_103": 232448, "sm_120": 101376}
MAX_SPECIALIZATIONS = 8  # compiled per kernel and runner: a kernel launched at many sizes costs no more than this
ERROR_CHARS = 600


def checked_target(target: str) -> str:
    """`target` as sm_<major><minor> (sm_90a is sm_90); one line naming the known ones for anything else."""
    name = target.strip().lower().removesuffix("a")
    if name not in SHARED_LIMIT:
        raise KernelbotError(f"--target {target}: unknown GPU architecture; use one of {', '.join(SHARED_LIMIT)} "
                             "(sm_90: H100 and H200)")
    return name


def device_target(index: int) -> str:
    """The compute capability of this process's index-th GPU, as sm_<major><minor>."""
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def flagged(build: KernelBuild) -> KernelBuild:
    """The build with what would hurt on its target said in `flags`."""
    limit = SHARED_LIMIT.get(build.target, 0)
    flags = []
    if build.spill_bytes:
        flags.append(f"spills {build.spill_bytes} B to local memory on {build.target} (slower there, not wrong)")
    if limit and build.shared_bytes > limit:
        flags.append(f"needs {build.shared_bytes} B of shared memory per block, over {build.target}'s {limit} B (the "
                     "launch fails there)")
    return build.model_copy(update={"shared_limit": limit, "flags": flags})


def over_shared(build: KernelBuild) -> bool:
    return bool(build.shared_limit) and build.shared_bytes > build.shared_limit


def cuda_builds(kernels: list[Any]) -> list[KernelBuild]:
    """cuda_check's ptxas report (PtxasKernel records) as builds."""
    return [flagged(KernelBuild(kernel=k.kernel[:200], backend="cuda", target=k.arch.removesuffix("a")[:16], ok=True,
                                registers=k.registers, spill_bytes=k.spill_store_bytes + k.spill_load_bytes,
                                shared_bytes=k.smem_bytes)) for k in kernels]


def described(build: KernelBuild) -> str:
    """One build in a line: what it costs on its target, or why it does not compile, and its flags."""
    what = (f"{build.registers} registers, {build.spill_bytes} B spilled, {build.shared_bytes} B shared" if build.ok
            else build.error)
    return f"{build.kernel}: {what}" + "".join(f"; {flag}" for flag in build.flags)


def gate(builds: list[KernelBuild]) -> tuple[Check | None, list[str]]:
    """The `compile` finding of the builds (None where there is nothing to add) and the notes they add: a kernel that
    does not compile for its target or needs more shared memory than it has fails; spills are notes. A pass names
    each Triton kernel's registers, spills and shared memory (nvcc's report already names the CUDA kernels')."""
    failed = [b for b in builds if not b.ok or over_shared(b)]
    notes = [f"{b.kernel} [{b.specialization or b.backend}]: {b.flags[0]}" for b in builds if b.spill_bytes][:5]
    if failed:
        detail = "; ".join(f"{b.kernel} for {b.target}: " + (b.error if not b.ok else b.flags[-1]) for b in failed[:3])
        return Check(id="compile", status="fail", detail=detail[:1500]), notes
    triton = {b.kernel: b for b in builds if b.backend == "triton"}  # one line per kernel (its last specialization)
    if not triton:
        return None, notes
    detail = f"Triton for {builds[0].target}: " + "; ".join(described(b) for b in triton.values())
    return Check(id="compile", status="pass", detail=detail[:1500]), notes


# ------------------------------------------------------------------------------------------- in the box (Triton)

def compile_launch(fn: Callable[..., Any], named: Mapping[str, Any], options: Mapping[str, Any], target: str,
                   stand_ins: Mapping[int, Any]) -> KernelBuild:
    """The kernel `fn` (its Python function) as launched with arguments `named` and launch `options`, compiled for
    `target`. Under the interpreter every @triton.jit function is an InterpretedFunction and libdevice's functions
    are numpy stand-ins: the kernel is compiled from its own source with those replaced by what Triton compiles
    (`stand_ins`: id of a stand-in -> the original)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type

    kernel = _jit(fn, stand_ins, {})
    signature, constexprs = {}, {}
    for param in kernel.params:
        value = named.get(param.name, param.default)
        if param.is_constexpr or value is None:
            signature[param.name], constexprs[param.name] = "constexpr", value
        else:
            signature[param.name] = mangle_type(value)
    launch = {k: v for k, v in options.items() if k in ("num_warps", "num_stages", "num_ctas", "maxnreg")}
    spec = ", ".join([*(f"{k}: {v}" for k, v in signature.items() if v != "constexpr"),
                      *(f"{k}={constexprs[k]}" for k in constexprs), *(f"{k}={v}" for k, v in launch.items())])
    base = KernelBuild(kernel=fn.__name__[:200], backend="triton", target=target, specialization=spec[:400], ok=False)
    try:
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", int(target[3:]), 32), options=launch)
        ptxas = _ptxas_report(compiled.asm["ptx"], int(target[3:]))
    except Exception as exc:  # a kernel Triton cannot compile for the target: its message, short
        return base.model_copy(update={"error": _first_error(exc)})
    if ptxas is None:
        return base.model_copy(update={"error": "ptxas gave no report"})
    return flagged(base.model_copy(update={
        "ok": True, "registers": ptxas["registers"], "spill_bytes": ptxas["spill_store_bytes"] +
        ptxas["spill_load_bytes"], "shared_bytes": int(compiled.metadata.shared) + ptxas["smem_bytes"]}))


def _jit(fn: Callable[..., Any], stand_ins: Mapping[int, Any], made: dict[int, Any]) -> Any:
    """A JITFunction of `fn` whose globals hold what Triton compiles: @triton.jit helpers as JITFunctions (through
    modules of them too), libdevice's originals for their stand-ins."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if id(fn) in made:
        return made[id(fn)]

    def real(value: Any) -> Any:
        if isinstance(value, InterpretedFunction):
            return _jit(value.fn, stand_ins, made)
        if isinstance(value, types.ModuleType) and any(isinstance(v, InterpretedFunction) or id(v) in stand_ins
                                                       for v in vars(value).values()):
            module = types.ModuleType(value.__name__)
            vars(module).update({k: stand_ins.get(id(v), v) if not isinstance(v, InterpretedFunction) else
                                 _jit(v.fn, stand_ins, made) for k, v in vars(value).items()})
            return module
        return stand_ins.get(id(value), value)

    names = set(fn.__code__.co_names)  # only what the kernel's code names needs replacing
    scope = {k: real(v) if k in names else v for k, v in fn.__globals__.items()}
    copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__annotations__, copy.__qualname__, copy.__module__ = dict(fn.__annotations__), fn.__qualname__, \
        fn.__module__
    made[id(fn)] = JITFunction(copy)
    return made[id(fn)]


def _ptxas_report(ptx: str, capability: int) -> dict[str, Any] | None:
    """Triton's bundled ptxas -v on the compiled PTX: registers, spills, static shared memory (cuda_check's parse)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    from kernelbot.agent.verify.cuda_check import parse_ptxas

    with tempfile.TemporaryDirectory(prefix="kb_ptxas_") as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run([get_ptxas(capability).path, "-v", f"--gpu-name={sm_arch_from_capability(capability)}",
                               str(source), "-o", str(source.with_suffix(".cubin"))], capture_output=True, text=True,
                              timeout=120)
    kernels = parse_ptxas(done.stderr + done.stdout)
    return kernels[0] if done.returncode == 0 and kernels else None


def _first_error(exc: BaseException) -> str:
    """The error itself: Triton's compile errors quote the kernel's source between where (the first line) and what
    (`error_message`, else the last line); ptxas's name the error in a line of their own."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    what = getattr(exc, "error_message", None) or next(
        (line for line in lines[1:] if re.search(r"\berror\b|Error", line)), lines[-1] if len(lines) > 1 else "")
    return f"{type(exc).__name__}: " + " ".join(dict.fromkeys([*lines[:1], str(what)]))[:ERROR_CHARS]
