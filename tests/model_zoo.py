"""Tiny Hugging Face model directories for tests, one per kind of architecture the engine must run.

Each is written the way a real checkpoint is: config.json from the transformers config class's save_pretrained,
and, when asked for, weights from the model's own save_pretrained (safetensors). Every model is tiny (hidden 64,
2 layers, vocab 256), so a forward takes milliseconds; each still exercises the feature it is here for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

TINY: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)
SMALL_WINDOW = 8  # below the tests' prompt + decode length, so the window really cuts attention off


@dataclass(frozen=True)
class ZooModel:
    name: str
    exercises: str  # what this architecture adds over the others, for people reading a failure
    config: Callable[[], Any]  # a transformers PretrainedConfig


def _llama() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**TINY)


def _qwen2() -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(**TINY)


def _mistral() -> Any:
    from transformers import MistralConfig

    return MistralConfig(**TINY, sliding_window=SMALL_WINDOW)


def _gpt_neox() -> Any:
    from transformers import GPTNeoXConfig

    sizes = {k: v for k, v in TINY.items() if k != "num_key_value_heads"}
    return GPTNeoXConfig(**sizes, hidden_act="gelu", use_parallel_residual=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})


def _gpt2() -> Any:
    from transformers import GPT2Config

    return GPT2Config(n_embd=TINY["hidden_size"], n_layer=TINY["num_hidden_layers"], n_head=TINY["num_attention_heads"],
                      vocab_size=TINY["vocab_size"], n_positions=TINY["max_position_embeddings"])


def _mixtral() -> Any:
    from transformers import MixtralConfig

    return MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2)


def _qwen2_moe() -> Any:
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(**TINY, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          shared_expert_intermediate_size=64, decoder_sparse_step=1)


def _gemma2() -> Any:
    from transformers import Gemma2Config

    return Gemma2Config(**TINY, head_dim=16, sliding_window=SMALL_WINDOW, final_logit_softcapping=30.0,
                        attn_logit_softcapping=50.0)


def _bloom() -> Any:
    from transformers import BloomConfig

    return BloomConfig(hidden_size=TINY["hidden_size"], n_layer=TINY["num_hidden_layers"],
                       n_head=TINY["num_attention_heads"], vocab_size=TINY["vocab_size"])


def _phi() -> Any:
    from transformers import PhiConfig

    sizes = {k: v for k, v in TINY.items() if k != "num_key_value_heads"}
    return PhiConfig(**sizes, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 0.5})


ZOO: dict[str, ZooModel] = {m.name: m for m in [
    ZooModel("llama", "the reference: RMSNorm, gated SiLU MLP, GQA, full rotary", _llama),
    ZooModel("qwen2", "GQA with biased q/k/v projections", _qwen2),
    ZooModel("mistral", "sliding-window attention shorter than the sequence", _mistral),
    ZooModel("gpt-neox", "LayerNorm, parallel residual, partial rotary (1/4), plain GELU MLP, fused qkv", _gpt_neox),
    ZooModel("gpt2", "Conv1D projections (addmm over a [in, out] weight), fused c_attn, learned positions, no "
             "rotary, GELU (tanh) MLP, dropout layers", _gpt2),
    ZooModel("mixtral", "mixture of experts (4 experts, top 2)", _mixtral),
    ZooModel("qwen2-moe", "mixture of experts with a gated shared expert", _qwen2_moe),
    ZooModel("gemma2", "attention and final-logit soft-capping, alternating sliding window, tied embeddings, eager "
             "attention (it refuses sdpa)", _gemma2),
    ZooModel("bloom", "ALiBi attention (no rotary, no position embeddings), fused per-head q/k/v, the residual added "
             "inside attention and MLP, LayerNorm after the embeddings", _bloom),
    ZooModel("phi", "LayerNorm, parallel attention + MLP off one norm, partial rotary (1/2), biased dense layers",
             _phi),
]}


def write_model_dir(root: Path, name: str) -> Path:
    """root/name holding only the zoo model's config.json, as its config class's save_pretrained writes it."""
    directory = root / name
    ZOO[name].config().save_pretrained(directory)
    return directory


def write_model_with_weights(root: Path, name: str, seed: int = 0,
                             max_shard_size: str = "50GB") -> tuple[Path, torch.nn.Module]:
    """root/name holding config.json and the safetensors of a model drawn with `seed` (fp32), as the model's
    save_pretrained writes them (sharded, with an index, when over `max_shard_size`); and that model, in eval
    mode, to compare with."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    directory = root / name
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(ZOO[name].config(), dtype=torch.float32).eval()
    hf_logging.disable_progress_bar()
    model.save_pretrained(directory, max_shard_size=max_shard_size)
    return directory, model
