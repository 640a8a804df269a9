"""A kernel source's identity sees everything the source includes: editing a shared header (in a copy of the library,
never the real one) changes the build's hash, the built-in candidates' source hashes (the journal's keys) and the
stored kernel's, for exactly the sources that include it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kernelbot.agent.propose.proposer import propose
from kernelbot.kernel_library import FAMILIES, cpp_build, identity
from kernelbot.kernel_library.store import KernelStore
from kernelbot.records import Task

REAL_ROOT = identity.ROOT


def _task(family: str, module_class: str, init_args: list) -> Task:
    return Task(id=f"t-{family}", hotspot_id="h", family=family, module_class=module_class, dtype="float32",
                input_shapes=[[8, 1, 512]], free_dims=[[0, 1]], init_args=init_args, share=0.1, floor_us=1.0)


TASKS = {"gated_mlp": _task("gated_mlp", "LlamaMLP", [512, 1376, "float32"]),
         "linear": _task("linear", "Linear", [512, 512, False, "float32"]),
         "rmsnorm": _task("rmsnorm", "LlamaRMSNorm", [512, 1e-6, "float32"])}


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of kernel_library that source identities are computed from."""
    copy = tmp_path / "kernel_library"
    shutil.copytree(REAL_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(identity, "ROOT", copy)
    return copy


def _keys(root: Path, store: KernelStore) -> dict[str, str]:
    """Every key that must follow the sources: builds, built-in candidates, and a stored gated-MLP kernel."""
    keys = {f"build {p.relative_to(root)}": cpp_build.source_hash(p) for p in sorted(root.glob("*/*.cpp"))}
    for family, task in TASKS.items():
        for cand, _ in propose(task, ["cpp"], root / family / "reference.py"):
            keys[f"candidate {family} {cand.id}"] = cand.source_hash
    found = store.lookup(TASKS["gated_mlp"], "cpp", "cpu:test")
    assert found is not None
    keys["stored gated_mlp"] = found[1]["source_hash"]
    return keys


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def _store(tmp_path: Path) -> KernelStore:
    store = KernelStore(tmp_path / "store")
    source = FAMILIES["gated_mlp"].candidate_source("cpp", {"grain": 4})
    store.add(TASKS["gated_mlp"], "cpp", "cpu:test", source, {"run_id": "r0", "source_hash": "from-an-old-run"})
    return store


def test_a_gemm_header_edit_changes_the_keys_of_what_includes_it_and_nothing_else(library, tmp_path):
    store = _store(tmp_path)
    before = _keys(library, store)
    _append(library / "small_m_gemm.h", "\n// an edit\n")
    after = _keys(library, store)
    changed = {k for k in before if before[k] != after[k]}
    # linear.cpp and attention.cpp include the header; gated MLP runs linear's extension; the stored kernel is one
    assert {k for k in before if k.startswith(("build linear/", "build decode_attention/", "candidate linear",
                                               "candidate gated_mlp", "stored"))} <= changed
    # RMSNorm includes only lanes.h (which the GEMM header includes, not the other way round); RoPE includes nothing
    assert not changed & {k for k in before if k.startswith(("build rmsnorm/", "build rotary_embedding/",
                                                             "candidate rmsnorm"))}


def test_editing_the_lanes_header_reaches_sources_through_another_header(library, tmp_path):
    store = _store(tmp_path)
    before = _keys(library, store)
    _append(library / "lanes.h", "\n// an edit\n")
    after = _keys(library, store)
    changed = {k for k in before if before[k] != after[k]}
    # RMSNorm's C++ includes lanes.h itself, linear's through small_m_gemm.h; RoPE's includes neither
    assert {k for k in before if not k.startswith("build ")} <= changed  # every candidate and the stored kernel
    assert {"build rmsnorm/rmsnorm.cpp", "build linear/linear.cpp", "build decode_attention/attention.cpp"} <= changed
    assert "build rotary_embedding/rotary_embedding.cpp" not in changed


def test_a_copy_of_the_library_has_the_identity_of_the_original(library, tmp_path, monkeypatch):
    store = _store(tmp_path)
    copied = _keys(library, store)
    monkeypatch.setattr(identity, "ROOT", REAL_ROOT)
    assert copied == _keys(REAL_ROOT, store)


def test_a_candidate_is_known_by_its_text_and_the_library_files_it_imports(library):
    source = FAMILIES["rmsnorm"].candidate_source("cpp", {"grain": 8})
    before = identity.source_identity(source)
    assert identity.source_identity(source.replace("8", "64")) != before  # another configuration
    assert identity.source_identity(source, salt="-O2") != before
    _append(library / "rmsnorm" / "cpp.py", "\n# an edit\n")
    assert identity.source_identity(source) != before
    assert identity.source_identity("import torch\n") == identity.source_identity("import torch\n")
