"""The rotary embedding family (SGLang's and vLLM's RotaryEmbedding layer): the reference is RoPE (each pair of dims
turned in float64), the C++ and Triton kernels match it, in fp32 and half precision, NeoX and GPT-J layouts, full
and partial rotary, and the C++ kernel refuses positions past its cos/sin cache."""

import pytest
import torch
from helpers import family_wrapper

from kernelbot.agent.verify.run import load_reference
from kernelbot.kernel_library import FAMILIES


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
    kernel = family_wrapper("rotary_embedding", backend)(*init).eval()
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
    kernel = family_wrapper("rotary_embedding", backend)(*init).eval()
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
