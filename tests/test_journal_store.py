"""The kernel store: keyed by op signature, backend and device; $KERNELBOT_STORE picks its root."""

from __future__ import annotations

from kernelbot.kernel_library.store import KernelStore, store_root
from kernelbot.records import Task


def _task(shape: list[int], dtype: str = "float32", tid: str = "h01-rmsnorm") -> Task:
    return Task(id=tid, hotspot_id="h01", family="rmsnorm", module_class="LlamaRMSNorm", dtype=dtype,
                input_shapes=[shape], free_dims=[[0]], init_args=[shape[-1], 1e-6], share=0.1, floor_us=1.0)


def test_store_is_keyed_by_signature_backend_and_device(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELBOT_STORE", str(tmp_path / "s"))
    store = KernelStore()
    assert store.root == store_root() == tmp_path / "s"
    assert store.lookup(_task([4, 1, 128]), "cpp", "cpp:A") is None
    store.add(_task([4, 1, 128]), "cpp", "cpp:A", "class ModelNew: pass\n", {"run_id": "r1", "speedup": 2.0})
    source, entry = store.lookup(_task([4, 1, 128], tid="h07-rmsnorm-other-model"), "cpp", "cpp:A")
    assert source == "class ModelNew: pass\n" and entry["run_id"] == "r1" and entry["backend"] == "cpp"
    assert entry["signature"]["input_shapes"] == [[4, 1, 128]]
    for other in ((_task([4, 8, 128]), "cpp", "cpp:A"), (_task([4, 1, 128], "bfloat16"), "cpp", "cpp:A"),
                  (_task([4, 1, 128]), "triton", "cpp:A"), (_task([4, 1, 128]), "cpp", "cpp:B")):
        assert store.lookup(*other) is None, other


def test_a_kernel_stored_before_the_cpp_wrappers_moved_still_imports_and_builds(tmp_path):
    """Kernels stored by earlier versions import `<family>.cpu`; the store hands them back importing `<family>.cpp`,
    and the class they name is there."""
    from kernelbot.loading import load_module

    store = KernelStore(tmp_path / "s")
    old = ("from kernelbot.kernel_library.rmsnorm.cpu import RMSNormCpp\n\n\n"
           "class ModelNew(RMSNormCpp):\n    CONFIG = {'grain': 8}\n")
    store.add(_task([4, 1, 128]), "cpp", "cpp:A", old, {"run_id": "r0"})
    source, _ = store.lookup(_task([4, 1, 128]), "cpp", "cpp:A")
    assert "rmsnorm.cpp import RMSNormCpp" in source and ".cpu import" not in source
    (tmp_path / "candidate.py").write_text(source)
    assert load_module(tmp_path / "candidate.py", "kb_old_stored").ModelNew.CONFIG == {"grain": 8}
