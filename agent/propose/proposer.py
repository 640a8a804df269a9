"""The built-in proposer, no LLM needed: kernel_library families at several configurations, and for a generic
task (a reference extracted from the model) the reference's own ATen graph generated as C++
(agent/propose/aten_cpp/)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.base import GENERIC
from kernelbot.kernel_library.identity import source_identity
from kernelbot.records import Candidate, Task


def available_backends(device_kind: str) -> list[str]:
    """The backends whose kernels can join a pack on this device: C++ on a CPU, Triton on a GPU. (`kernelbot verify`
    still takes a Triton candidate on a CPU, through Triton's interpreter; a run does not propose one there: it could
    never be timed or shipped, and interpreting it took most of a run's time — 10 of 11 minutes for a Gemma-2.)"""
    if device_kind == "cpu":
        return ["cpp"]
    return ["triton"] if importlib.util.find_spec("triton") is not None else []


def propose(task: Task, backends: list[str], reference: Path) -> list[tuple[Candidate, str]]:
    """(candidate, source) pairs; raises aten_cpp.Unsupported when a generic task's graph cannot be generated."""
    if task.family == GENERIC:
        return _generated(task, backends, reference)
    family = FAMILIES[task.family]
    out = []
    for backend in backends:
        if task.dtype not in family.dtypes.get(backend, ()):
            continue
        for i, config in enumerate(family.configs[backend]):
            source = family.candidate_source(backend, config)
            cand = Candidate(id=f"{backend}-{i}", task_id=task.id, backend=backend, proposer="builtin",
                             config=config, source_hash=source_identity(source))
            out.append((cand, source))
    return out


def _generated(task: Task, backends: list[str], reference: Path) -> list[tuple[Candidate, str]]:
    if "cpp" not in backends:
        return []
    from kernelbot.agent.propose import aten_cpp

    out = []
    for i, (config, source) in enumerate(aten_cpp.generate(reference)):
        out.append((Candidate(id=f"cpp-gen-{i}", task_id=task.id, backend="cpp", proposer="builtin:aten_cpp",
                              config=config, source_hash=source_identity(source)), source))
    return out


def write_candidate(cand: Candidate, source: str, task_dir: Path) -> Path:
    cdir = task_dir / "candidates" / cand.id
    cdir.mkdir(parents=True, exist_ok=True)
    (cdir / "candidate.py").write_text(source)
    (cdir / "candidate.json").write_text(cand.model_dump_json(indent=2))
    return cdir / "candidate.py"
