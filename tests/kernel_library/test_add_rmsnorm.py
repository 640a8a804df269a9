"""The fused residual add + RMSNorm family (vLLM's and SGLang's RMSNorm called with a residual): both outputs of the
C++ and Triton kernels against the reference, in fp32 and bf16, at decode, prefill and odd sizes."""

import pytest
import torch
from helpers import family_wrapper

from kernelbot.agent.verify.run import load_reference
from kernelbot.kernel_library import FAMILIES

SHAPES = [[8, 1], [1, 1], [3, 7], [13, 1], [2, 33]]  # leading dims


@pytest.mark.parametrize("weight_in_fp32", [False, True])
@pytest.mark.parametrize(("backend", "dtype"), [("cpp", torch.float32), ("cpp", torch.bfloat16), ("cpp", torch.float16),
                                              ("triton", torch.float32)])  # the interpreter's bf16 casts truncate
def test_fused_add_rmsnorm_normalises_the_unrounded_sum_and_returns_the_rounded_residual(backend, dtype,
                                                                                       weight_in_fp32):
    """Both outputs of the serving engines' fused add + RMSNorm, at decode, prefill and odd sizes. In bf16 the
    normalised value comes from the fp32 sum, not from the rounded residual: a kernel normalising the rounded residual
    differs from the reference well beyond bf16's rounding on rows whose sum rounds far."""
    family = FAMILIES["add_rmsnorm"]
    torch.manual_seed(0)
    args = (96, 1e-6, str(dtype).removeprefix("torch."), weight_in_fp32)
    reference = load_reference(family.reference_path).Model(*args).eval()
    with torch.no_grad():
        reference.weight.normal_()
    kernel = family_wrapper("add_rmsnorm", backend)(*args).eval()
    kernel.load_state_dict(reference.state_dict())
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
    for lead in SHAPES:
        x, residual = torch.randn(*lead, 96, dtype=dtype), torch.randn(*lead, 96, dtype=dtype) * 100
        with torch.inference_mode():
            (out, new_residual), (want, want_residual) = kernel(x, residual), reference(x, residual)
        torch.testing.assert_close(new_residual, want_residual, rtol=0, atol=0)
        torch.testing.assert_close(out, want, **tol)
        if dtype == torch.bfloat16:  # the two weight orders round apart: the kernel follows the one it was given
            other = load_reference(family.reference_path).Model(*args[:3], not weight_in_fp32).eval()
            other.load_state_dict(reference.state_dict())
            with torch.inference_mode():
                elsewise = other(x, residual)[0]
            assert (out.double() - want.double()).abs().sum() < (out.double() - elsewise.double()).abs().sum()
