"""The decode-attention family in a pack: transformers' attention calls, with their DynamicCache, routed to the
kernel at the verified batch and tokens whatever the cache's length; other calls fall back and are counted."""

from __future__ import annotations

from pathlib import Path

import torch

from kernelbot.engine import TorchEngine
from kernelbot.engine.models import resolve_spec
from kernelbot.kernel_library import FAMILIES, classes_covered
from kernelbot.records import Pack, PackEntry

ATTENTION = FAMILIES["decode_attention"]


def entry_for(engine: TorchEngine, shapes: list[list[int]], pack_dir: Path, name: str) -> PackEntry:
    module = engine.model.model.layers[0].self_attn
    source = ATTENTION.candidate_source("cpp", {"grain": 4})
    (pack_dir / "kernels").mkdir(parents=True, exist_ok=True)
    (pack_dir / "kernels" / f"{name}.py").write_text(source)
    return PackEntry(task_id=name, candidate_id=name, family="decode_attention", module_class=type(module).__name__,
                     input_shapes=shapes, init_args=ATTENTION.init_args(module), dtype=engine.spec.dtype,
                     backend="cpp", config={"grain": 4}, source_file=f"kernels/{name}.py", source_hash="0",
                     verification="pass", speedup=2.0)


def test_llama_attention_is_covered_by_structure_not_by_its_class_name():
    spec, _ = resolve_spec("llama-micro", "float32", 2, 4, 2, 0)
    assert classes_covered(TorchEngine(spec).model).get("LlamaAttention") == "decode_attention"


def test_decode_steps_of_any_cache_length_run_the_kernel_and_the_tokens_stay(tmp_path):
    spec, _ = resolve_spec("llama-micro", "float32", 2, 6, 5, 0)
    engine = TorchEngine(spec)
    tokens_before = engine.run_workload()
    layer = engine.model.model.layers[0].self_attn
    heads, d = layer.k_proj.out_features // layer.head_dim, layer.head_dim
    decode = [[2, 1, 128], [1, 1, d], [1, 1, d], [2, heads, 6, d], [2, heads, 6, d]]
    prefill = [[2, 6, 128], [1, 6, d], [1, 6, d], [2, heads, 0, d], [2, heads, 0, d]]
    pack = Pack(version="v", run_id="r", device="cpu", entries=[entry_for(engine, decode, tmp_path, "decode"),
                                                                 entry_for(engine, prefill, tmp_path, "prefill")])
    engine.apply_pack(pack, tmp_path)
    tokens_after = engine.run_workload()
    engine.remove_pack()
    layers = spec.layers or 0
    assert engine.patcher.counts["decode"] == layers * spec.decode_steps  # cache lengths 6..10, one kernel
    assert engine.patcher.counts["prefill"] == layers
    assert engine.patcher.fallbacks["LlamaAttention"] == 0
    assert torch.equal(tokens_before, tokens_after)


def test_a_batch_the_kernel_was_not_verified_for_falls_back(tmp_path):
    spec, _ = resolve_spec("llama-micro", "float32", 3, 6, 2, 0)
    engine = TorchEngine(spec)
    layer = engine.model.model.layers[0].self_attn
    heads, d = layer.k_proj.out_features // layer.head_dim, layer.head_dim
    other_batch = [[2, 1, 128], [1, 1, d], [1, 1, d], [2, heads, 6, d], [2, heads, 6, d]]
    pack = Pack(version="v", run_id="r", device="cpu", entries=[entry_for(engine, other_batch, tmp_path, "b2")])
    engine.apply_pack(pack, tmp_path)
    engine.run_workload()
    engine.remove_pack()
    assert engine.patcher.counts["b2"] == 0
    assert engine.patcher.fallbacks["LlamaAttention"] == (spec.layers or 0) * (1 + spec.decode_steps)
