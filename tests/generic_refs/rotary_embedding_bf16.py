"""kernelbot generic task: LlamaRotaryEmbedding at model.rotary_emb (bfloat16).

Test fixture for agent/propose/aten_cpp.py, in the format the extractor writes: forward() is the module's own ATen graph
(make_fx, real mode) over its parameters and buffers and the call's tensors.
"""
# ruff: noqa

import base64

import torch
from torch import nn

inf, nan = float("inf"), float("nan")
DTYPE = torch.bfloat16
INPUT_SHAPES = [[8, 1, 512], [8, 1]]
INPUT_DTYPES = ['bfloat16', 'int64']
INIT_ARGS = []
PARAMS = [('inv_freq', [32], 'float32', 'buffer'), ('original_inv_freq', [32], 'float32', 'buffer')]


def _exact(data, shape, dtype):
    raw = bytearray(base64.b64decode(data))
    return torch.frombuffer(raw, dtype=torch.uint8).view(getattr(torch, dtype)).reshape(shape).clone()


def _like(shape, dtype, mean, std):
    return (torch.randn(shape, dtype=torch.float64) * std + mean).to(getattr(torch, dtype))


def _ints(shape, dtype, low, high):
    return torch.randint(low, high + 1, shape, dtype=getattr(torch, dtype))


def _register(root, name, value, parameter):
    *path, leaf = name.split(".")
    for part in path:
        if not hasattr(root, part):
            root.add_module(part, nn.Module())
        root = getattr(root, part)
    if parameter:
        root.register_parameter(leaf, nn.Parameter(value, requires_grad=False))
    else:
        root.register_buffer(leaf, value)


def graph(p0, p1, x0, x1):
    unsqueeze = torch.ops.aten.unsqueeze.default(x1, 2);  x1 = None
    _to_copy = torch.ops.aten._to_copy.default(unsqueeze, dtype = torch.float32);  unsqueeze = None
    mul = torch.ops.aten.mul.Tensor(_to_copy, p0);  _to_copy = p0 = None
    cat = torch.ops.aten.cat.default([mul, mul], -1);  mul = None
    cos = torch.ops.aten.cos.default(cat)
    mul_1 = torch.ops.aten.mul.Tensor(cos, 1.0);  cos = None
    sin = torch.ops.aten.sin.default(cat);  cat = None
    mul_2 = torch.ops.aten.mul.Tensor(sin, 1.0);  sin = None
    _to_copy_1 = torch.ops.aten._to_copy.default(mul_1, dtype = torch.bfloat16);  mul_1 = None
    _to_copy_2 = torch.ops.aten._to_copy.default(mul_2, dtype = torch.bfloat16);  mul_2 = None
    return (_to_copy_1, _to_copy_2)


def _values():
    return [
        _exact("AACAPxH5Pz+a9Q8/m+jXPpvooT4j1HI+hxg2PneNCD7NzMw9DZSZPcJVZj0Vuiw944YBPU9Dwjw5rZE88ntaPArXIzywufU7nES4O3cuijs4Pk87DWkbOygV6TqOya46bxKDOoyURDoWahM6JRfdOWDLpTkVqHg5U3c6OXLUCzk=", [32], "float32"),
        _exact("AACAPxH5Pz+a9Q8/m+jXPpvooT4j1HI+hxg2PneNCD7NzMw9DZSZPcJVZj0Vuiw944YBPU9Dwjw5rZE88ntaPArXIzywufU7nES4O3cuijs4Pk87DWkbOygV6TqOya46bxKDOoyURDoWahM6JRfdOWDLpTkVqHg5U3c6OXLUCzk=", [32], "float32"),
    ]


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        for (name, _shape, _dtype, kind), value in zip(PARAMS, _values()):
            _register(self, name, value, kind == "parameter")

    def params(self):
        return [self.get_parameter(n) if kind == "parameter" else self.get_buffer(n) for n, _s, _d, kind in PARAMS]

    def forward(self, x0, x1):
        out = graph(*self.params(), x0, x1)
        return out[0] if len(out) == 1 else out


def get_inputs():
    return [
        _like([8, 1, 512], "bfloat16", 0.0, 1.0),
        _ints([8, 1], "int64", 0, 2047),
    ]


def get_init_inputs():
    return list(INIT_ARGS)
