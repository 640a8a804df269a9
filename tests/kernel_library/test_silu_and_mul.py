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
