"""CUDA candidates: compile what they hand to torch's `load_inline`/`load` with `nvcc -Xptxas -v` for the GPU they
will run on (its compute capability; sm_90 where none is visible) and keep ptxas's report (registers, shared memory,
spills per kernel). Without a GPU the candidate cannot run, so the build stops there with NeedsGPU; with one,
torch's own build goes on as usual.

Installed in the sandboxed process that imports the candidate, before it does (nvcc is one of the allowed
compilers); in a harness that forks runners, in the runner: importing torch's extension tools queries CUDA.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

from kernelbot.agent.verify.compile_gate import TARGET_ENV
from kernelbot.agent.verify.disguise import like

DEFAULT_ARCH = "sm_90"  # where no GPU is visible (the CPU-side tests), the H100/H200's
REPORTS: list[dict[str, Any]] = []
_TARGET: list[str | None] = [None]  # TARGET_ENV as install() found it
# load_inline puts these before CUDA sources; the same here, so the sources compile as they would there.
_PRELUDE = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


class NeedsGPU(Exception):
    """The candidate's CUDA code was compiled (its ptxas report kept), but there is no GPU to run it on."""


def parse_ptxas(text: str) -> list[dict[str, Any]]:
    """Per kernel: registers, static shared memory, stack and spill bytes, from `-Xptxas -v` output."""
    kernels: list[dict[str, Any]] = []
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            kernels.append({"kernel": m.group(1), "arch": m.group(2), "registers": None, "smem_bytes": 0,
                            "stack_bytes": 0, "spill_store_bytes": 0, "spill_load_bytes": 0})
        elif kernels and (m := _PROPS.search(line)):
            kernels[-1].update(stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                               spill_load_bytes=int(m.group(3)))
        elif kernels and (m := _USED.search(line)):
            kernels[-1]["registers"] = int(m.group(1))
            kernels[-1]["smem_bytes"] = int(m.group(2) or 0)
    return kernels


def target_arch() -> str:
    """The verification's GPU target (compile_gate.TARGET_ENV, which verify sets; read when install ran, since the
    runner takes it out of the candidate's environment), else sm_<major><minor> of the GPU the candidate runs on
    (torch's current device), else DEFAULT_ARCH."""
    import torch

    target = _TARGET[0] or os.environ.get(TARGET_ENV)
    if target:
        return target
    if not torch.cuda.is_available():
        return DEFAULT_ARCH
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def include_dirs() -> list[str]:
    from torch.utils.cpp_extension import include_paths

    return [*include_paths(), sysconfig.get_paths()["include"]]


def compile_report(sources: list[str], workdir: Path, extra_flags: list[str] | None = None) -> dict[str, Any]:
    """nvcc -arch=<target_arch()> -Xptxas -v on each source; returns {"ok", "kernels", "log"}."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return {"ok": False, "kernels": [], "log": "nvcc not found: CUDA sources cannot be compiled here"}
    arch = target_arch()
    kernels, logs, ok = [], [], True
    for i, source in enumerate(sources):
        src = workdir / f"candidate_{i}.cu"
        src.write_text(source)
        cmd = [nvcc, f"-arch={arch}", "-Xptxas", "-v", "-cubin", str(src), "-o", str(src.with_suffix(".cubin")),
               "-std=c++20", "--expt-relaxed-constexpr", "-DTORCH_EXTENSION_NAME=candidate", *(extra_flags or []),
               *[f"-I{d}" for d in include_dirs()]]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        ok &= proc.returncode == 0
        logs.append(proc.stderr[-4000:] + proc.stdout[-1000:])
        kernels += parse_ptxas(proc.stderr + proc.stdout)
    return {"ok": ok, "kernels": kernels, "log": "\n".join(logs)[-6000:]}


def install(workdir: Path) -> None:
    """Route torch's CUDA builds through the ptxas report; without a GPU, stop there."""
    from torch.utils import cpp_extension

    _TARGET[0] = os.environ.get(TARGET_ENV)
    original_inline, original_load = cpp_extension.load_inline, cpp_extension.load

    def gate(sources: list[str], flags: list[str] | None) -> None:
        import torch

        report = compile_report(sources, workdir, flags)
        REPORTS.append(report)
        if not report["ok"]:
            raise RuntimeError("nvcc failed:\n" + report["log"][-1500:])
        if not torch.cuda.is_available():
            names = ", ".join(k["kernel"] for k in report["kernels"]) or "no kernels"
            raise NeedsGPU(f"CUDA code compiled for {target_arch()} ({names}); no GPU here to run it on")

    def load_inline(name, cpp_sources, cuda_sources=None, *args, **kwargs):
        if cuda_sources:
            srcs = [cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources)
            gate([_PRELUDE + s for s in srcs], kwargs.get("extra_cuda_cflags"))
        return original_inline(name, cpp_sources, cuda_sources, *args, **kwargs)

    def load(name, sources, *args, **kwargs):
        paths = [sources] if isinstance(sources, str) else list(sources)
        cu = [Path(p).read_text() for p in paths if str(p).endswith(".cu")]
        if cu:
            gate(cu, kwargs.get("extra_cuda_cflags"))
        return original_load(name, sources, *args, **kwargs)

    cpp_extension.load_inline, cpp_extension.load = like(load_inline, original_inline), like(load, original_load)
