"""What holds for every family: each backend against its own reference at decode, prefill and odd sizes, bf16 as
accurate as eager, lookup by class name, and the registry (each family folder registers itself, once, and has its
test file tests/kernel_library/test_<family>.py, where what is particular to one family is tested)."""

import dataclasses
import importlib
import pkgutil
from pathlib import Path

import pytest
import torch
from helpers import family_pair, family_wrapper

from kernelbot.agent.verify.run import load_reference
from kernelbot.kernel_library import FAMILIES, family_for
from kernelbot.kernel_library.registry import DuplicateFamilyError, register

INIT = {"rmsnorm": [96, 1e-6], "linear": [72, 40, True], "gated_mlp": [64, 88], "silu_and_mul": [],
        "sparse_moe": [64, 40, 6, 2]}
FEATURES = {"rmsnorm": 96, "linear": 72, "gated_mlp": 64, "silu_and_mul": 2 * 45, "sparse_moe": 64}  # last dim
SHAPES = [[8, 1], [1, 1], [3, 7], [13, 1], [2, 33]]  # leading dims


@pytest.mark.parametrize(("name", "backend"), sorted((n, b) for n, f in FAMILIES.items() if f.inputs == 1
                                                     for b in f.wrappers))
def test_family_matches_reference(name, backend):
    family = FAMILIES[name]
    torch.manual_seed(0)
    reference, kernel = family_pair(name, backend, *INIT[name])
    features = FEATURES[name]
    for config in family.configs[backend]:
        kernel.CONFIG = config
        for lead in SHAPES:
            x = torch.randn(*lead, features)
            with torch.inference_mode():
                torch.testing.assert_close(kernel(x), reference(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("name", "path"), [("rmsnorm", "native"), ("linear", "native"), ("linear", "fp32"),
                                           ("gated_mlp", "native"), ("gated_mlp", "fp32")])
def test_cpp_kernels_in_bf16_are_as_accurate_as_eager(name, path, monkeypatch):
    """bf16 weights and activations, through the avx512_bf16 kernels (native; where the CPU has them) and through
    the fp32 kernels other CPUs use: no further from float64 than torch's own bf16 path."""
    from kernelbot.kernel_library.cpp_build import load_cpp
    from kernelbot.kernel_library.linear import cpp as linear_cpp

    if name != "rmsnorm" and path == "native" and not load_cpp(linear_cpp.SOURCE).has_avx512_bf16():
        pytest.skip("this CPU has no avx512_bf16")
    if path == "fp32":
        for module in (linear_cpp, importlib.import_module("kernelbot.kernel_library.gated_mlp.cpp")):
            monkeypatch.setattr(module, "bf16_path", lambda ext, x: False)
    family = FAMILIES[name]
    torch.manual_seed(0)
    reference = load_reference(family.reference_path).Model(*INIT[name], "bfloat16").eval()
    exact = load_reference(family.reference_path).Model(*INIT[name], "float64").eval()
    exact.load_state_dict({k: v.double() for k, v in reference.state_dict().items()})
    kernel = family_wrapper(name, "cpp")(*INIT[name], "bfloat16").eval()
    kernel.load_state_dict(reference.state_dict())
    for lead in SHAPES:
        x = torch.randn(*lead, FEATURES[name]).bfloat16()
        with torch.inference_mode():
            got, eager, truth = kernel(x), reference(x), exact(x.double())
        assert got.dtype == torch.bfloat16 and got.shape == eager.shape
        err = float((got.double() - truth).norm() / truth.norm())
        assert err <= 1.25 * float((eager.double() - truth).norm() / truth.norm()) + 1e-4, (lead, err)


def test_family_lookup_by_module_class():
    assert family_for("LlamaRMSNorm").name == "rmsnorm"
    assert family_for("LlamaMLP").name == "gated_mlp"
    assert family_for("SiluAndMul").name == "silu_and_mul"  # SGLang's layer
    assert family_for("RotaryEmbedding").name == "rotary_embedding"
    assert family_for("LlamaAttention") is None


LIBRARY = Path(importlib.import_module("kernelbot.kernel_library").__file__).parent
FAMILY_TESTS = Path(__file__).parent / "kernel_library"


def _family_folders() -> list[str]:
    """The subpackages of kernel_library/ (every one a family)."""
    return sorted(info.name for info in pkgutil.iter_modules([str(LIBRARY)]) if info.ispkg)


def test_every_family_folder_registers_one_family_under_its_own_name():
    assert list(FAMILIES) == _family_folders()
    for name, family in FAMILIES.items():
        assert family.name == name and family.reference_path == LIBRARY / name / "reference.py"
        assert family is importlib.import_module(f"kernelbot.kernel_library.{name}").FAMILY


def test_every_family_folder_has_a_test_file_of_its_own_named_after_it():
    assert [name for name in _family_folders() if not (FAMILY_TESTS / f"test_{name}.py").is_file()] == []
    assert sorted(p.stem.removeprefix("test_") for p in FAMILY_TESTS.glob("test_*.py")) == _family_folders()


def test_registering_a_second_family_under_a_taken_name_is_refused_in_one_line():
    before = dict(FAMILIES)
    impostor = dataclasses.replace(FAMILIES["rmsnorm"], module_classes=("MyNorm",))
    with pytest.raises(DuplicateFamilyError, match="'rmsnorm' is registered twice") as refused:
        register(impostor)
    assert "\n" not in str(refused.value)
    assert FAMILIES == before and FAMILIES["rmsnorm"] is not impostor


def test_a_registered_family_is_found_by_lookup_and_the_registry_stays_in_name_order():
    extra = dataclasses.replace(FAMILIES["silu_and_mul"], name="aaa_extra", module_classes=("ExtraAct",))
    try:
        assert register(extra) is extra
        assert list(FAMILIES) == sorted(FAMILIES) and family_for("ExtraAct") is extra
    finally:
        del FAMILIES["aaa_extra"]
    assert family_for("ExtraAct") is None


def test_no_two_families_claim_a_class_name_so_lookup_does_not_depend_on_their_order():
    names = [c for f in FAMILIES.values() for c in f.module_classes]
    assert len(names) == len(set(names))
