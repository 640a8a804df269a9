"""kernelbot generic task: LayerNormGelu at blocks.0.ln_act (bfloat16).

Test fixture for agent/propose/aten_cpp.py, in the format the extractor writes: forward() is the module's own ATen graph
(make_fx, real mode) over its parameters and buffers and the call's tensors.
"""
# ruff: noqa

import base64

import torch
from torch import nn

inf, nan = float("inf"), float("nan")
DTYPE = torch.bfloat16
INPUT_SHAPES = [[8, 1, 512]]
INPUT_DTYPES = ['bfloat16']
INIT_ARGS = []
PARAMS = [('norm.weight', [512], 'bfloat16', 'parameter'), ('norm.bias', [512], 'bfloat16', 'parameter')]


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


def graph(p0, p1, x0):
    native_layer_norm = torch.ops.aten.native_layer_norm.default(x0, [512], p0, p1, 1e-05);  x0 = p0 = p1 = None
    getitem = native_layer_norm[0]
    getitem_1 = native_layer_norm[1];  getitem_1 = None
    getitem_2 = native_layer_norm[2];  native_layer_norm = getitem_2 = None
    gelu = torch.ops.aten.gelu.default(getitem, approximate = 'tanh');  getitem = None
    return (gelu,)


def _values():
    return [
        _exact("Yz9iP3o/dT+LP4k/eD9KP4Q/YD+EP4Q/gj+QP44/ej9dP1U/hz+KP4g/WD93P5g/ij9xP3w/gj+SP5Q/jD9qP3A/gD9zP4M/hj+BP4g/hj99P4o/eT+BP4c/nT9aP1c/bz+LP44/gj96P3Y/hz92P3U/ij+TP6w/WT9gP5c/cj9xP4w/jj+RP1o/oT90P4Q/Vj9yP3Q/cz9lP44/fD+KP34/iT9rP4A/iz92P40/hT96P50/UD9/P2U/aD+AP4k/lT9dP4Q/hz89P1U/ej+EP4M/gT+EP4Y/hj9qP4o/aD96P0I/fj9/P4w/hD9oP38/cD90P5k/dj+CP48/jD+SP2k/dT9rP4c/iD+GP5k/ZT9+P4E/cT9gP30/Zj94P4M/eT+CP4M/jz+EP4U/ez99P4I/bD9PP4I/bj+EP4I/hT+MP2c/hD99P40/cz+KP4g/hD+DP30/hT94P2Q/gz9cP34/dz9YP3c/jj+CP5Q/ij9kP24/kz+EP4k/Zz9iP2E/cj+HP4U/hT+CP4s/eT+NP34/ZD+FP4g/iD9hP4g/cj+PP4E/jD+LP2A/jT9zP18/jD+QP28/hz+EP38/ZT99P3c/lD+CP4U/fD+IP3k/Xj98P3I/cz+LP2k/iz+PP1M/Wj9TP4E/ZD+SP30/hz98P34/jT+MP3Q/aj+CP5g/hT9/P2s/cz93P4c/Yj98P3s/fj+SP4g/dD93P14/lj+aP3o/iT+HP4M/Sz+HP3I/aj9/P48/hT97P2I/eD+MP2M/hz+KP3s/bT9+P2c/gT9zP2s/ij9wP5E/kz9wP40/dT9wP3o/cz+KP4E/ZT99P2Y/YT+GP2E/XT+UP38/dT95P30/fz+FP44/mT+NP40/dT9gP5A/gz+HP4A/Rz+TP2E/iD+yP30/hD+FP3I/Zz+RP5k/Xz9EP0s/jD9uP5k/ZD+HP5Q/jj+QP4E/lT+GP5E/iz+BP4o/Zz9pP3g/dz+GP4Y/iz+FP5M/hj9yP38/iD94P3I/dD9fP3w/hz97P3o/hD+KP5A/jD+HP1k/hD+JP5M/tD+OP1g/bj+HP5A/cD9sP4M/gj9HP5I/cz+WP2Y/lj9hP4o/jz9uP34/nD+XP4A/jT9lP5c/eT95P4o/cD9oP4M/iT+YP48/cT+MP1k/nT+QP3Q/hj+RP4Y/cz97P4Q/gT+FP20/gz95P5Q/ej9hP38/lz9lP6w/cT90P5Y/ez94P5E/kT+CP5Q/dj+SP4Q/Vz9xP4g/hj9+P4Q/ez9bP4g/Yj+AP4M/aT+UPy8/cj91P3c/WD+AP5A/lD9WP38/iD+DP24/ZD+VP2k/hz+FP4E/Xz9uP3w/Zz9mP4g/ez+JP00/Qj+DP1U/kT9VPw==", [512], "bfloat16"),
        _exact("YL2BvYK9yD2sPEQ7Lz6VvZ69dD0Avus9lz0APja9qD2ovRQ9Jb59vm07DL0cvbq7rT2MPa4+K75RPeq8CT3wPQU+tj1JvfC9jb1vvho8przDu04+Cr0GPVs9Sj6qvEi7UDwROqM9Jz0UvQY+xr20PSi8i70ovSa+UD1uPrw8Wb2zvd85Ab7evZo9BT3hvAY+rTzfPL69jL5nveC8ZTxQPeM8yb22PSE+BrwPvaY87LxzPHg+CD7YvBU9gj6Kvno+iDrMvcg9Nb3WvKM9471vPp29Q71LvaK8Yz5gvNG9kjxSvWe9vL2avRy84T0GPvC8ob2LvF++lD3qPLw8Az4Nvl09wr2mPBC9Xz0ePnY9Cr0mPbc9Fb7zPfW8az4HPV8+/72APpG97D1hvac9TT40vTG9Qr0FPce9oz1rvak8rzzDPZY9Fb5RvpG8gD0tvqc9IL0DPlM9Dz3VvcS9vD1IPco9zD3vvXC9mbz9vfI9oLwJvtc90r3svD0+db4nPYu8bz3XPQQ+Jr6dvfq9az2PPc485DwbvCU+R7wPvrm9Dr2QPUg7r71dPVi9CL4ePic9Ur5XPXY9J706PSC9Wz6pvCG8Rz2RPY07NL2KvTI+wb3avby8Ab5kPYE80j38PQC5Ob6OPfU9Bz4Pvfc9hb1YPcO9XL4dPSi9l70qPlU9v7xMPdw8Fz4RPSY+cz0xvn+9JLq3PUq6lDttPSK+cb07vJA9ZL0cvZG7VT2cPdO9AL46vHy9rz1+POI94D1qPZ89C76dvau82byfvRA+mL5svK699LxaPk49tr1NPi6+ir2cvUS+5r13vXi+vL2QPZu9Gj3nPRA7GT5hvjO8Ib5lPdq9JT0mvW+91Lx4vZq8xT2LPZ6977sUvgG+cT20vdS9+b2LvG89Qj7ePJY9A74Tvcm7CT7ZvSo9oL0gu8G9+TufPqa94r2UvaE9DD4ZPc29JDlYvCk8F72SvUW8/j2jPKS94jwhPH4+9r3RPR+9urvgvMi7Wj24vQW+Db4tPj29pzzUveg9ar1XviA9DzywveG8Nj3EPQg+nj2dPn++Lr6nuw8+az5YPXg8VT1yvc09B74TOmk9Eb4EvYM8GL6pPdA9BD5VPj88c7y3PZy9Hr43vo49fL4IO028LT5pPsS9kj2tPeU7IzoQvkQ8CL2svT09fD2zvMW8gL2nPWq9RLwvvac9Eb4jvPY7cj0jPYK9Eb3hvVK+BLxhuOu9TT6RvBu+3D2mOyq+Pb16Owi+Yz2UvVk+pDs5Pac9ZLwXvTu9Bb6QPUS+2D3Wvbg8iz1ZPRE9bj1yO389rD21vcY9sj22Pb29BT2ovRQ9tjzlPAG9JL2xPAQ+1b0nvlw93j0vvg==", [512], "bfloat16"),
    ]


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        for (name, _shape, _dtype, kind), value in zip(PARAMS, _values()):
            _register(self, name, value, kind == "parameter")

    def params(self):
        return [self.get_parameter(n) if kind == "parameter" else self.get_buffer(n) for n, _s, _d, kind in PARAMS]

    def forward(self, x0):
        out = graph(*self.params(), x0)
        return out[0] if len(out) == 1 else out


def get_inputs():
    return [
        _like([8, 1, 512], "bfloat16", 0.0, 1.0),
    ]


def get_init_inputs():
    return list(INIT_ARGS)
