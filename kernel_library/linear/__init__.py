"""A linear layer, y = x W^T (+ b): transformers' and torch's `nn.Linear`, by class name."""

from kernelbot.kernel_library.base import Family, dtype_name, rows
from kernelbot.kernel_library.registry import register


def _cost(dims, itemsize):
    m, (n, k) = rows(dims[0]), dims[1]
    return 2.0 * m * n * k, (m * (n + k) + n * k) * itemsize


FAMILY = Family(
    name="linear",
    module_classes=("Linear",),
    wrappers={"cpp": "cpp:LinearCpp", "triton": "triton_kernel:LinearTriton"},
    configs={"cpp": [{"grain": 1}, {"grain": 4}, {"grain": 16}],
             "triton": [{"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64}]},
    dtypes={"cpp": ("float32", "bfloat16"), "triton": ("float32", "bfloat16", "float16")},
    init_args=lambda m: [int(m.in_features), int(m.out_features), m.bias is not None, dtype_name(m.weight.dtype)],
    cost=_cost,
    matches=lambda m, dims: len(dims) > 1 and list(m.weight.shape) == dims[1],
    weight_dims=lambda args: [[int(args[1]), int(args[0])]],  # [out, in]
)
register(FAMILY)
