"""The GPT-NeoX attention family (one fused projection holding each head's q, k and v, partial rotary, biases): found
by structure in a GPT-NeoX model and not in a Llama or GPT-2 one, its C++ kernel (decode attention's step, rotating
the first rotary_dim dims of each head) matches the reference in fp32 and bf16, appends into a DynamicCache as
GPT-NeoX's own attention does, its call is read from the ops GPT-NeoX's attention runs, `kernelbot verify` passes it,
and an optimize run of a GPT-NeoX model routes its attention calls to it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import write_module
from model_zoo import ZOO

from kernelbot.agent.optimize import OptimizeOptions, optimize
from kernelbot.agent.tasks.references import reference_source
from kernelbot.agent.verify.run import verify
from kernelbot.kernel_library import FAMILIES, classes_covered
from kernelbot.kernel_library.attention_reference import rope_cos_sin
from kernelbot.kernel_library.base import OpCall
from kernelbot.kernel_library.decode_attention.cache import step_dynamic_layer
from kernelbot.kernel_library.neox_attention.cpp import NeoxAttentionCpp
from kernelbot.kernel_library.neox_attention.reference import Model
from kernelbot.records import KernelOutcome, Task

FAMILY = FAMILIES["neox_attention"]
HIDDEN, HEADS, D, ROTARY = 64, 4, 16, 4


def _model(name: str, attention: str = "sdpa") -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(ZOO[name].config(), dtype=torch.float32,
                                            attn_implementation=attention).eval()


def _attention(model: torch.nn.Module) -> torch.nn.Module:
    return next(m for m in model.modules() if type(m).__name__ == "GPTNeoXAttention")


def _cos_sin(batch: int, past: int, tokens: int, rotary: int = ROTARY, dtype: torch.dtype = torch.float32):
    cos, sin = rope_cos_sin(torch.arange(past, past + tokens).expand(batch, tokens), rotary, 1e4)
    return cos.to(dtype), sin.to(dtype)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_gpt_neoxs_attention_is_found_by_structure_and_llamas_and_gpt2s_are_not(attention):
    neox = _model("gpt-neox", attention)
    module = _attention(neox)
    assert classes_covered(neox).get("GPTNeoXAttention") == "neox_attention"
    assert FAMILY.init_args(module) == [HIDDEN, HEADS, D, module.rotary_ndims, True, "float32"]
    assert module.rotary_ndims < module.head_size  # the zoo's NeoX rotates a quarter of each head
    for other in ("llama", "gpt2"):
        assert "neox_attention" not in classes_covered(_model(other)).values()


@pytest.mark.parametrize(("batch", "tokens", "past", "rotary"), [(2, 1, 7, 4), (3, 5, 0, 8), (1, 13, 4, 16),
                                                                 (4, 1, 0, 2)])
def test_the_kernel_matches_the_reference_in_fp32(batch, tokens, past, rotary):
    torch.manual_seed(1)
    reference = Model(HIDDEN, HEADS, D, rotary).eval()
    kernel = NeoxAttentionCpp(HIDDEN, HEADS, D, rotary).eval()
    kernel.load_state_dict(reference.state_dict())
    x, k, v = torch.randn(batch, tokens, HIDDEN), torch.randn(batch, HEADS, past, D), torch.randn(batch, HEADS, past, D)
    cos, sin = _cos_sin(batch, past, tokens, rotary)
    for config in FAMILY.configs["cpp"]:
        kernel.CONFIG = config
        with torch.inference_mode():
            for got, want in zip(kernel(x, cos, sin, k, v), reference(x, cos, sin, k, v), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_kernel_in_bf16_is_as_accurate_as_eager():
    torch.manual_seed(2)
    reference = Model(HIDDEN, HEADS, D, ROTARY, True, "bfloat16").eval()
    exact = Model(HIDDEN, HEADS, D, ROTARY, True, "float64").eval()
    exact.load_state_dict({k: v.double() for k, v in reference.state_dict().items()})
    kernel = NeoxAttentionCpp(HIDDEN, HEADS, D, ROTARY, True, "bfloat16").eval()
    kernel.load_state_dict(reference.state_dict())
    for tokens, past in ((1, 9), (6, 0)):
        x = torch.randn(2, tokens, HIDDEN).bfloat16()
        k, v = torch.randn(2, HEADS, past, D).bfloat16(), torch.randn(2, HEADS, past, D).bfloat16()
        cos, sin = _cos_sin(2, past, tokens, dtype=torch.bfloat16)
        with torch.inference_mode():
            got, eager = kernel(x, cos, sin, k, v)[0], reference(x, cos, sin, k, v)[0]
            truth = exact(x.double(), cos.double(), sin.double(), k.double(), v.double())[0]
        assert got.dtype == torch.bfloat16
        err = float((got.double() - truth).norm() / truth.norm())
        assert err <= 1.25 * float((eager.double() - truth).norm() / truth.norm()) + 1e-4, (tokens, err)


def test_cos_and_sin_wider_than_a_head_are_refused_in_one_line():
    kernel = NeoxAttentionCpp(HIDDEN, HEADS, D, ROTARY).eval()
    x, past = torch.randn(1, 1, HIDDEN), torch.zeros(1, HEADS, 0, D)
    cos, sin = _cos_sin(1, 0, 1, rotary=2 * D)
    with pytest.raises(RuntimeError, match="at most head_dim"):
        kernel(x, cos, sin, past, past)


def test_step_dynamic_layer_is_a_drop_in_for_gpt_neoxs_attention_with_a_dynamic_cache():
    from transformers import DynamicCache

    neox = _model("gpt-neox")
    module = _attention(neox)
    kernel = NeoxAttentionCpp(*FAMILY.init_args(module)).eval()
    kernel.load_state_dict(module.state_dict())
    theirs, ours = DynamicCache(config=neox.config), DynamicCache(config=neox.config)
    past = 0
    for tokens in (5, 1, 1, 1):
        x = torch.randn(2, tokens, HIDDEN)
        cos, sin = _cos_sin(2, past, tokens, module.rotary_ndims)
        with torch.inference_mode():
            want, _ = module(x, attention_mask=None, layer_past=theirs, position_embeddings=(cos, sin))
            got = step_dynamic_layer(kernel, ours.layers[module.layer_idx], x, cos, sin, room=2)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert ours.get_seq_length(module.layer_idx) == theirs.get_seq_length(module.layer_idx)
        torch.testing.assert_close(ours.layers[module.layer_idx].keys, theirs.layers[module.layer_idx].keys)
        past += tokens


@pytest.mark.parametrize(("attention", "tokens", "past"), [("sdpa", 1, 7), ("sdpa", 6, 0), ("eager", 1, 3)])
def test_the_call_is_read_from_the_ops_gpt_neoxs_attention_runs(attention, tokens, past, tmp_path: Path):
    from transformers import DynamicCache

    neox = _model("gpt-neox", attention)
    module = _attention(neox)
    rotary = module.rotary_ndims
    cache = DynamicCache(config=neox.config)
    with torch.inference_mode():
        if past:
            module(torch.randn(2, past, HIDDEN), attention_mask=None, layer_past=cache,
                   position_embeddings=_cos_sin(2, 0, past, rotary))
        mask = None if attention == "sdpa" else torch.zeros(1, 1, tokens, past + tokens)
        x = torch.randn(2, tokens, HIDDEN)
        with torch.profiler.profile(record_shapes=True) as prof:
            module(x, attention_mask=mask, layer_past=cache, position_embeddings=_cos_sin(2, past, tokens, rotary))
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = sorted((e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
                     if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    ops = [OpCall(e["name"], e["args"]["Input Dims"], e["args"]["Input type"]) for e in events]
    dims, types = FAMILY.call_dims(ops)
    past_dims = [2, HEADS, past, D]
    assert dims == [[2, tokens, HIDDEN], [2, tokens, rotary], [2, tokens, rotary], past_dims, past_dims]
    assert types == ["float"] * 5 and FAMILY.matches(module, dims)
    longer = [2, HEADS, past + 50, D]
    assert 0 < FAMILY.cost(dims, 4)[0] < FAMILY.cost([*dims[:3], longer, longer], 4)[0]


def test_kernelbot_verify_passes_the_kernel(tmp_path: Path):
    # a decode step at a small model's width (hidden 256, 4 heads of 64, a quarter of each rotated)
    task = Task(id="attn", hotspot_id="h", family="neox_attention", module_class="GPTNeoXAttention", dtype="float32",
                input_shapes=[[4, 1, 256], [4, 1, 16], [4, 1, 16], [4, 4, 16, 64], [4, 4, 16, 64]],
                free_dims=[[0, 1], [0, 1], [0, 1], [0, 2], [0, 2]], init_args=[256, 4, 64, 16, True, "float32"],
                share=0.3, floor_us=1.0)
    ref = write_module(tmp_path / "reference.py", reference_source(task))
    cand = write_module(tmp_path / "cand" / "candidate.py", FAMILY.candidate_source("cpp", {"grain": 4}))
    verdict = verify(task, ref, cand, tmp_path / "work")
    assert verdict.verdict == "pass", verdict.problems


@pytest.mark.slow
def test_a_gpt_neox_models_attention_runs_a_verified_kernel_of_its_own(tmp_path: Path):
    from model_zoo import write_model_dir

    opts = OptimizeOptions(model=str(write_model_dir(tmp_path, "gpt-neox")), dtype="float32", batch=2, prompt_len=8,
                           decode_steps=6, run_dir=tmp_path / "run", families=["neox_attention"], max_tasks=1,
                           iterations=1, e2e_rounds=3, bench_rounds=9, compile=False, min_share=0.01, device="cpu")
    report = optimize(opts)
    ran = [k for k in report.kernels if k.outcome in (KernelOutcome.ACCEPTED, KernelOutcome.SLOWER_IN_MODEL)]
    assert ran and all(k.op == "neox_attention" and k.calls > 0 for k in ran), [k.reason for k in report.kernels]
    assert report.fidelity.passed, report.fidelity.summary()
