"""FLOPs and minimum bytes of common aten ops from the shapes and dtypes a trace recorded."""

from __future__ import annotations

import math

from kernelbot.dtypes import DTYPE_NAMES

ITEMSIZE = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "long int": 8, "int": 4, "bool": 1,
            "unsigned char": 1, "signed char": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1}

MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
          "aten::_addmm_activation"}
CONV = {"aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::conv2d", "aten::conv1d",
        "aten::conv3d", "aten::miopen_convolution"}
ATTENTION = {"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
             "aten::_scaled_dot_product_efficient_attention", "aten::_flash_attention_forward",
             "aten::_efficient_attention_forward", "aten::_scaled_dot_product_cudnn_attention"}
SOFTMAX = {"aten::softmax", "aten::_softmax", "aten::log_softmax", "aten::_log_softmax"}
NORM = {"aten::layer_norm", "aten::native_layer_norm", "aten::rms_norm", "aten::_fused_rms_norm", "aten::batch_norm",
        "aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::_batch_norm_impl_index", "aten::group_norm",
        "aten::native_group_norm", "aten::miopen_batch_norm"}
REDUCTION = {"aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::max", "aten::min", "aten::argmax",
             "aten::norm", "aten::var", "aten::std", "aten::var_mean", "aten::prod", "aten::linalg_vector_norm"}
ELEMENTWISE = {"aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul", "aten::mul_", "aten::div",
               "aten::div_", "aten::relu", "aten::relu_", "aten::gelu", "aten::silu", "aten::silu_", "aten::sigmoid",
               "aten::tanh", "aten::exp", "aten::pow", "aten::copy_", "aten::fill_", "aten::zero_", "aten::clamp",
               "aten::clamp_", "aten::where", "aten::neg", "aten::rsqrt", "aten::sqrt", "aten::threshold_backward",
               "aten::gelu_backward", "aten::silu_backward", "aten::sigmoid_backward", "aten::tanh_backward",
               "aten::addcmul_", "aten::addcdiv_", "aten::lerp_", "aten::_foreach_add_", "aten::dropout",
               "aten::native_dropout", "aten::masked_fill_", "aten::masked_fill", "aten::cat", "aten::_to_copy",
               "aten::clone", "aten::hardtanh", "aten::leaky_relu", "aten::elu", "aten::abs", "aten::log"}


def _tensors(dims: list, types: list) -> list[tuple[list[int], int]]:
    out = []
    for d, t in zip(dims, types or [""] * len(dims), strict=False):
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            out.append((d, ITEMSIZE.get(t, 4)))
    return out


def dtype_of(types: list) -> str:
    return next((DTYPE_NAMES[t] for t in types or [] if t in DTYPE_NAMES), "float32")


def op_cost(name: str, dims: list, types: list) -> tuple[float, float] | None:
    """(FLOPs, minimum bytes moved) for one call, or None when the op or its shapes are not understood."""
    ts = _tensors(dims, types)
    if not ts:
        return None
    size = ts[0][1]
    try:
        if name in MATMUL:
            mats = [d for d, _ in ts if len(d) >= 2] if name not in ("aten::addmm", "aten::baddbmm") else \
                [d for d, _ in ts[1:] if len(d) >= 2]
            if name == "aten::linear" and len(ts) >= 2:
                x, w = ts[0][0], ts[1][0]
                m, k, n = math.prod(x[:-1]), x[-1], w[0]
                batch = 1
            else:
                a, b = mats[0], mats[1]
                batch = math.prod(a[:-2]) if len(a) > 2 else 1
                m, k, n = a[-2], a[-1], b[-1]
            return 2.0 * batch * m * k * n, float(batch * (m * k + k * n + m * n) * size)
        if name in CONV:
            (x, _), (w, _) = ts[0], ts[1]
            n_, spatial = x[0], math.prod(x[2:])
            out = n_ * w[0] * spatial
            return 2.0 * out * math.prod(w[1:]), float((math.prod(x) + math.prod(w) + out) * size)
        if name in ATTENTION:
            q, k = ts[0][0], ts[1][0]
            b_h, length, d = math.prod(q[:-2]), q[-2], q[-1]
            return 4.0 * b_h * length * k[-2] * d, float((2 * math.prod(q) + 2 * math.prod(k)) * size)
        numel = math.prod(ts[0][0])
        if name in SOFTMAX:
            return 5.0 * numel, 2.0 * numel * size
        if name in NORM:
            return 8.0 * numel, float(2 * numel * size + sum(math.prod(d) * s for d, s in ts[1:]))
        if name in REDUCTION:
            return float(numel), float(numel * size)
        if name in ELEMENTWISE:
            biggest = max(math.prod(d) for d, _ in ts)
            return float(biggest), float(sum(math.prod(d) * s for d, s in ts) + biggest * size)
    except (IndexError, TypeError, ValueError):
        return None
    return None
