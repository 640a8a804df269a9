"""On a CPU: a candidate's generated C++ under AddressSanitizer, for the reads and writes past an allocation that guard
regions cannot see (a guard catches writes into it, never a read of it).

The parent builds, once per source and cached, an ASan build of each extension the candidate's profiled call ran
(kernel_library/cpp_build.build_sanitized: generated C++, whose text the build cache holds), then runs the main input
set once in a sandboxed job with ASan's runtime preloaded, where the candidate's loader picks the ASan build. The
inputs go unguarded, each in an allocation of its own, so ASan's redzones lie right past them. The kernel library's
own C++ (loaded by path: the project's shipped code, which its own tests check) is not rebuilt per candidate; C++
built some other way (torch's load_inline called directly) has no ASan build here, and is left to the guard regions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from kernelbot.agent.verify.judge import not_run
from kernelbot.agent.verify.messages import SanitizeJob
from kernelbot.kernel_library import cpp_build
from kernelbot.records import Check
from kernelbot.sandbox import run_job
from kernelbot.sandbox.box import STDERR

CHECK = "out_of_bounds"
_ERROR = re.compile(r"ERROR: AddressSanitizer: ([\w-]+)[^\n]*\n(READ|WRITE)?(?: of size (\d+))?")
_BUILD = re.compile(r"^(kb_\w+_[0-9a-f]{16})\.")


def own_builds(own_kernels: list[str]) -> list[str]:
    """The kernelbot C++ builds (module names) among the native functions the candidate's profiled call ran."""
    return sorted({m.group(1) for k in own_kernels if (m := _BUILD.match(k))})


def generated(builds: list[str]) -> list[str]:
    """Those built from C++ text (a generator's or an LLM's): the build cache holds their source."""
    return [b for b in builds if (cpp_build.cache_root() / b / f"{b}.cpp").is_file()]


def read_report(text: str) -> str:
    """ASan's first error as one line ("heap-buffer-overflow: READ of size 4 in kb_...so"), or "" when none."""
    found = _ERROR.search(text)
    if found is None:
        return ""
    kind, access, size = found.groups()
    frame = re.search(r"#0 0x[0-9a-f]+ +\(([^)]*)\)", text[found.end():])
    where = f" in {Path(frame.group(1).split('+')[0]).name}" if frame else ""
    return f"{kind}: {access or 'access'}{f' of size {size}' if size else ''}{where}"


def asan_check(job: Callable[[], SanitizeJob], own_kernels: list[str], workdir: Path, timeout: float,
               env: dict[str, str]) -> Check | None:
    """The out_of_bounds finding of the main input set (`job()` writes its plan) run under ASan, or None when the
    candidate ran no generated C++ of kernelbot's builds (nothing for this check to add, and nothing written)."""
    builds = generated(own_builds(own_kernels))
    if not builds:
        return None
    runtime = cpp_build.asan_environment()
    if not runtime:
        return not_run(CHECK, "AddressSanitizer: the compiler has no ASan runtime (libasan) here")
    unbuilt = [b for b in builds if not cpp_build.build_sanitized(b)]
    if unbuilt:
        return not_run(CHECK, f"AddressSanitizer: no ASan build of {', '.join(unbuilt)} could be made")
    where = workdir / "asan"
    result = run_job(job().model_dump(mode="json"), where, timeout=timeout, env={**env, **runtime},
                     address_limit=False)
    log = where / STDERR
    found = read_report(log.read_text(errors="replace") if log.is_file() else result.detail)
    if found:
        return Check(id=CHECK, status="fail", detail=f"AddressSanitizer: {found}")
    if result.status != "ok":
        return not_run(CHECK, f"AddressSanitizer: the job ended {result.status} without a report "
                              f"({result.detail.strip().splitlines()[-1][:300] if result.detail.strip() else ''})")
    return Check(id=CHECK, status="pass", detail=f"AddressSanitizer: no access outside an allocation by "
                                                 f"{', '.join(builds)} on the main input set (inputs unguarded)")
