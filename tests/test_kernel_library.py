"""Every family, every backend, against its own reference at decode, prefill and odd sizes."""

import importlib

import pytest
import torch

from kernelbot.agent.verify.run import load_reference
from kernelbot.kernel_library import FAMILIES, family_for

INIT = {"rmsnorm": [96, 1e-6], "linear": [72, 40, True], "gated_mlp": [64, 88], "silu_and_mul": [],
        "sparse_moe": [64, 40, 6, 2]}
FEATURES = {"rmsnorm": 96, "linear": 72, "gated_mlp": 64, "silu_and_mul": 2 * 45, "sparse_moe": 64}  # last dim
SHAPES = [[8, 1], [1, 1], [3, 7], [13, 1], [2, 33]]  # leading dims


def _wrapper(family, backend):
    module, cls = family.wrappers[backend].split(":")
    return getattr(importlib.import_module(f"kernelbot.kernel_library.{family.name}.{module}"), cls)


@pytest.mark.parametrize(("name", "backend"), sorted((n, b) for n, f in FAMILIES.items() if f.inputs == 1
                                                     for b in f.wrappers))
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


@pytest.mark.parametrize("weight_in_fp32", [False, True])
@pytest.mark.parametrize(("backend", "dtype"), [("cpp", torch.float32), ("cpp", torch.bfloat16),
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
    kernel = _wrapper(family, backend)(*args).eval()
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


def _paged_batch(lens: list[int], new: list[int], heads: int, kv_heads: int, d: int, bs: int, dtype: torch.dtype):
    """Dense keys and values per request, written into a shuffled paged cache in vLLM's CPU layout by hand (keys
    transposed per block, then values): (dense, inputs of the paged attention family)."""
    per_request = max(-(-n // bs) for n in lens)
    blocks = torch.randperm(len(lens) * per_request + 3)
    cache = torch.randn(len(blocks), kv_heads, bs, 2 * d, dtype=dtype)  # garbage everywhere no request writes
    table = blocks[:len(lens) * per_request].view(len(lens), per_request).to(torch.int32)
    dense = []
    for r, n in enumerate(lens):
        k, v = torch.randn(kv_heads, n, d, dtype=dtype), torch.randn(kv_heads, n, d, dtype=dtype)
        for t in range(n):
            flat = cache[table[r, t // bs]].view(kv_heads, 2 * bs * d)
            flat[:, :bs * d].view(kv_heads, d, bs)[:, :, t % bs] = k[:, t]
            flat[:, bs * d:].view(kv_heads, bs, d)[:, t % bs] = v[:, t]
        dense.append((k, v))
    query = torch.randn(sum(new), heads, d, dtype=dtype)
    starts = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    return dense, [query, cache, table, torch.tensor(lens, dtype=torch.int32), starts]


def test_the_paged_attention_reference_reads_the_cache_as_vllm_lays_it_out():
    torch.manual_seed(0)
    lens, new, heads, kv_heads, d = [5, 40, 1], [1, 3, 1], 4, 2, 32
    dense, inputs = _paged_batch(lens, new, heads, kv_heads, d, 16, torch.float32)
    got = load_reference(FAMILIES["paged_attention"].reference_path).Model(heads, kv_heads, d, d ** -0.5)(*inputs)
    query, starts = inputs[0], inputs[4]
    for r, (k, v) in enumerate(dense):
        q = query[starts[r]:starts[r + 1]].transpose(0, 1)  # [heads, new, d]
        k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
        mask = torch.ones(new[r], lens[r], dtype=torch.bool).tril(lens[r] - new[r])
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=d ** -0.5)
        torch.testing.assert_close(got[starts[r]:starts[r + 1]], want.transpose(0, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("backend", "dtype", "d"), [("cpp", torch.float32, 32), ("cpp", torch.bfloat16, 64),
                                                     ("cpp", torch.bfloat16, 40), ("triton", torch.float32, 32)])
def test_paged_attention_kernels_match_the_reference_at_decode_and_prefill(backend, dtype, d):
    """bf16 with a head size of 16 * n takes the AVX-512 path where the CPU has it, 40 the generic one."""
    family = FAMILIES["paged_attention"]
    torch.manual_seed(1)
    for lens, new, heads, kv_heads in (([7, 33, 2, 64], [1, 1, 1, 1], 8, 2), ([9, 20], [9, 4], 4, 4)):
        _, inputs = _paged_batch(lens, new, heads, kv_heads, d, 16, dtype)
        args = (heads, kv_heads, d, d ** -0.5)
        want = load_reference(family.reference_path).Model(*args)(*inputs)
        got = _wrapper(family, backend)(*args)(*inputs)
        tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
        torch.testing.assert_close(got, want, **tol)
