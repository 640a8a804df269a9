"""Honest kernels in the styles people write pass; the checks that used to pass cheats or fail honest kernels.

Liger-Kernel-style Triton (one program per row block, masked loads, fp32 accumulation, libdevice's rsqrt) and
a split reduction accumulated with float atomics pass, the latter with its order-dependence reported (and
failed under require_deterministic). A softmax that masks with -inf passes random masks but not fully masked or
left-padded rows. A candidate right only for its first calls passes verification and is refused by the
benchmark, whose timed outputs are checked.
"""

import pytest
from helpers import write_module
from test_verify import RMS_TASK

from kernelbot.agent.tasks.references import reference_source
from kernelbot.agent.verify.bench import bench
from kernelbot.agent.verify.run import task_from_reference, verify

LIGER_STYLE_RMSNORM = '''
import torch
import triton
import triton.language as tl
from triton.language.extra.libdevice import rsqrt
from kernelbot.kernel_library.rmsnorm.reference import Model


@triton.jit
def _rms_norm_forward_kernel(Y_ptr, Y_row_stride, X_ptr, X_row_stride, W_ptr, RSTD_ptr, n_cols, eps,
                             BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0).to(tl.int64)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols
    Y_ptr += row_idx * Y_row_stride
    X_ptr += row_idx * X_row_stride
    RSTD_ptr += row_idx
    X_row = tl.load(X_ptr + col_offsets, mask=mask, other=0)
    X_row_dtype = X_row.dtype
    W_row = tl.load(W_ptr + col_offsets, mask=mask, other=0)
    X_row = X_row.to(tl.float32)
    mean_square = tl.sum(X_row * X_row, axis=0) / n_cols
    rstd = rsqrt(mean_square + eps)
    tl.store(RSTD_ptr, rstd)
    X_row = (X_row * rstd).to(X_row_dtype)
    tl.store(Y_ptr + col_offsets, X_row * W_row, mask=mask)


class ModelNew(Model):
    def forward(self, hidden_states):
        hidden_states = hidden_states.contiguous()  # Liger's autograd function does this (@ensure_contiguous)
        shape = hidden_states.shape
        X = hidden_states.view(-1, shape[-1])
        n_rows, n_cols = X.shape
        BLOCK_SIZE = triton.next_power_of_2(n_cols)
        Y = torch.empty((n_rows, n_cols), dtype=X.dtype, device=X.device)
        RSTD = torch.empty(n_rows, dtype=torch.float32, device=X.device)
        _rms_norm_forward_kernel[(n_rows,)](Y, Y.stride(0), X, X.stride(0), self.weight, RSTD, n_cols,
                                            self.variance_epsilon, BLOCK_SIZE=BLOCK_SIZE, num_warps=4)
        return Y.view(*shape)
'''

SWIGLU_REFERENCE = """
import torch
import torch.nn.functional as F
from torch import nn


class Model(nn.Module):
    def forward(self, gate, up):
        return F.silu(gate) * up


tokens, intermediate = 16, 96


def get_inputs():
    return [torch.randn(tokens, intermediate), torch.randn(tokens, intermediate)]


def get_init_inputs():
    return []
"""

LIGER_STYLE_SWIGLU = '''
import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def silu(x):
    return x * tl.sigmoid(x)


@triton.jit
def _swiglu_forward_kernel(a_ptr, b_ptr, c_ptr, stride, n_cols: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    program_id = tl.program_id(0).to(tl.int64)
    a_ptr += program_id * stride
    b_ptr += program_id * stride
    c_ptr += program_id * stride
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols
    a_row = tl.load(a_ptr + col_offsets, mask=mask, other=0).to(tl.float32)
    b_row = tl.load(b_ptr + col_offsets, mask=mask, other=0)
    c_row = silu(a_row).cast(b_row.dtype) * b_row
    tl.store(c_ptr + col_offsets, c_row, mask=mask)


class ModelNew(nn.Module):
    def forward(self, a, b):  # Liger's ensure_contiguous decorator makes its inputs contiguous
        a, b = a.contiguous(), b.contiguous()
        ori_shape = a.shape
        n_cols = ori_shape[-1]
        a = a.view(-1, n_cols)
        b = b.view(-1, n_cols)
        c = torch.empty_like(a)
        BLOCK_SIZE = triton.next_power_of_2(n_cols)
        _swiglu_forward_kernel[(a.shape[0],)](a, b, c, c.stride(-2), n_cols=n_cols, BLOCK_SIZE=BLOCK_SIZE,
                                              num_warps=4)
        return c.view(*ori_shape)
'''

ROW_SUM_REFERENCE = """
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return x.sum(dim=-1)


rows, cols = 8, 640


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
"""

SPLIT_SUM_WITH_ATOMICS = '''
import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _split_row_sum(x_ptr, out_ptr, n_cols, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * CHUNK
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, CHUNK, BLOCK):
        cols = first + start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
    tl.atomic_add(out_ptr + row, tl.sum(acc, axis=0))  # split-K style: the programs of a row accumulate


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        n_cols = x.shape[-1]
        out = torch.zeros(x.shape[:-1], dtype=torch.float32)
        _split_row_sum[(x.numel() // n_cols, triton.cdiv(n_cols, 128))](x, out, n_cols, CHUNK=128, BLOCK=32)
        return out
'''

MASKED_SOFTMAX_REFERENCE = """
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, scores, keep):
        # padding gets the dtype's lowest value: a fully padded row comes out uniform, never NaN
        return torch.softmax(scores.masked_fill(~keep, torch.finfo(scores.dtype).min), dim=-1)


batch_size, keys = 8, 40


def get_inputs():
    return [torch.randn(batch_size, keys), torch.rand(batch_size, keys) > 0.2]


def get_init_inputs():
    return []
"""

ONLINE_SOFTMAX = '''
import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _online_masked_softmax(s_ptr, keep_ptr, out_ptr, n_cols, pad, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    m = tl.full((), float("-inf"), tl.float32)
    total = tl.zeros((), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):  # one block at a time, rescaling the running sum
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n_cols
        s = tl.load(s_ptr + row * n_cols + cols, mask=inside, other=0.0)
        keep = tl.load(keep_ptr + row * n_cols + cols, mask=inside, other=0) != 0
        s = tl.where(inside, tl.where(keep, s, pad), float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(s - m_new), axis=0)
        m = m_new
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n_cols
        s = tl.load(s_ptr + row * n_cols + cols, mask=inside, other=0.0)
        keep = tl.load(keep_ptr + row * n_cols + cols, mask=inside, other=0) != 0
        s = tl.where(keep, s, pad)
        tl.store(out_ptr + row * n_cols + cols, tl.exp(s - m) / total, mask=inside)


class ModelNew(nn.Module):
    def forward(self, scores, keep):
        scores, keep = scores.contiguous(), keep.contiguous()
        n_cols = scores.shape[-1]
        out = torch.empty_like(scores)
        _online_masked_softmax[(scores.numel() // n_cols,)](scores, keep, out, n_cols, PAD, BLOCK=8)
        return out
'''


def _verify(tmp_path, reference: str, candidate: str, rmsnorm: bool = False, **kwargs):
    ref = write_module(tmp_path / "reference.py", reference)
    cand = write_module(tmp_path / "cand" / "candidate.py", candidate)
    task = RMS_TASK if rmsnorm else task_from_reference(ref)
    return verify(task, ref, cand, tmp_path / "work", timeout=300, **kwargs)


@pytest.mark.parametrize("reference,candidate", [
    (reference_source(RMS_TASK), LIGER_STYLE_RMSNORM),
    (SWIGLU_REFERENCE, LIGER_STYLE_SWIGLU),
], ids=["rmsnorm", "swiglu"])
def test_liger_style_triton_kernels_pass_with_special_values_included(tmp_path, reference, candidate):
    verdict = _verify(tmp_path, reference, candidate, rmsnorm=candidate is LIGER_STYLE_RMSNORM)
    assert verdict.verdict == "pass", verdict.problems
    assert any("±inf and NaN" in c for c in verdict.cases)
    assert next(c for c in verdict.checks if c.id == "race").status == "pass"


@pytest.mark.slow  # the fast tier's lock-protected accumulation (test_verify_corpus) reports order dependence too
def test_a_split_reduction_with_float_atomics_passes_and_reports_its_order_dependence(tmp_path):
    verdict = _verify(tmp_path, ROW_SUM_REFERENCE, SPLIT_SUM_WITH_ATOMICS)
    assert verdict.verdict == "pass", verdict.problems
    assert any("depend on program order" in n and "_split_row_sum" in n for n in verdict.notes), verdict.notes
    assert "float atomic adds" in next(c.detail for c in verdict.checks if c.id == "race")


@pytest.mark.slow
def test_require_deterministic_fails_a_reduction_whose_bits_depend_on_program_order(tmp_path):
    verdict = _verify(tmp_path, ROW_SUM_REFERENCE, SPLIT_SUM_WITH_ATOMICS, require_deterministic=True)
    assert verdict.failed == ["nondeterminism"], verdict.problems
    assert "--require-deterministic" in next(c.detail for c in verdict.checks if c.id == "nondeterminism")


@pytest.mark.parametrize("pad,verdict_", [
    pytest.param('float("-inf")', "fail", id="masks_with_minus_inf"),
    pytest.param("-3.4028234663852886e38", "pass", id="masks_with_the_lowest_float", marks=pytest.mark.slow),
])
def test_an_online_softmax_is_checked_on_fully_masked_and_left_padded_rows(tmp_path, pad, verdict_):
    """Random masks almost never mask a whole block of a row: only the masked-row fuzzing finds the NaN."""
    verdict = _verify(tmp_path, MASKED_SOFTMAX_REFERENCE, ONLINE_SOFTMAX.replace("PAD", pad))
    assert verdict.verdict == verdict_, verdict.problems
    if verdict_ == "fail":
        assert verdict.failed == ["correctness"], verdict.problems
        detail = next(c.detail for c in verdict.checks if c.id == "correctness")
        assert "masked" in detail and "NaN/Inf" in detail and "observed" not in detail


RIGHT_ONLY_AT_FIRST = '''
import torch
from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp


class ModelNew(RMSNormCpp):
    calls = 0
    replay = {}

    def forward(self, x):
        ModelNew.calls += 1
        if ModelNew.calls > 1500 and tuple(x.shape) in self.replay:  # verification makes fewer calls than this
            return self.replay[tuple(x.shape)].clone()
        self.replay[tuple(x.shape)] = out = super().forward(x)
        return out
'''


@pytest.mark.slow  # 40 s on 2 cores: the benchmark's own rounds must run to catch it
def test_a_candidate_right_only_for_its_first_calls_passes_verification_but_not_the_benchmark(tmp_path):
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    cand = write_module(tmp_path / "cand" / "candidate.py", RIGHT_ONLY_AT_FIRST)
    assert verify(RMS_TASK, ref, cand, tmp_path / "verify").verdict == "pass"
    with pytest.raises(RuntimeError, match="timed call's output is wrong"):
        bench(RMS_TASK, ref, cand, tmp_path / "bench", rounds=24, device="cpu")  # up to 200 calls a round


@pytest.mark.slow
def test_the_benchmark_checks_an_honest_candidate_and_times_it(tmp_path):
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    cand = write_module(tmp_path / "cand" / "candidate.py",
                        "from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp as ModelNew\n")
    result = bench(RMS_TASK, ref, cand, tmp_path / "bench", rounds=3, device="cpu")
    assert result.rounds == 3 and result.candidate_us > 0 and result.reference_us > 0
