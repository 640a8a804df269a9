"""The roofline floor of a whole workload (profiler/workload_floor.py), against a hand count of a tiny Llama."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from kernelbot.profiler.workload_floor import workload_floor
from kernelbot.records import Device

VOCAB, HIDDEN, INTER, LAYERS, BATCH, PROMPT = 100, 16, 32, 1, 2, 8
DEVICE = Device(kind="cpu", name="test", threads=1, peak_gflops=1.0, peak_gbps=1.0, peaks_source="test")


def _model(tied: bool) -> torch.nn.Module:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied)
    with torch.device("meta"):
        return LlamaForCausalLM(config)


@pytest.mark.parametrize("tied", [True, False], ids=["tied head", "own head"])
def test_prefill_runs_the_lm_head_only_on_each_sequences_last_token(tied):
    per_layer = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTER + 2 * HIDDEN  # q, k, v, o; gate, up, down; two norms
    head = VOCAB * HIDDEN  # the embedding's lookup is no GEMM: a tied head is counted once, as the head
    body = LAYERS * per_layer + HIDDEN  # and the final norm
    attention = 2 * LAYERS * HIDDEN * PROMPT ** 2 * BATCH  # QK^T and PV, causal: half of 2 x 2 x tokens^2
    want = 2 * body * BATCH * PROMPT + 2 * head * BATCH + attention
    floor = workload_floor(_model(tied), DEVICE, BATCH, PROMPT, decode_steps=1)
    assert floor.prefill_gflop * 1e9 == pytest.approx(want)
    # a decode step reads every weight once, the head's included
    assert floor.weight_bytes == pytest.approx(4 * (body + head))
