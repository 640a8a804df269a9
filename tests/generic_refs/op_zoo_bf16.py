"""kernelbot generic task: OpZoo at tests.op_zoo (bfloat16).

Test fixture for agent/propose/aten_cpp.py, in the format the extractor writes: forward() is the module's own ATen graph
(make_fx, real mode) over its parameters and buffers and the call's tensors.
"""
# ruff: noqa

import base64

import torch
from torch import nn

inf, nan = float("inf"), float("nan")
DTYPE = torch.bfloat16
INPUT_SHAPES = [[2, 5, 32], [2, 5]]
INPUT_DTYPES = ['bfloat16', 'int64']
INIT_ARGS = []
PARAMS = [('w', [32, 32], 'bfloat16', 'parameter')]


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


def graph(p0, x0, x1):
    arange = torch.ops.aten.arange.default(5, dtype = torch.int64, device = torch.device('cpu'), pin_memory = False)
    full = torch.ops.aten.full.default([5, 5], -inf, dtype = torch.bfloat16, device = torch.device('cpu'), pin_memory = False)
    triu = torch.ops.aten.triu.default(full, 1);  full = None
    clamp = torch.ops.aten.clamp.default(x1, 0, 7);  x1 = None
    new_zeros = torch.ops.aten.new_zeros.default(x0, [8, 32], pin_memory = False)
    select = torch.ops.aten.select.int(x0, 0, 0)
    slice_1 = torch.ops.aten.slice.Tensor(select, 0, 0, 1);  select = None
    view = torch.ops.aten.view.default(slice_1, [1, 32]);  slice_1 = None
    add = torch.ops.aten.add.Tensor(new_zeros, view);  new_zeros = view = None
    embedding = torch.ops.aten.embedding.default(add, clamp);  add = clamp = None
    slice_2 = torch.ops.aten.slice.Tensor(embedding, 1, 0, 1);  embedding = None
    expand = torch.ops.aten.expand.default(slice_2, [2, 5, 32]);  slice_2 = None
    mul = torch.ops.aten.mul.Tensor(expand, 0.5);  expand = None
    add_1 = torch.ops.aten.add.Tensor(x0, mul);  x0 = mul = None
    gt = torch.ops.aten.gt.Scalar(add_1, 2.0)
    masked_fill = torch.ops.aten.masked_fill.Scalar(add_1, gt, 1.5);  add_1 = gt = None
    view_1 = torch.ops.aten.view.default(masked_fill, [2, 5, 4, 8])
    permute = torch.ops.aten.permute.default(view_1, [0, 2, 1, 3]);  view_1 = None
    transpose = torch.ops.aten.transpose.int(permute, -1, -2)
    expand_1 = torch.ops.aten.expand.default(permute, [2, 4, 5, 8])
    clone = torch.ops.aten.clone.default(expand_1, memory_format = torch.contiguous_format);  expand_1 = None
    _unsafe_view = torch.ops.aten._unsafe_view.default(clone, [8, 5, 8]);  clone = None
    expand_2 = torch.ops.aten.expand.default(transpose, [2, 4, 8, 5]);  transpose = None
    clone_1 = torch.ops.aten.clone.default(expand_2, memory_format = torch.contiguous_format);  expand_2 = None
    _unsafe_view_1 = torch.ops.aten._unsafe_view.default(clone_1, [8, 8, 5]);  clone_1 = None
    bmm = torch.ops.aten.bmm.default(_unsafe_view, _unsafe_view_1);  _unsafe_view = _unsafe_view_1 = None
    _unsafe_view_2 = torch.ops.aten._unsafe_view.default(bmm, [2, 4, 5, 5]);  bmm = None
    div = torch.ops.aten.div.Tensor(_unsafe_view_2, 3.0);  _unsafe_view_2 = None
    add_2 = torch.ops.aten.add.Tensor(div, triu);  div = triu = None
    _softmax = torch.ops.aten._softmax.default(add_2, -1, False);  add_2 = None
    expand_3 = torch.ops.aten.expand.default(_softmax, [2, 4, 5, 5])
    view_2 = torch.ops.aten.view.default(expand_3, [8, 5, 5]);  expand_3 = None
    expand_4 = torch.ops.aten.expand.default(permute, [2, 4, 5, 8]);  permute = None
    clone_2 = torch.ops.aten.clone.default(expand_4, memory_format = torch.contiguous_format);  expand_4 = None
    _unsafe_view_3 = torch.ops.aten._unsafe_view.default(clone_2, [8, 5, 8]);  clone_2 = None
    bmm_1 = torch.ops.aten.bmm.default(view_2, _unsafe_view_3);  view_2 = _unsafe_view_3 = None
    _unsafe_view_4 = torch.ops.aten._unsafe_view.default(bmm_1, [2, 4, 5, 8]);  bmm_1 = None
    transpose_1 = torch.ops.aten.transpose.int(_unsafe_view_4, 1, 2);  _unsafe_view_4 = None
    clone_3 = torch.ops.aten.clone.default(transpose_1, memory_format = torch.contiguous_format);  transpose_1 = None
    _unsafe_view_5 = torch.ops.aten._unsafe_view.default(clone_3, [2, 5, 32]);  clone_3 = None
    topk = torch.ops.aten.topk.default(_unsafe_view_5, 3)
    getitem = topk[0]
    getitem_1 = topk[1];  topk = None
    gather = torch.ops.aten.gather.default(_unsafe_view_5, -1, getitem_1);  getitem_1 = None
    cumsum = torch.ops.aten.cumsum.default(_unsafe_view_5, 1)
    split_with_sizes = torch.ops.aten.split_with_sizes.default(_unsafe_view_5, [16, 16], -1)
    getitem_2 = split_with_sizes[0]
    getitem_3 = split_with_sizes[1];  split_with_sizes = None
    stack = torch.ops.aten.stack.default([getitem_2, getitem_3]);  getitem_2 = getitem_3 = None
    sum_1 = torch.ops.aten.sum.dim_IntList(stack, [0]);  stack = None
    rsub = torch.ops.aten.rsub.Scalar(sum_1, 1.0);  sum_1 = None
    pow_1 = torch.ops.aten.pow.Tensor_Scalar(rsub, 2);  rsub = None
    mean = torch.ops.aten.mean.dim(pow_1, [0, 1]);  pow_1 = None
    slice_3 = torch.ops.aten.slice.Tensor(arange, 0, 0, 1);  arange = None
    index_select = torch.ops.aten.index_select.default(_unsafe_view_5, 1, slice_3);  slice_3 = None
    native_layer_norm = torch.ops.aten.native_layer_norm.default(_unsafe_view_5, [32], None, None, 1e-05)
    getitem_4 = native_layer_norm[0]
    getitem_5 = native_layer_norm[1];  getitem_5 = None
    getitem_6 = native_layer_norm[2];  native_layer_norm = getitem_6 = None
    gelu = torch.ops.aten.gelu.default(getitem_4, approximate = 'tanh')
    sigmoid = torch.ops.aten.sigmoid.default(getitem_4)
    mul_1 = torch.ops.aten.mul.Tensor(gelu, sigmoid);  gelu = sigmoid = None
    silu = torch.ops.aten.silu.default(getitem_4)
    add_3 = torch.ops.aten.add.Tensor(mul_1, silu);  mul_1 = silu = None
    tanh = torch.ops.aten.tanh.default(getitem_4);  getitem_4 = None
    abs_1 = torch.ops.aten.abs.default(tanh);  tanh = None
    sub = torch.ops.aten.sub.Tensor(add_3, abs_1);  add_3 = abs_1 = None
    select_1 = torch.ops.aten.select.int(_softmax, 1, 0)
    transpose_2 = torch.ops.aten.transpose.int(_unsafe_view_5, 1, 2)
    baddbmm = torch.ops.aten.baddbmm.default(select_1, _unsafe_view_5, transpose_2, alpha = 0.5);  select_1 = transpose_2 = None
    t = torch.ops.aten.t.default(p0);  p0 = None
    view_3 = torch.ops.aten.view.default(_unsafe_view_5, [10, 32])
    mm = torch.ops.aten.mm.default(view_3, t);  view_3 = t = None
    _unsafe_view_6 = torch.ops.aten._unsafe_view.default(mm, [2, 5, 32]);  mm = None
    maximum = torch.ops.aten.maximum.default(_unsafe_view_5, cumsum)
    clamp_1 = torch.ops.aten.clamp.default(maximum, -1.0);  maximum = None
    gt_1 = torch.ops.aten.gt.Scalar(_unsafe_view_5, 0)
    zeros_like = torch.ops.aten.zeros_like.default(_unsafe_view_5, pin_memory = False)
    where = torch.ops.aten.where.self(gt_1, _unsafe_view_5, zeros_like);  gt_1 = zeros_like = None
    add_4 = torch.ops.aten.add.Tensor(clamp_1, where);  clamp_1 = where = None
    clone_4 = torch.ops.aten.clone.default(_unsafe_view_5)
    select_2 = torch.ops.aten.select.int(clone_4, 1, 0)
    fill_ = torch.ops.aten.fill_.Scalar(select_2, 0.0);  select_2 = fill_ = None
    argmax = torch.ops.aten.argmax.default(_unsafe_view_5, -1)
    _to_copy = torch.ops.aten._to_copy.default(argmax, dtype = torch.float32);  argmax = None
    gt_2 = torch.ops.aten.gt.Scalar(_unsafe_view_5, 0);  _unsafe_view_5 = None
    logical_not = torch.ops.aten.logical_not.default(gt_2);  gt_2 = None
    _to_copy_1 = torch.ops.aten._to_copy.default(logical_not, dtype = torch.bfloat16);  logical_not = None
    return (masked_fill, _softmax, getitem, gather, cumsum, mean, _to_copy, index_select, sub, baddbmm, _unsafe_view_6, add_4, clone_4, _to_copy_1)


def _values():
    return [
        _exact("QL5Fviu9lL0RPuw9WL20vlw9WL5vPVI9pDxTPj8+Kb1nvpG+wT0HPsw9hb5pvZ4+AD7Ive28+zxtPoc+Ij4QvtG9rTuovSo9lj2ZPNs9lz2MvAc+Rr0PPLI9xD57voe+5r0VPjQ+8zwdvYa9uT2HvZi9/j2CPhI/g75Tvps+vL3CvR0+Pj5cPny+2z6hvWU9i768vaS9q702vj4+wLwKPn+86z0Pvhw5ED6JvTE+dD0ovcQ+ob4IvDK+I763O/I9jD5ovms9sT3fvpG+HL0/PSk9UjxnPZs9nD0UvgU+Hr4VvdC+R7y6uyQ+bj0dvhm81b2evaQ+ib2pPEc+Hj5tPhe+j70JvsE90D2fPaY+Nb5TvJ88y71Uvou8ML5VvSg9Mb2iPCc9Rz5FPYQ9Cb2hvAM9BL6ivrI88L1XPdc8hD0lPim+Tj2TvCo+qr0CPtM9Vj0SPaS8dj1WvTi+JD1uvjW8db2FvnK9OT60PIY+BT44vva9ez48PeQ9Kr5Lvky+v722PYs9hz3qPBY+RL0uPku8Or6GPcs94j1Ovs89u71IPoU8JD4PPla+KD6pvVu+Iz5bPuO9wT1EPba7Nb6cvGq9hj4DPYI9xrzaPUC9Y77CvLa9s70TPhe+Dz5FPpa+fL6WvlA8OL52Ppe8xT3nvC+8MT4bPqK9Fb7GPKI+hT3Xuwm+qb13vcg9Rb7EvAW9arxuPsw9pb16vWK+kT6wPiC98T3GPTc9sL62Pbe9E76Au0g+iD0IvUW+WL0gPkS+vz0HPvy8+r1cvCe+JTynvQu+DD7YvV0+ej7UvSk+lL3VvRS9p70GPpM8N76fvC6+TL6jPVK+ar6EPrW7j70uvbC8FbyLPUA+pT4sPis+lL1Uvls+Jj21PR+7v756PlC+3D0oP6q8Sj2DPby9Kr5mPqY+XL7IvrG+Gz7tvac+PL65PYM+OT5VPp08ij6ePV4+FT4yPAQ+Jr4Xvlm9ZL2bPao9Fj6FPXo+pD22vb274D1UvcC9pb1Zvu68vT34vCC9ST0IPlg+ID66PYO+VT39PXg+Lz8/Poa+773EPVM+270CviQ94zy+vm0+q72PPi++kD5QvgM+TD7zvTO8vD6YPgG7Jz42vpc+P709vQA+3L0ivjk95T2ePks+yb0lPoG+wD5SPqa9mz1nPpQ9r73+vDw9ljx1PQG+HT0uvYc+J71Nvoy7mj41vhE/wr2ivZU+DL1YvV0+Zj4EPYY+g71uPmo9ib7Ivc09lT2EvGE9AL10vso9Rr7DOxM9HL6FPge/wL2TvWO9hL4hu1E+iD6Lvhu81z05Peq9Or6PPha+xj15PXE8X77xveC8Jr4wvt09Ar31Pau+zr4WPZG+Xz6Ovrq9173ZvSY+Dz2jO5I++L0Evsw9Vb5EPvw9Vj6YvQw+DL52PYq+077FO2q9gr0bvBA+6T0RP46+rj1DvWU9SD5dPhg+p71Ivuu9x76APAq9I7ysPma9Xz23Pag+Dr2nu608cjoIPos9dr1gPiW+Fj6MvOe9jL2Kvq09xj4dPbW9Fb46Ole+Ob4BPl09PL1fPhE9Oj0evum+wb07vb88rj09PSe+GD6GPmC8b70KPUW9yjzOPmM+NL15Pdk+5r7QPuM6Kr4nPpe9Mr0IPj2+xz4DvqK9qb0Hvb0+u7wuvvQ8r73BvR2+AL6CvDw+YD5IvQe+57y6vvY9Qz0cPVs+a765PSK+Cj1vvbo9hD7NPWe9ij0YPni+Sz5MvcQ+Yj26PlW+1T7xvUQ+vL0LPqs+lr2TvaG9Xj0mvgg+xL0NPRI9Iz76PXi+r77yvNU9kL4MPoW9Wj6wPW49Mb4kvh0+pz0oPio+R77Ivf68U75KPgW9ZL4zPi++RL2ePsy+iz3ovMc9Mz5bPoq+A75QvsQ97z0rPT49gbyJPqa8br4avm298T2nOxK+uD20vWO+hD6LPa++tD3NPYu9mz2Gvbc+Db2GvKY98j3rO5a9572UPiG+Nr4dvVa+vj3XPC8+Uj5WuZq+7D1MPmE+br1OPt29tD0ivre+gz2Mvfy9jT6yPR+9qj03PXw+cj2LPss9k77UvYm6GT6ouvc7xj2Hvsm9nLzvPb69gr3yu7E9Aj4wvlW+m7zSvRI+1Dw9Pjs+wz0EPmi+A74PvTW9Bb5wPv6+xbwRvku9tj6sPRe+qj6RvuW9Ar6jvj++zr3Ovh2+8D0BvoA9QT5vO38+u76VvIa+vz02vok9ir3HvTC9z70BvSQ+6D0Dvke8dr5Xvsk9Fr4xvk++6LzHPaE+OT35PVq+db0nvGU+Nb6OPQW+hbshvlA8BT8Kvj2+970HPmk+fz0rvog5tLyNPHy9872kvFM+CD0Ivjw9hjzUPk2+Lj6EvRu8O70nvLY9Gb5evmq+kD6evQs9ML5BPsO9s76FPW88Er47vZc9JD5jPgQ+Aj/UvpG+C7xuPsQ+tD3PPLE9yb0rPmG+dTrCPXK+XL3bPH2+DT4uPlw+sj6fPMq8GD4CvoO+mL7tPdK+YjurvJA+wj4jvvQ9ED4/PIg6cL6jPGK9D76dPdI9Fr0kvdW9Cz7DvaO8kr0LPnG+iLxNPMk9iD3ZvXK9PL6vvly8u7hDvqs+8ryBvjc+CzyNvp690Dtivr099721Pgg8mj0LPr68e72cvV2+7z2jvjQ+M74aPeg9tT1yPcY9yjvVPQ8+F74lPhQ+GD4evl09DL53PRg9Pj1XvYm9Ez1bPjG+i763PTk+kr4=", [32, 32], "bfloat16"),
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
        _like([2, 5, 32], "bfloat16", 0.0, 1.0),
        _ints([2, 5], "int64", 0, 2047),
    ]


def get_init_inputs():
    return list(INIT_ARGS)
