"""SiLU(gate) * up over the two halves of the last dim: SGLang's and vLLM's `SiluAndMul` layer, by class name."""

from kernelbot.kernel_library.base import Family, rows
from kernelbot.kernel_library.registry import register

FAMILY = Family(
    name="silu_and_mul",
    module_classes=("SiluAndMul",),
    wrappers={"cpp": "cpp:SiluAndMulCpp", "triton": "triton_kernel:SiluAndMulTriton"},
    configs={"cpp": [{"grain": 1}, {"grain": 16}], "triton": [{"BLOCK": 1024, "num_warps": 4}]},
    dtypes={"cpp": ("float32", "bfloat16", "float16"), "triton": ("float32", "bfloat16", "float16")},
    init_args=lambda m: [],
    # per output element: exp, add, divide, multiply; read gate and up, write the product
    cost=lambda dims, itemsize: (4.0 * rows(dims[0]) * (dims[0][-1] // 2),
                                 1.5 * rows(dims[0]) * dims[0][-1] * itemsize),
    matches=lambda m, dims: len(dims) >= 1 and dims[0][-1] % 2 == 0,
)
register(FAMILY)
