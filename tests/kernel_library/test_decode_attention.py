"""The decode_attention family: its reference against transformers' own attention with a DynamicCache, the C++ and
Triton kernels against the reference (prefill, decode, both at once, GQA, biases, broadcast cos/sin, fp32 and
bf16), appending step by step into caches with room, and the family's description of live modules."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, MistralConfig, Qwen2Config
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
from transformers.models.mistral.modeling_mistral import MistralAttention
from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3Config

from kernelbot import KernelbotError
from kernelbot.engine.kv_cache import cache_kwarg
from kernelbot.kernel_library.attention_reference import rope_cos_sin
from kernelbot.kernel_library.base import OpCall
from kernelbot.kernel_library.decode_attention import FAMILY
from kernelbot.kernel_library.decode_attention import reference as ref_module
from kernelbot.kernel_library.decode_attention.cache import kv_with_room, step_dynamic_layer
from kernelbot.kernel_library.decode_attention.reference import Model

HIDDEN = 64


@dataclass(frozen=True)
class Case:
    """One call: batch, new tokens, past tokens, heads, kv heads, head_dim, biases, cos/sin batch (1 or B)."""

    batch: int
    tokens: int
    past: int
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    bias: bool = False
    cos_batch: int = 1

    def init(self, dtype: str) -> list:
        return [HIDDEN, self.heads, self.kv_heads, self.head_dim, self.bias, dtype]

    def inputs(self, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
        """Drawn by the reference's own get_inputs (real cos/sin of positions past..past+tokens-1)."""
        shapes = [[self.batch, self.tokens, HIDDEN], [self.cos_batch, self.tokens, self.head_dim],
                  [self.cos_batch, self.tokens, self.head_dim], *[[self.batch, self.kv_heads, self.past,
                                                                   self.head_dim]] * 2]
        saved = ref_module.INPUT_SHAPES, ref_module.DTYPE
        ref_module.INPUT_SHAPES, ref_module.DTYPE = shapes, dtype
        try:
            torch.manual_seed(seed)
            return ref_module.get_inputs()
        finally:
            ref_module.INPUT_SHAPES, ref_module.DTYPE = saved


CASES = {
    "prefill": Case(batch=2, tokens=6, past=0),
    "decode": Case(batch=3, tokens=1, past=9),
    "past and several new tokens": Case(batch=2, tokens=4, past=5),
    "a long past over several key blocks": Case(batch=1, tokens=3, past=150, heads=2, kv_heads=1),
    "multi-head (no GQA) with biases": Case(batch=2, tokens=3, past=4, kv_heads=4, bias=True),
    "GQA 4:1, cos per batch row": Case(batch=3, tokens=2, past=3, kv_heads=1, cos_batch=3),
    "decode with biases, head_dim 32": Case(batch=2, tokens=1, past=6, heads=2, kv_heads=2, head_dim=32, bias=True),
    "a long prefill (80 rows), with biases": Case(batch=4, tokens=20, past=2, bias=True),
    # bf16 prefill in tiles (prefill_tiles.h, head_dim a multiple of 32): a group of 7 query heads per KV head, a
    # past, and token chunks of 64 with a partial last tile of rows and a partial last block of keys
    "prefill in tiles, GQA 7:1 after a past": Case(batch=2, tokens=40, past=19, heads=7, kv_heads=1, head_dim=64),
    "prefill in tiles over two chunks of tokens": Case(batch=1, tokens=70, past=0, heads=4, kv_heads=2, head_dim=32),
    # one sequence, two kv heads, a long context: fewer items than twice the threads, so a decode step splits each
    # head's keys into chunks side by side and combines them (flash-decoding)
    "decode over a long context, split into chunks": Case(batch=1, tokens=1, past=700, heads=4, kv_heads=2,
                                                          head_dim=64),
    # bf16 decode scores 16 keys at a time and weighs values 16 // (head_dim / 16) heads at a time: a group of 7 heads
    # (the last pass of values has a padding head) over a past that ends inside a block of keys, and head_dim 48
    "decode, GQA 7:1 over a past ending inside a block": Case(batch=2, tokens=1, past=37, heads=7, kv_heads=1,
                                                              head_dim=64),
    "decode with head_dim 48, GQA 6:1": Case(batch=3, tokens=1, past=21, heads=6, kv_heads=1, head_dim=48),
}


def _wrapper(backend: str) -> type:
    module, cls = FAMILY.wrappers[backend].split(":")
    return getattr(importlib.import_module(f"kernelbot.kernel_library.decode_attention.{module}"), cls)


def _models(case: Case, backend: str, dtype: str) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """(kernel, reference in dtype, reference in float64), all with the same seeded weights."""
    torch.manual_seed(0)
    reference = Model(*case.init(dtype)).eval()
    exact = Model(*case.init("float64")).eval()
    exact.load_state_dict({k: v.double() for k, v in reference.state_dict().items()})
    kernel = _wrapper(backend)(*case.init(dtype)).eval()
    kernel.load_state_dict(reference.state_dict())
    return kernel, reference, exact


def _relative_error(got: torch.Tensor, truth: torch.Tensor) -> float:
    return float((got.double() - truth).norm() / truth.norm())


def assert_as_accurate_as_eager(got, eager, truth, slack: float) -> None:
    """Each output has eager's shape and dtype, and is no further from float64 than `slack` times eager's error."""
    for i, (g, e, t) in enumerate(zip(got, eager, truth, strict=True)):
        assert g.shape == e.shape and g.dtype == e.dtype, (i, g.shape, e.shape, g.dtype)
        err, eager_err = _relative_error(g, t), _relative_error(e, t)
        assert err <= slack * eager_err + 1e-6, f"output {i}: relative error {err:.2e}, eager's {eager_err:.2e}"


def _run(kernel, reference, exact, inputs):
    with torch.inference_mode():
        return kernel(*inputs), reference(*inputs), exact(*[x.double() for x in inputs])


# --- the reference is transformers' attention -----------------------------------------------------------------------

def _hf_attention(kind: str, kv_heads: int = 2) -> tuple[torch.nn.Module, LlamaRotaryEmbedding, object]:
    kw = {"hidden_size": HIDDEN, "num_attention_heads": 4, "num_key_value_heads": kv_heads, "intermediate_size": 128,
          "num_hidden_layers": 1, "rope_theta": 50000.0}
    if kind == "llama":
        config = LlamaConfig(**kw)
        module = LlamaAttention(config, 0)
    else:
        config = Qwen2Config(**kw)
        module = Qwen2Attention(config, 0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return module.eval(), LlamaRotaryEmbedding(config), config


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_reference_equals_transformers_attention_with_a_dynamic_cache(kind):
    """Prefill, two decode steps, then three tokens at once (with the causal mask a model would pass)."""
    module, rope, config = _hf_attention(kind)
    reference = Model(*FAMILY.init_args(module)).eval()
    reference.load_state_dict(module.state_dict())
    cache = DynamicCache(config=config)
    past_key = past_value = torch.zeros(2, 2, 0, 16)
    position = 0
    for tokens in (5, 1, 1, 3):
        x = torch.randn(2, tokens, HIDDEN)
        cos, sin = rope(x, torch.arange(position, position + tokens)[None])
        mask = ref_module.causal_mask(tokens, position, x.device)[None, None] if position and tokens > 1 else None
        with torch.inference_mode():
            want, _ = module(x, (cos, sin), mask, **{cache_kwarg(module.forward): cache})
            got, key, value = reference(x, cos, sin, past_key, past_value)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(key, cache.layers[0].keys[:, :, position:], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(value, cache.layers[0].values[:, :, position:], rtol=1e-5, atol=1e-6)
        past_key, past_value = torch.cat((past_key, key), 2), torch.cat((past_value, value), 2)
        position += tokens


def test_the_references_inputs_are_real_rope_angles():
    case = CASES["past and several new tokens"]
    _, cos, sin, _, _ = case.inputs(torch.float64, seed=3)
    torch.testing.assert_close(cos**2 + sin**2, torch.ones_like(cos), rtol=1e-6, atol=1e-6)
    half = case.head_dim // 2
    torch.testing.assert_close(cos[..., :half], cos[..., half:])  # cat(freqs, freqs), as transformers lays it out
    # the first frequency is 1 rad per position: its angle is the position itself, past..past+tokens-1
    angles = torch.atan2(sin[0, :, 0], cos[0, :, 0])
    want = torch.arange(case.past, case.past + case.tokens).double()
    torch.testing.assert_close(torch.remainder(angles - want + torch.pi, 2 * torch.pi), torch.full_like(want, torch.pi),
                               rtol=1e-5, atol=1e-5)


# --- C++ ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CASES))
def test_cpp_forward_matches_the_reference_in_fp32(name):
    kernel, reference, exact = _models(CASES[name], "cpp", "float32")
    for config in FAMILY.configs["cpp"]:
        kernel.CONFIG = config
        got, eager, truth = _run(kernel, reference, exact, CASES[name].inputs(torch.float32, seed=1))
        for g, e in zip(got, eager, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
        assert_as_accurate_as_eager(got, eager, truth, slack=3.0)


@pytest.mark.parametrize("path", ["native", "fp32"])
@pytest.mark.parametrize("name", list(CASES))
def test_cpp_forward_in_bf16_is_as_accurate_as_eager(name, path, monkeypatch):
    """Through the avx512_bf16 GEMMs (where the CPU has them) and through the fp32 GEMMs other CPUs use."""
    from kernelbot.kernel_library.cpp_build import load_cpp
    from kernelbot.kernel_library.decode_attention import cpp

    if path == "native" and not load_cpp(cpp.SOURCE).has_avx512_bf16():
        pytest.skip("this CPU has no avx512_bf16")
    if path == "fp32":
        monkeypatch.setattr(cpp, "bf16_path", lambda ext, x: False)
    kernel, reference, exact = _models(CASES[name], "cpp", "bfloat16")
    got, eager, truth = _run(kernel, reference, exact, CASES[name].inputs(torch.bfloat16, seed=2))
    assert_as_accurate_as_eager(got, eager, truth, slack=1.25)


def _stepwise(backend: str, dtype: torch.dtype, capacity_buffer) -> None:
    """Prefill, three decode steps and a chunk of 3, appended by `step` into caches with room; each step against the
    reference given the keys so far. Positions past the filled ones stay NaN: nothing reads or writes them."""
    case = Case(batch=2, tokens=1, past=0, bias=True)
    kernel, reference, _ = _models(case, backend, str(dtype).removeprefix("torch."))
    key_cache, value_cache = capacity_buffer(case, 40, dtype), capacity_buffer(case, 40, dtype)
    key_cache.fill_(float("nan"))
    value_cache.fill_(float("nan"))
    past_key = past_value = torch.zeros(2, case.kv_heads, 0, case.head_dim, dtype=dtype)
    position = 0
    for step, tokens in enumerate((5, 1, 1, 1, 3)):
        x = torch.randn(2, tokens, HIDDEN, dtype=dtype)
        cos, sin = (t.to(dtype) for t in rope_cos_sin(torch.arange(position, position + tokens)[None], 16, 1e4))
        with torch.inference_mode():
            got = kernel.step(x, cos, sin, key_cache, value_cache, position)
            want, key, value = reference(x, cos, sin, past_key, past_value)
        tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
        torch.testing.assert_close(got, want, **tol, msg=lambda m, s=step: f"step {s}: {m}")
        past_key, past_value = torch.cat((past_key, key), 2), torch.cat((past_value, value), 2)
        position += tokens
        torch.testing.assert_close(key_cache[:, :, :position], past_key, **tol)
        torch.testing.assert_close(value_cache[:, :, :position], past_value, **tol)
        assert bool(key_cache[:, :, position:].isnan().all() and value_cache[:, :, position:].isnan().all())


def _contiguous_buffer(case: Case, capacity: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(case.batch, case.kv_heads, capacity, case.head_dim, dtype=dtype)


def _strided_buffer(case: Case, capacity: int, dtype: torch.dtype) -> torch.Tensor:
    """Heads outermost, then batch: a [B, KVH, capacity, D] view whose batch and head strides are not the usual."""
    return torch.empty(case.kv_heads, case.batch, capacity, case.head_dim, dtype=dtype).transpose(0, 1)


@pytest.mark.parametrize("buffer", [_contiguous_buffer, _strided_buffer])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpp_step_appends_into_a_larger_cache_over_several_steps(dtype, buffer):
    _stepwise("cpp", dtype, buffer)


def test_cpp_kernels_refuse_a_cache_without_room_before_writing():
    from kernelbot.kernel_library.decode_attention.cpp import DecodeAttentionCpp

    case = CASES["decode"]
    kernel = DecodeAttentionCpp(*case.init("float32")).eval()
    x, cos, sin, _, _ = case.inputs(torch.float32, seed=0)
    small = torch.zeros(case.batch, case.kv_heads, case.past, case.head_dim)
    with pytest.raises(RuntimeError, match="fewer than the 10 needed"):
        kernel.step(x, cos, sin, small, small.clone(), case.past)
    assert bool((small == 0).all())
    with pytest.raises(KernelbotError, match="dtype"):
        kernel.step(x, cos, sin, small.bfloat16(), small.bfloat16(), 0)


class _IgnoresThePast(Model):
    """A plausible bug: attention over the new tokens only (the cache never read)."""

    def forward(self, hidden_states, cos, sin, past_key, past_value):
        return super().forward(hidden_states, cos, sin, past_key[:, :, :0], past_value[:, :, :0])


class _NoCausalOffset(Model):
    """A plausible bug: the causal mask aligned to the first key (token t sees keys 0..t), as sdpa's is_causal is."""

    def forward(self, hidden_states, cos, sin, past_key, past_value):
        original = ref_module.causal_mask
        ref_module.causal_mask = lambda tokens, past_len, device: torch.ones(tokens, past_len + tokens,
                                                                             dtype=torch.bool).tril()
        try:
            return super().forward(hidden_states, cos, sin, past_key, past_value)
        finally:
            ref_module.causal_mask = original


@pytest.mark.parametrize("bug", [_IgnoresThePast, _NoCausalOffset])
def test_a_broken_attention_fails_the_comparison(bug):
    case = CASES["past and several new tokens"]
    _, reference, exact = _models(case, "cpp", "float32")
    broken = bug(*case.init("float32")).eval()
    broken.load_state_dict(reference.state_dict())
    got, eager, truth = _run(broken, reference, exact, case.inputs(torch.float32, seed=4))
    with pytest.raises(AssertionError):
        assert_as_accurate_as_eager(got, eager, truth, slack=3.0)


def test_cpp_forward_leaves_pytorch_a_small_share_of_the_work():
    """The verifier's reference_fallback check: PyTorch ops do under half the reference's work."""
    from kernelbot.agent.verify.probes import OpLog

    case = CASES["past and several new tokens"]
    kernel, reference, _ = _models(case, "cpp", "float32")
    inputs = case.inputs(torch.float32, seed=5)
    with torch.inference_mode():
        kernel(*inputs)  # packs the weights once, as the first verified call would
        with OpLog() as ref_log:
            reference(*inputs)
        with OpLog() as kernel_log:
            kernel(*inputs)
    assert sum(kernel_log.compute.values()) < 0.1 * sum(ref_log.compute.values()), kernel_log.compute


# --- Triton (interpreter) -------------------------------------------------------------------------------------------

TRITON_CASES = ["prefill", "decode", "past and several new tokens", "a long past over several key blocks",
                "GQA 4:1, cos per batch row", "decode with biases, head_dim 32"]


@pytest.mark.parametrize("name", TRITON_CASES)
def test_triton_forward_matches_the_reference_in_fp32(name):
    kernel, reference, exact = _models(CASES[name], "triton", "float32")
    got, eager, truth = _run(kernel, reference, exact, CASES[name].inputs(torch.float32, seed=1))
    for g, e in zip(got, eager, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", TRITON_CASES)
def test_triton_forward_in_bf16_stays_near_eager(name, bf16_dot_in_the_interpreter):
    """The interpreter truncates fp32 -> bf16 casts where a GPU rounds: up to about twice eager's error per rounding
    step, so the bound is looser than the C++ one."""
    kernel, reference, exact = _models(CASES[name], "triton", "bfloat16")
    got, eager, truth = _run(kernel, reference, exact, CASES[name].inputs(torch.bfloat16, seed=2))
    assert_as_accurate_as_eager(got, eager, truth, slack=4.0)


def test_triton_step_appends_into_a_larger_cache_over_several_steps():
    _stepwise("triton", torch.float32, _strided_buffer)


# --- appending to transformers' DynamicCache ------------------------------------------------------------------------

def test_kv_with_room_grows_in_place_until_the_room_is_used_then_copies_once():
    keys, values = torch.randn(2, 2, 3, 8), torch.randn(2, 2, 3, 8)
    k1, v1 = kv_with_room(keys, values, 1, room=2)
    assert k1.shape == (2, 2, 4, 8) and k1.untyped_storage().data_ptr() != keys.untyped_storage().data_ptr()
    torch.testing.assert_close(k1[:, :, :3], keys)
    torch.testing.assert_close(v1[:, :, :3], values)
    k1[:, :, 3], v1[:, :, 3] = 1.0, 2.0
    k2, v2 = kv_with_room(k1, v1, 2, room=2)  # capacity 6: room for 2 more
    assert k2.untyped_storage().data_ptr() == k1.untyped_storage().data_ptr() and k2.shape[2] == 6
    assert bool((k2[:, :, 3] == 1).all() and (v2[:, :, 3] == 2).all())
    k2[:, :, 4:], v2[:, :, 4:] = 3.0, 4.0
    k3, _ = kv_with_room(k2, v2, 1, room=2)  # full: a new buffer, the past copied
    assert k3.untyped_storage().data_ptr() != k2.untyped_storage().data_ptr()
    torch.testing.assert_close(k3[:, :, :6], k2)
    cropped = k3[:, :, :4]  # what DynamicLayer.crop keeps: not trusted to own the rest
    k4, _ = kv_with_room(cropped, cropped, 1, room=2)
    assert k4.untyped_storage().data_ptr() != k3.untyped_storage().data_ptr()
    empty = torch.zeros(2, 2, 0, 8)  # a plain tensor is never written past its end, even with nothing to append
    k5, _ = kv_with_room(empty, empty, 0, room=2)
    assert k5.shape == (2, 2, 0, 8) and k5.untyped_storage().nbytes() == 2 * 2 * 2 * 8 * 4


@pytest.mark.parametrize(("backend", "kv_heads"), [("cpp", 2), ("triton", 2), ("cpp", 1)])
def test_step_dynamic_layer_is_a_drop_in_for_llama_attention_with_a_dynamic_cache(backend, kv_heads):
    # kv_heads 1: multi-query attention, every query head reading the one cached head
    module, rope, config = _hf_attention("llama", kv_heads)
    assert FAMILY.covers(module)
    kernel = _wrapper(backend)(*FAMILY.init_args(module)).eval()
    kernel.load_state_dict(module.state_dict())
    theirs, ours = DynamicCache(config=config), DynamicCache(config=config)
    position = 0
    for tokens in (5, 1, 1, 1):
        x = torch.randn(2, tokens, HIDDEN)
        cos, sin = rope(x, torch.arange(position, position + tokens)[None])
        with torch.inference_mode():
            want, _ = module(x, (cos, sin), None, **{cache_kwarg(module.forward): theirs})
            got = step_dynamic_layer(kernel, ours.layers[0], x, cos, sin, room=2)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        position += tokens
        assert ours.get_seq_length() == theirs.get_seq_length() == position
        torch.testing.assert_close(ours.layers[0].keys, theirs.layers[0].keys, rtol=1e-5, atol=1e-6)


# --- the family -----------------------------------------------------------------------------------------------------

def _attention_ops(module: torch.nn.Module, rope: LlamaRotaryEmbedding, config, tokens: int, past: int,
                   trace: Path) -> list[OpCall]:
    """The ops one attention call runs, in order, with their Input Dims and Input type as the profiler's trace
    records them."""
    cache = DynamicCache(config=config)
    with torch.inference_mode():
        if past:
            x = torch.randn(2, past, HIDDEN)
            module(x, rope(x, torch.arange(past)[None]), None, **{cache_kwarg(module.forward): cache})
        x = torch.randn(2, tokens, HIDDEN)
        cos_sin = rope(x, torch.arange(past, past + tokens)[None])
        with torch.profiler.profile(record_shapes=True) as prof:
            module(x, cos_sin, None, **{cache_kwarg(module.forward): cache})
    prof.export_chrome_trace(str(trace))
    events = sorted((e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "cpu_op"),
                    key=lambda e: e["ts"])
    return [OpCall(e["name"], e["args"]["Input Dims"], e["args"]["Input type"]) for e in events]


@pytest.mark.parametrize(("tokens", "past"), [(1, 7), (6, 0)])
def test_the_call_is_read_from_the_ops_llama_attention_runs(tokens, past, tmp_path):
    module, rope, config = _hf_attention("llama")
    dims, types = FAMILY.call_dims(_attention_ops(module, rope, config, tokens, past, tmp_path / "trace.json"))
    past_dims = [2, 2, past, 16]
    assert dims == [[2, tokens, HIDDEN], [1, tokens, 16], [1, tokens, 16], past_dims, past_dims, [HIDDEN, HIDDEN]]
    assert types == ["float"] * 6
    assert FAMILY.matches(module, dims) and FAMILY.free_dims(dims[:5]) == [[0, 1], [0, 1], [0, 1], [0, 2], [0, 2]]


def test_the_family_describes_live_attention_modules():
    llama, _, _ = _hf_attention("llama")
    qwen2, _, _ = _hf_attention("qwen2")
    dims = [[2, 5, HIDDEN], [1, 5, 16], [1, 5, 16], [2, 2, 7, 16], [2, 2, 7, 16]]
    assert FAMILY.init_args(llama) == [HIDDEN, 4, 2, 16, False, "float32"]
    assert FAMILY.init_args(qwen2) == [HIDDEN, 4, 2, 16, True, "float32"]
    assert FAMILY.matches(llama, dims) and FAMILY.matches(qwen2, dims)
    assert not FAMILY.matches(llama, [[2, 5, HIDDEN], [1, 5, 32], [1, 5, 32], [2, 2, 7, 32], [2, 2, 7, 32]])
    kw = {"hidden_size": HIDDEN, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
          "num_hidden_layers": 1}
    windowed = MistralAttention(MistralConfig(**kw, sliding_window=4096), 0)
    assert FAMILY.matches(windowed, dims)  # a sliding window: the kernel's own argument
    assert FAMILY.init_args(windowed) == [HIDDEN, 4, 2, 16, False, "float32", 16**-0.5, None, 4096]
    assert FAMILY.matches(MistralAttention(MistralConfig(**kw, sliding_window=None), 0), dims)
    assert not FAMILY.matches(Qwen3Attention(Qwen3Config(**kw, head_dim=16), 0), dims)  # q_norm / k_norm
    flops, nbytes = FAMILY.cost(dims, 4)
    longer = FAMILY.cost([*dims[:3], [2, 2, 70, 16], [2, 2, 70, 16]], 4)
    assert 0 < flops < longer[0] and 0 < nbytes < longer[1]


def test_the_family_covers_plain_rope_attention_of_any_class_but_not_cohere_interleaved_rope():
    from transformers.models.cohere.modeling_cohere import CohereAttention, CohereConfig

    llama, _, _ = _hf_attention("llama")
    kw = {"hidden_size": HIDDEN, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
          "num_hidden_layers": 1}
    cohere = CohereAttention(CohereConfig(**kw), 0)  # same projections and scaling; RoPE on interleaved pairs
    assert FAMILY.covers(llama) and FAMILY.covers(llama.bfloat16())
    assert not FAMILY.covers(cohere)


def test_decode_steps_over_a_growing_cache_are_one_hotspot_and_prefill_another():
    decode = [[[8, 1, 512], [1, 1, 64], [1, 1, 64], [8, 8, p, 64], [8, 8, p, 64]] for p in (32, 33, 63)]
    prefill = [[8, 32, 512], [1, 32, 64], [1, 32, 64], [8, 8, 0, 64], [8, 8, 0, 64]]
    keys = {json.dumps(FAMILY.group_dims(dims)) for dims in decode}
    assert len(keys) == 1 and json.dumps(FAMILY.group_dims(prefill)) not in keys
