from kernelbot.kernel_library.base import Family, dtype_name, rows


def _uses_silu(module) -> bool:
    act = getattr(getattr(module, "config", None), "hidden_act", None)
    return act in ("silu", "swish") or type(getattr(module, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation")


def _cost(dims, itemsize):
    m, (inter, hidden) = rows(dims[0]), dims[1]  # the first op is the gate projection
    return 6.0 * m * hidden * inter, (3 * hidden * inter + m * (2 * hidden + 2 * inter)) * itemsize


FAMILY = Family(
    name="gated_mlp",
    module_classes=("LlamaMLP", "Qwen2MLP", "MistralMLP"),
    wrappers={"cpp": "cpp:GatedMLPCpp", "triton": "triton_kernel:GatedMLPTriton"},
    configs={"cpp": [{"grain": 1}, {"grain": 4}, {"grain": 16}],
             "triton": [{"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64}]},
    dtypes={"cpp": ("float32", "bfloat16"), "triton": ("float32", "bfloat16", "float16")},
    init_args=lambda m: [int(m.gate_proj.in_features), int(m.gate_proj.out_features),
                         dtype_name(m.gate_proj.weight.dtype)],
    cost=_cost,
    matches=lambda m, dims: _uses_silu(m) and len(dims) > 1 and list(m.gate_proj.weight.shape) == dims[1],
)
