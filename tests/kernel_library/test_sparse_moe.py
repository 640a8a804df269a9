"""The sparse MoE family: Mixtral's block found by structure (a block with a shared expert is not taken for it), its
C++ kernel routes as the model does and matches the reference in fp32 and bf16, and passes `kernelbot verify`."""

from __future__ import annotations

import pytest
import torch
from helpers import write_module
from model_zoo import ZOO

from kernelbot.agent.optimize import OptimizeOptions, optimize
from kernelbot.agent.tasks.references import reference_source
from kernelbot.agent.verify.run import verify
from kernelbot.engine.capture import profile_callable
from kernelbot.kernel_library import FAMILIES, classes_covered
from kernelbot.kernel_library.sparse_moe.cpp import SparseMoeCpp
from kernelbot.kernel_library.sparse_moe.reference import Model
from kernelbot.profiler.hotspots import rank_hotspots
from kernelbot.profiler.trace import load_trace
from kernelbot.records import Device, KernelOutcome, Task

HIDDEN, INTER, EXPERTS, TOP_K = 48, 40, 6, 2


def _block(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(ZOO[name].config(), dtype=torch.float32).eval()
    return next(m for m in model.modules() if type(m).__name__.endswith("SparseMoeBlock")), model


def test_mixtrals_block_is_found_by_structure_and_a_block_with_a_shared_expert_is_not():
    mixtral, model = _block("mixtral")
    assert FAMILIES["sparse_moe"].covers(mixtral)
    assert classes_covered(model).get(type(mixtral).__name__) == "sparse_moe"
    qwen_moe, _ = _block("qwen2-moe")  # the same router and experts, plus a gated shared expert: not Mixtral's sum
    assert not FAMILIES["sparse_moe"].covers(qwen_moe)


@pytest.mark.parametrize("experts", ["grouped_mm", "eager"])
def test_the_profile_reads_a_moe_call_whichever_way_transformers_runs_its_experts(tmp_path, experts):
    block, _ = _block("mixtral")
    block.experts.config._experts_implementation = experts
    x = torch.randn(3, 2, block.gate.weight.shape[1])
    with torch.inference_mode():
        profile_callable(lambda: block(x), tmp_path / "moe.json.gz")
    device = Device(kind="cpu", name="test", threads=1, peak_gflops=100.0, peak_gbps=10.0, peaks_source="test")
    [hotspot] = [h for h in rank_hotspots(load_trace(tmp_path / "moe.json.gz"), device, classes_covered(block))
                 if h.family == "sparse_moe"]
    experts_, hidden = block.gate.weight.shape
    (x_dims, router, gate_up, (hit, pairs)) = hotspot.input_dims
    assert (x_dims, router, gate_up) == ([3, 2, hidden], [experts_, hidden], list(block.experts.gate_up_proj.shape[1:]))
    assert pairs == 3 * 2 * block.top_k and 1 <= hit <= experts_  # six tokens, two experts each


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_routes_as_the_reference_does_and_matches_it(dtype):
    torch.manual_seed(1)
    reference = Model(HIDDEN, INTER, EXPERTS, TOP_K, str(dtype).removeprefix("torch.")).eval()
    exact = Model(HIDDEN, INTER, EXPERTS, TOP_K, "float64").eval()
    exact.load_state_dict({k: v.double() for k, v in reference.state_dict().items()})
    kernel = SparseMoeCpp(HIDDEN, INTER, EXPERTS, TOP_K, str(dtype).removeprefix("torch.")).eval()
    kernel.load_state_dict(reference.state_dict())
    for config in FAMILIES["sparse_moe"].configs["cpp"]:
        kernel.CONFIG = config
        for lead in ([1, 1], [4, 1], [3, 7], [2, 33]):  # one token (most experts idle) to every expert hit
            x = torch.randn(*lead, HIDDEN).to(dtype)
            with torch.inference_mode():
                got, eager = kernel(x), reference(x)
                truth = exact(x.double())
            assert got.dtype == dtype and got.shape == x.shape
            if dtype == torch.float32:
                torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-5)
            else:  # routed as the model routes, then no further from float64 than torch's own bf16 path
                err = float((got.double() - truth).norm() / truth.norm())
                assert err <= 1.25 * float((eager.double() - truth).norm() / truth.norm()) + 1e-4, (lead, err)


def test_the_kernel_repacks_an_experts_weights_written_in_place():
    torch.manual_seed(2)
    kernel = SparseMoeCpp(HIDDEN, INTER, EXPERTS, TOP_K).eval()
    reference = Model(HIDDEN, INTER, EXPERTS, TOP_K).eval()
    x = torch.randn(5, 1, HIDDEN)
    with torch.inference_mode():
        kernel.load_state_dict(reference.state_dict())
        kernel(x)
        for model in (kernel, reference):
            model.experts.down_proj.mul_(-2.0)
        torch.testing.assert_close(kernel(x), reference(x), rtol=1e-4, atol=1e-5)


def test_kernelbot_verify_passes_the_moe_kernel(tmp_path):
    task = Task(id="moe", hotspot_id="h", family="sparse_moe", module_class="MixtralSparseMoeBlock",
                dtype="float32", input_shapes=[[4, 1, HIDDEN]], free_dims=[[0, 1]],
                init_args=[HIDDEN, INTER, EXPERTS, TOP_K, "float32"], share=0.3, floor_us=1.0)
    ref = write_module(tmp_path / "reference.py", reference_source(task))
    source = FAMILIES["sparse_moe"].candidate_source("cpp", {"grain": 4})
    cand = write_module(tmp_path / "cand" / "candidate.py", source)
    verdict = verify(task, ref, cand, tmp_path / "work")
    assert verdict.verdict == "pass", verdict.problems
    assert "moe" in next(c.detail for c in verdict.checks if c.id == "reference_fallback")


@pytest.mark.slow
def test_a_mixtral_models_moe_blocks_run_a_verified_kernel_of_their_own(tmp_path):
    from model_zoo import write_model_dir

    opts = OptimizeOptions(model=str(write_model_dir(tmp_path, "mixtral")), dtype="float32", batch=2, prompt_len=8,
                           decode_steps=6, run_dir=tmp_path / "run", families=["sparse_moe"], max_tasks=1,
                           iterations=1, e2e_rounds=3, bench_rounds=9, compile=False, min_share=0.01, device="cpu")
    report = optimize(opts)
    ran = [k for k in report.kernels if k.outcome in (KernelOutcome.ACCEPTED, KernelOutcome.SLOWER_IN_MODEL)]
    assert ran and all(k.op == "sparse_moe" and k.calls > 0 for k in ran), [k.reason for k in report.kernels]
    assert report.fidelity.passed, report.fidelity.summary()
