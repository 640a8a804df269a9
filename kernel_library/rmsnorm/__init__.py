"""RMSNorm as Llama computes it (x / rms(x) * weight): by class name, or by structure for any module that
computes it (MixtralRMSNorm, a model's own norm)."""

import torch

from kernelbot.kernel_library.base import Family, computes_reference, dtype_name, rows
from kernelbot.kernel_library.registry import register


def _covers(m: torch.nn.Module) -> bool:
    """A leaf with a 1-D weight and an epsilon that computes Llama's RMSNorm (Gemma's 1 + weight does not)."""
    weight = getattr(m, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or next(m.children(), None) is not None:
        return False
    if not isinstance(getattr(m, "variance_epsilon", getattr(m, "eps", None)), float):
        return False
    x = torch.randn(2, 3, weight.shape[0], dtype=weight.dtype, device=weight.device)
    return computes_reference(FAMILY, m, [x])


FAMILY = Family(
    name="rmsnorm",
    module_classes=("LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm", "RMSNorm"),
    wrappers={"cpp": "cpp:RMSNormCpp", "triton": "triton_kernel:RMSNormTriton"},
    configs={"cpp": [{"grain": 1}, {"grain": 8}, {"grain": 64}], "triton": [{"num_warps": 4}]},
    dtypes={"cpp": ("float32", "bfloat16", "float16"), "triton": ("float32", "bfloat16", "float16")},
    init_args=lambda m: [int(m.weight.shape[0]), float(getattr(m, "variance_epsilon", getattr(m, "eps", 1e-6))),
                         dtype_name(m.weight.dtype)],
    # read x, write out, read the weight once
    cost=lambda dims, itemsize: (4.0 * rows(dims[0]) * dims[0][-1], (2 * rows(dims[0]) + 1) * dims[0][-1] * itemsize),
    matches=lambda m, dims: list(m.weight.shape) == dims[0][-1:],
    covers=_covers,
)
register(FAMILY)
