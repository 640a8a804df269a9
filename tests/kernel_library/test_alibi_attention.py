"""BLOOM's ALiBi attention as a family of its own: found by structure; its slopes are BLOOM's for any number of
heads; the reference, standing in for every attention of a BLOOM model, gives the model's own logits over prefill and
decode steps; the C++ kernel (fp32, bf16) matches the reference; routed through the family's engine seam with the
model's own cache, every call gives the model's logits; the call is read from the ops BLOOM's attention runs; an
optimize run of a BLOOM model routes its attention to a verified kernel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from model_zoo import ZOO

from kernelbot.agent.optimize import OptimizeOptions, optimize
from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.alibi_attention.cpp import AlibiAttentionCpp
from kernelbot.kernel_library.alibi_attention.reference import Model, alibi_slopes
from kernelbot.kernel_library.base import OpCall
from kernelbot.records import KernelOutcome

FAMILY = FAMILIES["alibi_attention"]
HIDDEN, HEADS, D = 64, 4, 16


def _bloom() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(ZOO["bloom"].config(), dtype=torch.float32).eval()


def _attentions(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__ == "BloomAttention"]


def test_the_slopes_are_blooms_for_any_number_of_heads():
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    for heads in range(1, 25):
        torch.testing.assert_close(alibi_slopes(heads), _get_alibi_slopes(heads, torch.device("cpu")))


def test_blooms_attention_is_covered_and_llama_style_attentions_are_not():
    attention = _attentions(_bloom())[0]
    assert FAMILY.covers(attention) and FAMILY.init_args(attention) == [HIDDEN, HEADS, "float32"]
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    assert not FAMILY.covers(LlamaAttention(LlamaConfig(hidden_size=64, num_attention_heads=4), 0))


def test_the_reference_in_every_attention_gives_the_models_own_logits():
    model = _bloom()
    tokens = torch.randint(0, 256, (2, 11))
    with torch.no_grad():
        want = model(tokens).logits
        for module in _attentions(model):
            reference = Model(*FAMILY.init_args(module)).eval()
            reference.load_state_dict(module.state_dict())
            empty = torch.zeros(2, HEADS, 0, D)

            def forward(hidden_states, residual, *args, _ref=reference, _empty=empty, **kwargs):
                return _ref(hidden_states, residual, _empty, _empty)[0], None

            module.forward = forward
        got = model(tokens, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("heads", "batch", "tokens", "past"), [(4, 2, 1, 11), (4, 3, 12, 0), (6, 1, 5, 6),
                                                                (4, 2, 1, 70), (1, 1, 1, 600)])
def test_the_kernel_matches_the_reference(heads, batch, tokens, past):
    """6 heads: slopes past the largest power of two; a past of 70: positions over more than a block of keys; one
    head of one sequence over 600: a decode step split into chunks, each biased from its own first position."""
    torch.manual_seed(1)
    hidden = heads * D
    reference, kernel = Model(hidden, heads).eval(), AlibiAttentionCpp(hidden, heads).eval()
    kernel.load_state_dict(reference.state_dict())
    x, residual = torch.randn(batch, tokens, hidden), torch.randn(batch, tokens, hidden)
    k, v = torch.randn(batch, heads, past, D), torch.randn(batch, heads, past, D)
    for config in FAMILY.configs["cpp"]:
        kernel.CONFIG = config
        with torch.inference_mode():
            for got, want in zip(kernel(x, residual, k, v), reference(x, residual, k, v), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_kernel_in_bf16_is_as_accurate_as_eager():
    torch.manual_seed(2)
    reference = Model(HIDDEN, HEADS, "bfloat16").eval()
    exact = Model(HIDDEN, HEADS, "float64").eval()
    exact.load_state_dict({k: v.double() for k, v in reference.state_dict().items()})
    kernel = AlibiAttentionCpp(HIDDEN, HEADS, "bfloat16").eval()
    kernel.load_state_dict(reference.state_dict())
    for tokens, past in ((1, 40), (10, 0)):
        x, residual = torch.randn(2, tokens, HIDDEN).bfloat16(), torch.randn(2, tokens, HIDDEN).bfloat16()
        k, v = torch.randn(2, HEADS, past, D).bfloat16(), torch.randn(2, HEADS, past, D).bfloat16()
        with torch.inference_mode():
            got, eager = kernel(x, residual, k, v)[0], reference(x, residual, k, v)[0]
            truth = exact(*(t.double() for t in (x, residual, k, v)))[0]
        err = float((got.double() - truth).norm() / truth.norm())
        assert err <= 1.25 * float((eager.double() - truth).norm() / truth.norm()) + 1e-4, (tokens, err)


def test_routed_through_the_engine_seam_every_call_gives_the_models_own_logits():
    from transformers import DynamicCache

    model = _bloom()
    routed: list[int] = []
    for module in _attentions(model):
        kernel = AlibiAttentionCpp(*FAMILY.init_args(module)).eval()
        kernel.load_state_dict(module.state_dict())

        def forward(*args, _kernel=kernel, _module=module, _own=module.forward, **kwargs):
            shapes = [list(args[0].shape), list(args[1].shape)]
            thunk = FAMILY.engine_call(_kernel, _module, args, kwargs, shapes)
            if thunk is None:
                return _own(*args, **kwargs)
            routed.append(_module.layer_idx)
            return thunk()

        module.forward = forward
    tokens = torch.randint(0, 256, (2, 5 + 6))
    with torch.no_grad():
        want = _bloom()(tokens).logits
        cache = DynamicCache(config=model.config)
        got = [model(tokens[:, :5], past_key_values=cache).logits]
        got += [model(tokens[:, i:i + 1], past_key_values=cache).logits for i in range(5, 11)]
    torch.testing.assert_close(torch.cat(got, 1), want, rtol=1e-4, atol=1e-4)
    assert len(routed) == 2 * 7 and set(routed) == {0, 1}


@pytest.mark.parametrize(("tokens", "past"), [(1, 7), (6, 0)])
def test_the_call_is_read_from_the_ops_blooms_attention_runs(tokens, past, tmp_path):
    from transformers import DynamicCache

    model = _bloom()
    module = _attentions(model)[0]
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        if past:
            model(torch.randint(0, 256, (2, past)), past_key_values=cache)
        with torch.profiler.profile(record_shapes=True) as prof:
            model(torch.randint(0, 256, (2, tokens)), past_key_values=cache)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = sorted((e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
                     if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    ops = [OpCall(e["name"], e["args"]["Input Dims"], e["args"]["Input type"]) for e in events]
    first = next(i for i, op in enumerate(ops) if op.name == "aten::linear" and op.dims[1] == [3 * HIDDEN, HIDDEN])
    dims, types = FAMILY.call_dims(ops[first:])
    past_dims = [2, HEADS, past, D]
    assert dims == [[2, tokens, HIDDEN], [2, tokens, HIDDEN], past_dims, past_dims] and types == ["float"] * 4
    assert FAMILY.matches(module, dims)


@pytest.mark.slow
def test_a_bloom_models_attention_runs_a_verified_kernel(tmp_path: Path):
    from model_zoo import write_model_dir

    opts = OptimizeOptions(model=str(write_model_dir(tmp_path, "bloom")), dtype="float32", batch=2, prompt_len=8,
                           decode_steps=6, run_dir=tmp_path / "run", families=["alibi_attention"], max_tasks=2,
                           iterations=1, e2e_rounds=3, bench_rounds=9, compile=False, min_share=0.01, device="cpu")
    report = optimize(opts)
    ran = [k for k in report.kernels if k.outcome in (KernelOutcome.ACCEPTED, KernelOutcome.SLOWER_IN_MODEL)]
    assert ran and all(k.op == "alibi_attention" and k.calls > 0 for k in ran), [k.reason for k in report.kernels]
    assert report.fidelity.passed, report.fidelity.summary()
