"""The SiLU-and-multiply family (SGLang's and vLLM's SiluAndMul): its C++ and Triton kernels against the reference in
every dtype each backend takes, at a half width of whole vectors and one with a tail."""

import pytest
import torch
from helpers import TOLERANCE, family_pair

from kernelbot.kernel_library import FAMILIES

FAMILY = FAMILIES["silu_and_mul"]
LEADS = [[1, 1], [5, 1], [3, 7]]  # decode, a few tokens, a batch of odd length


@pytest.mark.parametrize(("backend", "dtype"), [(b, d) for b, ds in sorted(FAMILY.dtypes.items()) for d in ds])
@pytest.mark.parametrize("half", [64, 45])
def test_silu_and_mul_kernels_match_the_reference_in_every_dtype_they_take(backend: str, dtype: str,
                                                                          half: int) -> None:
    torch.manual_seed(0)
    reference, kernel = family_pair("silu_and_mul", backend)
    for config in FAMILY.configs[backend]:
        kernel.CONFIG = config
        for lead in LEADS:
            x = 4 * torch.randn(*lead, 2 * half).to(getattr(torch, dtype))
            with torch.inference_mode():
                got, want = kernel(x), reference(x)
            assert got.dtype == want.dtype and got.shape == (*lead, half)
            torch.testing.assert_close(got, want, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_cpp_kernel_gives_the_reference_at_saturated_gates_infinities_and_nan(dtype: str) -> None:
    """Gates past exp's range either way, ±inf, NaN, subnormals and signed zeros, in every lane position of a
    vector and its tail (the bf16 vector path clamps and masks them lane by lane)."""
    torch.manual_seed(0)
    reference, kernel = family_pair("silu_and_mul", "cpp")
    edges = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 1e-3, 88.0, 89.0, -88.0, -89.0, 100.0, -100.0, float("inf"),
                          -float("inf"), float("nan"), 3e38, -3e38, 1.0])
    x = torch.randn(3, 2 * 37)
    x[:, :17], x[1, 20:37], x[2, 37:54] = edges, edges, edges.flip(0)
    x = x.to(getattr(torch, dtype))
    with torch.inference_mode():
        got, want = kernel(x), reference(x)
    torch.testing.assert_close(got, want, equal_nan=True, **TOLERANCE[dtype])
