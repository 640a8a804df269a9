"""Decoder layers whose attention runs a pack kernel are run part to part (engine/layer_route.py) only where that
gives exactly what the layer's own forward gives; the engine binds a kernel's hot path only where the candidate
left the library's methods as they are."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from kernelbot.engine import TorchEngine
from kernelbot.engine.models import resolve_spec
from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.base import hot_path as _bound
from kernelbot.kernel_library.gated_mlp.cpp import GatedMLPCpp
from kernelbot.kernel_library.linear.cpp import LinearCpp
from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp
from kernelbot.records import Pack, PackEntry


def _entry(engine: TorchEngine, family: str, module: torch.nn.Module, shapes: list[list[int]], pack_dir: Path,
           name: str) -> PackEntry:
    source = FAMILIES[family].candidate_source("cpp", {"grain": 4})
    (pack_dir / "kernels").mkdir(parents=True, exist_ok=True)
    (pack_dir / "kernels" / f"{name}.py").write_text(source)
    return PackEntry(task_id=name, candidate_id=name, family=family, module_class=type(module).__name__,
                     input_shapes=shapes, init_args=FAMILIES[family].init_args(module), dtype=engine.spec.dtype,
                     backend="cpp", config={"grain": 4}, source_file=f"kernels/{name}.py", source_hash="0",
                     verification="pass", speedup=2.0)


def _whole_layer_pack(engine: TorchEngine, pack_dir: Path) -> Pack:
    """Attention (decode and prefill), both norms and the MLP at decode: every part of every layer."""
    layer = engine.model.model.layers[0]
    attention, batch, prompt = layer.self_attn, engine.spec.batch, engine.spec.prompt_len
    hidden, d = attention.q_proj.in_features, attention.head_dim
    kv = attention.k_proj.out_features // d
    decode = [[batch, 1, hidden], [1, 1, d], [1, 1, d], [batch, kv, prompt, d], [batch, kv, prompt, d]]
    prefill = [[batch, prompt, hidden], [1, prompt, d], [1, prompt, d], [batch, kv, 0, d], [batch, kv, 0, d]]
    entries = [_entry(engine, "decode_attention", attention, decode, pack_dir, "attn"),
               _entry(engine, "decode_attention", attention, prefill, pack_dir, "attn-prefill"),
               _entry(engine, "rmsnorm", layer.input_layernorm, [[batch, 1, hidden]], pack_dir, "norm"),
               _entry(engine, "gated_mlp", layer.mlp, [[batch, 1, hidden]], pack_dir, "mlp")]
    return Pack(version="v", run_id="r", device="cpu", entries=entries)


def _run(engine: TorchEngine) -> tuple[torch.Tensor, torch.Tensor]:
    engine.patcher.reset_counts()
    tokens, logits = engine.generate(record_logits=True)
    return tokens, torch.stack(logits)


def _without_layer_routes(engine: TorchEngine) -> dict:
    return {i: vars(layer).pop("forward") for i, layer in enumerate(engine.model.model.layers)
            if "forward" in vars(layer)}


def test_layers_whose_parts_run_pack_kernels_run_part_to_part_with_the_same_logits_and_counts(tmp_path):
    spec, _ = resolve_spec("llama-micro", "float32", 2, 6, 4, 0)
    engine = TorchEngine(spec)
    engine.apply_pack(_whole_layer_pack(engine, tmp_path), tmp_path)
    assert engine.patcher.lean_layers == [f"model.layers.{i}" for i in range(spec.layers or 0)]
    tokens, logits = _run(engine)
    counts = dict(engine.patcher.counts)
    routes = _without_layer_routes(engine)
    module_tokens, module_logits = _run(engine)
    assert counts == dict(engine.patcher.counts)
    layers = spec.layers or 0
    assert counts["attn"] == counts["mlp"] == layers * spec.decode_steps and counts["attn-prefill"] == layers
    assert counts["norm"] >= 2 * layers * spec.decode_steps
    assert torch.equal(tokens, module_tokens) and torch.equal(logits, module_logits)
    for i, forward in routes.items():
        engine.model.model.layers[i].forward = forward
    engine.remove_pack()
    assert engine.patcher.lean_layers == [] and all("forward" not in vars(m) for m in engine.model.modules())


class _ScaledResidual(LlamaDecoderLayer):
    """A layer that is not x + attention(norm(x)): its residual is halved."""

    def forward(self, hidden_states, **kwargs):
        attended, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        x = 0.5 * hidden_states + attended
        return x + self.mlp(self.post_attention_layernorm(x))


def test_a_layer_that_is_not_a_pre_norm_residual_block_keeps_its_own_forward(tmp_path):
    spec, _ = resolve_spec("llama-micro", "float32", 2, 6, 3, 0)
    engine = TorchEngine(spec)
    engine.model.model.layers[0].__class__ = _ScaledResidual
    engine.apply_pack(_whole_layer_pack(engine, tmp_path), tmp_path)
    assert engine.patcher.lean_layers == ["model.layers.1"]
    tokens, logits = _run(engine)
    routes = _without_layer_routes(engine)
    module_tokens, module_logits = _run(engine)
    assert torch.equal(logits, module_logits) and torch.equal(tokens, module_tokens)
    for i, forward in routes.items():
        engine.model.model.layers[i].forward = forward


def test_under_the_profiler_a_routed_layer_runs_its_own_forward_so_every_part_is_seen(tmp_path):
    spec, _ = resolve_spec("llama-micro", "float32", 2, 6, 2, 0)
    engine = TorchEngine(spec)
    engine.apply_pack(_whole_layer_pack(engine, tmp_path), tmp_path)
    seen: list[str] = []
    handles = [m.register_forward_hook(lambda m, a, o: seen.append(type(m).__name__))
               for m in engine.model.modules() if type(m).__name__ == "LlamaMLP"]
    engine.run_workload()
    assert seen == []  # part to part, a part runs its kernel or its own forward, not its module's call
    engine.remove_pack()
    engine.run_workload()
    assert len(seen) == (spec.layers or 0) * (1 + spec.decode_steps)
    engine.apply_pack(_whole_layer_pack(engine, tmp_path), tmp_path)
    seen.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        engine.run_workload()
    assert len(seen) == (spec.layers or 0) * (1 + spec.decode_steps)
    for h in handles:
        h.remove()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_bound_hot_path_of_each_library_kernel_computes_its_forward(dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 1, 64).to(dtype)
    name = str(dtype).removeprefix("torch.")
    for kernel in [RMSNormCpp(64, 1e-6, name), GatedMLPCpp(64, 96, name), LinearCpp(64, 40, True, name)]:
        family = type(kernel).__name__
        for p in kernel.parameters():
            torch.nn.init.normal_(p, std=0.1)
        bound = _bound(kernel, name)
        assert bound is not None, family
        assert torch.equal(bound(x), kernel.forward(x)), family


def test_a_candidate_that_redefines_a_library_method_is_never_bound():
    class Plain(RMSNormCpp):
        CONFIG = {"grain": 4}

    class OwnForward(RMSNormCpp):
        def forward(self, hidden_states):
            return super().forward(hidden_states) * 1.01

    class OwnBound(RMSNormCpp):
        def bound(self, dtype):
            return lambda hidden_states: hidden_states

    assert _bound(Plain(8, 1e-6), "float32") is not None
    assert _bound(OwnForward(8, 1e-6), "float32") is None
    assert _bound(OwnBound(8, 1e-6), "float32") is None


def test_an_attention_kernel_is_bound_through_its_shared_step_but_never_beside_another_forward():
    """The C++ attentions take step and bound from one base (decode_attention's StepAttentionCpp) and forward from
    their own class or a mixin: bound. A class whose forward is another library class's (a reference's, which never
    runs the bound step) is not, whatever order its bases come in."""
    from kernelbot.kernel_library.decode_attention.cpp import DecodeAttentionCpp
    from kernelbot.kernel_library.fused_attention.cpp import FusedAttentionCpp
    from kernelbot.kernel_library.neox_attention.reference import Model as NeoxReference

    class ReferenceForward(NeoxReference, DecodeAttentionCpp):
        pass

    assert _bound(DecodeAttentionCpp(64, 4, 2, 16), "float32") is not None
    assert _bound(FusedAttentionCpp(64, 4, 16, 0.25), "float32") is not None
    assert _bound(ReferenceForward.__new__(ReferenceForward), "float32") is None  # built bare: its bases' inits differ


def test_the_report_names_the_layers_run_part_to_part_and_leaves_the_model_as_it_was(tmp_path):
    from kernelbot.agent.measure.end_to_end import layer_routes_note

    spec, _ = resolve_spec("llama-micro", "float32", 2, 6, 2, 0)
    engine = TorchEngine(spec)
    pack = _whole_layer_pack(engine, tmp_path)
    note = layer_routes_note(engine, pack, tmp_path)
    assert note is not None and note.startswith("2 decoder layer(s)") and "model.layers.1" in note
    assert all("forward" not in vars(m) for m in engine.model.modules())
    only_norms = Pack(version="v", run_id="r", device="cpu", entries=[e for e in pack.entries if e.family == "rmsnorm"])
    assert layer_routes_note(engine, only_norms, tmp_path) is None
