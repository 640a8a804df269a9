"""kernelbot's SGLang plugin: a kernel pack in SGLang's own processes, through SGLang's plugin seam.

SGLang runs `register()` through its `sglang.srt.plugins` entry point (`load_plugins()`, first thing in every
scheduler/TP-rank process, before the model is built; `SGLANG_PLUGINS=kernelbot_pack` allowlists it). It registers
AROUND hooks on the `forward` of the layer classes in `LAYERS` (RMSNorm plain and with its fused residual add,
SiluAndMul, RotaryEmbedding), so every instance goes through engine/router.py's router however it later
resolves its own backend method: to a pack kernel for the variants, shapes and dtypes it was verified on, to SGLang's
own path otherwise (counted, with the reason), and, when capturing, recorded as the tasks' source. Every other fused op
of SGLang's layer modules (a `BaseFusedOp` with its own native forward: GemmaRMSNorm, GeluAndMul, ...) is hooked the
same way for generic kernels (engine/generic_layers.py): captured as a task whose reference is its forward_native,
routed by its attributes and the call's exact signature.

Environment: see engine/router.py (KERNELBOT_PACK_DIR, KERNELBOT_COUNTS_DIR, KERNELBOT_CAPTURE_DIR).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

import torch

from kernelbot.engine.router import LayerSpec, Router, generic_spec, router_from_env

CLASSES = {  # SGLang's layer classes by name → the module that defines them
    "RMSNorm": "sglang.srt.layers.layernorm",
    "SiluAndMul": "sglang.srt.layers.activation",
    "RotaryEmbedding": "sglang.srt.layers.rotary_embedding.base",
}
NUMERICS = {  # methods a subclass may override to compute something the kernel was not verified against
    "RMSNorm": ("forward_native", "forward_cuda", "forward_cpu", "forward_hip"),
    "SiluAndMul": ("forward_native", "forward_cuda", "forward_cpu", "forward_hip"),
    # a subclass with its own cache (scaled RoPE: linear, Llama 3, YaRN...) rotates by other angles
    "RotaryEmbedding": ("forward_native", "forward_cuda", "forward_cpu", "forward_hip", "_compute_cos_sin_cache",
                        "_compute_inv_freq"),
}

FUSED_OP = ("sglang.kernels.fused_op", "BaseFusedOp")  # the base of SGLang's ops with a native forward
BASE_MODULES = (FUSED_OP[0], "sglang.srt.layers.utils.multi_platform")  # where forward_native is only a stub
GENERIC_MODULES = ("sglang.srt.layers.activation", "sglang.srt.layers.layernorm")  # whose fused ops are looked at

_ROUTER: Router | None = None


def _common(cls_name: str, layer: torch.nn.Module) -> str:
    """Why no kernel may stand in for this layer whatever the call: it runs forward_native under torch.compile, or
    its class overrides the numerics of the class the kernel was verified against."""
    if getattr(layer, "is_torch_compile", False):
        return "torch.compile (layer runs forward_native)"
    base = getattr(sys.modules.get(CLASSES[cls_name]), cls_name, None)
    if base is not None and type(layer) is not base:
        overridden = next((m for m in NUMERICS[cls_name]
                           if getattr(type(layer), m, None) is not getattr(base, m, None)), None)
        if overridden:
            return f"subclass {type(layer).__name__} overrides {overridden}"
    return ""


def _norm_variant(layer: torch.nn.Module, call: dict[str, Any], dtype: str) -> str:
    if call.get("backend") is not None:
        return "explicit backend"
    if call.get("quant_linear") is not None or getattr(layer, "_quant_linear", None) is not None:
        return "fused output quantisation"
    if call.get("post_residual_addition") is not None:
        return "post-residual addition"
    if (not getattr(layer, "has_weight", True) or getattr(layer, "variance_size_override", None) is not None
            or getattr(layer, "override_orig_dtype", None) is not None):
        return "layer variant"
    return _common("RMSNorm", layer)


def _plain_norm_variant(layer: torch.nn.Module, call: dict[str, Any], dtype: str) -> str:
    """The rmsnorm family computes Llama's RMSNorm (cast to the input dtype, then the weight); SGLang's default
    multiplies the weight in fp32 first. The two agree exactly only in fp32. (The fused add + RMSNorm family takes
    either order: its weight_in_fp32 argument.)"""
    if dtype != "float32" and not getattr(layer, "cast_x_before_out_mul", False):
        return "numerics (weight multiplied before the cast)"
    return _norm_variant(layer, call, dtype)


def _add_norm_args(layer: torch.nn.Module) -> list[Any]:
    from kernelbot.kernel_library import FAMILIES

    return [*FAMILIES["add_rmsnorm"].init_args(layer), not getattr(layer, "cast_x_before_out_mul", False)]


def _silu_variant(layer: torch.nn.Module, call: dict[str, Any], dtype: str) -> str:
    return "odd width" if call["x"].shape[-1] % 2 else _common("SiluAndMul", layer)


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
    return _common("RotaryEmbedding", layer)


def _pair(result: Any, call: dict[str, Any]) -> list[torch.Tensor]:
    return [t for t in result if isinstance(t, torch.Tensor)]


NORM = ("x", "residual", "post_residual_addition", "quant_linear", "backend")


def _compiling(layer: torch.nn.Module) -> bool:
    return bool(getattr(layer, "is_torch_compile", False))


LAYERS: dict[str, list[LayerSpec]] = {
    "RMSNorm": [
        LayerSpec("add_rmsnorm", NORM, inputs=lambda c: [c["x"], c["residual"]], variant=_norm_variant,
                  run=lambda k, c: k(c["x"], c["residual"]), accepts=lambda c: c.get("residual") is not None,
                  outputs=_pair, mutable=_compiling, init_args=_add_norm_args),
        LayerSpec("rmsnorm", NORM, inputs=lambda c: [c["x"]], variant=_plain_norm_variant,
                  run=lambda k, c: k(c["x"]), accepts=lambda c: c.get("residual") is None, mutable=_compiling),
    ],
    "SiluAndMul": [LayerSpec("silu_and_mul", ("x",), inputs=lambda c: [c["x"]], run=lambda k, c: k(c["x"]),
                             variant=_silu_variant, mutable=_compiling)],
    "RotaryEmbedding": [LayerSpec(
        "rotary_embedding", ("positions", "query", "key", "offsets", "fused_set_kv_buffer_arg"), main=1,
        variant=_rotary_variant, outputs=_pair, inputs=lambda c: [c["positions"], c["query"], c["key"]],
        run=lambda k, c: k(c["positions"], c["query"], c["key"]), mutable=_compiling)],
}


def _generic_classes() -> dict[str, type]:
    """SGLang's fused ops (its layer modules' BaseFusedOp subclasses) that LAYERS does not take, whose forward is the
    base's dispatch and whose forward_native is their own: each may become a generic task, forward_native the
    reference (the classes one name ties to, the first found). None where SGLang has no such modules (an older
    release, a stand-in)."""
    try:
        base = getattr(importlib.import_module(FUSED_OP[0]), FUSED_OP[1])
        for module in GENERIC_MODULES:
            importlib.import_module(module)
        taken = tuple(getattr(importlib.import_module(module), name) for name, module in CLASSES.items())
    except (ImportError, AttributeError):
        return {}
    found: dict[str, type] = {}
    todo = list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        native = next(k for k in cls.__mro__ if "forward_native" in vars(k))
        if issubclass(cls, taken) or inspect.isabstract(cls) or cls.forward is not base.forward or \
                native.__module__ in BASE_MODULES or not cls.__module__.startswith("sglang."):
            continue
        found.setdefault(cls.__name__, cls)
    return found


def _generic_variant(layer: torch.nn.Module, call: dict[str, Any], dtype: str) -> str:
    return "torch.compile (layer runs forward_native compiled)" if _compiling(layer) else ""


def register() -> None:
    """The entry point: route the pack named by KERNELBOT_PACK_DIR, and/or capture what the layers run."""
    global _ROUTER
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    generic = {name: (cls, spec) for name, cls in _generic_classes().items()
               if (spec := generic_spec(cls, variant=_generic_variant, mutable=_compiling)) is not None}
    targets = {**LAYERS, **{name: [spec] for name, (_, spec) in generic.items()}}
    router = router_from_env("sglang", targets)
    if router is None:
        return
    _ROUTER = router
    wanted = set(targets) if router.capturing else {cls for cls, _family in router.routes}
    for name in sorted(wanted, key=list(targets).index):
        only = generic[name][0] if name in generic else None  # a generic hook takes its own class's calls only
        target = f"{CLASSES[name]}.{name}" if only is None else f"{only.__module__}.{only.__qualname__}"

        def hook(original: Any, layer: torch.nn.Module, *args: Any, _specs: list[LayerSpec] = targets[name],
                 _only: type | None = only, **kwargs: Any) -> Any:
            if _only is not None and type(layer) is not _only:
                return original(layer, *args, **kwargs)
            return router.handle(_specs, layer, lambda *a, **k: original(layer, *a, **k), args, kwargs)

        HookRegistry.register(f"{target}.forward", hook, HookType.AROUND)
        router.hooked.append(target)
    router.write(force=True)


def flush() -> None:
    """Write this process's counters now."""
    if _ROUTER is not None:
        _ROUTER.write(force=True)
