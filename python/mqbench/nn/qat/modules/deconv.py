"""``ConvTranspose2d`` QAT module: the weight is fake-quantized per output channel, which for a
transposed convolution is weight dimension 1."""
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ConvTranspose2d", "deconv_weight_quantizer"]


def deconv_weight_quantizer(qconfig):
    """A weight fake quantizer from ``qconfig`` with ch_axis 1 when it is per channel."""
    factory = qconfig.weight
    keywords = getattr(getattr(factory, "p", None), "keywords", {})
    if keywords.get("ch_axis", -1) not in (-1, None):
        factory = factory.with_args(ch_axis=1)
    return factory()


class ConvTranspose2d(nn.ConvTranspose2d):
    """nn.ConvTranspose2d with ``weight_fake_quant`` (ch_axis 1); the bias is not quantized."""

    _FLOAT_MODULE = nn.ConvTranspose2d

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, padding_mode="zeros",
                 qconfig=None, device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                         output_padding=output_padding, groups=groups, bias=bias,
                         dilation=dilation, padding_mode=padding_mode, device=device, dtype=dtype)
        assert qconfig, "qconfig must be provided for QAT module"
        self.qconfig = qconfig
        self.weight_fake_quant = deconv_weight_quantizer(qconfig)

    def _deconv(self, input, weight, bias, output_size=None):
        output_padding = self._output_padding(input, output_size, self.stride, self.padding,
                                              self.kernel_size, self.dilation)
        return F.conv_transpose2d(input, weight, bias, self.stride, self.padding, output_padding,
                                  self.groups, self.dilation)

    def forward(self, input, output_size=None):
        return self._deconv(input, self.weight_fake_quant(self.weight), self.bias, output_size)

    @staticmethod
    def _float_deconv(mod):
        return mod[0] if isinstance(mod, nn.Sequential) else mod

    @classmethod
    def from_float(cls, mod):
        assert type(mod) == cls._FLOAT_MODULE, \
            f"{cls.__name__}.from_float expects {cls._FLOAT_MODULE.__name__}, got {type(mod).__name__}"
        assert hasattr(mod, "qconfig") and mod.qconfig, "the float module needs a qconfig"
        d = cls._float_deconv(mod)
        qat = cls(d.in_channels, d.out_channels, d.kernel_size, stride=d.stride, padding=d.padding,
                  output_padding=d.output_padding, groups=d.groups, bias=d.bias is not None,
                  dilation=d.dilation, padding_mode=d.padding_mode, qconfig=mod.qconfig)
        qat.weight = d.weight
        qat.bias = d.bias
        return qat
