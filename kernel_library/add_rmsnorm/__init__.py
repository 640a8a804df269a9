"""Fused residual add + RMSNorm, as serving engines run it between a decoder layer's parts (vLLM's RMSNorm and
SGLang's RMSNorm called with a residual): two inputs, x and residual [tokens, hidden]; two outputs, the normalised
sum and the new residual. No transformers module computes it (transformers adds the residual outside its norm), so
the family is found in served engines by their layers' own calls (engine/router.py)."""

from __future__ import annotations

from kernelbot.kernel_library.base import Family, rows
from kernelbot.kernel_library.registry import register
from kernelbot.kernel_library.rmsnorm import FAMILY as RMSNORM

FAMILY = Family(
    name="add_rmsnorm",
    module_classes=(),
    wrappers={"cpp": "cpp:AddRMSNormCpp", "triton": "triton_kernel:AddRMSNormTriton"},
    configs={"cpp": [{"grain": 1}, {"grain": 8}, {"grain": 64}], "triton": [{"num_warps": 4}]},
    dtypes={"cpp": ("float32", "bfloat16", "float16"), "triton": ("float32", "bfloat16", "float16")},
    init_args=RMSNORM.init_args,
    # read x, residual and the weight; write out and the new residual
    cost=lambda dims, itemsize: (5.0 * rows(dims[0]) * dims[0][-1], (4 * rows(dims[0]) + 1) * dims[0][-1] * itemsize),
    matches=lambda m, dims: len(dims) >= 2 and list(m.weight.shape) == dims[0][-1:],
    inputs=2,
)
register(FAMILY)
