"""What a run needs in memory, from the model's config and the workload, before anything large is allocated. Served: the
engine's limits (the context length the load needs, not the model's window; KV space for the sequences in flight; a
GPU's share for the larger of the A/B's servers), an A/B that cannot fit refused in one line before anything starts,
the user's own memory flags winning (the real vLLM server started so is tests/test_vllm_served.py's served loop: its
model declares 32768 positions). In-process: a model too large for the host refused before it is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernelbot import KernelbotError
from kernelbot.cli import main
from kernelbot.engine import builtin_spec
from kernelbot.engine.memory import GIB, ModelFootprint, kv_values_per_token, model_footprint
from kernelbot.engine.models import build_model
from kernelbot.engine.serving import served_engine
from kernelbot.engine.serving.apis import APIS
from kernelbot.engine.serving.load import Workload
from kernelbot.engine.serving.serve_options import EngineKind, ServeOptions
from kernelbot.engine.serving.sizing import check_fits, plan_memory

QWEN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "hidden_act": "silu"}


def _model_dir(tmp_path: Path, config: dict, name: str = "model") -> str:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def test_the_footprint_of_a_qwen_shaped_config_is_read_without_building_it(tmp_path):
    spec, _ = builtin_spec(_model_dir(tmp_path, QWEN), dtype="bfloat16")
    fp = model_footprint(spec)
    assert fp.parameters == 494_032_768  # Qwen2.5-0.5B's, its embedding tied to the LM head
    assert fp.kv_bytes_per_token == 24 * 2 * 64 * 2 * 2  # layers x KV heads x head dim x (K, V) x bf16
    assert fp.max_positions == 32768


def test_the_parameter_count_from_the_config_is_the_built_models(tmp_path):
    small = dict(QWEN, num_hidden_layers=2, vocab_size=1024, hidden_size=128, intermediate_size=256,
                 num_attention_heads=4, num_key_value_heads=2)
    for tied in (True, False):
        spec, _ = builtin_spec(_model_dir(tmp_path, dict(small, tie_word_embeddings=tied), f"m{tied}"),
                               dtype="float32")
        model = build_model(spec)
        assert model_footprint(spec).parameters == sum(p.numel() for p in model.parameters())


def test_kv_values_per_token_follow_kv_heads_multi_query_and_latent_attention():
    from transformers import DeepseekV2Config, GPTBigCodeConfig, LlamaConfig

    gqa = LlamaConfig(num_hidden_layers=3, hidden_size=256, num_attention_heads=8, num_key_value_heads=2)
    assert kv_values_per_token(gqa) == 3 * 2 * 2 * 32
    mqa = GPTBigCodeConfig(n_layer=2, n_embd=256, n_head=8, multi_query=True)
    assert kv_values_per_token(mqa) == 2 * 2 * 1 * 32
    mla = DeepseekV2Config(num_hidden_layers=2, kv_lora_rank=512, qk_rope_head_dim=64)
    assert kv_values_per_token(mla) == 2 * (512 + 64)


def test_the_servers_context_is_the_workloads_and_never_above_the_models():
    fp = ModelFootprint(parameters=10**8, dtype_bytes=2, kv_bytes_per_token=12288, activation_bytes_per_token=1000,
                        max_positions=32768)
    plan = plan_memory(fp, longest_prompt=512, longest_output=128, in_flight=8, device_kind="cpu",
                       available_bytes=64 * GIB)
    assert plan.limits.context_len == 512 + 128 + 1  # the fidelity probe's one more token
    # 8 sequences of 641 tokens in whole 256-token blocks (768), 1.25x headroom, rounded to a block
    assert plan.limits.kv_tokens == 7680 and plan.limits.kv_cache_bytes == 7680 * 12288
    assert plan.limits.memory_fraction is None  # on a CPU the KV cache's bytes say it all
    short = fp.model_copy(update={"max_positions": 600})
    assert plan_memory(short, longest_prompt=512, longest_output=128, in_flight=8, device_kind="cpu",
                       available_bytes=64 * GIB).limits.context_len == 600


def test_on_a_gpu_weights_and_kv_split_over_tp_and_the_fraction_covers_the_packed_server():
    fp = ModelFootprint(parameters=7 * 10**9, dtype_bytes=2, kv_bytes_per_token=131072,
                        activation_bytes_per_token=100_000, max_positions=4096)
    one = plan_memory(fp, longest_prompt=2048, longest_output=256, in_flight=16, device_kind="cuda",
                      available_bytes=79 * GIB, device_total_bytes=80 * GIB)
    two = plan_memory(fp, longest_prompt=2048, longest_output=256, in_flight=16, device_kind="cuda",
                      available_bytes=79 * GIB, device_total_bytes=80 * GIB, tp=2)
    assert two.weight_bytes * 2 >= one.weight_bytes > two.weight_bytes
    assert two.limits.kv_cache_bytes < one.limits.kv_cache_bytes
    assert one.twin_bytes == 0  # the float64 twin lives on the host, not the GPU
    packed = 2 * one.weight_bytes + one.kv_bytes + one.runtime_bytes
    assert packed <= one.limits.memory_fraction * 80 * GIB < packed + 0.02 * 80 * GIB


def test_an_ab_that_does_not_fit_says_the_bytes_and_the_flags_in_one_line():
    fp = ModelFootprint(parameters=7 * 10**9, dtype_bytes=2, kv_bytes_per_token=131072,
                        activation_bytes_per_token=100_000, max_positions=32768)
    plan = plan_memory(fp, longest_prompt=512, longest_output=128, in_flight=8, device_kind="cpu",
                       available_bytes=20 * GIB)
    with pytest.raises(KernelbotError) as err:
        check_fits(plan, "vllm")
    message = str(err.value)
    assert "\n" not in message and "20.00 GiB is available" in message and "--server-arg" in message
    assert "weights 13.04 GiB each" in message and "serve a smaller model" in message
    kv_bound = fp.model_copy(update={"parameters": 10**8})
    long = plan_memory(kv_bound, longest_prompt=30000, longest_output=2000, in_flight=32, device_kind="cpu",
                       available_bytes=20 * GIB)
    with pytest.raises(KernelbotError, match="lower --batch, --prompt-len or --decode-steps"):
        check_fits(long, "vllm")
    check_fits(plan.model_copy(update={"available_bytes": 200 * GIB}), "vllm")  # fits: no error


def test_optimize_refuses_an_ab_that_does_not_fit_before_writing_the_model_or_starting_a_server(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(served_engine, "engine_version", lambda kind, python: "0.32.0")
    monkeypatch.setattr(served_engine, "host_available_bytes", lambda: 1 * GIB)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run_dir = tmp_path / "run"
    code = main(["optimize", "--engine", "vllm", "--model", _model_dir(tmp_path, QWEN), "--dtype", "bfloat16",
                 "--prompt-len", "512", "--decode-steps", "128", "--run-dir", str(run_dir), "--no-compile"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "the vllm A/B does not fit" in err and "1.00 GiB is available" in err
    assert not (run_dir / "model").exists() and not (run_dir / "serve").exists()


def _engine(tmp_path: Path, monkeypatch, server_args: list[str]) -> served_engine.ServedEngine:
    monkeypatch.setattr(served_engine, "engine_version", lambda kind, python: "0.32.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec, _ = builtin_spec("llama-micro", dtype="float32", prompt_len=16, decode_steps=8)
    opts = ServeOptions(engine=EngineKind.VLLM, server_args=server_args)
    workload = Workload(num_prompts=4, input_len=16, output_len=8, concurrency=4)
    return served_engine.ServedEngine(opts, spec, workload, tmp_path, lambda _: None)


def test_the_vllm_command_carries_the_workloads_limits(tmp_path, monkeypatch):
    engine = _engine(tmp_path, monkeypatch, [])
    setup = engine._setup("stock", None, tmp_path / "pack")
    command = APIS[EngineKind.VLLM].command(["vllm"], setup, 8000)
    assert command[command.index("--max-model-len") + 1] == "25"
    assert int(command[command.index("--kv-cache-memory-bytes") + 1]) == setup.limits.kv_cache_bytes > 0
    assert "--gpu-memory-utilization" not in command  # a fraction of host memory would size nothing here


def test_a_memory_flag_the_user_gives_wins_over_every_computed_limit(tmp_path, monkeypatch):
    engine = _engine(tmp_path, monkeypatch, ["--max-model-len=4096"])
    setup = engine._setup("stock", None, tmp_path / "pack")
    command = APIS[EngineKind.VLLM].command(["vllm"], setup, 8000)
    assert "--max-model-len=4096" in command
    assert "--max-model-len" not in command and "--kv-cache-memory-bytes" not in command


def test_the_sglang_command_carries_the_same_limits_in_its_own_flags(tmp_path, monkeypatch):
    setup = _engine(tmp_path, monkeypatch, [])._setup("stock", None, tmp_path / "pack")
    command = APIS[EngineKind.SGLANG].command(["sglang"], setup, 8000)
    assert command[command.index("--context-length") + 1] == "25"
    assert int(command[command.index("--max-total-tokens") + 1]) == setup.limits.kv_tokens
    assert "--mem-fraction-static" not in command


def test_an_in_process_run_too_large_for_the_host_is_refused_before_the_model_is_built(tmp_path, monkeypatch, capsys):
    from kernelbot.agent import engines

    monkeypatch.setattr(engines, "host_available_bytes", lambda: 2 * GIB)
    built = []
    monkeypatch.setattr(engines, "TorchEngine", lambda *a, **k: built.append(a))
    code = main(["optimize", "--model", _model_dir(tmp_path, QWEN), "--dtype", "bfloat16", "--prompt-len", "512",
                 "--decode-steps", "128", "--run-dir", str(tmp_path / "run"), "--no-compile"])
    err = capsys.readouterr().err
    assert code == 2 and not built, err
    assert "in this process needs 5.78 GiB of host memory" in err and "the float64 twin 3.68 GiB" in err
    assert "2.00 GiB is available" in err and "\n" not in err.strip()
