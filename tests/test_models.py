"""`--model` takes a local Hugging Face causal-LM directory: every zoo architecture builds and decodes, saved weights
load exactly, bad directories end in one line, and the built-in models are what they were."""

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from model_zoo import ZOO, write_model_dir, write_model_with_weights

from kernelbot import KernelbotError
from kernelbot.engine.kv_cache import cache_kwarg, returned_cache
from kernelbot.engine.models import build_model, builtin_spec, resolve_spec
from kernelbot.engine.torch_engine import TorchEngine

WORKLOAD = dict(dtype="float32", batch=2, prompt_len=10, decode_steps=4)  # 14 positions: past the zoo's window of 8


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zoo")
    return {name: write_model_dir(root, name) for name in ZOO}


def _one_line_error(match: str, model: str, **workload: object) -> str:
    with pytest.raises(KernelbotError, match=match) as caught:
        resolve_spec(model, **{**WORKLOAD, **workload})
    message = str(caught.value)
    assert "\n" not in message
    return message


def _first_weight(model: torch.nn.Module) -> torch.Tensor:
    return next(iter(model.state_dict().values()))


@pytest.mark.parametrize("name", list(ZOO))
def test_every_zoo_architecture_builds_from_its_directory_and_decodes_the_same_for_a_seed(zoo, name):
    spec, notes = resolve_spec(str(zoo[name]), **WORKLOAD)
    config = ZOO[name].config()
    assert (spec.name, spec.path, spec.model_type) == (name, str(zoo[name].resolve()), config.model_type)
    assert spec.architecture.endswith(("ForCausalLM", "LMHeadModel"))  # GPT2LMHeadModel
    assert (spec.layers, spec.hidden, spec.vocab, spec.weights) == (2, 64, 256, "seeded random")
    assert any("seeded random weights" in note for note in notes)
    engine = TorchEngine(spec)
    tokens = engine.run_workload()
    assert tokens.shape == (2, 5)  # the prefill's token, then 4 decode steps
    assert int(tokens.max()) < spec.vocab
    assert torch.equal(tokens, TorchEngine(spec).run_workload())
    other_seed = build_model(spec.model_copy(update={"seed": 1}))
    assert not torch.equal(_first_weight(other_seed), _first_weight(engine.model))


@pytest.mark.parametrize("name", list(ZOO))
def test_cached_decode_gives_the_logits_of_recomputing_the_whole_sequence(zoo, name):
    spec, _ = resolve_spec(str(zoo[name]), **WORKLOAD)
    engine = TorchEngine(spec)
    tokens, logits = engine.generate(record_logits=True)
    sequence = torch.cat([engine.prompts, tokens[:, :-1]], dim=1)
    with torch.inference_mode():
        whole = engine.model(input_ids=sequence, use_cache=False).logits
    recomputed = whole[:, spec.prompt_len - 1:].double()
    torch.testing.assert_close(torch.stack(logits, dim=1), recomputed, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(ZOO))
def test_the_float64_twin_runs_every_architecture_close_to_its_fp32_model(zoo, name):
    spec, _ = resolve_spec(str(zoo[name]), **WORKLOAD)
    engine = TorchEngine(spec)
    tokens, logits = engine.generate(record_logits=True)
    exact = engine.in_float64()
    _, exact_logits = exact.generate(record_logits=True, forced=tokens)
    assert next(exact.model.parameters()).dtype == torch.float64
    torch.testing.assert_close(torch.stack(exact_logits), torch.stack(logits), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("name", list(ZOO))
def test_saved_safetensors_load_and_give_the_logits_of_the_model_that_saved_them(tmp_path, name):
    directory, saver = write_model_with_weights(tmp_path, name, seed=3)
    spec, notes = resolve_spec(str(directory), **WORKLOAD)
    tensors = int(spec.weights.removeprefix("safetensors (").removesuffix(" tensors)"))
    assert tensors > 0
    assert any("declares dtype float32" in note for note in notes)
    engine = TorchEngine(spec)
    with torch.inference_mode():
        assert torch.equal(engine.model(input_ids=engine.prompts).logits, saver(input_ids=engine.prompts).logits)


def test_sharded_safetensors_with_an_index_load_every_shard(tmp_path):
    directory, saver = write_model_with_weights(tmp_path, "qwen2", seed=5, max_shard_size="40KB")
    assert len(list(directory.glob("*.safetensors"))) > 1 and (directory / "model.safetensors.index.json").is_file()
    spec, _ = resolve_spec(str(directory), **WORKLOAD)
    assert spec.weights == f"safetensors ({len(saver.state_dict())} tensors)"
    engine = TorchEngine(spec)
    with torch.inference_mode():
        assert torch.equal(engine.model(input_ids=engine.prompts).logits, saver(input_ids=engine.prompts).logits)


def test_a_directory_without_config_json_is_a_one_line_error(tmp_path):
    _one_line_error("has no config.json", str(tmp_path))


def test_a_path_that_is_neither_a_built_in_nor_a_directory_is_a_one_line_error(tmp_path):
    _one_line_error("unknown model .*llama-tiny", str(tmp_path / "absent"))


def test_a_config_with_an_unknown_model_type_names_it_and_the_transformers_version(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kb-unheard-of",
                                                      "architectures": ["UnheardOfForCausalLM"]}))
    message = _one_line_error("kb-unheard-of", str(tmp_path))
    assert "UnheardOfForCausalLM" in message and "transformers 5." in message


def test_a_config_that_needs_remote_code_is_refused_without_running_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kb-custom",
                                                      "auto_map": {"AutoConfig": "custom.KbConfig"}}))
    (tmp_path / "custom.py").write_text("raise SystemExit('remote code ran')\n")
    _one_line_error("remote code", str(tmp_path))


def test_a_config_transformers_cannot_build_as_a_causal_lm_is_refused(tmp_path):
    from transformers import ViTConfig

    vision = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    vision.save_pretrained(tmp_path)
    _one_line_error("no causal-LM model for model_type 'vit'", str(tmp_path))


def test_a_config_that_is_not_json_is_a_one_line_error(tmp_path):
    (tmp_path / "config.json").write_text("{ not json")
    _one_line_error("not readable JSON", str(tmp_path))


def test_safetensors_whose_shapes_do_not_match_the_config_name_the_tensors(tmp_path):
    directory, _ = write_model_with_weights(tmp_path, "qwen2")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "vocab_size": 300}))
    spec, _ = resolve_spec(str(directory), **WORKLOAD)
    with pytest.raises(KernelbotError, match="do not match its config.json") as caught:
        TorchEngine(spec)
    assert "model.embed_tokens.weight ([256, 64] saved, [300, 64] expected)" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_safetensors_missing_a_tensor_name_it(tmp_path):
    from safetensors.torch import load_file, save_file

    directory, _ = write_model_with_weights(tmp_path, "mistral")
    tensors = load_file(directory / "model.safetensors")
    dropped = "model.layers.1.self_attn.k_proj.weight"
    save_file({k: v for k, v in tensors.items() if k != dropped}, directory / "model.safetensors",
              metadata={"format": "pt"})
    spec, _ = resolve_spec(str(directory), **WORKLOAD)
    with pytest.raises(KernelbotError, match=f"missing {dropped}"):
        build_model(spec)


def test_a_damaged_safetensors_file_is_a_one_line_error(tmp_path):
    directory, _ = write_model_with_weights(tmp_path, "llama")
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    _one_line_error("model.safetensors is not a readable safetensors file", str(directory))


def test_the_workload_must_fit_the_models_positions(zoo):
    _one_line_error("needs 200 positions .* max_position_embeddings is 128", str(zoo["llama"]), prompt_len=190,
                    decode_steps=10)


@dataclass
class OldStyleOutput:
    """An output that is no Mapping, with the cache under its pre-transformers-5 name."""

    logits: torch.Tensor
    past_key_values: Any


class OldCacheName(torch.nn.Module):
    """A causal LM that takes and returns its cache as `past_key_values`, as models before transformers 5 did."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, use_cache: bool = False) -> OldStyleOutput:
        out = self.inner(input_ids=input_ids, use_cache=use_cache, **{cache_kwarg(self.inner.forward): past_key_values})
        return OldStyleOutput(logits=out.logits, past_key_values=returned_cache(out))


class NoCache(torch.nn.Module):
    """A causal LM whose forward takes no cache at all."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor) -> Any:
        return self.inner(input_ids=input_ids, use_cache=False)


@pytest.mark.parametrize("wrapper", [OldCacheName, NoCache])
def test_a_model_that_takes_its_cache_under_the_old_name_or_none_decodes_the_same(zoo, wrapper):
    spec, _ = resolve_spec(str(zoo["mistral"]), **WORKLOAD)
    engine = TorchEngine(spec)
    twin = object.__new__(TorchEngine)
    twin.spec, twin.prompts = spec, engine.prompts
    twin._use(wrapper(engine.model))
    assert twin.cache_name == ("past_key_values" if wrapper is OldCacheName else None)
    assert torch.equal(twin.run_workload(), engine.run_workload())


def test_built_in_names_still_resolve_and_llama_tiny_is_the_model_it_was():
    from transformers import LlamaConfig, LlamaForCausalLM

    assert builtin_spec is resolve_spec
    micro, _ = resolve_spec("llama-micro", dtype="float32")
    assert (micro.layers, micro.hidden, micro.vocab, micro.path) == (2, 128, 512, None)
    spec, notes = resolve_spec("llama-tiny", dtype="float32")
    assert (spec.layers, spec.hidden, spec.heads, spec.intermediate, spec.vocab) == (4, 512, 8, 1376, 4000)
    assert (spec.architecture, spec.weights, spec.path, notes) == ("LlamaForCausalLM", "seeded random", None, [])
    # the recipe llama-tiny was built with before directories existed
    config = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=8, vocab_size=4000, max_position_embeddings=256)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    before = LlamaForCausalLM(config).eval()
    now = build_model(spec)
    assert now.config._attn_implementation == "sdpa"
    assert list(now.state_dict()) == list(before.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(now.state_dict().values(), before.state_dict().values(), strict=True))


def test_the_report_line_names_the_architecture_the_directory_and_the_weights(zoo, tmp_path):
    spec, _ = resolve_spec(str(zoo["gpt-neox"]), **WORKLOAD)
    assert spec.summary() == (f"GPTNeoXForCausalLM from {zoo['gpt-neox'].resolve()}: 2 layers, 4 heads, hidden 64, "
                              "vocab 256; float32; seeded random weights")
    directory, saver = write_model_with_weights(tmp_path, "phi")
    loaded, _ = resolve_spec(str(directory), **WORKLOAD)
    assert loaded.summary().endswith(f"float32; safetensors ({len(saver.state_dict())} tensors) weights")


def test_the_cli_refuses_a_model_that_does_not_exist_with_one_line_and_exit_2(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "kernelbot.cli", "optimize", "--model", "/nonexistent",
                           "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown model '/nonexistent'" in lines[0] and "Traceback" not in proc.stderr
    assert not run_dir.exists()


@pytest.mark.slow
def test_the_compiled_twin_of_a_mixture_of_experts_model_decodes_the_same(zoo):
    spec, _ = resolve_spec(str(zoo["mixtral"]), **WORKLOAD)
    engine = TorchEngine(spec)
    tokens, logits = engine.generate(record_logits=True)
    compiled_tokens, compiled_logits = engine.compiled().generate(record_logits=True)
    assert torch.equal(compiled_tokens, tokens)
    torch.testing.assert_close(torch.stack(compiled_logits), torch.stack(logits), atol=1e-4, rtol=1e-4)
