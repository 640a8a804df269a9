"""The first run on a machine builds the library's C++ extensions with a spinner and a line saying so; later runs
find them cached and say nothing."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from kernelbot.agent import optimize
from kernelbot.kernel_library import cpp_build


def test_every_library_source_is_unbuilt_in_an_empty_cache_and_none_once_built(tmp_path, monkeypatch):
    sources = sorted(Path(cpp_build.__file__).parent.glob("*/*.cpp"))
    cpp_build.prebuild_library()  # the real cache: built (or already there)
    assert cpp_build.unbuilt_library() == []
    monkeypatch.setenv("KERNELBOT_CACHE", str(tmp_path))
    assert cpp_build.unbuilt_library() == sources


def test_a_first_build_is_announced_and_a_cached_one_is_silent(tmp_path, monkeypatch):
    out = io.StringIO()
    stages = optimize.Stages(Console(file=out, width=200), tmp_path)
    built: list[bool] = []
    monkeypatch.setattr(optimize, "prebuild_library", lambda: built.append(True) or {})
    monkeypatch.setattr(optimize, "unbuilt_library", lambda: [Path("a.cpp"), Path("b.cpp")])
    optimize._build_library(stages)
    assert built == [True] and "built 2 C++ kernel extensions" in out.getvalue()
    monkeypatch.setattr(optimize, "unbuilt_library", lambda: [])
    optimize._build_library(stages)
    assert built == [True] and out.getvalue().count("built") == 1
    assert "built 2 C++ kernel extensions" in (tmp_path / "log.txt").read_text()
