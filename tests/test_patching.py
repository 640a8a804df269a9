"""engine/patching.py: a pack on a model in this process goes through the one router (engine/router.py), so what the
served engines get (decisions kept per layer, the first-call check, in-model timing and switch-off) holds here too."""

import torch

from kernelbot.agent.measure.end_to_end import router_report
from kernelbot.agent.measure.gate import engine_losers
from kernelbot.engine import TorchEngine, builtin_spec
from kernelbot.engine import router as routing
from kernelbot.records import Pack, PackEntry

LIBRARY_NORM = "from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp as ModelNew\n"


def _engine_and_pack(tmp_path) -> tuple[TorchEngine, Pack]:
    """llama-micro and a one-kernel pack of the library's C++ RMSNorm at the decode shape."""
    spec, _ = builtin_spec("llama-micro", dtype="float32", batch=2, prompt_len=5, decode_steps=8)
    (tmp_path / "kernels").mkdir(exist_ok=True)
    (tmp_path / "kernels" / "norm.py").write_text(LIBRARY_NORM)
    shape = [2, 1, spec.hidden]
    entry = PackEntry(task_id="t", candidate_id="norm", family="rmsnorm", module_class="LlamaRMSNorm",
                      input_shapes=[shape], init_args=[spec.hidden, 1e-6, "float32"], profiled_dims=[shape],
                      dtype="float32", backend="cpp", config={}, source_file="kernels/norm.py", source_hash="x",
                      verification="pass", speedup=2.0)
    return TorchEngine(spec), Pack(version="test", run_id="r", device="cpu", entries=[entry])


def test_a_kernel_slower_in_the_model_than_the_modules_own_path_stops_taking_calls(tmp_path, monkeypatch):
    engine, pack = _engine_and_pack(tmp_path)
    expected = engine.run_workload()
    monkeypatch.setattr(routing, "_timed", lambda path, run: (run(), 5e-6 if path == "kernel" else 1e-6))
    engine.apply_pack(pack, tmp_path)
    for _ in range(3):  # enough decode calls to pass PROBE_AFTER and take PROBE_CALLS timings of each path
        tokens = engine.run_workload()
    assert torch.equal(tokens, expected)
    off = engine.patcher.switched_off
    assert set(off) == {"norm"} and "slower in the engine" in off["norm"]
    calls = engine.patcher.counts["norm"]
    engine.run_workload()
    assert engine.patcher.counts["norm"] == calls  # switched off: every later call runs the module's own forward
    report = router_report(engine, pack)
    assert report.custom["norm"].timed == routing.PROBE_CALLS and report.custom["norm"].kernel_us == 5.0
    accepted = type("A", (), {"entry_id": "norm", "bench": type("B", (), {"speedup": 2.0})()})()
    (loser, why), = engine_losers([accepted], [report])
    assert loser is accepted and "switched off" in why


def test_a_kernel_as_fast_in_the_model_keeps_its_calls_and_its_timings_outlive_a_reapplied_pack(tmp_path,
                                                                                               monkeypatch):
    engine, pack = _engine_and_pack(tmp_path)
    monkeypatch.setattr(routing, "_timed", lambda path, run: (run(), 1e-6 if path == "kernel" else 5e-6))
    engine.apply_pack(pack, tmp_path)
    for _ in range(3):
        engine.run_workload()
    engine.remove_pack()
    engine.apply_pack(pack, tmp_path)
    engine.patcher.reset_counts()
    engine.run_workload()
    steps = engine.spec.decode_steps
    assert engine.patcher.switched_off == {}
    assert engine.patcher.counts["norm"] == (2 * engine.spec.layers + 1) * steps
    assert router_report(engine, pack).custom["norm"].timed == routing.PROBE_CALLS  # not timed again


def test_a_layers_route_is_decided_once_per_call_shape_not_on_every_call(tmp_path, monkeypatch):
    engine, pack = _engine_and_pack(tmp_path)
    decided: list[tuple] = []
    route = routing.Router._route

    def counting(self, spec, layer, call, x):
        decided.append((id(layer), tuple(x.shape)))
        return route(self, spec, layer, call, x)

    monkeypatch.setattr(routing.Router, "_route", counting)
    engine.apply_pack(pack, tmp_path)
    engine.run_workload()
    engine.run_workload()
    norms = 2 * engine.spec.layers + 1
    assert len(decided) == len(set(decided)) == 2 * norms  # each norm: once at the prefill's shape, once at decode's
