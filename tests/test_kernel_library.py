"""Every family, every backend, against its own reference at decode, prefill and odd sizes."""

import importlib

import pytest
import torch

from kernelbot.agent.verify.run import load_reference
from kernelbot.kernel_library import FAMILIES, family_for

INIT = {"rmsnorm": [96, 1e-6], "linear": [72, 40, True], "gated_mlp": [64, 88], "silu_and_mul": []}
FEATURES = {"rmsnorm": 96, "linear": 72, "gated_mlp": 64, "silu_and_mul": 2 * 45}  # the input's last dim
SHAPES = [[8, 1], [1, 1], [3, 7], [13, 1], [2, 33]]  # leading dims


def _wrapper(family, backend):
    module, cls = family.wrappers[backend].split(":")
    return getattr(importlib.import_module(f"kernelbot.kernel_library.{family.name}.{module}"), cls)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("name", sorted(n for n, f in FAMILIES.items() if f.inputs == 1))
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


@pytest.mark.parametrize(("name", "path"), [("rmsnorm", "native"), ("linear", "native"), ("linear", "fp32"),
                                           ("gated_mlp", "native"), ("gated_mlp", "fp32")])
def test_cpp_kernels_in_bf16_are_as_accurate_as_eager(name, path, monkeypatch):
    """bf16 weights and activations, through the avx512_bf16 kernels (native; where the CPU has them) and through
    the fp32 kernels other CPUs use: no further from float64 than torch's own bf16 path."""
    from kernelbot.kernel_library.linear import cpp as linear_cpp

    if name != "rmsnorm" and path == "native" and not linear_cpp.load_cpp(linear_cpp.SOURCE).has_avx512_bf16():
        pytest.skip("this CPU has no avx512_bf16")
    if path == "fp32":
        for module in (linear_cpp, importlib.import_module("kernelbot.kernel_library.gated_mlp.cpp")):
            monkeypatch.setattr(module, "bf16_path", lambda ext, x: False)
    family = FAMILIES[name]
    torch.manual_seed(0)
    reference = load_reference(family.reference_path).Model(*INIT[name], "bfloat16").eval()
    exact = load_reference(family.reference_path).Model(*INIT[name], "float64").eval()
    exact.load_state_dict({k: v.double() for k, v in reference.state_dict().items()})
    kernel = _wrapper(family, "cpp")(*INIT[name], "bfloat16").eval()
    kernel.load_state_dict(reference.state_dict())
    for lead in SHAPES:
        x = torch.randn(*lead, FEATURES[name]).bfloat16()
        with torch.inference_mode():
            got, eager, truth = kernel(x), reference(x), exact(x.double())
        assert got.dtype == torch.bfloat16 and got.shape == eager.shape
        err = float((got.double() - truth).norm() / truth.norm())
        assert err <= 1.25 * float((eager.double() - truth).norm() / truth.norm()) + 1e-4, (lead, err)


def test_repacks_when_weights_change():
    from kernelbot.kernel_library.linear.cpp import LinearCpp

    layer = LinearCpp(16, 24, False)
    torch.nn.init.normal_(layer.weight)
    x = torch.randn(2, 16)
    before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)  # in place: same storage, new version
    torch.testing.assert_close(layer(x), 2 * before)


def _rope_by_rotation(positions, x, head_size, rotary_dim, base, neox):
    """RoPE written independently of the reference: each pair of dims is a complex number turned by
    position * base^(-2i/rotary_dim), in float64."""
    x = x.double().reshape(len(positions), -1, head_size)
    angles = positions.double()[:, None] * base ** (-torch.arange(0, rotary_dim, 2).double() / rotary_dim)
    turn = torch.polar(torch.ones_like(angles), angles)[:, None, :]
    rot = x[..., :rotary_dim]
    a, b = (rot[..., : rotary_dim // 2], rot[..., rotary_dim // 2:]) if neox else (rot[..., ::2], rot[..., 1::2])
    z = torch.complex(a, b) * turn
    out = torch.cat((z.real, z.imag), -1) if neox else torch.stack((z.real, z.imag), -1).flatten(-2)
    return torch.cat((out, x[..., rotary_dim:]), -1).reshape(len(positions), -1)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize(("head_size", "rotary_dim"), [(64, 64), (48, 32)])  # full and partial rotary
def test_rotary_embedding_matches_a_rotation_in_float64(backend, neox, head_size, rotary_dim):
    family = FAMILIES["rotary_embedding"]
    init = [head_size, rotary_dim, 512, 10000.0, neox, "float32"]
    reference = load_reference(family.reference_path).Model(*init).eval()
    kernel = _wrapper(family, backend)(*init).eval()
    kernel.load_state_dict(reference.state_dict())
    torch.manual_seed(0)
    for tokens in (1, 7, 16):
        positions = torch.randint(0, 512, (tokens,))
        qkv = torch.randn(tokens, 7 * head_size)  # q and k as SGLang passes them: column slices of qkv
        query, key = qkv[:, : 4 * head_size], qkv[:, 4 * head_size: 6 * head_size]
        with torch.inference_mode():
            got, ref = kernel(positions, query, key), reference(positions, query, key)
        for g, r, x in zip(got, ref, (query, key), strict=True):
            exact = _rope_by_rotation(positions, x, head_size, rotary_dim, 10000.0, neox)
            torch.testing.assert_close(r.double(), exact, rtol=1e-4, atol=1e-4)  # the reference is RoPE
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize(("dtype", "cache_dtype"), [("bfloat16", "bfloat16"), ("bfloat16", "float32"),
                                                    ("float16", "float16")])
def test_rotary_embedding_in_half_precision_stays_within_the_references_rounding(backend, dtype, cache_dtype):
    family = FAMILIES["rotary_embedding"]
    init = [64, 64, 256, 10000.0, True, cache_dtype]
    reference = load_reference(family.reference_path).Model(*init).eval()
    kernel = _wrapper(family, backend)(*init).eval()
    kernel.load_state_dict(reference.state_dict())
    exact = load_reference(family.reference_path).Model(*init).double().eval()
    # SGLang's semantics in float64: the cache's cos/sin rounded to the activation dtype, nothing rounded after
    exact.load_state_dict({"cos_sin_cache": reference.cos_sin_cache.to(getattr(torch, dtype))})
    torch.manual_seed(1)
    positions = torch.randint(0, 256, (9,))
    query, key = (torch.randn(9, n * 64).to(getattr(torch, dtype)) for n in (4, 2))
    with torch.inference_mode():
        got, ref = kernel(positions, query, key), reference(positions, query, key)
        want = exact(positions, query.double(), key.double())
    for g, r, w in zip(got, ref, want, strict=True):
        assert g.dtype == query.dtype
        # C++: within an ulp of the exact result, and closer than torch's reference, which rounds more often.
        # Triton's interpreter truncates fp32 -> bf16 casts (measured: the cos cast and the result), so two ulps.
        ulp = torch.finfo(g.dtype).eps * w.abs().clamp_min(1) * (1 if backend == "cpp" else 2)
        assert bool(((g.double() - w).abs() <= ulp).all()), float((g.double() - w).abs().max())
        if backend == "cpp":
            assert float((g.double() - w).abs().max()) <= float((r.double() - w).abs().max())


def test_rotary_embedding_cpp_refuses_positions_past_its_cache():
    from kernelbot.kernel_library.rotary_embedding.cpp import RotaryEmbeddingCpp

    kernel = RotaryEmbeddingCpp(32, 32, 16, 10000.0, True, "float32")
    with pytest.raises(RuntimeError, match="position 16 out of range"):
        kernel(torch.tensor([3, 16]), torch.randn(2, 64), torch.randn(2, 32))


def test_family_lookup_by_module_class():
    assert family_for("LlamaRMSNorm").name == "rmsnorm"
    assert family_for("LlamaMLP").name == "gated_mlp"
    assert family_for("SiluAndMul").name == "silu_and_mul"  # SGLang's layer
    assert family_for("RotaryEmbedding").name == "rotary_embedding"
    assert family_for("LlamaAttention") is None
