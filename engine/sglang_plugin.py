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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

PLUGIN_NAME = "kernelbot_pack"
PACK_ENV = "KERNELBOT_PACK_DIR"
COUNTS_ENV = "KERNELBOT_COUNTS_DIR"
KERNEL_LABEL = "kernelbot::"  # the prefix engine/patching.py gives pack kernels in traces

# pack family -> the SGLang layer classes whose forward its kernels stand in for. SiluAndMul and
# RotaryEmbedding get a hook only once a family with a kernel for them exists; the pack's gated_mlp and
# linear kernels replace whole transformers modules that SGLang builds differently (merged, parallel
# linears), so they are reported as not routed.
TARGETS: dict[str, tuple[str, ...]] = {"rmsnorm": ("sglang.srt.layers.layernorm.RMSNorm",)}


@dataclass
class _State:
    pack_dir: Path
    counts_dir: Path | None
    run_id: str
    routes: dict[str, dict[tuple, list[Any]]] = field(default_factory=dict)  # family -> key -> entries
    custom: dict[str, dict[str, int]] = field(default_factory=dict)  # candidate id -> calls, captured
    fallback: dict[str, dict[str, int]] = field(default_factory=dict)  # layer class -> reason -> calls
    unrouted: list[dict[str, str]] = field(default_factory=list)
    device_kernels: dict[str, list[str]] = field(default_factory=dict)  # candidate id -> GPU kernel names
    kernels: dict[tuple[int, str], torch.nn.Module] = field(default_factory=dict)
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
        shape = entry.input_shapes[0]
        key = (_rows(shape), shape[-1], entry.dtype)
        state.routes.setdefault(entry.family, {}).setdefault(key, []).append(entry)
        state.custom[entry.candidate_id] = {"calls": 0, "captured": 0}
    for family in state.routes:
        for target in TARGETS[family]:
            HookRegistry.register(f"{target}.forward", _HOOKS[family], HookType.AROUND)
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


_RMSNORM_EXTRAS = ("residual", "post_residual_addition", "quant_linear")


def _rmsnorm_route(state: _State, layer: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[Any, str]:
    """(the pack entry for this call, "") or (None, why it falls back)."""
    x = args[0] if args else kwargs.get("x")
    if kwargs.get("backend") is not None:
        return None, "explicit backend"
    if getattr(layer, "is_torch_compile", False):
        return None, "torch.compile (layer runs forward_native)"
    if not isinstance(x, torch.Tensor) or set(kwargs) - {"x", *_RMSNORM_EXTRAS}:
        return None, "signature"
    if any(a is not None for a in [*args[1:], *(kwargs.get(k) for k in _RMSNORM_EXTRAS)]):
        return None, "fused residual add"
    if getattr(layer, "_quant_linear", None) is not None:
        return None, "fused output quantisation"
    if (not getattr(layer, "has_weight", True) or getattr(layer, "variance_size_override", None) is not None
            or getattr(layer, "override_orig_dtype", None) is not None):
        return None, "layer variant"
    dtype = str(x.dtype).removeprefix("torch.")
    entries = state.routes["rmsnorm"].get((_rows(list(x.shape)), x.shape[-1], dtype))
    if not entries:
        return None, "shape/dtype not in pack"
    eps = float(layer.variance_epsilon)
    entry = next((e for e in entries if int(e.init_args[0]) == layer.weight.shape[0]
                  and float(e.init_args[1]) == eps), None)
    if entry is None:
        return None, "hidden size/eps not in pack"
    # The pack's kernels compute Llama's RMSNorm (cast to the input dtype, then the weight); SGLang's
    # default multiplies the weight in fp32 first. The two agree exactly only in fp32.
    if dtype != "float32" and not getattr(layer, "cast_x_before_out_mul", False):
        return None, "numerics (weight multiplied before the cast)"
    if not _device_ok(entry.backend, x):
        return None, f"device ({entry.backend} kernel, {x.device.type} tensor)"
    return entry, ""


def _kernel(state: _State, entry: Any, layer: torch.nn.Module) -> torch.nn.Module:
    key = (id(layer), entry.candidate_id)
    if key not in state.kernels:
        from kernelbot.loading import load_module

        module = load_module(state.pack_dir / entry.source_file, f"kb_sglang_{entry.candidate_id}")
        kernel = module.ModelNew(*entry.init_args)
        kernel.load_state_dict({"weight": layer.weight.detach()})
        state.kernels[key] = kernel.to(layer.weight.device).eval()
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


def _rmsnorm_hook(original, layer, *args, **kwargs):
    state = _STATE
    x = args[0] if args else kwargs.get("x")
    capturing = isinstance(x, torch.Tensor) and _capturing(x)
    if state is None:
        return original(layer, *args, **kwargs)
    entry, reason = _rmsnorm_route(state, layer, args, kwargs)
    if entry is None:
        _fallback(state, layer, reason, capturing)
        return original(layer, *args, **kwargs)
    kernel = _kernel(state, entry, layer)
    counts = state.custom[entry.candidate_id]
    counts["captured" if capturing else "calls"] += 1
    state.write(force=counts["calls"] + counts["captured"] == 1)
    flat = x.reshape(entry.input_shapes[0])  # the layout the kernel was verified on (same rows, same hidden)
    if torch.autograd._profiler_enabled():
        with torch.profiler.record_function(f"{KERNEL_LABEL}{entry.candidate_id} {entry.dtype}"):
            return kernel(flat).reshape(x.shape)
    return kernel(flat).reshape(x.shape)


_HOOKS = {"rmsnorm": _rmsnorm_hook}


def flush() -> None:
    """Write this process's counters now."""
    if _STATE is not None:
        _STATE.write(force=True)


def read_counts(counts_dir: Path) -> list[dict[str, Any]]:
    """Every process's counters, as written by the plugin (one file per scheduler/TP-rank process)."""
    return [json.loads(p.read_text()) for p in sorted(Path(counts_dir).glob("counts-*.json"))]
