"""The MoE experts family (a served engine's FusedMoE experts, the router's choices given): its reference is the
expert half of the sparse MoE block, its C++ kernel matches it in fp32 and bf16 for any routing (idle experts, one
token, every expert hit), `kernelbot verify` passes it and fails a kernel that gives each token the wrong experts'
mix; a captured call's cost reads the experts' weights from the layer's arguments."""

from __future__ import annotations

import pytest
import torch
from helpers import write_module

from kernelbot.agent.tasks.references import reference_source
from kernelbot.agent.verify.run import verify
from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.moe_experts.cpp import MoeExpertsCpp
from kernelbot.kernel_library.moe_experts.reference import Model
from kernelbot.kernel_library.sparse_moe.reference import Model as SparseMoe
from kernelbot.profiler.row_split import profiled_dims
from kernelbot.records import LayerCapture, Task

HIDDEN, INTER, EXPERTS, TOP_K = 48, 40, 6, 2


def _routing(tokens: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(EXPERTS, generator=generator)[:TOP_K] for _ in range(tokens)]).to(torch.int32)
    weights = torch.rand(tokens, TOP_K, generator=generator)
    return weights / weights.sum(-1, keepdim=True), ids


def test_the_reference_is_the_sparse_moe_blocks_experts_given_its_routers_choices():
    torch.manual_seed(0)
    block = SparseMoe(HIDDEN, INTER, EXPERTS, TOP_K).eval()
    experts = Model(HIDDEN, INTER, EXPERTS, TOP_K).eval()
    experts.load_state_dict({"w13_weight": block.experts.gate_up_proj, "w2_weight": block.experts.down_proj})
    x = torch.randn(9, HIDDEN)
    with torch.no_grad():
        weights, ids = block.route(x)
        torch.testing.assert_close(experts(x, weights, ids.to(torch.int32)), block(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_matches_the_reference_for_any_routing(dtype):
    torch.manual_seed(1)
    gen = torch.Generator().manual_seed(1)
    name = str(dtype).removeprefix("torch.")
    reference = Model(HIDDEN, INTER, EXPERTS, TOP_K, name).eval()
    exact = Model(HIDDEN, INTER, EXPERTS, TOP_K, "float64").eval()
    exact.load_state_dict({k: v.double() for k, v in reference.state_dict().items()})
    kernel = MoeExpertsCpp(HIDDEN, INTER, EXPERTS, TOP_K, name).eval()
    kernel.load_state_dict(reference.state_dict())
    for config in FAMILIES["moe_experts"].configs["cpp"]:
        kernel.CONFIG = config
        for tokens in (1, 3, 8, 41):  # one token (most experts idle) to every expert hit many times
            x = torch.randn(tokens, HIDDEN).to(dtype)
            weights, ids = _routing(tokens, gen)
            with torch.inference_mode():
                got, eager, truth = kernel(x, weights, ids), reference(x, weights, ids), exact(x.double(), weights, ids)
            assert got.dtype == dtype and got.shape == x.shape
            if dtype == torch.float32:
                torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-5)
            else:
                err = float((got.double() - truth).norm() / truth.norm())
                assert err <= 1.25 * float((eager.double() - truth).norm() / truth.norm()) + 1e-4, (tokens, err)


def _task() -> Task:
    return Task(id="moe", hotspot_id="h", family="moe_experts", module_class="RoutedExperts", dtype="float32",
                input_shapes=[[8, HIDDEN], [8, TOP_K], [8, TOP_K]], free_dims=[[0], [0], [0]],
                init_args=[HIDDEN, INTER, EXPERTS, TOP_K, "float32"], share=0.3, floor_us=1.0)


def test_kernelbot_verify_passes_the_experts_kernel(tmp_path):
    task = _task()
    ref = write_module(tmp_path / "reference.py", reference_source(task))
    source = FAMILIES["moe_experts"].candidate_source("cpp", {"grain": 4})
    cand = write_module(tmp_path / "cand" / "candidate.py", source)
    verdict = verify(task, ref, cand, tmp_path / "work")
    assert verdict.verdict == "pass", verdict.problems


WRONG_SLOT = '''
import torch
from kernelbot.kernel_library.moe_experts.cpp import MoeExpertsCpp


class ModelNew(MoeExpertsCpp):
    """Right experts, each token's weights swapped between its two slots: right whenever the weights are equal."""

    def forward(self, x, topk_weights, topk_ids):
        return super().forward(x, topk_weights.flip(-1), topk_ids)
'''


@pytest.mark.slow  # the verifier's correctness check at work on a wrong kernel; the fast tier has the kernel's pass
def test_kernelbot_verify_fails_a_kernel_that_mixes_a_tokens_experts_with_each_others_weights(tmp_path):
    task = _task()
    ref = write_module(tmp_path / "reference.py", reference_source(task))
    cand = write_module(tmp_path / "cand" / "candidate.py", WRONG_SLOT)
    verdict = verify(task, ref, cand, tmp_path / "work")
    assert verdict.verdict == "fail" and "correctness" in verdict.failed, \
        verdict.problems


def test_a_captured_calls_cost_counts_the_experts_weights_from_the_layers_arguments():
    capture = LayerCapture(engine_class="RoutedExperts", module_class="MoERunner", family="moe_experts",
                           init_args=[512, 1376, 4, 2, "bfloat16"], dtype="bfloat16",
                           input_shapes=[[8, 512], [8, 2], [8, 2]], calls=1)
    dims = profiled_dims(capture)
    assert dims == [[8, 512], [8, 2], [8, 2], [4, 2 * 1376, 512]]
    flops, nbytes = FAMILIES["moe_experts"].cost(dims, 2)
    assert flops == 2 * (8 * 2) * 3 * 512 * 1376  # 16 token-expert pairs, three 512×1376 projections each
    assert nbytes >= 4 * 3 * 512 * 1376 * 2  # every expert hit at 8 tokens × top 2 of 4: all their weights
    one = FAMILIES["moe_experts"].cost([[1, 512], [1, 2], [1, 2], [4, 2 * 1376, 512]], 2)[1]
    assert one < nbytes / 1.9  # one token reads two experts' weights, not four
