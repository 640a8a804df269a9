"""kernelbot generic task: LayerNormGelu at blocks.0.ln_act (float32).

Test fixture for agent/propose/aten_cpp.py, in the format the extractor writes: forward() is the module's own ATen graph
(make_fx, real mode) over its parameters and buffers and the call's tensors.
"""
# ruff: noqa

import base64

import torch
from torch import nn

inf, nan = float("inf"), float("nan")
DTYPE = torch.float32
INPUT_SHAPES = [[8, 1, 512]]
INPUT_DTYPES = ['float32']
INIT_ARGS = []
PARAMS = [('norm.weight', [512], 'float32', 'parameter'), ('norm.bias', [512], 'float32', 'parameter')]


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
        _exact("si1jP+R/Yj/PlXk/iOR0Pw7dij+T24g/++h3P7PZST8IIIQ/nKhfP9N6hD+x8YM/soiBP4/Xjz91S44/cKt5P0BfXT+MlVQ/zUCHPysoij9Hqoc/hzBYP9xCdz/ut5c/OZqJP+ICcT+hj3s/OFmCP63IkT8aTpQ/1RyMP+Fmaj/SSnA/hmeAPzFjcz8BLoM/zKCFP1lwgT/AM4g/laWFP4FhfT+uJIo/opV4Pw6sgD9PsYY/3nedP3VlWj96YVc/1sRuPxgsiz8ygo0/wkaCP3kaej+Z+HU/RfSGP0zidT+sk3Q/AoaJP/J3kz+Jp6s/O81YP/lnYD/gSpc/gOFxP2BtcT+Qxos/7DeOP6mCkD+kKFo/T9ygP13jcz+IS4Q/DEpWPzPtcT9ct3M/SjVzP3CvZD9vRY4/GGZ8P0tQij88nH0/VMuIPwSKaj/sAoA/uMaKP1bCdT8cTo0/mZWEP8+zeT/jeJ0/KdRPPxy6fj+hP2U/eoNnP+FtgD/QFok/LRGVP/8tXT8SaYQ/gaeGP1QZPT/8kVQ/Mih6P1uVgz8hKYM/8fuAP5RThD/80IU/TdmFP7TYaT8xAIo/MUZoP9plej+OqUE/JSJ+P0Qhfz/7UYw/KHiEPxtpaD+5j34/FQ9wP/MgdD9MmZg/4bF1PwGWgT/D6I4/ttGLP+TBkT+1Ymk/nEZ1P31laz9kPYc/C9CHP+L5hT/q95g/4chkPz0Ffj9qfYE/OctwP8snYD/tYn0/ioplPxf/dz9kJYM/alp5P8SDgT9oH4M/KuiOP5uxgz/O8oQ/T9p6Pyf7fD/MdYI/mDtsP+ZZTz80rIE/V/htP0cHhD+/A4I/wu6EPyVhjD/XoGY/TdyDP7BAfT++x4w/nztzPwK+iT8M6oc/EwWEPw27gj887Xw/KJ2EP/H1dz+UYmQ/FhWDP69BXD+FTn4/fNN2PyYGWD/P63Y/ddaNP9SugT8sJJQ/lwCKP+hiZD9yi20/ftOSPzOHgz/oiIg/K4tmP2KNYT86YmE/aKxxPxXUhj9JNYU/+wyFPwIygj+gNos/i6Z4P7YTjT9yGH4/AQpkP5gEhT8lnIc/JHqIP2AeYT91xoc/J/5xP239jj96P4E/yVSMP5LBij8M6F8/qqGMPztWcz9zJ18/EjqMPwdukD829G4/1DuHP7+ugz9GJX8/z9BkPxkSfT/qNXc/uByUP+Jzgj/+3IQ/Ukt8P1kpiD+JzHg/iPRdP1FdfD9sU3I//JlyP/oGiz8zS2k/f7yKP87Bjj946lI/dytaPwgOUz+V+YA/RGNkP7dvkj82K30/QWKHP02rez9oXH4/tkqNP3ubiz+s03M/f7VpP0vagT9IW5g/QP+EP/j9fj95e2s/Z1BzP8i+dj9NfYc//2diP3JUfD/AA3s/QM99P5DZkT/so4c/m6NzP7ygdj8HB14/GLOVPztwmj+8Ano/vg2JP7Rshz8sb4M/ikpLP+HVhj88S3I/4+NpPwdmfz9U/44/axqFP7Ppej9taGI/reR3PysJjD9So2I/FieHP28iij+1RXs/QkRtP3HvfT8T6WY/OMaAP5Z7cz8iK2s/9n6KP2/Kbz+nkpA/ZrmSP+0dcD/Bpow/re90P6wLcD/Rdno/a31zP7ISij+OYIE/95FkP4oDfT8u92U/7lRhP78fhj8whmA/VO1cP+HBkz9gJn8/fkh1P+x0eT8TsXw/NZp+PxI6hT/gao4/zMSYP/zljD8C3Iw/4uZ0P4MwYD83cZA/yx6DP+nJhj/FoH8//8NGP+PDkj/IymA/Az+IP9ZNsj+T0Hw/x8eDP+LlhD9Z7XE/fY1mP146kT+R55g/ePdeP3naQz+CCUs//qOLP703bj/AFJk/9L1jPzfthj/cspM/xOaNPzj0jz8UeYE/JrqUP27vhT9AppA/Zy2LP2jVgD/C5Yk/GipnP4VGaT/i2Xc/dHB3P5nQhT/4YoY/Bj2LPyL8hD9huJI/PyOGP09Ycj/pHH8/1WmIP1wIeD/anHE/Yp9zPxVvXz+Oi3s/uxeHP4FZez9b/3k/CsSDP6o0ij+VLpA/bPmLP2D7hj+SpFg/zf+DPwd5iT8VkJI/xn+0PzRQjj+C41c/MhtuPyZahz/j2I8/KJpvP/NtbD8wFYM/WCGCP5TdRj8ryJE/6iNzPwSAlT9syWU/cJSVP7zTYD+iyok/uFKPP6/AbT8/Un4/PzmcP6bZlj9nsn8/LIqMP4a1ZD9frpY/19l4P0zpeD8Ulok/DYdvP42iZz+5eYM/oZiIPwaulz+BPo8/UeZwPxxZjD9RXFk/lN+cP4S6jz98knM/Q86FP2pMkT/kjYU/WtxyP9s8ez9Hh4M/b2eBP8OZhD9NtGw/su+CP3p8eT9jOZQ/ib55P4VNYT+qV38/BhKXP3XfZD9ijqs/KnFxP9bTcz//T5Y/ZcR6P1nmdz9Xj5A/KDiRP4R7gj8QHpQ/tTN2P2nbkT8cY4Q/zOxWPwn3cD9ar4c/mJqFP+CHfT86OoQ/FDN7P5d3Wz+ulYc/rVliPy51gD/Uw4I/YYxoP1L3kz/AQy8/wqJxPwH8dD8teHc/iGlYP42ffz9yro8/CWaUP9I7Vj9Ai34/RA+IP5F4gz9XcG4/0QxkP+9/lT9vc2k/p2yHP4KphD/MIIE/B4teP77qbT/Ly3s/YyFnP0OcZT8BSYg/yR57P1IsiT+Py0w/EVBCPwHPgj9ZglQ/uMKQP4p4VT8=", [512], "float32"),
        _exact("46tfvXsPgb3y+YG9fpzHPSvnqzzd4kM7kwYvPqeilL2ga569lzV0PfsKAL4Vnuo9z2qXPdZTAD6gEza9dJ6nPZuHp73hlRM9ElYlvrBFfb5Y82w7JywMvVhXHL0nYbq728WsPULaiz0Gy60+A+Iqvmg/UT1rR+q8ujwJPUMD8D3QqAQ+z3K2PUukSL0FKfC9+LSMvegWb76XExo8tIulvHcMw7s6A04+K/MJvYSFBT3/N1s9mhBKPjP+qbySX0i7o6FPPFxmEToWrqI9J8UmPVfTE72LKwY+jqTFvWdZtD3f5Ce806aKvec0KL12vSW+BwpQPdrebT5iO7w8F/JYvWzasr3Pa985v84AvkcZ3r3PNZo97ZAEPchJ4bzVsQU+k3etPKLK3jxH0b29++2LvucVZ73jdeC8OgRlPJhOUD0HAOM8vvXIvSgJtj1FqiA+exsGvEIdD73r06U8Yz7svIf4cjyXrXc+TPkHPoAn2LwGSRU970CCPmOzib6IH3o+TvyHOrUUzL2ZZcg9S9A0vcLY1bz4bKM9Qr7ivaOmbj70rJy98YtCvWnbSr03f6K8vc1iPl3zX7zzhNC9UyaSPF9dUr2oMGe98BS8vbmCmb3EiRu8GHXhPfEwBj4d5u+88XOhvS/firyytF6+tYGTPWfW6TwYn7s8IWgDPgk7Db5wfl09aBzCvamYpTyfqg+98jtfPevRHT6l23U9dnMKvfy/JT2r6bY9H+YUvtsy8z2fXvW8myRrPjlkBz09sl4+0Cv/vTinfz4HxZC9o5zrPUMvYb2hBKc9F9tMPuz0M73L5zC9KrZBve9hBT3MZce9i2ijPejSar23y6g8vRevPNd1wz2aIZY9dAMVvlt9Ub5RD5G8Kpx/PcPxLL6vcKc9P5QfvczTAj5D0FI9s8AOPWiO1L3OVsS9ygq8PR82SD0vgsk9NgLMPQXA7r2axG+9c4eYvJtt/b1bdvI9rh2gvGfeCL6XRdc971DSvSuE67yDOz0+Vz51vjf+Jj2oK4u8d0dvPdIg1z2vpAM+GYglvsd7nb1a8/m918BqPQ0yjz0zqs08kBvkPGcMG7yH6CQ++lVHvF3CDr7pTLm9BAIOvflekD1OLUg7sfKuvTezXD17ple9p2YIvtw4Hj6MXyc9OmVSvitpVz1iinU97gonve+OOT0XeiC9/StbPtbrqLwnMyG87NhGPRfpkD2YHY07af4zveN3ir3bDzI+R/vAvSAK2r2ELby836cAvgsnZD02HoE8/VfSPcDB+z03QQC5JUw5vk3WjT3nZPU9PtQGPkesDr33S/c95ayEvSCqVz3euMK9DbVbvhfCHD0A1Se9FkSXvQ+AKT7wJFU9Ho++vOu9Sz0y+ds8fTsXPvZSET3DXiY+3RBzPaGuML4Qx369BdMjuh9Wtz3z2Em6swSUO61MbT3IDCK+e8JwvcC/OryHp489iJNjvXJXHL2n+pC7LdJUPR+qmz07y9K9ngoAvpVGOry9gHu9K7KuPe0cfjwtfuI92CTgPXeVaT3v/549lPAKvr/AnL37O6u8+DzZvABOn73LGRA+13SYvng6bLymEK694vvzvAgJWj5T6009Ea21vROJTD7q6S2+ZaCJvYr/m718DES+gLzlvaI3d73Xs3e+fs+7vXi8jz1J2Zq91yYaPecB5z1KgA87RPUYPnWFYL7EsTK8d6kgvpeaZD1LNdq9U+UkPav8Jb1g8m69HcjTvIMJeL1FNZq8B4fEPRNEiz1TiZ29MtPuu3PME75XQQG+O+twPceEs73ABdS9m+D4vX71iryKgG49kYFBPhLM3TydiJU9lhUDvtS1Er0evMi7iB4JPtXc2L0pXSo9ucSfvW0OILv1b8G90lH5O+p3nz6UC6a9v1jivRgilL0HbqE9QboLPi8MGT2N48y9jYcjOcuLV7yi/yg8uXcXvRy8kb1SGUW8A5v9PVGhojzXiKO9oiPiPHnfIDyNKn4+4uX1vZUX0T3ugB69g2m6u30B4LysD8i7j/FZPT++t70iSgW+y5MMvscmLT4nUT2948amPPiF073Ahec9bZhpvdUiV75Xth89hBoPPFmWr70q9+C8KIo1PflsxD1bZAg+x1+ePb2AnD5DwH6+NbAtvo4Cp7tbmQ4+skRrPqr2Vz0vBng8r4JUPT2Ccb138Mw9q+cGvjbOEjrbmmg9kFMRvqomBL0QLYM8s+oXvoWgqD3tNNA9ecMDPpcyVT6bRT8819tyvLvltj3uBZy9aJIdvky9Nr6ib449qIN7voGkBzsrUk28wassPj0WaT778sO9g1OSPcrxrD11KOU7omUjOiLtD77ptUM8D6sHvbwurL2/3zw92kx8PZNvs7wdJ8W8BAWAvbolpz3z6Gm9JbZDvAcML70WxqY9vJgQviB4I7wKjfU7yMtxPas/Iz37OoK9RfAQvSIT4b2HXVK+RygEvIOJYLgIluq9N2xNPrsJkbwoGhu+nSbcPbdYpjtWjCm+iwY9vaiKeTshlQe+yEFjPawDlL37TVk+WbmjOwMxOT3t0qY9f2xkvAqZFr0bVTu92Y8EvmOajz1ej0O+LdLXPQp91r0farg80jqLPcifWD0fFxE98sdtPVfXcTv9MH89gfurPWahtL0ppMU92u+xPfrbtT1aZb29+78EPRu5p709chQ93vS1PDOV5DxUGAG9p0MkvU63sDxvnwM+SrTUvVVRJ75HIVw9GrjdPecmL74=", [512], "float32"),
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
        _like([8, 1, 512], "float32", 0.0, 1.0),
    ]


def get_init_inputs():
    return list(INIT_ARGS)
