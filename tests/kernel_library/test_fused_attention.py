"""The fused-QKV attention family (GPT-2's shape: one Conv1D for q, k and v, biases, no rotary): found by structure in
a GPT-2 model and not in a Llama one, its C++ kernel matches the reference in fp32 and bf16, appends into a
DynamicCache as GPT-2's own attention does, its call is read from the ops GPT-2's attention runs, `kernelbot verify`
passes it, and an optimize run of a GPT-2 model routes its attention calls to it."""

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
from kernelbot.kernel_library.base import OpCall
from kernelbot.kernel_library.decode_attention.cache import step_dynamic_layer
from kernelbot.kernel_library.fused_attention.cpp import FusedAttentionCpp
from kernelbot.kernel_library.fused_attention.reference import Model
from kernelbot.records import KernelOutcome, Task

FAMILY = FAMILIES["fused_attention"]
HIDDEN, HEADS, D = 64, 4, 16


def _model(name: str, attention: str = "sdpa") -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(ZOO[name].config(), dtype=torch.float32,
                                            attn_implementation=attention).eval()


def _attention(model: torch.nn.Module) -> torch.nn.Module:
    return next(m for m in model.modules() if type(m).__name__ == "GPT2Attention")


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_gpt2s_attention_is_found_by_structure_and_llamas_is_not(attention):
    gpt2 = _model("gpt2", attention)
    module = _attention(gpt2)
    assert classes_covered(gpt2).get("GPT2Attention") == "fused_attention"
    assert FAMILY.init_args(module) == [module.c_attn.weight.shape[0], module.num_heads, module.head_dim,
                                        module.head_dim**-0.5, "float32"]
    assert "fused_attention" not in classes_covered(_model("llama")).values()


def test_a_gpt2_scaled_by_the_inverse_layer_index_is_covered_with_each_layers_scale():
    from transformers import AutoModelForCausalLM

    config = ZOO["gpt2"].config()
    config.scale_attn_by_inverse_layer_idx = True
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    layers = [m for m in model.modules() if type(m).__name__ == "GPT2Attention"]
    assert all(FAMILY.covers(m) for m in layers)
    assert FAMILY.init_args(layers[1])[3] == pytest.approx(layers[1].head_dim**-0.5 / 2)


@pytest.mark.parametrize(("batch", "tokens", "past"), [(2, 1, 7), (3, 5, 0), (1, 13, 4), (4, 1, 0)])
def test_the_kernel_matches_the_reference_in_fp32(batch, tokens, past):
    torch.manual_seed(1)
    reference = Model(HIDDEN, HEADS, D, D**-0.5).eval()
    kernel = FusedAttentionCpp(HIDDEN, HEADS, D, D**-0.5).eval()
    kernel.load_state_dict(reference.state_dict())
    x, k, v = torch.randn(batch, tokens, HIDDEN), torch.randn(batch, HEADS, past, D), torch.randn(batch, HEADS, past, D)
    for config in FAMILY.configs["cpp"]:
        kernel.CONFIG = config
        with torch.inference_mode():
            for got, want in zip(kernel(x, k, v), reference(x, k, v), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_kernel_in_bf16_is_as_accurate_as_eager():
    torch.manual_seed(2)
    reference = Model(HIDDEN, HEADS, D, D**-0.5, "bfloat16").eval()
    exact = Model(HIDDEN, HEADS, D, D**-0.5, "float64").eval()
    exact.load_state_dict({k: v.double() for k, v in reference.state_dict().items()})
    kernel = FusedAttentionCpp(HIDDEN, HEADS, D, D**-0.5, "bfloat16").eval()
    kernel.load_state_dict(reference.state_dict())
    for tokens, past in ((1, 9), (6, 0)):
        x = torch.randn(2, tokens, HIDDEN).bfloat16()
        k, v = torch.randn(2, HEADS, past, D).bfloat16(), torch.randn(2, HEADS, past, D).bfloat16()
        with torch.inference_mode():
            got, eager = kernel(x, k, v)[0], reference(x, k, v)[0]
            truth = exact(x.double(), k.double(), v.double())[0]
        assert got.dtype == torch.bfloat16
        err = float((got.double() - truth).norm() / truth.norm())
        assert err <= 1.25 * float((eager.double() - truth).norm() / truth.norm()) + 1e-4, (tokens, err)


def test_step_dynamic_layer_is_a_drop_in_for_gpt2s_attention_with_a_dynamic_cache():
    from transformers import DynamicCache

    gpt2 = _model("gpt2")
    module = _attention(gpt2)
    kernel = FusedAttentionCpp(*FAMILY.init_args(module)).eval()
    kernel.load_state_dict(module.state_dict())
    theirs, ours = DynamicCache(config=gpt2.config), DynamicCache(config=gpt2.config)
    for tokens in (5, 1, 1, 1):
        x = torch.randn(2, tokens, module.c_attn.weight.shape[0])
        with torch.inference_mode():
            want, _ = module(x, cache=theirs)
            got = step_dynamic_layer(kernel, ours.layers[module.layer_idx], x, None, None, room=2)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert ours.get_seq_length(module.layer_idx) == theirs.get_seq_length(module.layer_idx)
        torch.testing.assert_close(ours.layers[module.layer_idx].values, theirs.layers[module.layer_idx].values)


@pytest.mark.parametrize(("attention", "tokens", "past"), [("sdpa", 1, 7), ("sdpa", 6, 0), ("eager", 1, 3)])
def test_the_call_is_read_from_the_ops_gpt2s_attention_runs(attention, tokens, past, tmp_path: Path):
    from transformers import DynamicCache

    gpt2 = _model("gpt2", attention)
    module = _attention(gpt2)
    hidden = module.c_attn.weight.shape[0]
    cache = DynamicCache(config=gpt2.config)
    with torch.inference_mode():
        if past:
            module(torch.randn(2, past, hidden), cache=cache)
        mask = None if attention == "sdpa" else torch.zeros(1, 1, tokens, past + tokens)
        x = torch.randn(2, tokens, hidden)
        with torch.profiler.profile(record_shapes=True) as prof:
            module(x, cache=cache, attention_mask=mask)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = sorted((e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
                     if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    ops = [OpCall(e["name"], e["args"]["Input Dims"], e["args"]["Input type"]) for e in events]
    dims, types = FAMILY.call_dims(ops)
    past_dims = [2, module.num_heads, past, module.head_dim]
    assert dims == [[2, tokens, hidden], past_dims, past_dims, [hidden, 3 * hidden]] and types == ["float"] * 4
    assert FAMILY.matches(module, dims)
    longer = [2, module.num_heads, past + 50, module.head_dim]
    assert 0 < FAMILY.cost(dims, 4)[0] < FAMILY.cost([dims[0], longer, longer, dims[3]], 4)[0]


def test_kernelbot_verify_passes_the_kernel(tmp_path: Path):
    # a decode step at a small model's width (hidden 256, 4 heads of 64): at toy widths the wrapper's few tensor ops
    # rival the kernel's own work and the verifier's fallback check rightly weighs them
    task = Task(id="attn", hotspot_id="h", family="fused_attention", module_class="GPT2Attention", dtype="float32",
                input_shapes=[[4, 1, 256], [4, 4, 16, 64], [4, 4, 16, 64]], free_dims=[[0, 1], [0, 2], [0, 2]],
                init_args=[256, 4, 64, 64**-0.5, "float32"], share=0.3, floor_us=1.0)
    ref = write_module(tmp_path / "reference.py", reference_source(task))
    cand = write_module(tmp_path / "cand" / "candidate.py", FAMILY.candidate_source("cpp", {"grain": 4}))
    verdict = verify(task, ref, cand, tmp_path / "work")
    assert verdict.verdict == "pass", verdict.problems


@pytest.mark.slow
def test_a_gpt2_models_attention_runs_a_verified_kernel_of_its_own(tmp_path: Path):
    from model_zoo import write_model_dir

    opts = OptimizeOptions(model=str(write_model_dir(tmp_path, "gpt2")), dtype="float32", batch=2, prompt_len=8,
                           decode_steps=6, run_dir=tmp_path / "run", families=["fused_attention"], max_tasks=1,
                           iterations=1, e2e_rounds=3, bench_rounds=9, compile=False, min_share=0.01, device="cpu")
    report = optimize(opts)
    ran = [k for k in report.kernels if k.outcome in (KernelOutcome.ACCEPTED, KernelOutcome.SLOWER_IN_MODEL)]
    assert ran and all(k.op == "fused_attention" and k.calls > 0 for k in ran), [k.reason for k in report.kernels]
    assert report.fidelity.passed, report.fidelity.summary()
