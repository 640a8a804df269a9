import gzip
import json

import pytest
import torch

from kernelbot import KernelbotError
from kernelbot.engine import TorchEngine, builtin_spec
from kernelbot.profiler.hotspots import op_breakdown, rank_hotspots, self_time
from kernelbot.profiler.trace import load_trace
from kernelbot.records import Device

DEVICE = Device(kind="cpu", name="test", threads=1, peak_gflops=100.0, peak_gbps=10.0, peaks_source="test")


@pytest.fixture(scope="module")
def micro_trace(tmp_path_factory):
    spec, _ = builtin_spec("llama-micro", dtype="float32", batch=4, prompt_len=8, decode_steps=2)
    path = tmp_path_factory.mktemp("trace") / "trace.json.gz"
    TorchEngine(spec).profile(path)
    return load_trace(path)


def test_modules_carry_their_paths(micro_trace):
    mlp = micro_trace.modules[micro_trace.modules["cls"] == "LlamaMLP"]
    assert len(mlp) == 2 * 3  # 2 layers x (prefill + 2 decode steps)
    assert all(p.startswith("LlamaForCausalLM_0/LlamaModel_0/LlamaDecoderLayer_") for p in mlp["path"])


def test_a_whole_mlp_is_one_unit_not_its_linears(micro_trace):
    hotspots = rank_hotspots(micro_trace, DEVICE)
    mlp = [h for h in hotspots if h.module_class == "LlamaMLP"]
    assert {tuple(h.input_dims[0]) for h in mlp} == {(4, 8, 128), (4, 1, 128)}
    assert all(h.family == "gated_mlp" and h.floor_us > 0 for h in mlp)
    # The MLP's gate/up/down projections are inside the unit, so no Linear hotspot has their weights.
    linear_weights = {tuple(h.input_dims[1]) for h in hotspots if h.module_class == "Linear"}
    assert (344, 128) not in linear_weights and (128, 344) not in linear_weights
    assert (512, 128) in linear_weights  # lm_head
    decode_mlp = next(h for h in mlp if h.input_dims[0][1] == 1)
    assert decode_mlp.calls == 4  # 2 layers x 2 decode steps
    assert sum(h.share for h in hotspots) <= 1.0 + 1e-9
    assert [h.score_us for h in hotspots] == sorted((h.score_us for h in hotspots), reverse=True)


def test_roofline_floor_matches_hand_count(micro_trace):
    hotspots = rank_hotspots(micro_trace, DEVICE)
    norm = next(h for h in hotspots if h.module_class == "LlamaRMSNorm" and h.input_dims[0] == [4, 1, 128])
    bytes_per_call = (2 * 4 + 1) * 128 * 4  # read x, write out, read weight, fp32
    assert norm.bytes == bytes_per_call
    assert norm.floor_us == pytest.approx(round(norm.calls * bytes_per_call / (DEVICE.peak_gbps * 1e3), 1))


def test_self_time_subtracts_nested_events():
    import pandas as pd

    events = pd.DataFrame({"ts": [0.0, 1.0, 2.0, 5.0], "dur": [10.0, 3.0, 1.0, 2.0], "tid": [1, 1, 1, 1]})
    assert list(self_time(events)) == [5.0, 2.0, 1.0, 2.0]


def test_op_breakdown_has_matmuls(micro_trace):
    ops = op_breakdown(micro_trace)
    assert "aten::mm" in set(ops["name"]) or "aten::addmm" in set(ops["name"])
    assert ops["share"].sum() == pytest.approx(1.0)


def test_bad_traces_are_one_line_errors(tmp_path):
    truncated = tmp_path / "cut.json.gz"
    truncated.write_bytes(gzip.compress(json.dumps({"traceEvents": []}).encode())[:20])
    with pytest.raises(KernelbotError, match="cut.json.gz: cannot read"):
        load_trace(truncated)
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [')
    with pytest.raises(KernelbotError, match="broken.json: not valid JSON"):
        load_trace(broken)
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"something": 1}')
    with pytest.raises(KernelbotError, match="no traceEvents"):
        load_trace(wrong)


def test_real_gpu_trace_loads(shared_data):
    trace = load_trace(shared_data / "traces" / "a100_alexnet.json.gz")
    assert len(trace.ops) > 0
    assert trace.modules.empty  # no python_function events in this trace: nothing to rank by module
    assert rank_hotspots(trace, DEVICE) == []


class RotaryEmbedding(torch.nn.Module):
    """The op order of SGLang's RotaryEmbedding: forward_native (positions flattened, cache rows picked, then
    query and key viewed as heads) or, with `cuda_like`, forward_cuda's (the views, then one fused op)."""

    def __init__(self, cuda_like: bool) -> None:
        super().__init__()
        self.cuda_like, self.head_size = cuda_like, 16
        self.register_buffer("cos_sin_cache", torch.randn(64, 16))

    def forward(self, positions, query, key):
        if self.cuda_like:
            q, k = query.view(len(positions), -1, 16), key.view(len(positions), -1, 16)
            return torch.add(q, 1).flatten(1), torch.add(k, 1).flatten(1)
        cos, sin = self.cos_sin_cache.index_select(0, positions.flatten()).chunk(2, dim=-1)
        q = query.view(len(positions), -1, 16) * cos[:, None, :].repeat(1, 1, 2)
        k = key.view(len(positions), -1, 16) * sin[:, None, :].repeat(1, 1, 2)
        return q.flatten(1), k.flatten(1)


@pytest.mark.parametrize("cuda_like", [False, True])
def test_rotary_calls_are_read_from_their_query_and_key_views(tmp_path, cuda_like):
    from kernelbot.engine.capture import profile_callable

    rope = RotaryEmbedding(cuda_like)
    qkv = torch.randn(5, 4 * 16 + 2 * 2 * 16)
    args = (torch.arange(5), qkv[:, :64], qkv[:, 64:96])  # q and k: column slices, as SGLang passes them
    profile_callable(lambda: rope(*args), tmp_path / "rope.json.gz")
    [hotspot] = [h for h in rank_hotspots(load_trace(tmp_path / "rope.json.gz"), DEVICE)
                 if h.module_class == "RotaryEmbedding"]
    assert hotspot.family == "rotary_embedding"
    assert hotspot.input_dims == [[5], [5, 64], [5, 32]] and hotspot.dtype == "float32"
    assert hotspot.bytes == 2 * 5 * 96 * 4 + 8 * 5  # query and key read and written, one int64 per token
