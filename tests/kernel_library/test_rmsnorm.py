"""The RMSNorm family: its C++ and Triton kernels against the reference in every dtype each backend takes, at a
hidden size of whole vectors and one with a tail; and its structural test, which accepts Llama's RMSNorm under any
class name and refuses Gemma's (1 + weight)."""

import pytest
import torch
from helpers import TOLERANCE, family_pair

from kernelbot.kernel_library import FAMILIES

FAMILY = FAMILIES["rmsnorm"]
LEADS = [[1, 1], [5, 1], [3, 7]]  # decode, a few tokens, a batch of odd length


@pytest.mark.parametrize(("backend", "dtype"), [(b, d) for b, ds in sorted(FAMILY.dtypes.items()) for d in ds])
@pytest.mark.parametrize("hidden", [128, 77])
def test_rmsnorm_kernels_match_the_reference_in_every_dtype_they_take(backend: str, dtype: str, hidden: int) -> None:
    torch.manual_seed(0)
    reference, kernel = family_pair("rmsnorm", backend, hidden, 1e-6, dtype)
    with torch.no_grad():
        reference.weight.normal_()
    kernel.load_state_dict(reference.state_dict())
    for config in FAMILY.configs[backend]:
        kernel.CONFIG = config
        for lead in LEADS:
            x = 3 * torch.randn(*lead, hidden).to(getattr(torch, dtype))
            with torch.inference_mode():
                got, want = kernel(x), reference(x)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want, **TOLERANCE[dtype])


def test_rmsnorm_covers_llamas_norm_under_any_class_name_but_not_gemmas() -> None:
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    renamed, gemma = type("MyNorm", (LlamaRMSNorm,), {})(64), GemmaRMSNorm(64)
    with torch.no_grad():
        renamed.weight.normal_()
        gemma.weight.normal_()
    assert FAMILY.covers(renamed)
    assert not FAMILY.covers(gemma)
