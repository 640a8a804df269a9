"""The AMX path of the library's bf16 GEMM (kernel_library/amx_gemm.h), with the tile instructions emulated in
software (tests/cpp/amx_emulated.cpp): its row blocks, chunks, tail rows, panel pairs and epilogues against torch, at
the shapes where each part changes. On a CPU with AMX the same code runs on the tiles, and is verified there before
use as every kernel is; this host has none (the engine chosen is checked to say so)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.linear.cpp import SOURCE, pack_panels_bf16

EMULATED = Path(__file__).with_name("cpp") / "amx_emulated.cpp"


@pytest.fixture(scope="module")
def emulated():
    return load_cpp(EMULATED)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within bf16's rounding of the output (the sums are fp32 in both)."""
    torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("m, k, n", [(32, 64, 32), (45, 64, 40), (300, 96, 48), (7, 32, 16), (513, 64, 17)])
def test_the_amx_linear_matches_torch_through_tail_rows_chunks_and_a_lone_last_panel(emulated, m, k, n):
    torch.manual_seed(m + n)
    x, w, b = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16(), torch.randn(n).bfloat16()
    want = F.linear(x.float(), w.float(), b.float())
    _close(emulated.amx_gemm(x, pack_panels_bf16([w]), b, n, False), want)
    _close(emulated.amx_gemm(x, pack_panels_bf16([w]), None, n, False), want - b.float())


@pytest.mark.parametrize("gelu", [False, True])
def test_the_amx_gated_projection_applies_its_activation_to_the_gate_and_multiplies_by_up(emulated, gelu):
    torch.manual_seed(1)
    m, k, inter = 70, 64, 40
    x, gate, up = torch.randn(m, k).bfloat16(), torch.randn(inter, k).bfloat16(), torch.randn(inter, k).bfloat16()
    g, u = F.linear(x.float(), gate.float()), F.linear(x.float(), up.float())
    act = F.gelu(g, approximate="tanh") if gelu else F.silu(g)
    _close(emulated.amx_gemm(x, pack_panels_bf16([gate, up]), None, inter, gelu), act * u)


def test_this_host_runs_the_avx512_path_where_it_has_no_amx():
    ext = load_cpp(SOURCE)
    amx = "amx_bf16" in Path("/proc/cpuinfo").read_text()
    assert ext.has_amx_bf16() == amx
    want = "amx_bf16" if amx else "avx512_bf16" if ext.has_avx512_bf16() else "fp32"
    assert ext.gemm_engine(4096, 896) == want
    assert ext.gemm_engine(8, 896) != "amx_bf16"  # decode rows stream weights: the vector path
