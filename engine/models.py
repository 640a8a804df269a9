"""Which model a run uses: a built-in Llama made from fixed numbers, or any local Hugging Face causal-LM directory.

A directory is read with transformers (local files only, no remote code): config.json gives the architecture, and
`*.safetensors` weights are loaded when present (strictly: a missing, unexpected or mis-shaped tensor is an
error); without weights the model gets seeded random weights, as the built-ins do.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kernelbot import KernelbotError
from kernelbot.records import ModelSpec

BUILTIN_MODELS = {
    # The default stays exactly this so numbers compare across versions.
    "llama-tiny": dict(layers=4, hidden=512, heads=8, intermediate=1376, vocab=4000),
    "llama-micro": dict(layers=2, hidden=128, heads=4, intermediate=344, vocab=512),
}
DTYPES = ("float32", "bfloat16", "float16")
SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
FIRST_KEYS = 3  # how many offending tensor names an error lists


@dataclass(frozen=True)
class Checkpoint:
    """The safetensors files transformers would load from a model directory, and how many tensors they hold."""

    files: tuple[Path, ...]
    tensors: int


def cpu_has_fast_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def model_argument(model: str) -> str:
    """`--model` checked: a built-in name as it is, otherwise the absolute path of a directory with config.json."""
    if model in BUILTIN_MODELS:
        return model
    directory = Path(model).expanduser()
    if not directory.is_dir():
        raise KernelbotError(f"unknown model {model!r}: it is neither a built-in ({', '.join(BUILTIN_MODELS)}) nor a "
                             "directory; pass one of those or a local Hugging Face model directory (with config.json)")
    if not (directory / "config.json").is_file():
        raise KernelbotError(f"{directory} has no config.json, so it is not a Hugging Face model directory; pass the "
                             f"directory that holds config.json, or a built-in ({', '.join(BUILTIN_MODELS)})")
    return str(directory.resolve())


def resolve_spec(
    model: str = "llama-tiny",
    dtype: str = "auto",
    batch: int = 8,
    prompt_len: int = 32,
    decode_steps: int = 32,
    seed: int = 0,
) -> tuple[ModelSpec, list[str]]:
    """The spec for a built-in name or a local model directory, and notes for the report.
    dtype 'auto' is bf16 where the CPU has native bf16, else fp32, whatever the model's config says."""
    model = model_argument(model)
    dtype, notes = _run_dtype(dtype)
    if min(batch, prompt_len) < 1 or decode_steps < 0:
        raise KernelbotError("batch and prompt length must be at least 1 and decode steps not negative")
    workload = dict(dtype=dtype, batch=batch, prompt_len=prompt_len, decode_steps=decode_steps, seed=seed)
    if model in BUILTIN_MODELS:
        return ModelSpec(name=model, **workload, **BUILTIN_MODELS[model]), notes
    directory = Path(model)
    config = load_config(directory)
    _check_positions(config, prompt_len + decode_steps)
    checkpoint = find_checkpoint(directory)
    spec = ModelSpec(name=directory.name, path=str(directory), architecture=_architecture(config),
                     model_type=config.model_type,
                     weights=f"safetensors ({checkpoint.tensors} tensors)" if checkpoint else "seeded random",
                     **_sizes(config), **workload)
    if checkpoint is None:
        notes.append(f"{directory} holds no {SINGLE_FILE} (or {SHARD_INDEX}): the model runs with seeded random "
                     f"weights (seed {seed}), so its outputs mean nothing; its speed is the model's")
    declared = _declared_dtype(config)
    if declared is not None:
        notes.append(f"config.json declares dtype {declared}; the run uses {dtype} (bf16 only where the CPU has it "
                     "natively, else fp32, unless --dtype says otherwise)")
    return spec, notes


builtin_spec = resolve_spec  # the older name, still used by callers that only knew built-ins


def build_model(spec: ModelSpec) -> torch.nn.Module:
    """The model of a spec, in eval mode in the spec's dtype: a built-in from its numbers (path None), otherwise
    the directory's architecture with its safetensors weights, or seeded random weights when it has none."""
    if spec.path is None:
        return build_llama(spec)
    directory = Path(spec.path)
    config = load_config(directory)
    checkpoint = find_checkpoint(directory)
    with _quiet_transformers():
        if checkpoint is None:
            model = _with_attention(lambda attn: _random_model(config, spec.seed, attn), config)
        else:
            model = _with_attention(lambda attn: _loaded_model(directory, spec, attn), config)
    return model.to(getattr(torch, spec.dtype)).eval()


def build_llama(spec: ModelSpec) -> torch.nn.Module:
    """A Llama-architecture decoder from a transformers LlamaConfig with seeded random weights."""
    from transformers import LlamaForCausalLM

    config = llama_config(spec)
    config._attn_implementation = "sdpa"
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    return model.to(getattr(torch, spec.dtype)).eval()


def llama_config(spec: ModelSpec) -> Any:
    """The transformers LlamaConfig of a built-in's numbers."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=spec.hidden, intermediate_size=spec.intermediate, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.heads, vocab_size=spec.vocab,
        # the fidelity probe of a served run asks for one token after a whole prompt and its decode steps
        max_position_embeddings=max(256, spec.prompt_len + spec.decode_steps + 1),
    )


def spec_config(spec: ModelSpec) -> Any:
    """The transformers config a spec's model is built from: a built-in's numbers, or the directory's config.json."""
    return llama_config(spec) if spec.path is None else load_config(Path(spec.path))


def text_config(config: Any) -> Any:
    """The decoder's own config (multimodal configs nest it); the config itself where it has none or several."""
    try:
        return config.gettext_config(decoder=True)
    except Exception:  # ambiguous or absent sub-configs: the top level is the best there is
        return config


def int_attribute(config: Any, name: str) -> int | None:
    """An integer attribute of a config, None where it is absent, not an integer, or raises when read."""
    try:
        value = getattr(config, name)
    except Exception:  # some configs raise for per-layer values read as one
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def load_config(directory: Path) -> Any:
    """The directory's transformers config, from local files only and without remote code; it must be one that
    transformers builds as a causal LM."""
    import transformers
    from transformers import CONFIG_MAPPING, AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    raw = _raw_config(directory)
    model_type, architecture = raw.get("model_type"), (raw.get("architectures") or ["?"])[0]
    where = f"{directory / 'config.json'} (model_type {model_type!r}, architecture {architecture})"
    version = f"transformers {transformers.__version__}"
    if not model_type:
        raise KernelbotError(f"{where} names no model_type, so transformers cannot tell which architecture it is")
    if model_type not in CONFIG_MAPPING:
        remote = " (the config asks for the model's own code, and kernelbot runs no remote code)" \
            if raw.get("auto_map") else ""
        raise KernelbotError(f"{where}: {version} does not know this model_type{remote}; use a transformers that "
                             "does, or a model of an architecture it knows")
    try:
        with _quiet_transformers():
            config = AutoConfig.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # transformers raises many types for a config it cannot read
        raise KernelbotError(f"{where}: {version} cannot read this config: {_one_line(exc)}") from None
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise KernelbotError(f"{where}: {version} has no causal-LM model for model_type {config.model_type!r} "
                             "(AutoModelForCausalLM cannot build it); kernelbot runs decoder language models")
    return config


def find_checkpoint(directory: Path) -> Checkpoint | None:
    """The safetensors weights transformers would load (one file, or shards listed by an index), or None."""
    from safetensors import safe_open

    index = directory / SHARD_INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KernelbotError(f"{index} is not a safetensors index with a weight_map ({_one_line(exc)}); fix or "
                                 "remove it") from None
        files = tuple(directory / name for name in names)
    elif (directory / SINGLE_FILE).is_file():
        files = (directory / SINGLE_FILE,)
    else:
        stray = sorted(p.name for p in directory.glob("*.safetensors"))
        if stray:
            raise KernelbotError(f"{directory} holds {', '.join(stray[:FIRST_KEYS])} but neither {SINGLE_FILE} nor "
                                 f"{SHARD_INDEX}; name the weights as transformers saves them")
        return None
    tensors = 0
    for file in files:
        if not file.is_file():
            raise KernelbotError(f"{index} lists {file.name}, which is not in {directory}; add the shard or fix "
                                 "the index")
        try:
            with safe_open(str(file), framework="pt") as weights:
                tensors += len(list(weights.keys()))
        except Exception as exc:  # safetensors raises its own error type for a damaged file
            raise KernelbotError(f"{file} is not a readable safetensors file ({_one_line(exc)})") from None
    return Checkpoint(files=files, tensors=tensors)


def _raw_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise KernelbotError(f"{directory} has no config.json, so it is not a Hugging Face model directory")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise KernelbotError(f"{path} is not readable JSON ({_one_line(exc)}); fix the file") from None
    if not isinstance(raw, dict):
        raise KernelbotError(f"{path} holds no JSON object; a Hugging Face config is one")
    return raw


def _run_dtype(dtype: str) -> tuple[str, list[str]]:
    notes = []
    if dtype == "auto":
        if cpu_has_fast_bf16():
            dtype = "bfloat16"
        else:
            dtype = "float32"
            notes.append("this CPU lacks avx512_bf16/amx_bf16, so bf16 runs emulated; the workload runs in fp32")
    if dtype not in DTYPES:
        raise KernelbotError(f"unsupported dtype {dtype!r}: use float32, bfloat16 or float16")
    return dtype, notes


def _sizes(config: Any) -> dict[str, int | None]:
    text = text_config(config)
    vocab = int_attribute(text, "vocab_size")
    if vocab is None:
        raise KernelbotError(f"the {config.model_type} config has no integer vocab_size, so kernelbot cannot draw "
                             "prompt token ids; add vocab_size to config.json")
    return dict(layers=int_attribute(text, "num_hidden_layers"), hidden=int_attribute(text, "hidden_size"),
                heads=int_attribute(text, "num_attention_heads"),
                intermediate=int_attribute(text, "intermediate_size"), vocab=vocab)


def _check_positions(config: Any, tokens: int) -> None:
    limit = int_attribute(text_config(config), "max_position_embeddings")
    if limit is not None and tokens > limit:
        raise KernelbotError(f"the workload needs {tokens} positions (prompt + decode steps) but the model's "
                             f"max_position_embeddings is {limit}; lower --prompt-len or --decode-steps")


def _architecture(config: Any) -> str:
    if config.architectures:
        return str(config.architectures[0])
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM._model_mapping[type(config)].__name__


def _declared_dtype(config: Any) -> str | None:
    declared = getattr(config, "dtype", None)
    if declared is None:
        return None
    return str(declared).removeprefix("torch.")


def _with_attention(build: Callable[[str], torch.nn.Module], config: Any) -> torch.nn.Module:
    """build(attn_implementation) with sdpa, or eager where the architecture refuses sdpa (transformers raises
    when asked for it); a model that builds neither way is a one-line error."""
    for attention in ("sdpa", "eager"):
        try:
            return build(attention)
        except KernelbotError:
            raise
        except Exception as exc:  # transformers raises many types for a model it cannot build or load
            failure = exc
    raise _build_error(config, failure)


def _random_model(config: Any, seed: int, attention: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    # fp32 at init whatever the config declares, so the weights drawn for a seed do not depend on it
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32,
                                            trust_remote_code=False)


def _loaded_model(directory: Path, spec: ModelSpec, attention: str) -> torch.nn.Module:
    """transformers' own loader (it maps older checkpoint layouts, e.g. per-expert MoE tensors, onto today's
    modules and ties embeddings as the model declares); anything it reports missing, unexpected or mis-shaped is
    an error here rather than a warning."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec.seed)
    model, info = AutoModelForCausalLM.from_pretrained(
        directory, local_files_only=True, trust_remote_code=False, attn_implementation=attention,
        dtype=getattr(torch, spec.dtype), ignore_mismatched_sizes=True, output_loading_info=True)
    problems = []
    if info.get("mismatched_keys"):
        problems.append("shapes differ from the config's for " + ", ".join(
            f"{key} ({list(saved)} saved, {list(expected)} expected)"
            for key, saved, expected in sorted(_mismatches(info["mismatched_keys"]))[:FIRST_KEYS]))
    if info.get("missing_keys"):
        problems.append("missing " + _first(info["missing_keys"]))
    if info.get("unexpected_keys"):
        problems.append("unexpected " + _first(info["unexpected_keys"]))
    if info.get("error_msgs"):
        problems.append(_one_line(info["error_msgs"][0]))
    if problems:
        raise KernelbotError(f"the safetensors weights in {directory} do not match its config.json "
                             f"({spec.architecture}): {'; '.join(problems)}")
    return model


def _mismatches(entries: Any) -> list[tuple[str, Any, Any]]:
    """(key, saved shape, expected shape) from transformers' (key, saved, expected) records."""
    return [(str(key), saved, expected) for key, saved, expected in entries]


def _first(keys: Any) -> str:
    keys = sorted(str(k) for k in keys)
    more = f" and {len(keys) - FIRST_KEYS} more" if len(keys) > FIRST_KEYS else ""
    return ", ".join(keys[:FIRST_KEYS]) + more


def _build_error(config: Any, exc: Exception) -> KernelbotError:
    import transformers

    return KernelbotError(f"transformers {transformers.__version__} cannot build model_type {config.model_type!r} "
                          f"({_architecture(config)}) as a causal LM from this config: {_one_line(exc)}")


def _one_line(exc: Any, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No progress bars or advisory warnings from transformers while it reads and builds (errors still raise)."""
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
