import pytest
import torch
from helpers import norm_off_after_first_call

from kernelbot import KernelbotError
from kernelbot.engine import TorchEngine, builtin_spec
from kernelbot.records import Pack, PackEntry

LIBRARY_NORM = "from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp as ModelNew\n"


def _norm_pack(tmp_path, source: str, dtype: str, shape: list[int]) -> tuple:
    """A one-kernel RMSNorm pack in tmp_path, verified (as the records say) at `shape`."""
    (tmp_path / "kernels").mkdir(exist_ok=True)
    (tmp_path / "kernels" / "norm.py").write_text(source)
    entry = PackEntry(task_id="t", candidate_id="norm", family="rmsnorm", module_class="LlamaRMSNorm",
                      input_shapes=[shape], init_args=[shape[-1], 1e-6, dtype], profiled_dims=[shape], dtype=dtype,
                      backend="cpp", config={}, source_file="kernels/norm.py", source_hash="x", verification="pass",
                      speedup=2.0)
    return Pack(version="test", run_id="r", device="cpu", entries=[entry]), tmp_path


def test_default_spec_is_the_fixed_benchmark_workload():
    spec, _ = builtin_spec()
    assert (spec.layers, spec.hidden, spec.heads, spec.intermediate, spec.vocab) == (4, 512, 8, 1376, 4000)
    assert (spec.batch, spec.prompt_len, spec.decode_steps) == (8, 32, 32)
    assert spec.dtype in ("float32", "bfloat16")


def test_unknown_model_is_a_one_line_error():
    with pytest.raises(KernelbotError, match="unknown model 'gpt-17'.*llama-tiny"):
        builtin_spec("gpt-17")


def test_bad_sizes_are_refused():
    with pytest.raises(KernelbotError):
        builtin_spec("llama-micro", batch=0)
    with pytest.raises(KernelbotError, match="unsupported dtype"):
        builtin_spec("llama-micro", dtype="int8")


def test_micro_engine_generates_deterministically():
    spec, _ = builtin_spec("llama-micro", dtype="float32", batch=2, prompt_len=5, decode_steps=3)
    a = TorchEngine(spec).run_workload()
    b = TorchEngine(spec).run_workload()
    assert a.shape == (2, 4)  # first token from prefill, then 3 decode steps
    assert torch.equal(a, b)
    assert int(a.max()) < spec.vocab


def test_pack_routes_only_verified_shapes_and_counts_both_ways(tmp_path):
    from kernelbot.profiler.hotspots import rank_hotspots
    from kernelbot.profiler.trace import load_trace
    from kernelbot.records import Device

    spec, _ = builtin_spec("llama-micro", dtype="float32", batch=2, prompt_len=5, decode_steps=3)
    engine = TorchEngine(spec)
    expected = engine.run_workload()
    pack, _ = _norm_pack(tmp_path, LIBRARY_NORM, "float32", [2, 1, 128])  # decode shape: prefill falls back
    engine.apply_pack(pack, tmp_path)
    tokens = engine.run_workload()
    norms_per_step = 2 * spec.layers + 1
    assert engine.patcher.counts["norm"] == 3 * norms_per_step  # decode steps only
    assert engine.patcher.fallbacks["LlamaRMSNorm"] == norms_per_step  # the prefill
    assert torch.equal(tokens, expected)
    # A re-profile names the pack kernel where it ran, with the dims of the op it replaced, so it keeps a floor.
    engine.profile(tmp_path / "after.json.gz")
    device = Device(kind="cpu", name="t", threads=1, peak_gflops=100.0, peak_gbps=10.0, peaks_source="test")
    patched = [h for h in rank_hotspots(load_trace(tmp_path / "after.json.gz"), device) if h.kernel]
    assert [(h.kernel, h.input_dims, h.calls) for h in patched] == [("norm", [[2, 1, 128]], 3 * norms_per_step)]
    assert patched[0].floor_us > 0
    engine.remove_pack()
    assert not any("forward" in vars(m) for m in engine.model.modules())
    assert torch.equal(engine.run_workload(), expected)




@pytest.mark.parametrize(("dtype", "scale", "within"), [("bfloat16", None, True), ("float32", "1.01", False)])
def test_fidelity_sets_the_packs_logit_change_beside_the_dtypes_own_error(tmp_path, dtype, scale, within):
    from kernelbot.agent.measure.end_to_end import fidelity

    spec, _ = builtin_spec("llama-micro", dtype=dtype, batch=2, prompt_len=5, decode_steps=6)
    engine = TorchEngine(spec)
    source = LIBRARY_NORM
    if scale:  # verified-looking but 1% off after its checked first call: far beyond fp32's own error
        source = norm_off_after_first_call(scale)
    fid = fidelity(engine, *_norm_pack(tmp_path, source, dtype, [2, 5, spec.hidden]))
    assert fid.dtype_noise is not None and fid.dtype_noise > 0
    assert fid.within_noise is within and (fid.pack_error <= 2 * fid.dtype_noise) is within
    assert fid.passed is ((within or fid.greedy_match) and fid.kl.within_noise)
