"""Generic tasks: a module call extracted from a live model into a self-contained reference, and routed back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from kernelbot.agent.tasks.references import _computes, module_labels
from kernelbot.agent.verify import cases
from kernelbot.engine import extract
from kernelbot.engine.patching import PackPatcher
from kernelbot.loading import load_module
from kernelbot.records import Pack, PackEntry, Task


def tiny_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128)
    return LlamaForCausalLM(config).eval()


def workload(model: nn.Module) -> None:
    with torch.inference_mode():
        out = model(input_ids=torch.randint(0, 128, (2, 5)), use_cache=True)
        for _ in range(3):
            out = model(input_ids=torch.randint(0, 128, (2, 1)), past_key_values=out.past_key_values, use_cache=True)


def write_reference(module: nn.Module, model: nn.Module, tmp_path: Path, name: str) -> tuple[Path, extract.Extracted]:
    ex = extract.extract(module, extract.capture(module, lambda: workload(model)))
    path = tmp_path / f"{name}.py"
    path.write_text(extract.reference_source(ex, module, name, "float32"))
    return path, ex


def test_capture_cuts_the_workload_short_once_enough_calls_had_the_profiled_shape():
    model = tiny_llama()
    mlp = model.model.layers[0].mlp
    steps = []
    model.register_forward_pre_hook(lambda *_: steps.append(1))

    calls = extract.capture(mlp, lambda: workload(model), shape=[2, 1, 64], enough=2)
    assert [list(c.args[0].shape) for c in calls] == [[2, 5, 64], [2, 1, 64], [2, 1, 64]]
    assert len(steps) == 3  # prefill and two decode steps of four: the last one never ran
    assert all(c.output is not None for c in calls)
    steps.clear()
    assert len(extract.capture(mlp, lambda: workload(model))) == 4 and len(steps) == 4  # no shape: the whole run


def test_an_extracted_rotary_embedding_is_a_reference_that_computes_what_the_module_computes(tmp_path):
    model = tiny_llama()
    rotary = model.model.rotary_emb
    path, ex = write_reference(rotary, model, tmp_path, "rotary")
    ref = load_module(path, "kb_test_rotary_ref")
    assert ref.INPUT_DTYPES == ["float32", "int64"]
    reference = ref.Model()
    reference.load_state_dict(dict(rotary.named_buffers()))
    for inputs in ex.samples:
        want = rotary(inputs[0], position_ids=inputs[1])
        got = reference(*inputs)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_an_extracted_reference_passes_the_verifiers_planning_and_strength_checks(tmp_path):
    model = tiny_llama()
    path, ex = write_reference(model.model.layers[0].mlp, model, tmp_path, "mlp")
    module = load_module(path, "kb_test_mlp_ref")
    task = Task(id="t", hotspot_id="h", family="generic", module_class="LlamaMLP", dtype="float32",
                input_shapes=[t.shape for t in ex.signature.tensors], free_dims=[[]], init_args=[], share=0.1,
                floor_us=0.0)
    plan = cases.plan(module, task, seed=3)
    cases.check_strength(module, plan, init_seed=4)  # raises WeakTask if the output did not follow the inputs
    assert plan.cases[0].inputs[0].shape == torch.Size(ex.signature.tensors[0].shape)


def test_a_call_that_carries_a_kv_cache_is_not_extracted_and_says_why():
    model = tiny_llama()
    layer = model.model.layers[0]
    with pytest.raises(extract.NotExtractable, match="DynamicCache"):
        extract.extract(layer, extract.capture(layer, lambda: workload(model)))


class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x - 1  # control flow on a value: no fixed graph


def test_control_flow_that_depends_on_values_is_refused():
    module = Branchy()
    calls = extract.capture(module, lambda: module(torch.ones(3)))
    with pytest.raises(extract.NotExtractable, match="does not trace to a fixed graph"):
        extract.extract(module, calls)


def test_modules_with_other_constants_do_not_compute_the_extracted_graph():
    norm, other, same = nn.LayerNorm(8, eps=1e-5), nn.LayerNorm(8, eps=1e-3), nn.LayerNorm(8, eps=1e-5)
    ex = extract.extract(norm, extract.capture(norm, lambda: norm(torch.randn(2, 8))))
    assert _computes(same, ex)
    assert not _computes(other, ex)


def test_trace_labels_map_to_the_live_modules_in_first_call_order():
    model = tiny_llama()
    labels = module_labels(model, lambda: workload(model))
    assert labels["Embedding_0"] == "model.embed_tokens"
    assert labels["Linear_14"] == "lm_head"  # 7 linears per layer, 2 layers, then the head
    assert labels["LlamaDecoderLayer_1"] == "model.layers.1"


def _generic_pack(model: torch.nn.Module, tmp_path, scale: float) -> tuple[Pack, Path, list[int]]:
    """A pack of one generic kernel for the model's final norm: the extracted reference itself, times `scale`."""
    path, ex = write_reference(model.model.norm, model, tmp_path, "norm")
    pack_dir = tmp_path / "pack"
    (pack_dir / "kernels").mkdir(parents=True)
    kernel = f"class ModelNew(Model):\n    def forward(self, x0):\n        return super().forward(x0) * {scale}\n"
    (pack_dir / "kernels" / "k.py").write_text(path.read_text() + "\n\n" + kernel)
    entry = PackEntry(task_id="t", candidate_id="t__k", family="generic", module_class="LlamaRMSNorm",
                      input_shapes=[t.shape for t in ex.signature.tensors], init_args=[], dtype="float32",
                      backend="cpp", config={}, source_file="kernels/k.py", source_hash="0", verification="pass",
                      speedup=1.0, signature=ex.signature, module_paths=["model.norm"])
    return Pack(version="v", run_id="r", device="cpu", entries=[entry]), pack_dir, ex.signature.tensors[0].shape


def test_a_generic_pack_entry_routes_only_calls_with_the_extracted_signature(tmp_path):
    model = tiny_llama()
    norm = model.model.norm
    pack, pack_dir, shape = _generic_pack(model, tmp_path, scale=1.0)
    patcher = PackPatcher(model)
    patcher.apply(pack, pack_dir)
    x = torch.randn(shape)
    with torch.inference_mode():
        routed = norm(x)
        other = norm(torch.randn(3, 1, 64))  # another shape: falls back to the module's own forward
    patcher.remove()
    with torch.inference_mode():
        assert torch.allclose(routed, norm(x), atol=1e-6)
    assert other.shape == (3, 1, 64)
    assert patcher.counts["t__k"] == 1
    assert patcher.fallbacks["LlamaRMSNorm"] == 1


def test_a_kernel_whose_first_call_differs_from_the_modules_own_output_stops_taking_its_calls(tmp_path):
    model = tiny_llama()
    norm = model.model.norm
    pack, pack_dir, shape = _generic_pack(model, tmp_path, scale=2.0)  # verified elsewhere, wrong in this model
    patcher = PackPatcher(model)
    patcher.apply(pack, pack_dir)
    x = torch.randn(shape)
    with torch.inference_mode():
        first, second = norm(x), norm(x)
    patcher.remove()
    with torch.inference_mode():
        own = norm(x)
    assert torch.equal(first, own) and torch.equal(second, own)
    assert patcher.counts["t__k"] == 0 and patcher.fallbacks["LlamaRMSNorm"] == 2
    reasons = patcher.router.fallback["LlamaRMSNorm"]
    assert all("differs" in why for why in reasons), reasons


def test_a_module_that_computes_nothing_at_its_call_is_skipped_not_given_a_kernel():
    x = torch.randn(2, 5, 8)
    for module in (nn.Dropout(0.1).eval(), nn.Identity()):
        with pytest.raises(extract.NotExtractable, match="computes nothing"):
            extract.extract(module, [extract.Call((x,), {}, module(x))])
    moved = nn.Flatten(0, 1)  # a view that changes the shape is work the caller sees: extracted
    assert extract.extract(moved, [extract.Call((x,), {}, moved(x))]).signature.tensors[0].shape == [2, 5, 8]
