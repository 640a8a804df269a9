"""The linear family (nn.Linear): its C++ and Triton kernels against the reference in every dtype each backend takes,
with and without a bias, at output widths of whole panels and with a tail; and the C++ kernel repacking its weights
when they change in place."""

import pytest
import torch
from helpers import TOLERANCE, family_pair

from kernelbot.kernel_library import FAMILIES

FAMILY = FAMILIES["linear"]
LEADS = [[1, 1], [5, 1], [3, 7]]  # decode, a few tokens, a batch of odd length


@pytest.mark.parametrize(("backend", "dtype"), [(b, d) for b, ds in sorted(FAMILY.dtypes.items()) for d in ds])
@pytest.mark.parametrize(("in_features", "out_features", "bias"), [(64, 48, True), (72, 37, False)])
def test_linear_kernels_match_the_reference_in_every_dtype_they_take(backend: str, dtype: str, in_features: int,
                                                                     out_features: int, bias: bool,
                                                                     request: pytest.FixtureRequest) -> None:
    if backend == "triton" and dtype != "float32":
        request.getfixturevalue("bf16_dot_in_the_interpreter")  # half-precision tl.dot, as the verifier runs it
    torch.manual_seed(0)
    reference, kernel = family_pair("linear", backend, in_features, out_features, bias, dtype)
    for config in FAMILY.configs[backend]:
        kernel.CONFIG = config
        for lead in LEADS:
            x = torch.randn(*lead, in_features).to(getattr(torch, dtype))
            with torch.inference_mode():
                got, want = kernel(x), reference(x)
            assert got.dtype == want.dtype and got.shape == (*lead, out_features)
            torch.testing.assert_close(got, want, **TOLERANCE[dtype])


def test_the_cpp_linear_repacks_its_weights_when_they_change_in_place() -> None:
    from kernelbot.kernel_library.linear.cpp import LinearCpp

    layer = LinearCpp(16, 24, False)
    torch.nn.init.normal_(layer.weight)
    x = torch.randn(2, 16)
    before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)  # in place: same storage, new version
    torch.testing.assert_close(layer(x), 2 * before)
