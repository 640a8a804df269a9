"""Tolerances against a float64 reference: on inputs scaled far out, a problem that rounding alone changes (an
attention whose scores are orders of magnitude apart, where a near tie goes either way) is judged by how far
rounding moves it; a well-conditioned one keeps its tolerance there."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernelbot.agent.verify.numerics import compare, jittered_outputs, reference_outputs


class _ProjectAndAttend(nn.Module):
    """q = x @ W in bf16, then attention over k and v with fp32 scores. `split_k`: q summed from two bf16 halves,
    another legitimate order of roundings (as a kernel with split-K accumulation)."""

    def __init__(self, split_k: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(32, 32, generator=torch.Generator().manual_seed(1)) / 6)
        self.split_k = split_k

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        w = self.weight.detach().to(x.dtype)
        q = x[..., :16] @ w[:16] + x[..., 16:] @ w[16:] if self.split_k else x @ w
        p = torch.softmax(q.float() @ k.float().transpose(-1, -2), -1)
        return (p @ v.float()).to(x.dtype)


def _large(seed: int, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=gen) * 1e3).bfloat16() for shape in shapes]


# draws (found by search, fixed here) where the reference in bf16 picks exactly the float64 answer and the split-K
# order of roundings flips one row's near tie
@pytest.mark.parametrize("seed", [8, 11])
def test_a_near_tie_that_rounding_alone_flips_is_judged_by_that_movement(seed):
    inputs = _large(seed, (64, 1, 32), (64, 32, 32), (64, 32, 32))
    exact_model = _ProjectAndAttend().double()
    native, exact = reference_outputs(_ProjectAndAttend().bfloat16(), exact_model, inputs)
    with torch.inference_mode():
        split = _ProjectAndAttend(split_k=True).bfloat16()(*inputs)
    assert compare(native[0], native[0], exact[0]) is None
    assert compare(split, native[0], exact[0]) is not None  # the flipped row, judged as if the problem were tame
    assert compare(split, native[0], exact[0], jittered_outputs(exact_model, inputs, native)[0]) is None


def test_a_well_conditioned_op_keeps_its_tolerance_on_scaled_inputs():
    inputs = [_large(0, (8, 16))[0].abs()]  # positive rows and weights: no cancellation to be sensitive to
    weight = torch.rand(24, 16, generator=torch.Generator().manual_seed(1))
    native = [(inputs[0] @ weight.bfloat16().T)]
    exact_model = nn.Linear(16, 24, bias=False).double()
    exact_model.weight.data = weight.double()
    _, exact = reference_outputs(lambda x: x @ weight.bfloat16().T, exact_model, inputs)
    jittered = jittered_outputs(exact_model, inputs, native)[0]
    assert len(jittered) > 0
    assert compare(exact[0], native[0], exact[0], jittered) is None
    assert compare((exact[0].double() * 1.01).bfloat16(), native[0], exact[0], jittered) is not None
