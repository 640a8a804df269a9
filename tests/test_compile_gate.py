"""The pre-GPU compile gate: every Triton kernel a candidate launches (and every CUDA kernel it builds) compiled ahead
of time for the run's GPU target on this CPU, with Triton's own compiler and ptxas: what does not compile there, or
needs more shared memory than the target has, fails `compile`; spills are said."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import write_module

from kernelbot import KernelbotError
from kernelbot.agent.verify import compile_gate
from kernelbot.agent.verify.run import task_from_reference, verify
from kernelbot.records import KernelBuild

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def _build(**fields: object) -> KernelBuild:
    return compile_gate.flagged(KernelBuild(**{"kernel": "k", "backend": "triton", "target": "sm_90", "ok": True,
                                               "registers": 40, **fields}))


def test_spills_are_a_note_and_shared_memory_past_the_targets_limit_fails_compile() -> None:
    spills, fits = _build(spill_bytes=64, specialization="B=128"), _build(shared_bytes=232448)
    found, notes = compile_gate.gate([fits, spills])
    assert found is not None and found.status == "pass" and "k: 40 registers, 64 B spilled" in found.detail
    assert notes == ["k [B=128]: spills 64 B to local memory on sm_90 (slower there, not wrong)"]
    over = _build(shared_bytes=262144)
    found, _ = compile_gate.gate([fits, over])
    assert found is not None and found.status == "fail"
    assert "needs 262144 B of shared memory per block, over sm_90's 232448 B" in found.detail
    assert _build(target="sm_86", shared_bytes=131072).flags  # 99 KiB there
    failed = _build(ok=False, registers=None, error="CompilationError: at 5:46: K >= 16")
    assert compile_gate.gate([failed])[0].status == "fail"  # type: ignore[union-attr]
    assert compile_gate.gate([]) == (None, [])


def test_a_target_is_checked_and_named_as_its_architecture() -> None:
    assert compile_gate.checked_target("SM_90a") == "sm_90" and compile_gate.checked_target("sm_80") == "sm_80"
    with pytest.raises(KernelbotError, match="--target sm_91: unknown GPU architecture; use one of sm_80"):
        compile_gate.checked_target("sm_91")


def test_cuda_kernels_are_compiled_for_the_runs_target_and_read_into_the_same_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelbot.agent.verify import cuda_check
    from kernelbot.agent.verify.messages import PtxasKernel

    monkeypatch.setenv(compile_gate.TARGET_ENV, "sm_80")  # as verify hands it to the box
    assert cuda_check.target_arch() == "sm_80"
    big = PtxasKernel(kernel="k", arch="sm_80", registers=64, smem_bytes=200_000, stack_bytes=8, spill_store_bytes=8,
                      spill_load_bytes=8)
    build, = compile_gate.cuda_builds([big])
    assert (build.backend, build.target, build.spill_bytes, build.shared_limit) == ("cuda", "sm_80", 16, 166912)
    found, notes = compile_gate.gate([build])
    assert found is not None and found.status == "fail" and "over sm_80's 166912 B" in found.detail
    assert notes and "spills 16 B" in notes[0]


MATMUL_REFERENCE = """
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)]


def get_init_inputs():
    return []
"""
MATMUL_TRITON = """
import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _matmul(a, b, c, K, B: tl.constexpr):
    o = tl.arange(0, B)
    acc = tl.zeros((B, B), tl.float32)
    for k in range(0, K, B):  # pipelined on a GPU: num_stages buffers of each operand in shared memory
        x = tl.load(a + o[:, None] * K + k + o[None, :])
        y = tl.load(b + (k + o[:, None]) * B + o[None, :])
        acc += tl.dot(x, y, input_precision="ieee")
    tl.store(c + o[:, None] * B + o[None, :], acc)


class ModelNew(nn.Module):
    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        c = torch.empty_like(a)
        _matmul[(1,)](a, b, c, a.shape[1], B=a.shape[0], num_stages=9)
        return c
"""


@pytest.mark.parametrize("size,why", [(8, "K >= 16"), (64, "needs 262144 B of shared memory per block, over sm_90's")])
def test_a_kernel_the_interpreter_runs_but_an_h100_cannot_fails_compile_here(tmp_path: Path, size: int,
                                                                              why: str) -> None:
    """An 8x8 tl.dot is right in the interpreter, but sm_90's MMA needs K >= 16; a 64x64 fp32 one pipelined over nine
    stages wants 256 KiB of shared memory per block, which an H100 does not have."""
    ref = write_module(tmp_path / "reference.py", MATMUL_REFERENCE.replace("SIZE", str(size)))
    cand = write_module(tmp_path / "c" / "candidate.py", MATMUL_TRITON)
    verdict = verify(task_from_reference(ref), ref, cand, tmp_path / "w", timeout=300)
    compiled = next(c for c in verdict.checks if c.id == "compile")
    assert compiled.status == "fail" and "_matmul for sm_90: " in compiled.detail and why in compiled.detail
    assert verdict.builds and verdict.builds[0].target == "sm_90"


def _library_kernels() -> set[str]:
    """Every @triton.jit function the kernel library defines."""
    found = set()
    for path in (ROOT / "kernel_library").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(ast.unparse(d) == "triton.jit" for d in node.decorator_list):
                found.add(node.name)
    return found


# The library's own tests launch each of its Triton kernels at decode, prefill and odd sizes, fp32 and bf16
LIBRARY_TESTS = ["tests/test_kernel_library.py", "tests/kernel_library", "tests/test_gemma2_attention.py"]


@pytest.mark.slow  # about two minutes on 2 cores: the library's Triton tests, each launch compiled for sm_90 too
def test_every_library_triton_kernel_compiles_for_sm90_at_every_size_its_tests_launch_without_spilling(
        tmp_path: Path) -> None:
    out = tmp_path / "builds.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", compile_gate.TARGET_ENV: "sm_90", "KERNELBOT_BUILDS_OUT": str(out),
           "PYTHONPATH": os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "compile_gate_plugin", "-k", "triton or paged",
                           *LIBRARY_TESTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:]
    builds = [KernelBuild.model_validate(b) for b in json.loads(out.read_text())]
    assert {b.kernel for b in builds} == _library_kernels()
    bad = [f"{b.kernel} [{b.specialization}]: {compile_gate.described(b)}" for b in builds if not b.ok or b.flags]
    assert not bad, bad


FIXTURES = [(ROOT / "benchmarks" / "gpu_check" / "reference.py", ROOT / "benchmarks" / "gpu_check" / name)
            for name in ("correct_triton.py", "racy_triton.py")] + [
    (TESTS / "verify_corpus" / f"{ref}.py", TESTS / "verify_corpus" / f"{cand}.py") for ref, cand in (
        ("colsum_ref", "colsum_locked"), ("colsum_ref", "colsum_ticket"), ("gelu_ref", "gelu_erf"),
        ("layernorm_ref", "layernorm_one_pass"), ("layernorm_ref", "layernorm_two_pass"), ("silu_ref", "silu_flat"))]


@pytest.mark.slow  # about a minute on 2 cores: each fixture verified in the sandbox
@pytest.mark.parametrize("reference,candidate", FIXTURES, ids=[c.stem for _, c in FIXTURES])
def test_the_test_fixtures_triton_kernels_compile_for_sm90_without_spilling(tmp_path: Path, reference: Path,
                                                                            candidate: Path) -> None:
    verdict = verify(task_from_reference(reference), reference, candidate, tmp_path / "w", seed=4, timeout=300)
    assert verdict.builds, verdict.checks
    bad = [compile_gate.described(b) for b in verdict.builds if not b.ok or b.flags or b.target != "sm_90"]
    assert not bad, bad
