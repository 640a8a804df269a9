"""Race and bounds checking of Triton kernels in the CPU interpreter, and CUDA's compile-time checks."""

import os
import subprocess
import sys
import textwrap

import pytest
from helpers import write_module
from test_verify import RMS_TASK

from kernelbot.agent.tasks.references import reference_source
from kernelbot.agent.verify.cuda_check import compile_report, parse_ptxas
from kernelbot.agent.verify.run import verify
from kernelbot.agent.verify.sanitizer import parse_summary

KERNELS = '''
import os
os.environ["TRITON_INTERPRET"] = "1"
from kernelbot.agent.verify import triton_check as tc
tc.install()
import torch, triton, triton.language as tl

@triton.jit
def double(x, y, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    m = o < n
    tl.store(y + o, tl.load(x + o, mask=m) * 2, mask=m)

@triton.jit
def double_unmasked(x, y, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(y + o, tl.load(x + o) * 2)

@triton.jit
def sum_racy(x, y, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    s = tl.sum(tl.load(x + o, mask=o < n, other=0.0))
    tl.store(y, tl.load(y) + s)

@triton.jit
def sum_atomic(x, y, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.atomic_add(y, tl.sum(tl.load(x + o, mask=o < n, other=0.0)))

@triton.jit
def shift_left(x, n, B: tl.constexpr):  # in place: program p reads the block program p+1 writes
    o = tl.program_id(0) * B + tl.arange(0, B)
    m = o + 1 < n
    tl.store(x + o, tl.load(x + o + 1, mask=m), mask=m)

@triton.jit
def row_sums(x, y, n_rows, n_cols, B: tl.constexpr):  # a scalar bound and-ed into a block mask: 0/1 integers
    cols = tl.arange(0, B)
    for r in range(4):
        row = tl.program_id(0) * 4 + r
        s = tl.sum(tl.load(x + row * n_cols + cols, mask=(cols < n_cols) & (row < n_rows), other=0.0))
        tl.store(y + row + 0 * cols, s + 0.0 * cols, mask=(cols < 1) & (row < n_rows))

@triton.jit
def locked_sum(x, y, lock, n, B: tl.constexpr, INSIDE: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    s = tl.sum(tl.load(x + o, mask=o < n, other=0.0))
    while tl.atomic_cas(lock, 0, 1) == 1:
        pass
    if not INSIDE:
        tl.atomic_xchg(lock, 0)
    tl.store(y, tl.load(y) + s)
    if INSIDE:
        tl.atomic_xchg(lock, 0)

@triton.jit
def last_wins(y):  # the program that comes last leaves its id
    tl.atomic_xchg(y, tl.program_id(0))

x = torch.randn(100)
'''


def _run(body: str) -> str:
    code = KERNELS + textwrap.dedent(body)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_clean_kernel_has_no_findings_and_the_right_result():
    out = _run("""
        y = torch.empty(100)
        double[(4,)](x, y, 100, B=32)
        print(torch.equal(y, x * 2), tc.REPORT.as_dict())
    """)
    assert out.startswith("True") and "'out_of_bounds': [], 'races': []" in out and "'launches': 1" in out


def test_unmasked_tail_is_out_of_bounds_and_is_not_performed():
    out = _run("""
        y = torch.empty(100)
        double_unmasked[(4,)](x, y, 100, B=32)
        print(torch.equal(y, x * 2), tc.REPORT.out_of_bounds)
    """)
    assert out.startswith("True")  # the 28 lanes past the end were switched off, not read from wild memory
    assert "double_unmasked: program (3,0,0) reads 28 element(s)" in out and "x+400" in out
    assert "writes 28 element(s)" in out and "y+400" in out


def test_plain_read_modify_write_across_programs_is_a_race_atomics_are_not():
    out = _run("""
        y = torch.zeros(1)
        sum_racy[(4,)](x, y, 100, B=32)
        print(tc.REPORT.races)
        tc.REPORT.races.clear()
        z = torch.zeros(1)
        sum_atomic[(4,)](x, z, 100, B=32)
        print(tc.REPORT.races, bool(torch.allclose(z, x.sum(), atol=1e-5)))
    """)
    racy, atomic = out.strip().splitlines()
    assert "write-write" in racy and "read-write" in racy and "y+0" in racy
    assert atomic == "[] True"


DOTS = """
@triton.jit
def matmul(a, b, c, B: tl.constexpr, IEEE: tl.constexpr):
    o = tl.arange(0, B)
    x = tl.load(a + o[:, None] * B + o[None, :])
    y = tl.load(b + o[:, None] * B + o[None, :])
    z = tl.dot(x, y, input_precision="ieee") if IEEE else tl.dot(x, y)
    tl.store(c + o[:, None] * B + o[None, :], z)

for dtype in (torch.bfloat16, torch.float32):  # a kernel is flagged once: the float32 one without IEEE last
    for ieee in (True, False):
        a, b = torch.randn(16, 16, dtype=dtype), torch.randn(16, 16, dtype=dtype)
        c = torch.empty(16, 16, dtype=torch.float32)
        matmul[(1,)](a, b, c, B=16, IEEE=ieee)
        print(dtype, ieee, len(tc.REPORT.precision), bool(torch.allclose(c, a.float() @ b.float(), atol=1e-4)))
print(tc.REPORT.precision[0])
"""


def test_a_float32_dot_at_tf32_precision_is_a_finding_an_ieee_one_and_bf16_are_not():
    """The interpreter multiplies float32 in full float32 whatever tl.dot's precision says; a GPU, by default, rounds
    the inputs to TF32: such a dot is flagged (once per kernel), an IEEE one and a bf16 one are not."""
    lines = _run(DOTS).strip().splitlines()
    assert lines[:4] == ["torch.bfloat16 True 0 True", "torch.bfloat16 False 0 True", "torch.float32 True 0 True",
                         "torch.float32 False 1 True"]
    assert lines[4].startswith("matmul: tl.dot on float32 operands at TF32 precision") and 'input_precision="ieee"' \
        in lines[4]


def test_a_mask_of_zeros_and_ones_is_not_read_as_indices():
    out = _run("""
        y = torch.empty(10)
        row_sums[(3,)](x, y, 10, 10, B=16)
        # atol: a row's sum of ten normals can lie near zero, where fp32's summation order alone exceeds 1e-8
        print(torch.allclose(y, x.view(10, 10).sum(1), atol=1e-5), tc.REPORT.out_of_bounds, tc.REPORT.races)
    """)
    assert out.strip() == "True [] []"


def test_a_read_modify_write_inside_a_lock_is_no_race_and_one_outside_it_is():
    out = _run("""
        for inside in (True, False):
            y, lock = torch.zeros(1), torch.zeros(1, dtype=torch.int32)
            locked_sum[(4,)](x, y, lock, 100, B=32, INSIDE=inside)
            same = bool(torch.allclose(y, x.sum(), atol=1e-5))
            print(same, tc.REPORT.races, sorted(tc.REPORT.order_dependent_kernels))
            tc.REPORT.races.clear()
            tc.REPORT.order_dependent_kernels.clear()
    """)
    inside, outside = out.strip().splitlines()
    assert inside == "True [] ['locked_sum']"  # every lane of the compare-and-swap in bounds: no crash either
    assert "write-write" in outside and "read-write" in outside and "y+0" in outside


def test_exchanges_by_several_programs_at_one_address_are_a_race():
    out = _run("""
        y = torch.zeros(1, dtype=torch.int32)
        last_wins[(4,)](y)
        print(tc.REPORT.races)
    """)
    assert "atomics that do not commute" in out and "y+0" in out


def test_program_order_changes_the_result_of_an_in_place_shift():
    out = _run("""
        a, b = x.clone(), x.clone()
        shift_left[(4,)](a, 100, B=32)
        tc.set_order("reversed")
        shift_left[(4,)](b, 100, B=32)
        print(torch.equal(a, b), len(tc.REPORT.races) > 0)
    """)
    assert out.strip() == "False True"


RMS_BODY = '''
import torch
import triton
import triton.language as tl
from kernelbot.kernel_library.rmsnorm.reference import Model


@triton.jit
def _rms(x_ptr, w_ptr, out_ptr, scratch, n_cols, eps, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if MASKED:
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    else:
        x = tl.load(x_ptr + row * n_cols + cols)
    tl.store(scratch, tl.sum(x * x, axis=0))  # SCRATCH: every program shares one slot
    ss = tl.load(scratch)
    inv = 1.0 / tl.sqrt(ss / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * n_cols + cols, w * x * inv, mask=mask)


class ModelNew(Model):
    def forward(self, x):
        x = x.contiguous()
        n = x.shape[-1]
        out = torch.empty_like(x)
        scratch = torch.empty(1, dtype=torch.float32)
        _rms[(x.numel() // n,)](x, self.weight, out, scratch, n, self.variance_epsilon,
                                BLOCK=BLOCK_SIZE, MASKED=MASK)
        return out
'''


@pytest.mark.parametrize("block,mask,failed", [(64, True, "race"), (128, False, "out_of_bounds")])
def test_racy_and_out_of_bounds_triton_candidates_are_caught(tmp_path, block, mask, failed):
    """The shared scratch slot gives right answers in the sequential interpreter: only the race check sees it.
    The unmasked 128-wide load reads past every row of 64 (and past the input buffer on the last row)."""
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    source = RMS_BODY.replace("BLOCK_SIZE", str(block)).replace("MASK)", f"{mask})")
    cand = write_module(tmp_path / "c" / "candidate.py", source)
    verdict = verify(RMS_TASK, ref, cand, tmp_path / "w", timeout=300)
    assert failed in verdict.failed, verdict.checks
    if failed == "race":
        assert "correctness" not in verdict.failed  # the interpreter runs programs one at a time
        detail = next(c.detail for c in verdict.checks if c.id == "race")
        assert "scratch+0" in detail


LINEAR_REFERENCE = """
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 32, bias=False)

    def forward(self, x):
        return self.proj(x)


def get_inputs():
    return [torch.randn(16, 64)]


def get_init_inputs():
    return []
"""
LINEAR_TRITON = """
import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _gemm(x_ptr, w_ptr, out_ptr, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, K)
    x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0)
    w = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=rn[None, :] < N, other=0.0)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], tl.dot(x, wPRECISION), mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 32, bias=False)

    def forward(self, x):
        x2 = x.reshape(-1, 64).contiguous()
        out = torch.empty(x2.shape[0], 32, dtype=x.dtype, device=x.device)
        _gemm[(triton.cdiv(x2.shape[0], 16), 2)](x2, self.proj.weight, out, x2.shape[0], 32, K=64, BM=16, BN=16)
        return out.view(*x.shape[:-1], 32)
"""


@pytest.mark.parametrize("precision,status", [  # an ieee dot passing: the library's GEMMs' test, in the fast set
    ("", "fail"), pytest.param(', input_precision="ieee"', "pass", marks=pytest.mark.slow)])
def test_a_float32_gemm_whose_dot_a_gpu_runs_in_tf32_fails_precision_downcast_here(tmp_path, precision, status):
    """Exact in the interpreter, so correctness passes on this CPU; on a GPU its default-precision tl.dot rounds the
    inputs to TF32, which the verdict says here: precision_downcast fails, naming the fix. With IEEE it passes."""
    from kernelbot.agent.verify.run import task_from_reference

    ref = write_module(tmp_path / "reference.py", LINEAR_REFERENCE)
    cand = write_module(tmp_path / "c" / "candidate.py", LINEAR_TRITON.replace("PRECISION", precision))
    verdict = verify(task_from_reference(ref), ref, cand, tmp_path / "w", timeout=300)
    checks = {c.id: c for c in verdict.checks}
    assert checks["correctness"].status == "pass", checks["correctness"]
    assert checks["precision_downcast"].status == status, checks["precision_downcast"]
    assert ("_gemm: tl.dot on float32 operands at TF32 precision" in checks["precision_downcast"].detail) == (
        status == "fail")


@pytest.mark.parametrize("family,init_args,shape,wrapper", [
    ("linear", [48, 40, True, "float32"], [4, 1, 48], "linear.triton_kernel:LinearTriton"),
    pytest.param("gated_mlp", [32, 48, "float32"], [4, 1, 32], "gated_mlp.triton_kernel:GatedMLPTriton",
                 marks=pytest.mark.slow),  # the same precision rule as the linear's
])
def test_the_librarys_float32_triton_gemms_choose_ieee_precision(tmp_path, family, init_args, shape, wrapper):
    """Their tl.dot would otherwise run in TF32 on a GPU and fail float32's tolerance there."""
    from kernelbot.records import Task

    task = Task(id=family, hotspot_id="h", family=family, module_class="M", dtype="float32", input_shapes=[shape],
                free_dims=[[0, 1]], init_args=init_args, share=0.1, floor_us=1.0)
    ref = write_module(tmp_path / "reference.py", reference_source(task))
    path, cls = wrapper.split(":")
    cand = write_module(tmp_path / "c" / "candidate.py", f"from kernelbot.kernel_library.{path} import {cls} as "
                                                         "ModelNew\n")
    verdict = verify(task, ref, cand, tmp_path / "w", timeout=300)
    precision = next(c for c in verdict.checks if c.id == "precision_downcast")
    assert verdict.verdict == "pass" and precision.status == "pass", (verdict.failed, precision.detail)


# Whether a candidate is Triton is what it launches, not what its source spells: one reaches the library's Triton
# kernel without ever naming it; the other is C++ whose comments and docstring name it (and would fool a regex)
SPELLED_OTHERWISE = {
    "hidden_triton": ("""
import importlib

NAME = "tri" + "ton"
kernels = importlib.import_module(f"kernelbot.kernel_library.rmsnorm.{NAME}_kernel")


class ModelNew(getattr(kernels, "RMSNorm" + NAME.capitalize())):
    pass
""", True),
    "cpp_that_mentions_triton": ('''"""Not a Triton kernel, though this docstring says
    import triton
"""
from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp  # C++, no triton.jit anywhere


class ModelNew(RMSNormCpp):
    pass
''', False),
}


@pytest.mark.parametrize("name", list(SPELLED_OTHERWISE))
def test_the_interpreter_judges_what_a_candidate_launches_not_what_its_source_says(tmp_path, monkeypatch, name):
    source, launches = SPELLED_OTHERWISE[name]
    assert ("triton" in source.lower()) != launches
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # verify's own decision, not the test process's setting
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    verdict = verify(RMS_TASK, ref, write_module(tmp_path / name / "candidate.py", source), tmp_path / "work")
    assert verdict.verdict == "pass", verdict.problems
    assert bool(verdict.triton_launches) == launches
    race = next(c.detail for c in verdict.checks if c.id == "race")
    assert race.startswith(f"{verdict.triton_launches} launches" if launches else "no Triton launch"), race


PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4tilePKfPfi' for 'sm_90'
ptxas info    : Function properties for _Z4tilePKfPfi
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem, 380 bytes cmem[0]
ptxas info    : Compiling entry function '_Z3addPKfPfi' for 'sm_90'
ptxas info    : Function properties for _Z3addPKfPfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 372 bytes cmem[0]
"""


def test_interpreter_checks_refuse_to_install_where_triton_compiles_and_leave_libdevice_alone():
    # On a GPU the compiler must find libdevice's builtins; install() would put numpy functions in their place.
    code = textwrap.dedent("""
        import triton.language.extra.libdevice as libdevice
        before = libdevice.rsqrt
        from kernelbot.agent.verify import triton_check as tc
        try:
            tc.install()
        except Exception as exc:
            print("refused:", type(exc).__name__ == "KernelbotError" and "TRITON_INTERPRET" in str(exc),
                  libdevice.rsqrt is before)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.strip() == "refused: True True", proc.stderr[-2000:]


def test_ptxas_report_is_parsed_per_kernel():
    tile, add = parse_ptxas(PTXAS)
    assert tile == {"kernel": "_Z4tilePKfPfi", "arch": "sm_90", "registers": 255, "smem_bytes": 4096,
                    "stack_bytes": 8, "spill_store_bytes": 4, "spill_load_bytes": 4}
    assert add["registers"] == 8 and add["smem_bytes"] == 0 and add["spill_store_bytes"] == 0


@pytest.mark.skipif(not any(os.access(os.path.join(p, "nvcc"), os.X_OK) for p in os.environ["PATH"].split(":")),
                    reason="nvcc is not installed")
def test_nvcc_compiles_for_sm90_and_reports_registers_and_shared_memory(tmp_path):
    good = """__global__ void tile(const float* x, float* y, int n) {
        __shared__ float t[256]; int i = blockIdx.x * 256 + threadIdx.x;
        t[threadIdx.x] = i < n ? x[i] : 0.f; __syncthreads(); if (i < n) y[i] = t[255 - threadIdx.x]; }"""
    report = compile_report([good], tmp_path, ["-I/nonexistent"])
    assert report["ok"] and report["kernels"][0]["smem_bytes"] == 1024 and report["kernels"][0]["registers"] > 0
    broken = compile_report(["__global__ void k(float* y) { y[0] = undefined_name; }"], tmp_path)
    assert not broken["ok"] and "undefined_name" in broken["log"]


def test_compute_sanitizer_summary_is_read():
    text = ("========= COMPUTE-SANITIZER\n========= Invalid __global__ read of size 4 bytes\n"
            "=========     at k(float *)+0x70\n========= ERROR SUMMARY: 3 errors\n")
    assert parse_summary(text) == (3, "Invalid __global__ read of size 4 bytes")
    assert parse_summary("========= ERROR SUMMARY: 0 errors\n") == (0, "")
    assert parse_summary("Segmentation fault") == (None, "")


CUDA_CANDIDATE = '''
import torch
from torch.utils.cpp_extension import load_inline
from kernelbot.kernel_library.rmsnorm.reference import Model

CUDA = r"""
__global__ void rms_kernel(const float* x, const float* w, float* y, int cols, float eps) {
    __shared__ float part[256];
    int row = blockIdx.x;
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += x[row * cols + c] * x[row * cols + c];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    float inv = rsqrtf(part[0] / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[row * cols + c] = w[c] * x[row * cols + c] * inv;
}
torch::Tensor rms(torch::Tensor x, torch::Tensor w, double eps) {
    auto y = torch::empty_like(x);
    int cols = x.size(-1);
    rms_kernel<<<x.numel() / cols, 256>>>(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), cols, eps);
    return y;
}
"""
ext = load_inline("rms_cuda", "torch::Tensor rms(torch::Tensor x, torch::Tensor w, double eps);", cuda_sources=CUDA,
                  functions=["rms"])


class ModelNew(Model):
    def forward(self, x):
        return ext.rms(x.contiguous(), self.weight, self.variance_epsilon)
'''


@pytest.mark.slow
def test_cuda_candidate_is_compiled_for_sm90_and_its_runtime_checks_are_not_run_without_a_gpu(tmp_path):
    if not any(os.access(os.path.join(p, "nvcc"), os.X_OK) for p in os.environ["PATH"].split(":")):
        pytest.skip("nvcc is not installed")
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    cand = write_module(tmp_path / "cuda" / "candidate.py", CUDA_CANDIDATE)
    verdict = verify(RMS_TASK, ref, cand, tmp_path / "w", timeout=900)
    checks = {c.id: c for c in verdict.checks}
    assert checks["compile"].status == "pass" and "rms_kernel" in checks["compile"].detail
    assert "registers" in checks["compile"].detail and "1024 B smem" in checks["compile"].detail
    assert checks["correctness"].status == "not_run" and verdict.verdict == "fail" and verdict.failed == []
    broken = write_module(tmp_path / "broken" / "candidate.py", CUDA_CANDIDATE.replace("rsqrtf(", "rsqrtf_typo("))
    bad = verify(RMS_TASK, ref, broken, tmp_path / "w2", timeout=900)
    assert bad.failed == ["compile"] and "rsqrtf_typo" in next(c.detail for c in bad.checks if c.id == "compile")
