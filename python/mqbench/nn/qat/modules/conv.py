"""``Conv1d`` / ``Conv2d`` / ``Conv3d`` QAT modules: the convolution with its weight through
``weight_fake_quant`` (torch's ``nn.qat`` modules, owned here: same constructor, attributes and
state-dict keys ``weight``, ``bias``, ``weight_fake_quant.*``)."""
import torch.nn as nn

from mqbench.utils.module_types import is_float_module_of

__all__ = ["Conv1d", "Conv2d", "Conv3d", "qat_from_float"]


def qat_from_float(cls, mod, build):
    """The shared checks of ``from_float``: ``mod`` is ``cls``'s float module (or torch's class
    of the same name) and carries a qconfig. ``build(inner, qconfig)`` makes the QAT module from
    the float layer (``mod`` itself, or ``mod[0]`` of a fused container)."""
    if not is_float_module_of(mod, cls):
        expected = cls._FLOAT_MODULE
        raise TypeError(f"{cls.__name__}.from_float expects {expected.__name__}, got "
                        f"{type(mod).__name__}")
    qconfig = getattr(mod, "qconfig", None)
    if not qconfig:
        raise ValueError(f"{cls.__name__}.from_float: the float module needs a qconfig")
    inner = mod[0] if isinstance(mod, nn.Sequential) else mod
    return build(inner, qconfig)


def _conv_class(base, name, dims):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", qconfig=None, device=None,
                 dtype=None):
        base.__init__(self, in_channels, out_channels, kernel_size, stride=stride,
                      padding=padding, dilation=dilation, groups=groups, bias=bias,
                      padding_mode=padding_mode, device=device, dtype=dtype)
        if not qconfig:
            raise ValueError(f"{name}: a QAT module needs a qconfig")
        self.qconfig = qconfig
        self.weight_fake_quant = qconfig.weight()

    def forward(self, input):
        return self._conv_forward(input, self.weight_fake_quant(self.weight), self.bias)

    @classmethod
    def from_float(cls, mod, use_precomputed_fake_quant=False):
        def build(conv, qconfig):
            qat = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                      padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                      bias=conv.bias is not None, padding_mode=conv.padding_mode,
                      qconfig=qconfig)
            qat.weight = conv.weight  # shared with the float model, as torch's from_float
            qat.bias = conv.bias
            return qat
        return qat_from_float(cls, mod, build)

    def to_float(self):
        conv = base(self.in_channels, self.out_channels, self.kernel_size, self.stride,
                    self.padding, self.dilation, self.groups, self.bias is not None,
                    self.padding_mode)
        conv.weight = nn.Parameter(self.weight.detach())
        if self.bias is not None:
            conv.bias = nn.Parameter(self.bias.detach())
        conv.train(self.training)
        return conv

    return type(name, (base,), {
        "__doc__": f"nn.{name} whose weight goes through ``weight_fake_quant`` (a {dims}-d QAT "
                   "convolution).",
        "__module__": __name__, "_FLOAT_MODULE": base, "_canonical_name": f"nn.qat.{name}",
        "__init__": __init__, "forward": forward, "from_float": from_float,
        "to_float": to_float,
    })


Conv1d = _conv_class(nn.Conv1d, "Conv1d", 1)
Conv2d = _conv_class(nn.Conv2d, "Conv2d", 2)
Conv3d = _conv_class(nn.Conv3d, "Conv3d", 3)
