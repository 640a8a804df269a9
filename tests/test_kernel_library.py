"""Every family, every backend, against its own reference at decode, prefill and odd sizes."""

import importlib

import pytest
import torch

from kernelbot.agent.verify import load_reference
from kernelbot.kernel_library import FAMILIES, family_for

INIT = {"rmsnorm": [96, 1e-6], "linear": [72, 40, True], "gated_mlp": [64, 88], "silu_and_mul": []}
FEATURES = {"rmsnorm": 96, "linear": 72, "gated_mlp": 64, "silu_and_mul": 2 * 45}  # the input's last dim
SHAPES = [[8, 1], [1, 1], [3, 7], [13, 1], [2, 33]]  # leading dims


def _wrapper(family, backend):
    module, cls = family.wrappers[backend].split(":")
    return getattr(importlib.import_module(f"kernelbot.kernel_library.{family.name}.{module}"), cls)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_reference(name, backend):
    family = FAMILIES[name]
    torch.manual_seed(0)
    reference = load_reference(family.reference_path).Model(*INIT[name]).eval()
    kernel = _wrapper(family, backend)(*INIT[name]).eval()
    kernel.load_state_dict(reference.state_dict())
    features = FEATURES[name]
    for config in family.configs[backend]:
        kernel.CONFIG = config
        for lead in SHAPES:
            x = torch.randn(*lead, features)
            with torch.inference_mode():
                torch.testing.assert_close(kernel(x), reference(x), rtol=1e-4, atol=1e-5)


def test_repacks_when_weights_change():
    from kernelbot.kernel_library.linear.cpu import LinearCpp

    layer = LinearCpp(16, 24, False)
    torch.nn.init.normal_(layer.weight)
    x = torch.randn(2, 16)
    before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)  # in place: same storage, new version
    torch.testing.assert_close(layer(x), 2 * before)


def test_family_lookup_by_module_class():
    assert family_for("LlamaRMSNorm").name == "rmsnorm"
    assert family_for("LlamaMLP").name == "gated_mlp"
    assert family_for("SiluAndMul").name == "silu_and_mul"  # SGLang's layer
    assert family_for("LlamaAttention") is None
