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


def test_the_store_remembers_losses_by_source_identity_beside_an_accepted_kernel(tmp_path):
    store = KernelStore(tmp_path / "s")
    task = _task([8, 512, 128])
    assert store.losses(task, "cpp", "cpu:A") == {}
    store.record_loss(task, "cpp", "cpu:A", "hash-slow", 0.21, "r1")
    assert store.losses(task, "cpp", "cpu:A")["hash-slow"]["speedup"] == 0.21
    assert store.losses(task, "cpp", "cpu:B") == {} and store.losses(_task([8, 1, 128]), "cpp", "cpu:A") == {}
    assert store.lookup(task, "cpp", "cpu:A") is None  # a remembered loss is no kernel to reuse


def _bench(speedup: float, spread: float = 0.02, contended: bool = False):
    from kernelbot.records import Bench, HostLoad

    host = HostLoad(load_1m=0.1, cpu_count=2, contended=contended)
    return Bench(candidate_id="c", rounds=9, reference_us=100.0, candidate_us=100.0 / speedup,
                 reference_spread=spread, candidate_spread=spread, speedup=speedup, significant=speedup > 1.05,
                 host=host)


def test_a_loss_is_slower_beyond_the_benchmarks_noise_on_a_quiet_host():
    from kernelbot.agent.generate import lost

    assert lost(_bench(0.5)) and lost(_bench(0.9, spread=0.05))
    assert not lost(_bench(0.97, spread=0.05))  # within its noise
    assert not lost(_bench(0.5, contended=True))  # a loaded host proves nothing
    assert not lost(_bench(1.3))


def test_a_builtin_candidate_that_lost_to_the_op_here_is_not_proposed_again(tmp_path):
    from rich.console import Console

    from kernelbot.agent.generate import Generation
    from kernelbot.agent.journal.db import Journal
    from kernelbot.agent.journal.run_state import Clock, RunState
    from kernelbot.agent.run_options import OptimizeOptions
    from kernelbot.agent.stages import Stages
    from kernelbot.outcomes import Outcome, new_row
    from kernelbot.records import Candidate, Device, KernelOutcome, Origin

    task = _task([8, 512, 128])
    slow = Candidate(id="cpp-0", task_id=task.id, backend="cpp", proposer="builtin", origin=Origin.BUILTIN,
                     config={}, source_hash="hash-slow")
    other = slow.model_copy(update={"id": "cpp-1", "source_hash": "hash-other"})
    device = Device(kind="cpu", name="A", threads=2, peak_gflops=1.0, peak_gbps=1.0, peaks_source="test")
    store = KernelStore(tmp_path / "store")

    def generation(run: str) -> tuple[Generation, Journal]:
        (tmp_path / run).mkdir()
        journal = Journal(tmp_path / run)
        state = RunState(journal, Clock(journal, None), store, "cpu:A")
        return Generation(OptimizeOptions(run_dir=tmp_path / run), tmp_path / run, state,
                          Stages(Console(quiet=True), tmp_path / run), device), journal

    first, journal = generation("r1")
    with journal:
        for cand, speedup in ((slow, 0.4), (other, 0.99)):
            bench = _bench(speedup)
            row = new_row(task, cand, KernelOutcome.NOT_FASTER, "verified but not faster", timed=bench)
            evaluate = first.journaled(task, None, lambda c, p, row=row, bench=bench: Outcome(row=row, bench=bench))
            evaluate(cand, tmp_path / "r1" / f"{cand.id}.py")
    assert set(store.losses(task, "cpp", "cpu:A")) == {"hash-slow"}  # 0.99x is within noise: tried again
    second, journal = generation("r2")
    with journal:
        proposals = second._not_lost_before(task, [(slow, "src"), (other, "src")])
    assert proposals[1] == (other, "src")
    row = proposals[0]
    assert row.outcome is KernelOutcome.NOT_FASTER and row.speedup == 0.4
    assert "not proposed again" in row.reason and "run r1" in row.reason
