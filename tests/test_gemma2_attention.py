"""Gemma-2's attention through the decode attention family: its own scale (query_pre_attn_scalar), soft-capped scores
and, on its sliding layers, a window. Found by structure on both kinds of layer; the reference, standing in for every
attention of a real Gemma-2 model, gives the model's own logits over more tokens than the window; the C++ kernel
matches the reference; a hotspot over both kinds of layer gets a task per kind; routed through the family's engine
seam with the model's own cache (a sliding layer on the sliding attentions) every call gives the model's logits; eager's
masks are taken only where they mask nothing the kernel does not; an optimize run of a Gemma-2 model routes both kinds
of layer to their kernels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_zoo import SMALL_WINDOW, ZOO

from kernelbot.agent.optimize import OptimizeOptions, optimize
from kernelbot.agent.tasks.references import make_tasks
from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.attention_reference import rope_cos_sin
from kernelbot.kernel_library.decode_attention import plain_causal
from kernelbot.kernel_library.decode_attention.cpp import DecodeAttentionCpp
from kernelbot.kernel_library.decode_attention.reference import Model
from kernelbot.kernel_library.decode_attention.triton_kernel import DecodeAttentionTriton
from kernelbot.records import Hotspot, KernelOutcome

FAMILY = FAMILIES["decode_attention"]
HIDDEN, HEADS, KV_HEADS, D, CAP = 64, 4, 2, 16, 50.0


def _gemma2() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(ZOO["gemma2"].config(), dtype=torch.float32).eval()


def _attentions(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__ == "Gemma2Attention"]


def test_gemma2s_sliding_and_full_attention_are_covered_with_their_scale_cap_and_window():
    sliding, full = _attentions(_gemma2())[:2]
    assert sliding.sliding_window == SMALL_WINDOW and full.sliding_window is None
    for module, window in ((sliding, SMALL_WINDOW), (full, None)):
        assert FAMILY.covers(module)
        assert FAMILY.init_args(module) == [HIDDEN, HEADS, KV_HEADS, D, False, "float32", 256**-0.5, CAP, window]


def test_the_reference_in_every_attention_gives_the_models_own_logits_past_the_window():
    """Each Gemma2Attention's forward replaced by the reference, which keeps its own past keys and values (whole:
    its window cuts them off, not a cache): prefill then decode steps, 5 + 8 tokens, past the window of 8."""
    model = _gemma2()
    tokens = torch.randint(0, 256, (2, 5 + 8))
    with torch.no_grad():
        want = model(tokens).logits
        for module in _attentions(model):
            reference = Model(*FAMILY.init_args(module)).eval()
            reference.load_state_dict(module.state_dict())
            past = [torch.zeros(2, KV_HEADS, 0, D)] * 2

            def forward(hidden_states, position_embeddings, attention_mask=None, cache=None, _ref=reference,
                        _past=past, **kwargs):
                out, key, value = _ref(hidden_states, *position_embeddings, *_past)
                _past[:] = [torch.cat((_past[0], key), 2), torch.cat((_past[1], value), 2)]
                return out, None

            module.forward = forward
        steps = (model(tokens[:, i:i + 1], position_ids=torch.tensor([[i]])).logits for i in range(5, 13))
        got = torch.cat([model(tokens[:, :5]).logits, *steps], 1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize(("batch", "tokens", "past", "window"), [(2, 1, 11, SMALL_WINDOW), (3, 12, 0, SMALL_WINDOW),
                                                                 (1, 5, 6, None), (2, 1, 3, SMALL_WINDOW),
                                                                 (1, 40, 30, SMALL_WINDOW)])
def test_the_kernel_matches_the_reference_with_a_cap_and_a_window(backend, batch, tokens, past, window):
    """(1, 40, 30): rows whose window starts past the first block of keys their row block reads."""
    torch.manual_seed(1)
    args = [HIDDEN, HEADS, KV_HEADS, D, False, "float32", 256**-0.5, CAP, window]
    wrapper = DecodeAttentionCpp if backend == "cpp" else DecodeAttentionTriton
    reference, kernel = Model(*args).eval(), wrapper(*args).eval()
    with torch.no_grad():
        for p in reference.parameters():
            p.mul_(8)  # large scores: the cap bends them
    kernel.load_state_dict(reference.state_dict())
    cos, sin = rope_cos_sin(torch.arange(past, past + tokens)[None], D, 1e4)
    x = torch.randn(batch, tokens, HIDDEN)
    k, v = torch.randn(batch, KV_HEADS, past, D), torch.randn(batch, KV_HEADS, past, D)
    for config in FAMILY.configs.get(backend, [kernel.CONFIG]):
        kernel.CONFIG = config
        with torch.inference_mode():
            for got, want in zip(kernel(x, cos, sin, k, v), reference(x, cos, sin, k, v), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_kernel_in_bf16_is_as_accurate_as_eager_with_a_cap_and_a_window():
    torch.manual_seed(2)
    args = [HIDDEN, HEADS, KV_HEADS, D, False, "bfloat16", 256**-0.5, CAP, SMALL_WINDOW]
    reference, kernel = Model(*args).eval(), DecodeAttentionCpp(*args).eval()
    exact = Model(*[*args[:5], "float64", *args[6:]]).eval()
    exact.load_state_dict({k: v.double() for k, v in reference.state_dict().items()})
    kernel.load_state_dict(reference.state_dict())
    for tokens, past in ((1, 12), (10, 0)):
        cos, sin = (t.bfloat16() for t in rope_cos_sin(torch.arange(past, past + tokens)[None], D, 1e4))
        x = torch.randn(2, tokens, HIDDEN).bfloat16()
        k, v = torch.randn(2, KV_HEADS, past, D).bfloat16(), torch.randn(2, KV_HEADS, past, D).bfloat16()
        with torch.inference_mode():
            got, eager = kernel(x, cos, sin, k, v)[0], reference(x, cos, sin, k, v)[0]
            truth = exact(*(t.double() for t in (x, cos, sin, k, v)))[0]
        err = float((got.double() - truth).norm() / truth.norm())
        assert err <= 1.25 * float((eager.double() - truth).norm() / truth.norm()) + 1e-4, (tokens, err)


def test_routed_through_the_engine_seam_both_kinds_of_layer_give_the_models_own_logits_past_the_window():
    """Every Gemma2Attention call goes to a kernel built with that layer's own arguments, through the family's
    engine seam with the model's own DynamicCache (a sliding layer for the sliding attentions, cropped to its
    window) and eager attention's masks: prefill then decode steps past the window, every call routed."""
    from transformers import DynamicCache

    model = _gemma2()
    routed: list[int] = []
    for module in _attentions(model):
        kernel = DecodeAttentionCpp(*FAMILY.init_args(module)).eval()
        kernel.load_state_dict(module.state_dict())

        def forward(*args, _kernel=kernel, _module=module, _own=module.forward, **kwargs):
            hidden, (cos, _) = kwargs["hidden_states"], kwargs["position_embeddings"]
            shapes = [list(hidden.shape), list(cos.shape), list(cos.shape)]
            thunk = FAMILY.engine_call(_kernel, _module, args, kwargs, shapes)
            if thunk is None:
                return _own(*args, **kwargs)
            routed.append(_module.layer_idx)
            return thunk()

        module.forward = forward
    tokens = torch.randint(0, 256, (2, 5 + 9))
    with torch.no_grad():
        want = _gemma2()(tokens).logits
        cache = DynamicCache(config=model.config)
        got = [model(tokens[:, :5], past_key_values=cache).logits]
        got += [model(tokens[:, i:i + 1], past_key_values=cache).logits for i in range(5, 14)]
    torch.testing.assert_close(torch.cat(got, 1), want, rtol=1e-4, atol=1e-4)
    assert len(routed) == 2 * 10 and set(routed) == {0, 1}
    assert cache.layers[0].keys.shape[2] == SMALL_WINDOW - 1 and cache.layers[1].keys.shape[2] == 14


def test_a_hotspot_over_both_kinds_of_layer_gets_a_task_per_kind():
    """Gemma-2's sliding and full attentions share a class and the profiled shapes, not a window: one task each,
    the second's id marked, each built with its own layers' arguments."""
    model = _gemma2()
    dims = [[2, 1, HIDDEN], [1, 1, D], [1, 1, D], [2, KV_HEADS, 7, D], [2, KV_HEADS, 7, D], [HIDDEN, HIDDEN]]
    hotspot = Hotspot(id="h00", module_class="Gemma2Attention", module_paths=[], family="decode_attention",
                      input_dims=dims, dtype="float32", calls=12, total_us=1.0, share=0.5)
    first, second = make_tasks(hotspot, model)
    assert (first.id, second.id) == ("h00-decode_attention-2x1x64", "h00-decode_attention-2x1x64-v2")
    assert first.init_args[-1] == SMALL_WINDOW and second.init_args[-1] is None
    assert first.input_shapes == second.input_shapes == dims[:5]


def _additive(seen: torch.Tensor) -> torch.Tensor:
    return torch.zeros(seen.shape).masked_fill(~seen, torch.finfo(torch.float32).min)[None, None].expand(2, 1, -1, -1)


def test_eager_masks_are_taken_only_where_they_mask_nothing_the_kernel_does_not():
    keys, query = torch.arange(10), 6 + torch.arange(4)[:, None]  # 4 new tokens after 6 cached ones
    causal = keys <= query
    assert plain_causal(None, 4, 6, None) and plain_causal(_additive(causal), 4, 6, None)
    assert plain_causal(causal[None, None], 4, 6, None)  # a bool mask: True attends
    padded = causal.clone()
    padded[:, 0] = False  # a left-padded sequence: its first key is masked out
    assert not plain_causal(_additive(padded), 4, 6, None)
    windowed = causal & (keys > query - 5)
    assert plain_causal(_additive(windowed), 4, 6, 5) and not plain_causal(_additive(windowed), 4, 6, None)
    assert not plain_causal(_additive(causal), 4, 6, 5)  # a window the mask does not apply
    assert not plain_causal(None, 4, 6, 5) and plain_causal(None, 4, 0, 5)  # no mask: only within the window


@pytest.mark.slow
def test_a_gemma2_models_sliding_and_full_attention_layers_each_run_a_verified_kernel(tmp_path: Path):
    from model_zoo import write_model_dir

    opts = OptimizeOptions(model=str(write_model_dir(tmp_path, "gemma2")), dtype="float32", batch=2, prompt_len=8,
                           decode_steps=6, run_dir=tmp_path / "run", families=["decode_attention"], max_tasks=2,
                           iterations=1, e2e_rounds=3, bench_rounds=9, compile=False, min_share=0.01, device="cpu")
    report = optimize(opts)
    ran = [k for k in report.kernels if k.outcome in (KernelOutcome.ACCEPTED, KernelOutcome.SLOWER_IN_MODEL)]
    assert ran and all(k.op == "decode_attention" and k.calls > 0 for k in ran), [k.reason for k in report.kernels]
    assert {"-v2/" in k.candidate_id for k in ran} == {True, False}  # the sliding and the full layers' kernels
    assert report.fidelity.passed, report.fidelity.summary()
