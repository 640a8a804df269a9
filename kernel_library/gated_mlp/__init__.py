"""The gated MLP: down(act(gate(x)) * up(x)), SiLU (Llama, Qwen2, Mistral) or GELU's tanh form (Gemma, Gemma-2);
found by structure, whatever the module's class is called."""

import torch
import torch.nn.functional as F

from kernelbot.kernel_library.base import Family, computes_reference, dtype_name, rows
from kernelbot.kernel_library.registry import register

_PROBE = torch.linspace(-6.0, 6.0, 97, dtype=torch.float64)


def _activation(module: torch.nn.Module) -> str | None:
    """The module's gate activation as the reference names it, read from what its `act_fn` computes (names vary:
    silu, swish, gelu_pytorch_tanh, gelu_new...); None for any other."""
    act = getattr(module, "act_fn", None)
    if not callable(act):
        return None
    try:
        with torch.no_grad():
            got = act(_PROBE)
    except Exception:  # not an elementwise function of one tensor
        return None
    if not isinstance(got, torch.Tensor) or got.shape != _PROBE.shape:
        return None
    for name, want in (("silu", F.silu(_PROBE)), ("gelu_tanh", F.gelu(_PROBE, approximate="tanh"))):
        if torch.allclose(got, want, rtol=1e-9, atol=1e-9):
            return name
    return None


def _projections(m: torch.nn.Module) -> bool:
    """gate_proj, up_proj (hidden -> inter) and down_proj (inter -> hidden), linear, no biases."""
    gate, up, down = (getattr(m, n, None) for n in ("gate_proj", "up_proj", "down_proj"))
    if not all(isinstance(p, torch.nn.Linear) and p.bias is None for p in (gate, up, down)):
        return False
    return gate.weight.shape == up.weight.shape == down.weight.shape[::-1]


def _init_args(m: torch.nn.Module) -> list:
    args = [int(m.gate_proj.in_features), int(m.gate_proj.out_features), dtype_name(m.gate_proj.weight.dtype)]
    act = _activation(m)
    return args if act == "silu" else [*args, act]


def _covers(m: torch.nn.Module) -> bool:
    if not _projections(m) or _activation(m) is None:
        return False
    weight = m.gate_proj.weight
    return computes_reference(FAMILY, m, [torch.randn(2, 3, weight.shape[1], dtype=weight.dtype,
                                                      device=weight.device)])


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
    init_args=_init_args,
    cost=_cost,
    weight_dims=lambda args: [[int(args[1]), int(args[0])]],  # the gate projection's [inter, hidden]
    matches=lambda m, dims: (_projections(m) and _activation(m) is not None and len(dims) > 1
                             and list(m.gate_proj.weight.shape) == dims[1]),
    covers=_covers,
)
register(FAMILY)
