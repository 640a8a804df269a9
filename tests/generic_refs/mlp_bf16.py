"""kernelbot generic task: MLP at blocks.0.mlp (bfloat16).

Test fixture for agent/propose/aten_cpp.py, in the format the extractor writes: forward() is the module's own ATen graph
(make_fx, symbolic mode) over its parameters and buffers and the call's tensors.
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
PARAMS = [('fc1.weight', [1376, 512], 'bfloat16', 'parameter'), ('fc1.bias', [1376], 'bfloat16', 'parameter'), ('fc2.weight', [512, 1376], 'bfloat16', 'parameter'), ('fc2.bias', [512], 'bfloat16', 'parameter')]


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


def graph(p0, p1, p2, p3, x0):
    sym_size_int_1 = torch.ops.aten.sym_size.int(x0, 2)
    sym_size_int_2 = torch.ops.aten.sym_size.int(x0, 0)
    view = torch.ops.aten.view.default(x0, [sym_size_int_2, sym_size_int_1]);  x0 = sym_size_int_1 = None
    t = torch.ops.aten.t.default(p0)
    addmm = torch.ops.aten.addmm.default(p1, view, t);  p1 = view = t = None
    sym_size_int_3 = torch.ops.aten.sym_size.int(p0, 0);  p0 = None
    view_1 = torch.ops.aten.view.default(addmm, [sym_size_int_2, 1, sym_size_int_3]);  addmm = sym_size_int_3 = None
    gelu = torch.ops.aten.gelu.default(view_1)
    sym_size_int_5 = torch.ops.aten.sym_size.int(view_1, 2);  view_1 = None
    view_2 = torch.ops.aten.view.default(gelu, [sym_size_int_2, sym_size_int_5]);  gelu = sym_size_int_5 = None
    t_1 = torch.ops.aten.t.default(p2)
    addmm_1 = torch.ops.aten.addmm.default(p3, view_2, t_1);  p3 = view_2 = t_1 = None
    sym_size_int_6 = torch.ops.aten.sym_size.int(p2, 0);  p2 = None
    view_3 = torch.ops.aten.view.default(addmm_1, [sym_size_int_2, 1, sym_size_int_6]);  addmm_1 = sym_size_int_2 = sym_size_int_6 = None
    return (view_3,)


def _values():
    return [
        _like([1376, 512], "bfloat16", 4.23386e-05, 0.0255138),
        _exact("Gz3lvIm9Pz4vPgE+Qz3JvWg9ob0HPgE+Uz7evWm94j0lvh49Cj0PvuQ9xzwCPYA9n7zZvfG8uz0pPPU9hb0WPco9zDw/vjU+G772PQw+6r0UveA96z02vno9YT3Vvbk8aj3QPT27Ij4Avre9lzy5PH09V75qvX09hT2EvZ29s704vZE++j0BviW7s73FvQi9mb2TPCW97D03vNE9Fz6hvZK+J721Pa89izvKvZC9WT5iO3K8yDwJPbY8qbxlPRW9DD3iOvQ9BT2gPXA91z18u5Q9WL1TPYU9Mb1yO4s9UD5DPhg8mr3Zuwi8zjxEvgy+kTxivJm8UL21Oi6+dT0WvGu9s7xxvD49lT36vQ6+Aj6ZvbY9DjzlvXs9CT39PbK8Cz78vPG8z71Gvnk+xzyGvcA9mTwivBQ8kjyIvUI77T33PGo+Hr41vbY8nz0Rvma9Ib0mPjc9pT0Qvcy8br2ovGU9Mb7yvUq9zb2zPTk+LL0iPSU+IT4Xvew9Hb2mPea7gT3lvRQ8YDtZPZU8grz9PHA9H703vrg9Ez5MvTG9WjxCu308tb1dPNA7vj0zPeM9uj3IPRc+0L2SvPm9Bj1DPLY8qr0wvQM+xDwwvdG90rwgvra8urzNvae7Dr70vQ49ND7CvZ49Oj2dvZQ78j3PPZa9gT0CvjC+AzyDvXw9Qr1cvg8+rz2yO+U9Er55PdK9gj7HvWU9Sj1aPYW8zj2uvDm9OD5OPi+9LzuGvfs8b7zqvea9v73PvGS8jD1xvXu8OL0CPha+vr1NvjO9KD5jvXy9TT2ivZK96LyzvR0+Fb4CvjO+S70BviG9+b07vsG9eb0cvQe9ND7uPZO9Xr2fPSo9HL2IvYO8HT25vWK8JTvuPM08R72zvBk+cz2EvVc9KLuHPgQ+Jr6wvQc98T0fvu88PL17PWC9Hr6ivbQ9hT2nvYA9i70svWm8Bj7FvRK+nT11vBg+Pj31vRE+NT1qPXw9Zb0Cvvg7Yz66vQm+FDzvPR6+wrzqvUM+B76evdo9nb1UPS4+kLwZuy29VDySPVe9Vb25vUQ+Ar20PIs9d75BvbQ9FD2zvWu9Fz4pvn69VLwBPSS8zbyava88YTw9PTi9+71PvTk7W71WPRC+NT7mvY87tD1tPZC9IT2svWK+Kb7bvVS+3Dy5Pbk97D0kvgI+p7wzvgw9Pj7+vSM7gD2Rvfg8Pj0avfE9Yj0HvQG+V7yLPbg9s71UuwE+Or4vvr89B72FPbw9e7xyPcs8jj3UPWo9gb2ePCe+eT4QPnK9HL5fvbc9p72TPJa9Jb4fvlY+LT4NPuY8Xj1Mvps9+bw8Pg09Fr29PFE+hD2YPRa+oDm/PUE+KT4zviA+Kr5vPRo98LwOvZG87b12vnW+gTytPD886r3gvb69hL2KPUa94zxuvrW9j72kva68h7xGvZG9fr01PCw96zxIPoO+Qj3kvem8yLwFPg28Vb5kPdY9yzynvKI9ij3VPZW9/z0UvRQ+KT3EPSm7Eb01vb87Cj3wPVQ9xbwlvVC9OD1qvBG+770Bvi29WL6VvbC987uevfa9Mb3FvaE8Tz2evKA8tj2CvRW+GT2mvby9yD0EPi4+jb1svQy+ebwdvik9qL0hvga+nr07vrY9j73mPa+7pr7SvaE9cjwSPMO9Rr0UPiO+RTz8vXk85T0lPg++eTyvPJq9VD6FPAY+0L1OveI9qjyJPuw9BL6QOf26Ar7HvDW+F74KPXK+uD0mPhS+7D00vR49OT12PbW9nr2Uve899jxPPay96z2MPrQ9FT6huuG9wD2PvKG8Jz45Pjk9WT16vVo9+L2mPQK+GLyjPSQ+2zwyvaq9sL3BvVC9OTy2PMo94b0HPhq+PD4Svh49Cz6hvXy9Zb2NPYi8YT2SvaO9+r3yPOS9pj2fPNW8Vj0aPao9gT3qPOM8U72YPWk+9L2/vaO+7r2lPYK8zr0HvJm87Dw5voe9vb1APd+8Ij4vvau96TzaPSU8rzzDvUu+hT0IPvW8VD1fvmu+B70+via88zxHPXA9DzysPOo7CTw1vWa9cTyBvZI9QT4lPhk+U75OPjy8L73UPKI9P76APUk9mb1EvWw91rwsvks9E77yOzs9jz2WPBq+ZT7HPd292ro8vX4+T70NvWm9Zz3tvDm8db0bvQC9Hb40vf+9vzzVPc49z7zmvfA9u7xavic+l70RPSU+UL18u6c9yT3EPV+9MD55vfY8xD1YPC+9rj3OPIa9Oj4EPWI9Tr7lPQE+kbxNvhM+nT3CPIC8Pj4Mu3G+Db4vPia+Bj7LvFk9mL3rvVq+dD1fvT++2D3ovD88KzyePQQ+LbzjvO09xL2Ivta8D76lPUQ9oLunPRa6Nb30vXg+ej0LvQw7xLo6PXi8WD0Yvjo9AL4CPpM8qj3WO6g9Er5OPhA+Fb2aPRu+2T0vPRu9eD70udC9DT4rOwO+j7zYPAO+N74XveU88z1APTi+2T3pvVk9rz1APv29xL05voe9kz0LPvQ8Aj7jPLg7pz0vvT8+tj1nvbU9Bz6EPe297zzCPZC9WTzrPY+9ML0+vAe+Tb0UvSe9Wr2ivew8WT1pvoa95r0qPn+9jD2ZvBG+f7zlPKU9CD5ivc49NL4ivNW8hb3VvS49y7oiPgM+2DwPPJU8N76GPlY9AzzIOyO+A76Hvbw9v72zPW29lr3KvRK9Hj4ePEk9U736PAY9kj2yvYo9VL2UPbw8S72PPQo+d72QviC+BT5IPeA857yKPQu+8L1OvUW+Gb3Bvb29uz0Hvac9jL2bvTQ+pz3zPb297T0nvSq+oDyXPZk9CL22PQi+VzvIPAi+8LyFvY67vLxJvRy8yr4xPSA+Zb3ZPY29/T0IvlG9eb4QvrG90D2evRs9tb18vZ29IL1jvay93L1uvq89Ir5Hvg6+4Ly3PeQ8872SvQe+Yz4xvma93L09PYc99rwhviw9Jj3cvZk9Fbxhvqg7ODsTvq69sD1PvRo+Dj5sPoI9FT6BvG69uj13PaE8lz0TvRW+ur1aPSs9Cz09Pq48fbsTPtc9Cb48PY+9qT2dvWC9j72zPXK8Qb7APbo9oTxNvYU9TT4nvto9zbzOPBY+lL2VPGe9tD28vKu9Yr3IPQI9Zb20vgI+pr1svaQ9VTzmPaM9WrsePh0+NDsCvYm9A76ZvS4+Hr7TvO69372pvK+9sTziPYI97j2BvEo7ar1BPV2+hj0/uwY9/L14vuO9Xz0GvQU9zDshvqy9/D1UPco9pL3UPdy8IL1OvvS7y70RPWI99z1dPd28Ij1dPY4767xivfy9pD3YPRG9jTsIPtA8n70QvQU+1zyMPUm9LD0lPfU9vLwBve85070rvZk91DztvVe9Pz4sPqo8Wbw9Pc08Hr7vPJ48vL2qPZa9vDy4vPY9pb2QPba8hb1vvlO9qb1nPUa9Or3/PDC9Fb1yO/E9FTw0vJe9qz2bvdg8zz1fPYg9tT2GPrk9QT2ova+8Ur6Qvb68/z2LPCE+Db5lvSC+GL6kvdm9Kz3nPP29OLziOx4+772Fvt+9ATwzPSE+4L1PvhK93zwJPhY+wj3OvVw86TwJvsu9jLx3vWq9rr2yPbw9djwEPts9HL4CPpU9w72QPoE9Db6dvOK9kD2DvUC7ODyhPJ89Pj2pPcW8vz0vPUe9kbjRPZw+IL64PQ==", [1376], "bfloat16"),
        _like([512, 1376], "bfloat16", -2.31111e-05, 0.0155628),
        _exact("BbwDvlG9v70IvTI9ZT0FPrA9zb3rPJy8hbvNPYS9FL6YPYG9vz3vvUM+k7zbPUQ9f72rPUq+qz0APk49ozylPbQ9kD1/Pbk9mDygPHq+Uj2ZO/k9FL1kPZI8Lz2iPGc8wz2bPHG9Az03vh69yz1qPiS9kT2rPR++D76rvSm9Aj2LPWM9l71wveq9FD0PPkO+NzzPPIG89ryxvUQ9Dr5hubi8nrwRvbC9i72OvVa+4r3GPDo9fz3AvfQ9lj0XPhk+TTyjvYY9aD6wvY49pjufu228IT7SO6c9QT1tvd69sLtivYS9QrwJviu9JD6cPdg9O7xbOwq+Rr55vZE9qj06vsE8471zPRW+Fj4yPhq9zb3cveW9PLzyvVK91T3sPGI+bDwavoo9zj17PYk9RT2ivXc+Bz0Gvim+sDyBulo9tj2mvSC9XDx4Pg4+VD4mvYO7JT4/vjO9zT0mvh4+P708PRS9irxfPsG93b0jvpY8iD0VPZk9dr3LPTY9TT0HvRA+JLxfPc29kz4Nvas9dz38uyW+kr2kvc49qbpOPvq8PT3ivBE+Fr7JvGe+qr1avGi9OT2Lve29MT2fvIe+rDwXPlg9BT53OzK+kLtWPgi9YD1+vRg7XbwNPZO8Cj4WOyY9v73pPX090bwLPNa8Fb0svjw9yLxZvpa8Cz5JvWw9RD3FvSe+Qr6EvRY+S7xIvZi9Jb4CvO89kD1mvUS9S70oPWS8ML5JvTU9Cb2JvXE8QTqvvLo9UD6SPTc8IDvnPQ29mj0kPmQ+LTwwPQm+Fj2BPUA9Q758Pj09eb0BPRq7lD2ovQG8WD37PSa+Xj5HvWO95b1qPcU90L05PRQ94rysvZ28Bz0zvfm8Nr72vJy9ID5BvoE9erycPZe9ybzWPco9ujxcvey9tz38uxk9qjx/PfI9jb5PPNI72b01vZG9+L0ePKg9JDwOvSa9kz0aPXy9Er4aPpw93z0VPf+91DxFPcc9Nz44vbE9Tj5OPC2+Or41vns9R71AvVC9WzwkPlk+SD1vvdI9BD2IPa06qT1HPp+9lT6+vUo+tT2APfo9RbwdviA+cT0evR2+8z3yPFq9zD1rPVm+ZD2mvay9Zj2vvUM9hz2FvA0+9LtdvYK8sD3HPRM+8D0jvh29Yr0/PLG99z0luCQ+lLwkuoE9yz2jPXm96LyKvEs9kb2mvY89W70+PaW9hL2ePYi9CD5UPiK9dL2VvVE8wb1pPeq9Dbpgva09aD0ZPfI9uDylPWA8CT7Zvcy9Ab6Dvbs7zr1rPB8+FT5YPS29Q70ZPeY7X72kvNe9AruyvTA9pL0cPdq96z2dPek9BL6CPZw9CD41vVu8Fr6EPbo8rzxkvmI+x72ivA==", [512], "bfloat16"),
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
