"""The gated MLP found by structure and by what its activation computes: Gemma-2's GELU(tanh) MLP and a SiLU MLP of
an unknown class are covered, an exact-GELU or biased one is not; the GELU(tanh) kernels (C++ fp32 and bf16, Triton)
match the reference, and the C++ kernel in bf16 is as accurate as eager."""

from __future__ import annotations

import pytest
import torch
from model_zoo import ZOO

from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.gated_mlp.cpp import GatedMLPCpp
from kernelbot.kernel_library.gated_mlp.reference import Model
from kernelbot.kernel_library.gated_mlp.triton_kernel import GatedMLPTriton
from kernelbot.kernel_library.linear import cpp as linear_cpp

FAMILY = FAMILIES["gated_mlp"]
SHAPES = [[8, 1], [1, 1], [3, 7], [2, 33]]


class _MLP(torch.nn.Module):
    """An MLP of a class no family names: gate, up, down and an activation module."""

    def __init__(self, act: torch.nn.Module, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = torch.nn.Linear(32, 48, bias=bias), torch.nn.Linear(32, 48, bias=bias)
        self.down_proj, self.act_fn = torch.nn.Linear(48, 32, bias=bias), act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def test_gemma2s_mlp_and_an_unknown_silu_mlp_are_covered_and_exact_gelu_or_biases_are_not():
    from transformers import AutoModelForCausalLM

    gemma = AutoModelForCausalLM.from_config(ZOO["gemma2"].config(), dtype=torch.float32)
    mlp = next(m for m in gemma.modules() if type(m).__name__ == "Gemma2MLP")
    assert FAMILY.covers(mlp) and FAMILY.init_args(mlp) == [64, 128, "float32", "gelu_tanh"]
    assert FAMILY.covers(_MLP(torch.nn.SiLU())) and FAMILY.init_args(_MLP(torch.nn.SiLU())) == [32, 48, "float32"]
    assert not FAMILY.covers(_MLP(torch.nn.GELU()))  # erf GELU: not a form the kernels compute
    assert not FAMILY.covers(_MLP(torch.nn.SiLU(), bias=True))


@pytest.mark.parametrize("wrapper", [GatedMLPCpp, GatedMLPTriton])
def test_the_gelu_tanh_kernels_match_the_reference(wrapper):
    torch.manual_seed(0)
    reference, kernel = Model(64, 88, "float32", "gelu_tanh").eval(), wrapper(64, 88, "float32", "gelu_tanh").eval()
    kernel.load_state_dict(reference.state_dict())
    for config in FAMILY.configs["cpp" if wrapper is GatedMLPCpp else "triton"]:
        kernel.CONFIG = config
        for lead in SHAPES:
            x = 3 * torch.randn(*lead, 64)  # gates well into GELU's curved range
            with torch.inference_mode():
                torch.testing.assert_close(kernel(x), reference(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("path", ["native", "fp32"])
def test_the_gelu_tanh_kernel_in_bf16_is_as_accurate_as_eager(path, monkeypatch):
    if path == "native" and not load_cpp(linear_cpp.SOURCE).has_avx512_bf16():
        pytest.skip("this CPU has no avx512_bf16")
    if path == "fp32":
        monkeypatch.setattr("kernelbot.kernel_library.gated_mlp.cpp.bf16_path", lambda ext, x: False)
    torch.manual_seed(0)
    reference = Model(64, 88, "bfloat16", "gelu_tanh").eval()
    exact = Model(64, 88, "float64", "gelu_tanh").eval()
    exact.load_state_dict({k: v.double() for k, v in reference.state_dict().items()})
    kernel = GatedMLPCpp(64, 88, "bfloat16", "gelu_tanh").eval()
    kernel.load_state_dict(reference.state_dict())
    for lead in SHAPES:
        x = (3 * torch.randn(*lead, 64)).bfloat16()
        with torch.inference_mode():
            got, eager, truth = kernel(x), reference(x), exact(x.double())
        err = float((got.double() - truth).norm() / truth.norm())
        assert err <= 1.25 * float((eager.double() - truth).norm() / truth.norm()) + 1e-4, (lead, err)


def test_an_unknown_activation_is_refused_by_the_reference():
    with pytest.raises(ValueError, match="activation 'relu'"):
        Model(8, 16, "float32", "relu")
