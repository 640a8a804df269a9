"""The kernelbot SGLang plugin: routes SGLang layer calls to a kernel pack and counts both paths per rank.

SGLang runs `register()` through its `sglang.srt.plugins` entry point (`load_plugins()`, first thing in
every scheduler/TP-rank process, before the model is built; `SGLANG_PLUGINS=kernelbot_pack` allowlists
it). It registers AROUND hooks on the `forward` of the layer classes the pack's families cover, so every
instance goes through them however it later resolves and caches its own backend method. A call goes to a
pack kernel only for a layer variant, shape, dtype and device the kernel was verified on; everything else
runs SGLang's original path and is counted as a fallback, with the reason.

Environment: KERNELBOT_PACK_DIR (the pack: manifest.json + kernels/), KERNELBOT_COUNTS_DIR (where each
process writes `counts-pid<P>.json`, its rank inside; read back with `read_counts`).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

PLUGIN_NAME = "kernelbot_pack"
PACK_ENV = "KERNELBOT_PACK_DIR"
COUNTS_ENV = "KERNELBOT_COUNTS_DIR"
KERNEL_LABEL = "kernelbot::"  # profiler/trace.py reads these labels (not imported: it needs pandas)

# pack family -> the SGLang layer classes whose forward its kernels stand in for. The pack's gated_mlp and linear
# kernels replace whole transformers modules that SGLang builds differently (merged, parallel linears), so they
# are reported as not routed.
TARGETS: dict[str, tuple[str, ...]] = {
    "rmsnorm": ("sglang.srt.layers.layernorm.RMSNorm",),
    "silu_and_mul": ("sglang.srt.layers.activation.SiluAndMul",),
    "rotary_embedding": ("sglang.srt.layers.rotary_embedding.base.RotaryEmbedding",),
}


@dataclass
class _State:
    pack_dir: Path
    counts_dir: Path | None
    run_id: str
    routes: dict[str, dict[tuple, list[Any]]] = field(default_factory=dict)  # family -> (width, dtype) -> entries
    custom: dict[str, dict[str, int]] = field(default_factory=dict)  # candidate id -> calls, captured
    fallback: dict[str, dict[str, int]] = field(default_factory=dict)  # layer class -> reason -> calls
    unrouted: list[dict[str, str]] = field(default_factory=list)
    device_kernels: dict[str, list[str]] = field(default_factory=dict)  # candidate id -> GPU kernel names
    kernels: dict[tuple[int, str], torch.nn.Module] = field(default_factory=dict)
    decisions: dict[tuple, tuple[Any, str]] = field(default_factory=dict)  # call key -> (entry, fallback reason)
    hooked: list[str] = field(default_factory=list)
    last_write: float = 0.0

    def snapshot(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "rank": _rank(), "run_id": self.run_id, "pack_dir": str(self.pack_dir),
                "hooked": self.hooked, "custom": self.custom, "fallback": self.fallback,
                "unrouted": self.unrouted, "device_kernels": self.device_kernels,
                "forced_backend": os.environ.get("SGLANG_FORCE_FUSED_OP_BACKEND") or None}

    def write(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.counts_dir is None or (not force and now - self.last_write < 1.0):
            return
        self.last_write = now
        self.counts_dir.mkdir(parents=True, exist_ok=True)
        path = self.counts_dir / f"counts-pid{os.getpid()}.json"  # the rank (known later) is inside
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot(), indent=1))
        os.replace(tmp, path)


_STATE: _State | None = None


def _rank() -> int | None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return None


def register() -> None:
    """The entry point: read the pack named by KERNELBOT_PACK_DIR and hook the layers its kernels cover."""
    global _STATE
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from kernelbot.records import Pack

    pack_env = os.environ.get(PACK_ENV)
    if not pack_env:
        print(f"kernelbot plugin: {PACK_ENV} is not set; no pack applied", file=sys.stderr)
        return
    pack_dir = Path(pack_env)
    pack = Pack.model_validate_json((pack_dir / "manifest.json").read_text())
    counts_dir = Path(os.environ[COUNTS_ENV]) if os.environ.get(COUNTS_ENV) else None
    state = _State(pack_dir=pack_dir, counts_dir=counts_dir, run_id=pack.run_id)
    for entry in pack.entries:
        if entry.family not in TARGETS:
            state.unrouted.append({"candidate_id": entry.candidate_id, "family": entry.family,
                                   "reason": "no SGLang layer takes this family's kernel"})
            continue
        key = (entry.input_shapes[LAYERS[entry.family].main][-1], entry.dtype)
        state.routes.setdefault(entry.family, {}).setdefault(key, []).append(entry)
        state.custom[entry.candidate_id] = {"calls": 0, "captured": 0}
    for family in state.routes:
        for target in TARGETS[family]:
            HookRegistry.register(f"{target}.forward", _hook_for(LAYERS[family]), HookType.AROUND)
            state.hooked.append(target)
    _STATE = state
    atexit.register(state.write, True)
    state.write(force=True)


def _rows(shape: list[int]) -> int:
    n = 1
    for d in shape[:-1]:
        n *= d
    return n


def _fallback(state: _State, layer: torch.nn.Module, reason: str, capturing: bool) -> None:
    reasons = state.fallback.setdefault(type(layer).__name__, {})
    key = f"{reason} (graph capture)" if capturing else reason
    reasons[key] = reasons.get(key, 0) + 1
    state.write(force=reasons[key] == 1)


def _capturing(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _device_ok(backend: str, x: torch.Tensor) -> bool:
    if backend == "cpp":
        return x.device.type == "cpu"
    if backend == "triton":
        return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    return x.is_cuda


def _kernel(state: _State, entry: Any, layer: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    key = (id(layer), entry.candidate_id)
    if key not in state.kernels:
        from kernelbot.loading import load_module

        module = load_module(state.pack_dir / entry.source_file, f"kb_sglang_{entry.candidate_id}")
        kernel = module.ModelNew(*entry.init_args)
        kernel.load_state_dict({name: getattr(layer, name).detach() for name in kernel.state_dict()})
        state.kernels[key] = kernel.to(device).eval()
        state.device_kernels.setdefault(entry.candidate_id, _jit_names(type(kernel)))
    return state.kernels[key]


def _jit_names(cls: type) -> list[str]:
    """Names of the Triton kernels a pack kernel launches: what a GPU trace shows when it runs (also on
    CUDA-graph replays, where no Python runs)."""
    names = set()
    for base in cls.__mro__:
        for value in vars(sys.modules.get(base.__module__, object)).values():
            if type(value).__name__ == "JITFunction":
                names.add(value.fn.__name__)
    return sorted(names)


@dataclass(frozen=True)
class _Layer:
    """How the plugin stands in for one family's SGLang layer."""

    family: str
    params: tuple[str, ...]  # forward's parameters in order: the kernel's inputs first, then optional ones
    variant: Callable[[torch.nn.Module, dict[str, Any], str], str]  # why no kernel takes this call ("" if one may)
    # was this pack entry built with this layer's arguments (and, for several inputs, the call's other widths)?
    fits: Callable[[Any, torch.nn.Module, dict[str, Any]], bool]
    run: Callable[[Callable[..., Any], dict[str, Any]], Any]  # the call, through the pack kernel's forward
    main: int = 0  # the input whose width and dtype pick the pack's kernels and whose leading dims are rows
    numerics: tuple[str, ...] = ("forward_native", "forward_cuda", "forward_cpu", "forward_hip")  # a subclass
    # overriding any of these computes something the kernel was not verified against


def _hook_for(spec: _Layer) -> Callable[..., Any]:
    def hook(original, layer, *args, **kwargs):
        state = _STATE
        if state is None:
            return original(layer, *args, **kwargs)
        call = _named(spec.params, args, kwargs)
        x = call.get(spec.params[spec.main]) if call is not None else None
        if not isinstance(x, torch.Tensor):
            _fallback(state, layer, "signature", False)
            return original(layer, *args, **kwargs)
        capturing = _capturing(x)
        # A layer's variant is fixed once built, so the decision depends only on what changes between calls;
        # the cache keeps the hook's own cost below that of the ops it replaces.
        key = (id(layer), x.dtype, x.device, kwargs.get("backend") is not None,
               getattr(layer, "is_torch_compile", False),
               *((v.shape, v.dtype) if isinstance(v := call.get(k), torch.Tensor) else v is not None
                 for k in spec.params))
        decision = state.decisions.get(key)
        if decision is None:
            decision = state.decisions[key] = _route(state, spec, layer, x, call, kwargs)
        entry, reason = decision
        if entry is None:
            _fallback(state, layer, reason, capturing)
            return original(layer, *args, **kwargs)
        kernel = _kernel(state, entry, layer, x.device).forward  # not __call__: no module hooks to run
        counts = state.custom[entry.candidate_id]
        counts["captured" if capturing else "calls"] += 1
        state.write(force=counts["calls"] + counts["captured"] == 1)
        if not torch.autograd._profiler_enabled():
            return spec.run(kernel, call)
        # names the custom path in traces as engine/patching.py does (id, dtype, the dims the call came with),
        # so a re-profile ranks it as the pack's
        shapes = [list(call[p].shape) for p in spec.params[:len(entry.input_shapes)]]
        with torch.profiler.record_function(f"{KERNEL_LABEL}{entry.candidate_id} {entry.dtype} {json.dumps(shapes)}"):
            return spec.run(kernel, call)

    return hook


def _named(params: tuple[str, ...], args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """forward's arguments by name, or None for a call that does not fit its signature."""
    if len(args) > len(params) or set(kwargs) - set(params[len(args):]) - {"backend"}:
        return None
    return dict(zip(params, args, strict=False)) | kwargs


def _route(state: _State, spec: _Layer, layer: torch.nn.Module, x: torch.Tensor, call: dict[str, Any],
           kwargs: dict) -> tuple[Any, str]:
    """(the pack entry for this call, "") or (None, why it falls back).

    Row counts change with every batch, so a kernel takes any call with at most the rows of the shape it was
    profiled at (verification ran that shape and fuzzed rows below it); larger calls fall back."""
    if kwargs.get("backend") is not None:
        return None, "explicit backend"
    if getattr(layer, "is_torch_compile", False):
        return None, "torch.compile (layer runs forward_native)"
    overridden = _own_numerics(layer, spec)
    if overridden:
        return None, f"subclass {type(layer).__name__} overrides {overridden}"
    dtype = str(x.dtype).removeprefix("torch.")
    reason = spec.variant(layer, call, dtype)
    if reason:
        return None, reason
    entries = state.routes[spec.family].get((x.shape[-1], dtype))
    if not entries:
        return None, "width/dtype not in pack"
    fits = [e for e in entries if spec.fits(e, layer, call)]
    if not fits:
        return None, "layer arguments not in pack"
    rows = _rows(list(x.shape))
    fits = sorted((e for e in fits if _rows(e.input_shapes[spec.main]) >= rows),
                  key=lambda e: _rows(e.input_shapes[spec.main]))
    if not fits:
        return None, "more rows than the pack's kernels were verified on"
    if not _device_ok(fits[0].backend, x):
        return None, f"device ({fits[0].backend} kernel, {x.device.type} tensor)"
    return fits[0], ""


def _own_numerics(layer: torch.nn.Module, spec: _Layer) -> str | None:
    """The first method of the class the kernel was verified against that the layer's class overrides."""
    for target in TARGETS[spec.family]:
        module, _, name = target.rpartition(".")
        base = getattr(sys.modules.get(module), name, None)
        if base is not None and isinstance(layer, base):
            return next((m for m in spec.numerics if getattr(type(layer), m, None) is not getattr(base, m, None)),
                        None)
    return None


def _rmsnorm_variant(layer: torch.nn.Module, call: dict[str, Any], dtype: str) -> str:
    """A fused residual add is routed in fp32 only: the add then runs in torch exactly as SGLang runs it, and
    the kernel normalises the same sum; in other dtypes SGLang normalises the fp32 sum before rounding."""
    if call.get("quant_linear") is not None or getattr(layer, "_quant_linear", None) is not None:
        return "fused output quantisation"
    if (not getattr(layer, "has_weight", True) or getattr(layer, "variance_size_override", None) is not None
            or getattr(layer, "override_orig_dtype", None) is not None):
        return "layer variant"
    if call.get("residual") is None and call.get("post_residual_addition") is not None:
        return "signature"
    if call.get("residual") is not None and dtype != "float32":
        return "fused residual add (outside fp32 the norm of the unrounded sum)"
    # The pack's kernels compute Llama's RMSNorm (cast to the input dtype, then the weight); SGLang's default
    # multiplies the weight in fp32 first. The two agree exactly only in fp32.
    if dtype != "float32" and not getattr(layer, "cast_x_before_out_mul", False):
        return "numerics (weight multiplied before the cast)"
    return ""


def _rmsnorm_run(kernel: Callable[..., Any], call: dict[str, Any]) -> Any:
    x, residual = call["x"], call.get("residual")
    if residual is not None:  # SGLang's own order: x + residual (+ post addition), all in fp32
        x = x + residual
        if call.get("post_residual_addition") is not None:
            x = x + call["post_residual_addition"]
        residual = x
    out = kernel(x) if x.dim() == 2 else kernel(x.reshape(-1, x.shape[-1])).reshape(x.shape)
    return out if residual is None else (out, residual)


def _silu_variant(layer: torch.nn.Module, call: dict[str, Any], dtype: str) -> str:
    return "odd width" if call["x"].shape[-1] % 2 else ""


def _rotary_variant(layer: torch.nn.Module, call: dict[str, Any], dtype: str) -> str:
    if call.get("offsets") is not None:
        return "position offsets"
    if call.get("fused_set_kv_buffer_arg") is not None:
        return "fused KV-cache write"
    if hasattr(layer, "sin_cos_cache") or getattr(layer, "position_start", 0):
        return "layer variant"
    positions, query, key = call.get("positions"), call["query"], call.get("key")
    if not isinstance(positions, torch.Tensor) or not isinstance(key, torch.Tensor) or key.dtype != query.dtype:
        return "signature"
    if positions.dim() != 1 or positions.dtype != torch.int64 or query.dim() != 2 or key.dim() != 2:
        return "not int64 [tokens] positions with [tokens, heads * head_size] query and key"
    return ""


def _same_args(entry: Any, layer: torch.nn.Module, call: dict[str, Any]) -> bool:
    """Was the entry verified on a layer built with this layer's arguments (sizes, eps, weights' dtype...)?"""
    from kernelbot.kernel_library import FAMILIES

    return entry.init_args == FAMILIES[entry.family].init_args(layer)


def _rotary_fits(entry: Any, layer: torch.nn.Module, call: dict[str, Any]) -> bool:
    """Same layer arguments (head and rotary sizes, cache rows and dtype, base, style) and the same key width:
    the kernel loads this layer's own cos/sin cache, which must have the shape it was verified with."""
    return _same_args(entry, layer, call) and entry.input_shapes[2][-1] == call["key"].shape[-1]


LAYERS: dict[str, _Layer] = {
    "rmsnorm": _Layer("rmsnorm", ("x", "residual", "post_residual_addition", "quant_linear"), _rmsnorm_variant,
                      _same_args, _rmsnorm_run),
    "silu_and_mul": _Layer("silu_and_mul", ("x",), _silu_variant, _same_args, lambda kernel, call: kernel(call["x"])),
    "rotary_embedding": _Layer(
        "rotary_embedding", ("positions", "query", "key", "offsets", "fused_set_kv_buffer_arg"), _rotary_variant,
        _rotary_fits, lambda kernel, call: kernel(call["positions"], call["query"], call["key"]), main=1,
        # a subclass with its own cache (scaled RoPE: linear, Llama 3, YaRN...) rotates by other angles
        numerics=("forward_native", "forward_cuda", "forward_cpu", "forward_hip", "_compute_cos_sin_cache",
                  "_compute_inv_freq")),
}


def flush() -> None:
    """Write this process's counters now."""
    if _STATE is not None:
        _STATE.write(force=True)


def read_counts(counts_dir: Path) -> list[dict[str, Any]]:
    """Every process's counters, as written by the plugin (one file per scheduler/TP-rank process)."""
    return [json.loads(p.read_text()) for p in sorted(Path(counts_dir).glob("counts-*.json"))]
