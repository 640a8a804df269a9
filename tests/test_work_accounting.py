"""How the verifier counts PyTorch's work in a call (agent/verify/probes.py), which `reference_fallback` compares
between a candidate and its reference: an op with known FLOPs counts them whole, even where it runs a copy inside
(addmm copies its bias into the output first), and what is nested in it does not count again."""

from __future__ import annotations

import torch

from kernelbot.agent.verify.probes import measure_work, work_from_events

GEMM = 2 * 8 * 512 * 512


def test_a_gemm_that_copies_its_bias_first_counts_its_flops_and_the_copy_inside_does_not_count():
    events = [(1, 0, 100, "aten::linear", [[8, 512], [512, 512], [512]], 0),
              (1, 1, 99, "aten::addmm", [[512], [8, 512], [512, 512]], GEMM),
              (1, 2, 10, "aten::copy_", [[8, 512], [8, 512]], 0),
              (1, 101, 110, "aten::copy_", [[8, 8, 32, 64], [8, 8, 32, 64]], 0),  # a leaf of its own: counts
              (2, 0, 50, "aten::add", [[64], [64]], 0)]  # another thread's leaf
    compute = work_from_events(events).compute
    assert compute == {"addmm": GEMM, "copy_": 8 * 8 * 32 * 64, "add": 64}


def test_a_biased_linear_in_bf16_is_counted_as_its_gemm():
    layer = torch.nn.Linear(512, 512, dtype=torch.bfloat16)
    x = torch.randn(8, 512, dtype=torch.bfloat16)
    with torch.inference_mode():
        compute = measure_work(lambda: layer(x), all_threads=False).compute
    assert sum(compute.values()) >= GEMM, compute
