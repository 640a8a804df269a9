"""The paged attention family (vLLM's CPU paged KV cache): the reference reads the cache as vLLM lays it out, and
the C++ and Triton kernels match it at decode and prefill, over shuffled blocks, grouped heads and odd head sizes."""

import pytest
import torch
from helpers import family_wrapper

from kernelbot.agent.verify.run import load_reference
from kernelbot.kernel_library import FAMILIES


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
                                                     ("cpp", torch.bfloat16, 40), ("cpp", torch.float16, 32),
                                                     ("triton", torch.float32, 32)])
def test_paged_attention_kernels_match_the_reference_at_decode_and_prefill(backend, dtype, d):
    """bf16 with a head size of 16 * n takes the AVX-512 path where the CPU has it, 40 the generic one."""
    family = FAMILIES["paged_attention"]
    torch.manual_seed(1)
    for lens, new, heads, kv_heads in (([7, 33, 2, 64], [1, 1, 1, 1], 8, 2), ([9, 20], [9, 4], 4, 4)):
        _, inputs = _paged_batch(lens, new, heads, kv_heads, d, 16, dtype)
        args = (heads, kv_heads, d, d ** -0.5)
        want = load_reference(family.reference_path).Model(*args)(*inputs)
        got = family_wrapper("paged_attention", backend)(*args)(*inputs)
        tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
        torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("backend", ["reference", "cpp"])
def test_a_non_finite_value_reaches_only_the_tokens_that_see_its_key(backend):
    """Prefill: the last new token's value is inf, so the tokens before it (causally masked from it) stay finite,
    and only the last one turns non-finite; a reference that weighed masked keys by 0 made 0 * inf = NaN everywhere."""
    torch.manual_seed(2)
    heads, kv_heads, d, bs = 4, 2, 32, 16
    dense, inputs = _paged_batch([20], [6], heads, kv_heads, d, bs, torch.float32)
    last = 19  # the request's last token, the last of its 6 new query rows
    flat = inputs[1][inputs[2][0, last // bs]].view(kv_heads, 2 * bs * d)
    flat[:, bs * d:].view(kv_heads, bs, d)[:, last % bs] = float("inf")  # its value row, every kv head
    args = (heads, kv_heads, d, d ** -0.5)
    reference = load_reference(FAMILIES["paged_attention"].reference_path).Model(*args)
    model = reference if backend == "reference" else family_wrapper("paged_attention", backend)(*args)
    got = model(*inputs)
    assert torch.isfinite(got[:5]).all() and not torch.isfinite(got[5]).any()
    torch.testing.assert_close(got[:5], reference(*inputs)[:5], rtol=1e-5, atol=1e-5)
