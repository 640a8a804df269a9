"""The first run on a machine builds the library's C++ extensions with a spinner and a line saying so; later runs
find them cached and say nothing."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from kernelbot.agent import generate
from kernelbot.agent.stages import Stages
from kernelbot.kernel_library import cpp_build


def test_every_library_source_is_unbuilt_in_an_empty_cache_and_none_once_built(tmp_path, monkeypatch):
    sources = sorted(Path(cpp_build.__file__).parent.glob("*/*.cpp"))
    cpp_build.prebuild_library()  # the real cache: built (or already there)
    assert cpp_build.unbuilt_library() == []
    monkeypatch.setenv("KERNELBOT_CACHE", str(tmp_path))
    assert cpp_build.unbuilt_library() == sources


def test_a_first_build_compiles_the_unbuilt_sources_side_by_side_then_loads_every_source(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELBOT_CACHE", str(tmp_path))
    monkeypatch.setattr(cpp_build.os, "cpu_count", lambda: 2)
    children: list[str] = []
    loaded: list[Path] = []
    monkeypatch.setattr(cpp_build.subprocess, "run", lambda argv, **kw: children.append(argv[-1]))
    monkeypatch.setattr(cpp_build, "load_cpp", loaded.append)
    cpp_build.prebuild_library()
    sources = sorted(Path(cpp_build.__file__).parent.glob("*/*.cpp"))
    assert sorted(children) == [str(s) for s in sources] and loaded == sources
    children.clear()
    monkeypatch.setattr(cpp_build, "unbuilt_library", lambda: sources[:1])  # one left: built in this process
    cpp_build.prebuild_library()
    assert children == [] and loaded == sources * 2


def test_a_first_build_is_announced_and_a_cached_one_is_silent(tmp_path, monkeypatch):
    out = io.StringIO()
    stages = Stages(Console(file=out, width=200), tmp_path)
    built: list[bool] = []
    monkeypatch.setattr(generate, "prebuild_library", lambda: built.append(True) or {})
    monkeypatch.setattr(generate, "unbuilt_library", lambda: [Path("a.cpp"), Path("b.cpp")])
    generate.build_library(stages)
    assert built == [True] and "built 2 C++ kernel extensions" in out.getvalue()
    monkeypatch.setattr(generate, "unbuilt_library", lambda: [])
    generate.build_library(stages)
    assert built == [True] and out.getvalue().count("built") == 1
    assert "built 2 C++ kernel extensions" in (tmp_path / "log.txt").read_text()


def test_a_gpu_jobs_sandbox_gets_no_cpu_library_build_and_a_cpu_jobs_gets_the_built_cache(monkeypatch):
    built: list[bool] = []
    monkeypatch.setattr(cpp_build, "prebuild_library", lambda: built.append(True) or {"KERNELBOT_CACHE": "x"})
    assert cpp_build.library_env("cuda") == ({}, None) and built == []
    assert cpp_build.library_env("cpu", runs_cpp=False) == ({}, None) and built == []  # the interpreter's re-check
    assert cpp_build.library_env("cpu") == ({"KERNELBOT_CACHE": "x"}, None) and built == [True]


def _no_ninja() -> dict[str, str]:
    raise RuntimeError("Ninja is required to load C++ extensions (pip install ninja to get it)")  # torch's words


def test_a_library_build_that_fails_is_a_line_saying_how_to_fix_it_not_an_exception(tmp_path, monkeypatch):
    monkeypatch.setattr(cpp_build, "prebuild_library", _no_ninja)
    env, problem = cpp_build.library_env("cpu")
    assert env == {"KERNELBOT_CACHE": str(cpp_build.cache_dir().resolve())}
    assert problem is not None and "RuntimeError: Ninja is required" in problem and "install ninja" in problem
    out = io.StringIO()
    monkeypatch.setattr(generate, "prebuild_library", _no_ninja)
    monkeypatch.setattr(generate, "unbuilt_library", lambda: [Path("a.cpp")])
    generate.build_library(Stages(Console(file=out, width=300), tmp_path))  # optimize's first build goes on
    said = out.getvalue()
    assert "C++ build failed here (RuntimeError: Ninja is required" in said and "built 1" not in said


def test_each_candidate_shows_a_spinner_saying_which_of_how_many_it_is_and_only_its_verdict_stays(tmp_path):
    from kernelbot.records import Candidate, KernelResult, Task

    shown: list[str] = []

    class Watching(Stages):
        def working(self, message: str):
            shown.append(message)
            return super().working(message)

    out = io.StringIO()
    stages = Watching(Console(file=out, width=200, force_terminal=True), tmp_path)
    task = Task.model_construct(id="h00-rmsnorm-4x64")
    cands = [Candidate.model_construct(id=f"cpp-{i}") for i in range(2)]
    skipped = KernelResult.model_construct(candidate_id="triton-0")
    outcome = generate.Outcome(row=KernelResult.model_construct(reason="verified; 2.00x beyond noise"), accepted=None)
    generate.try_candidates(task, tmp_path, [skipped, *[(c, "src") for c in cands]], lambda *_: outcome, stages, None)
    assert shown == ["h00-rmsnorm-4x64: candidate 1 of 2 (cpp-0): verifying and benchmarking",
                     "h00-rmsnorm-4x64: candidate 2 of 2 (cpp-1): verifying and benchmarking"]
    assert "verifying and benchmarking" not in (tmp_path / "log.txt").read_text()
    assert (tmp_path / "log.txt").read_text().count("verified; 2.00x beyond noise") == 2


def test_a_cpu_verdict_on_a_host_whose_library_build_fails_says_so_and_still_judges_the_candidate(tmp_path,
                                                                                                  monkeypatch):
    """No ninja (simulated: the build raises torch's own error): a Triton candidate, which needs no C++ library, gets
    its verdict, with a note saying what failed and how to fix it."""
    from helpers import write_module
    from test_verify import RMS_TASK

    from kernelbot.agent.tasks.references import reference_source
    from kernelbot.agent.verify.run import verify

    monkeypatch.setattr(cpp_build, "prebuild_library", _no_ninja)
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    cand = write_module(tmp_path / "cand" / "candidate.py",
                        "from kernelbot.kernel_library.rmsnorm.triton_kernel import RMSNormTriton as ModelNew\n")
    verdict = verify(RMS_TASK, ref, cand, tmp_path / "work", device="cpu")
    assert verdict.verdict == "pass", verdict.failed
    assert any("C++ build failed here (RuntimeError: Ninja is required" in n for n in verdict.notes), verdict.notes
