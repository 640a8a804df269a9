"""kernelbot's vLLM plugin: a kernel pack in vLLM's own processes, through vLLM's documented seams.

vLLM runs `register()` in every process it starts (API server, engine core, each worker) through the
`vllm.general_plugins` entry point (`VLLM_PLUGINS=kernelbot_pack` allowlists it), before any model is built. It
registers out-of-tree replacements for the layer classes the pack (or a capture) needs: `CustomOp.register_oot` for
RMSNorm (plain and with its fused residual add), SiluAndMul, RotaryEmbedding and the unquantized MoE method (a
FusedMoE's experts, once vLLM's router has chosen them), `PluggableLayer.register_oot` for the linear layers and the
LM head (`ParallelLMHead`, whose GEMM runs inside `LogitsProcessor`). Each replacement is a subclass of vLLM's own
class with the same name: vLLM builds it wherever the model asks for the original, and
every call goes through engine/router.py's router — to a pack kernel for the variants, shapes and dtypes it
was verified on, to vLLM's own path for everything else (counted, with the reason). Linear layers and the LM head
are routed at their GEMM (the unquantized method's `apply`), so vLLM's own forward keeps its tensor-parallel gathers
and reductions; their weights (and the experts') are kept before vLLM repacks them for its CPU kernels. Every other
CustomOp with a native forward (GemmaRMSNorm, GeluAndMul, ...) is hooked the same way for generic kernels
(engine/generic_layers.py): captured as a task whose reference is its native forward, routed by its attributes and
the call's exact signature. A model's gated MLP (its merged gate-and-up projection, SiLU-and-mul, down projection:
a class of each model's own file, no CustomOp) is found by what it holds once the weights are loaded, and routed
whole to a fused gated-MLP kernel: one call in place of three, no [tokens, 2 x intermediate] tensor between them.

Environment: see engine/router.py (KERNELBOT_PACK_DIR, KERNELBOT_COUNTS_DIR, KERNELBOT_CAPTURE_DIR).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from kernelbot.engine.router import LayerSpec, Router, generic_spec, router_from_env

KNOWN_VERSIONS = ("0.32.0",)  # the vLLM releases whose layer classes and seams this plugin was tested against

ROUTER: Router | None = None  # this process's, once register() ran (engine/vllm_attention.py reads it)

LINEAR_MODULE = "vllm.model_executor.layers.linear"
LM_HEAD_MODULE = "vllm.model_executor.layers.vocab_parallel_embedding"
GEMM_METHODS = {  # layers routed at their GEMM: vLLM class name → its unquantized method's class (same module)
    **{name: "UnquantizedLinearMethod" for name in (
        "ColumnParallelLinear", "MergedColumnParallelLinear", "QKVParallelLinear", "RowParallelLinear",
        "ReplicatedLinear")},
    "ParallelLMHead": "UnquantizedEmbeddingMethod",
}
LAYER_MODULES = {  # vLLM class name → the module that defines it
    "RMSNorm": "vllm.model_executor.layers.layernorm",
    "SiluAndMul": "vllm.model_executor.layers.activation",
    "RotaryEmbedding": "vllm.model_executor.layers.rotary_embedding.base",
    **{name: LM_HEAD_MODULE if name == "ParallelLMHead" else LINEAR_MODULE for name in GEMM_METHODS},
}


def _norm_variant(layer: torch.nn.Module, call: dict[str, Any], dtype: str) -> str:
    if getattr(layer, "variance_size_override", None) is not None or not getattr(layer, "has_weight", True):
        return "layer variant (variance over part of the row, or no weight)"
    return ""


def _rotary_variant(layer: torch.nn.Module, call: dict[str, Any], dtype: str) -> str:
    positions, query, key = call.get("positions"), call.get("query"), call.get("key")
    if not isinstance(key, torch.Tensor) or not isinstance(positions, torch.Tensor):
        return "no key (shared KV layers)"
    if positions.dim() != 1 or positions.dtype != torch.int64 or query.dim() != 2 or key.dim() != 2:
        return "not int64 [tokens] positions with [tokens, heads * head_size] query and key"
    return ""


def _linear_weight(layer: torch.nn.Module) -> torch.Tensor | None:
    weight = getattr(layer, "_kernelbot_weight", None)
    return weight if weight is not None else getattr(layer, "weight", None)


def _linear_args(layer: torch.nn.Module) -> list[Any]:
    weight = _linear_weight(layer)
    assert weight is not None and weight.dim() == 2, "a linear layer without its weight"
    return [int(weight.shape[1]), int(weight.shape[0]), getattr(layer, "bias", None) is not None,
            str(weight.dtype).removeprefix("torch.")]


def _linear_state(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = {"weight": _linear_weight(layer)}
    if getattr(layer, "bias", None) is not None:
        state["bias"] = layer.bias
    return state


def _linear_variant(layer: torch.nn.Module, call: dict[str, Any], dtype: str) -> str:
    weight = _linear_weight(layer)
    if weight is None or weight.numel() == 0:
        return "weight not kept (loaded before the plugin)"
    if (call.get("bias") is None) != (getattr(layer, "bias", None) is None):
        return "bias added outside the GEMM (skip_bias_add, or a tensor-parallel rank other than 0)"
    if call["x"].dim() != 2:
        return "not a [tokens, features] input"
    return ""


def _pair(result: Any, call: dict[str, Any]) -> list[torch.Tensor]:
    return [t for t in result if isinstance(t, torch.Tensor)]


def _gemm_spec(name: str) -> LayerSpec:
    """A layer routed at its GEMM as the linear family; the LM head's GEMM runs inside LogitsProcessor's forward, which
    is what a trace shows around it."""
    traced = (lambda layer, call: "LogitsProcessor") if name == "ParallelLMHead" else None
    return LayerSpec("linear", ("layer", "x", "bias"), inputs=lambda c: [c["x"]], run=lambda k, c: k(c["x"]),
                     variant=_linear_variant, init_args=_linear_args, state=_linear_state, traced_as=traced)


LAYERS: dict[str, list[LayerSpec]] = {
    "RMSNorm": [
        LayerSpec("add_rmsnorm", ("x", "residual"), inputs=lambda c: [c["x"], c["residual"]],
                  run=lambda k, c: k(c["x"], c["residual"]), accepts=lambda c: c.get("residual") is not None,
                  variant=_norm_variant, outputs=_pair),
        LayerSpec("rmsnorm", ("x", "residual"), inputs=lambda c: [c["x"]], run=lambda k, c: k(c["x"]),
                  accepts=lambda c: c.get("residual") is None, variant=_norm_variant),
    ],
    "SiluAndMul": [LayerSpec("silu_and_mul", ("x",), inputs=lambda c: [c["x"]], run=lambda k, c: k(c["x"]))],
    "RotaryEmbedding": [LayerSpec(
        "rotary_embedding", ("positions", "query", "key"), main=1, variant=_rotary_variant, outputs=_pair,
        inputs=lambda c: [c["positions"], c["query"], c["key"]],
        run=lambda k, c: k(c["positions"], c["query"], c["key"]))],
    **{name: [_gemm_spec(name)] for name in GEMM_METHODS},
}


MOE_LAYER = "RoutedExperts"  # a FusedMoE's experts, routed at their unquantized method's apply
MOE_METHOD = ("vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method", "UnquantizedFusedMoEMethod")
MOE_PARAMS = ("layer", "x", "topk_weights", "topk_ids", "shared_experts", "shared_experts_input")


def _moe_weights(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(w13 [E, 2I, H], w2 [E, H, I]) as loaded, kept before vLLM pads and repacks them."""
    return getattr(layer, "_kernelbot_moe", None)


def _moe_args(layer: torch.nn.Module) -> list[Any]:
    kept = _moe_weights(layer)
    assert kept is not None, "a MoE layer without its weights"
    w13, w2 = kept
    return [int(w2.shape[1]), int(w2.shape[2]), int(w13.shape[0]), int(layer.top_k),
            str(w13.dtype).removeprefix("torch.")]


def _moe_variant(layer: torch.nn.Module, call: dict[str, Any], dtype: str) -> str:
    kept = _moe_weights(layer)
    if kept is None:
        return "weights not kept (loaded before the plugin)"
    if call.get("shared_experts") is not None:
        return "shared experts run inside the call"
    if str(getattr(layer, "activation", "")).lower().rsplit(".", 1)[-1] != "silu":
        return f"activation {getattr(layer, 'activation', None)} (the kernel computes SiLU-and-mul)"
    if getattr(layer, "expert_map", None) is not None or int(getattr(layer, "global_num_experts", -1)) != \
            int(kept[0].shape[0]):
        return "expert parallelism (this rank holds some of the experts)"
    if getattr(layer, "apply_router_weight_on_input", False) or getattr(layer, "w13_bias", None) is not None or \
            getattr(layer, "swiglu_limit", None) is not None:
        return "router weight on the input, expert biases or a clamped SwiGLU"
    if call["x"].dim() != 2:
        return "not a [tokens, hidden] input"
    return ""


MOE = LayerSpec("moe_experts", MOE_PARAMS, inputs=lambda c: [c["x"], c["topk_weights"], c["topk_ids"]],
                run=lambda k, c: k(c["x"], c["topk_weights"], c["topk_ids"]), variant=_moe_variant,
                init_args=_moe_args, state=lambda layer: dict(zip(("w13_weight", "w2_weight"), _moe_weights(layer),
                                                                  strict=True)),
                traced_as=lambda layer, call: "MoERunner")  # the module whose forward runs the router and experts


MLP_PARTS = {"gate_up_proj": "MergedColumnParallelLinear", "act_fn": "SiluAndMul", "down_proj": "RowParallelLinear"}
# vLLM's loader step after every weight is in (named as vLLM's loader module calls it): models' MLPs are hooked there
LOADED = ("vllm.model_executor.model_loader.base_loader", "process_weights_after_loading")


def _gated_mlp(module: torch.nn.Module) -> bool:
    """A model's MLP built of vLLM's merged gate-and-up projection, SiLU-and-mul and down projection, by class
    name (the plugin's replacements keep vLLM's names; a quantized or other subclass is another class)."""
    return all(type(getattr(module, part, None)).__name__ == cls for part, cls in MLP_PARTS.items())


def _mlp_weights(mlp: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(gate and up [2 x inter, hidden], down [hidden, inter]) as loaded, kept before vLLM repacks them."""
    gate_up, down = (getattr(getattr(mlp, part), "_kernelbot_weight", None) for part in ("gate_up_proj", "down_proj"))
    return (gate_up, down) if gate_up is not None and down is not None else None


def _mlp_args(mlp: torch.nn.Module) -> list[Any]:
    kept = _mlp_weights(mlp)
    assert kept is not None, "a gated MLP without its weights"
    return [int(kept[1].shape[0]), int(kept[1].shape[1]), str(kept[1].dtype).removeprefix("torch.")]


def _mlp_state(mlp: torch.nn.Module) -> dict[str, torch.Tensor]:
    kept = _mlp_weights(mlp)
    assert kept is not None, "a gated MLP without its weights"
    gate_up, down = kept
    inter = down.shape[1]
    return {"gate_proj.weight": gate_up[:inter], "up_proj.weight": gate_up[inter:], "down_proj.weight": down}


def _mlp_variant(mlp: torch.nn.Module, call: dict[str, Any], dtype: str) -> str:
    kept = _mlp_weights(mlp)
    if kept is None:
        return "weights not kept (quantized, or loaded before the plugin)"
    gate_up, down = mlp.gate_up_proj, mlp.down_proj
    if gate_up.bias is not None or down.bias is not None:
        return "projection biases"
    if gate_up.tp_size != 1 or down.tp_size != 1:
        return "tensor parallel (the down projection's all-reduce runs in its forward)"
    if list(gate_up.output_sizes) != [kept[1].shape[1]] * 2:
        return "gate and up projections not both of the down projection's input width"
    if not isinstance(call["x"], torch.Tensor) or call["x"].dim() != 2:
        return "not a [tokens, hidden] input"
    return ""


MLP = LayerSpec("gated_mlp", ("x",), inputs=lambda c: [c["x"]], run=lambda k, c: k(c["x"]), variant=_mlp_variant,
                init_args=_mlp_args, state=_mlp_state)


ATTENTION_IMPL = "CPUAttentionBackendImpl"  # the attention backend's implementation, routed by its class name
ROPE_NUMERICS = ("forward", "forward_native", "forward_static", "forward_cpu", "forward_cuda")


def _rope_classes() -> dict[str, type]:
    """RotaryEmbedding and every subclass that only builds another cos/sin cache (linear, dynamic-NTK, Llama 3,
    YaRN scaling...): the kernel reads the layer's own cache, so it computes any of them. A subclass with its own
    forward (multimodal, dual-chunk RoPE) keeps vLLM's path."""
    base = importlib.import_module(LAYER_MODULES["RotaryEmbedding"]).RotaryEmbedding
    importlib.import_module("vllm.model_executor.layers.rotary_embedding")  # defines the scaled variants
    found, todo = {base.__name__: base}, list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if all(getattr(cls, m) is getattr(base, m) for m in ROPE_NUMERICS):
            found.setdefault(cls.__name__, cls)
    return found


def _generic_classes(taken: dict[str, type]) -> dict[str, type]:
    """vLLM's CustomOps (the ones its imported layer modules registered) that no family's table takes and that have a
    native forward: each may become a generic task, its native forward the reference (engine/generic_layers.py)."""
    from vllm.model_executor.custom_op import CustomOp, op_registry

    found = {}
    for cls in op_registry.values():
        if not (isinstance(cls, type) and issubclass(cls, CustomOp)) or cls.__name__ in taken or \
                cls.__name__ == MOE_METHOD[1] or issubclass(cls, tuple(taken.values())):
            continue
        if cls.forward is CustomOp.forward and cls.forward_native is not CustomOp.forward_native:
            found[cls.__name__] = cls
    return found


@contextlib.contextmanager
def _native_ops() -> Iterator[None]:
    """vLLM's IR ops (vllm.ir: rms_norm, fused_add_rms_norm, ...) run their native implementation in Python, so a
    trace of a layer's native forward sees ATen ops, not the engine's own."""
    from vllm import ir
    from vllm.ir.op import IrOp

    with contextlib.ExitStack() as stack:
        for op in IrOp.registry.values():
            stack.enter_context(op.set_priority(["native"]))
        stack.enter_context(ir.enable_torch_wrap(False))
        yield


def register() -> None:
    """The entry point: route the pack named by KERNELBOT_PACK_DIR, and/or capture what the layers run."""
    global ROUTER
    if ROUTER is not None:
        return  # vLLM may load plugins more than once in a process
    from kernelbot.engine import vllm_attention

    classes = {name: getattr(importlib.import_module(module), name) for name, module in LAYER_MODULES.items()}
    classes.update(_rope_classes())
    targets = {name: LAYERS.get(name, LAYERS["RotaryEmbedding"]) for name in classes}
    targets[ATTENTION_IMPL] = vllm_attention.ATTENTION
    targets[MOE_LAYER] = [MOE]
    for name, cls in _generic_classes(classes).items():
        spec = generic_spec(cls)
        if spec is not None:
            classes[name], targets[name] = cls, [spec]
    router = router_from_env("vllm", targets, _native_ops, by_structure=(MLP,))
    if router is None:
        return
    ROUTER = router
    wanted = set(targets) if router.capturing else {cls for cls, _family in router.routes if cls in targets}
    if router.capturing or any(family == MLP.family for _cls, family in router.routes):
        wanted |= {MLP_PARTS["gate_up_proj"], MLP_PARTS["down_proj"]}  # their methods keep the weights it loads
        _route_mlps_once_loaded(router)
    for name in sorted(wanted - {ATTENTION_IMPL, MOE_LAYER}):
        _install(classes[name], targets[name], router)
        router.hooked.append(f"{classes[name].__module__}.{name}")
    if ATTENTION_IMPL in wanted:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

        register_backend(AttentionBackendEnum.CPU_ATTN, f"{vllm_attention.__name__}.KernelbotCPUAttentionBackend")
        router.hooked.append(f"{vllm_attention.__name__}.{ATTENTION_IMPL}")
    if MOE_LAYER in wanted:
        method = getattr(importlib.import_module(MOE_METHOD[0]), MOE_METHOD[1])
        sub = _moe_method(method, targets[MOE_LAYER], router)
        method.register_oot(sub, name=method.__name__)
        sub.name = method.name  # register_oot renames it; vLLM enables custom ops by their registry name
        router.hooked.append(f"{MOE_METHOD[0]}.{MOE_METHOD[1]}")
    router.write(force=True)


def note_step_rows(router: Router) -> None:
    """The most tokens vLLM's scheduler puts in one step (max_num_batched_tokens), read while a layer is built:
    vLLM's config is current then, and not while the plugin registers or the model runs."""
    if router.step_rows is None:
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        if config is not None:
            router.step_rows = int(config.scheduler_config.max_num_batched_tokens)


def _route_mlps_once_loaded(router: Router) -> None:
    """vLLM's loader step after loading, wrapped: then every gated MLP of the model (`_gated_mlp`) whose class the
    pack routes (any, when capturing) becomes a same-named subclass whose forward goes through the router."""
    loader = importlib.import_module(LOADED[0])
    process = getattr(loader, LOADED[1])
    routed: dict[type, type] = {}  # vLLM's class → its routed subclass (weights reloaded: routed once, not twice)

    def process_weights_after_loading(model: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        process(model, *args, **kwargs)
        for module in model.modules():
            base = type(module)
            if base in routed.values() or not _gated_mlp(module) or \
                    not (router.capturing or (base.__name__, MLP.family) in router.routes):
                continue
            if base not in routed:
                routed[base] = _routed_subclass(base, [MLP], router)
                router.hooked.append(f"{base.__module__}.{base.__name__}")
            module.__class__ = routed[base]
        router.write(force=True)

    setattr(loader, LOADED[1], process_weights_after_loading)


def _routed_subclass(base: type, specs: list[LayerSpec], router: Router, **extra: Any) -> type:
    """A subclass of `base` of the same name whose forward goes through the router."""

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        return router.handle(specs, self, lambda *a, **k: base.forward(self, *a, **k), args, kwargs)

    return type(base.__name__, (base,), {"forward": forward, "__module__": base.__module__,
                                         "__qualname__": base.__qualname__, **extra})


def _install(base: type, specs: list[LayerSpec], router: Router) -> None:
    """vLLM's class replaced, out of tree, by a subclass of the same name that routes its calls."""
    if base.__name__ in GEMM_METHODS:
        sub = _gemm_subclass(base, specs, router)
        base.register_oot(sub, name=base.__name__)
    else:
        def __init__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
            base.__init__(self, *args, **kwargs)
            note_step_rows(router)

        sub = _routed_subclass(base, specs, router, __init__=__init__)
        registry_name = getattr(base, "name", None)
        base.register_oot(sub, name=base.__name__)
        if registry_name is not None:
            sub.name = registry_name  # register_oot renames it; vLLM enables custom ops by their registry name


def _moe_method(method: type, specs: list[LayerSpec], router: Router) -> type:
    """vLLM's unquantized MoE method, built wherever vLLM builds it (CustomOp.register_oot), with the experts'
    weights kept before vLLM pads and repacks them for its CPU kernel, and each call of its experts routed (the
    router's choices already made: vLLM's own routing decides which experts a token runs)."""

    def process_weights_after_loading(self: Any, layer: torch.nn.Module) -> None:
        layer._kernelbot_moe = (layer.w13_weight.detach(), layer.w2_weight.detach())
        method.process_weights_after_loading(self, layer)

    def apply(self: Any, layer: torch.nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, shared_experts: Any = None, shared_experts_input: Any = None) -> Any:
        return router.handle(specs, layer, lambda *a, **k: method.apply(self, *a, **k),
                             (layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input), {})

    return type(method.__name__, (method,), {"process_weights_after_loading": process_weights_after_loading,
                                             "apply": apply, "__module__": method.__module__,
                                             "__qualname__": method.__qualname__})


def _gemm_subclass(base: type, specs: list[LayerSpec], router: Router) -> type:
    unquantized: type = getattr(importlib.import_module(base.__module__), GEMM_METHODS[base.__name__])

    class KernelbotLinearMethod(unquantized):  # type: ignore[valid-type,misc]
        """vLLM's unquantized GEMM, with the weight kept before vLLM repacks it and each call routed."""

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            layer._kernelbot_weight = layer.weight.detach()
            super().process_weights_after_loading(layer)

        def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            original: Callable[..., torch.Tensor] = lambda lay, inp, b=None: super(  # noqa: E731
                KernelbotLinearMethod, self).apply(lay, inp, b)
            return router.handle(specs, layer, original, (layer, x, bias), {})

    def __init__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)
        note_step_rows(router)
        if type(getattr(self, "quant_method", None)) is unquantized:
            self.quant_method.__class__ = KernelbotLinearMethod  # quantized layers keep their own method

    return type(base.__name__, (base,), {"__init__": __init__, "__module__": base.__module__,
                                         "__qualname__": base.__qualname__})
