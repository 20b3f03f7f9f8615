"""Transposed convolution + BatchNorm2d (+ ReLU) QAT modules with BatchNorm folding (weights
scaled along dimension 1, the output channels of a transposed convolution), and the
ConvTranspose2d + ReLU module. Training-mode folding runs as the fused C++ op
(``fold_bn_train``); eval mode and frozen BN fold with the running statistics."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from mqbench.nn.intrinsic import ConvTransposeBn2d as _FloatBn
from mqbench.nn.intrinsic import ConvTransposeBnReLU2d as _FloatBnReLU
from mqbench.nn.intrinsic import ConvTransposeReLU2d as _FloatReLU
from mqbench.nn.intrinsic.qat._bn_state import BnStateMixin
from mqbench.nn.qat import ConvTranspose2d as _QATDeconv
from mqbench.nn.intrinsic.qat.conv_fused import _fused_fold_supported

__all__ = ["ConvTransposeReLU2d", "ConvTransposeBn2d", "ConvTransposeBnReLU2d"]


class ConvTransposeReLU2d(_QATDeconv):
    _FLOAT_MODULE = _FloatReLU

    def forward(self, input, output_size=None):
        return F.relu(super().forward(input, output_size))


class ConvTransposeBn2d(BnStateMixin, _QATDeconv):
    """Transposed conv + BatchNorm2d QAT module; BN state as torch's fused ConvBn modules."""

    _FLOAT_MODULE = _FloatBn
    _relu = False

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=False, dilation=1, padding_mode="zeros",
                 eps=1e-05, momentum=0.1, freeze_bn=False, qconfig=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, output_padding,
                         groups, bias, dilation, padding_mode, qconfig)
        self.bn = nn.BatchNorm2d(out_channels, eps, momentum, True, True)
        self.freeze_bn = freeze_bn if self.training else True

    def _scaled_weight(self, scale_factor):
        w = self.weight  # [in, out / groups, kh, kw]
        g = self.groups
        s = scale_factor.reshape(g, 1, -1, 1, 1)
        return (w.reshape(g, w.shape[0] // g, *w.shape[1:]) * s).reshape(w.shape)

    def forward(self, input, output_size=None):
        bn = self.bn
        running_std = torch.sqrt(bn.running_var + bn.eps)
        scale_factor = bn.weight / running_std
        weight = self.weight_fake_quant(self._scaled_weight(scale_factor))
        conv = self._deconv(input, weight, None, output_size)
        if bn.training and _fused_fold_supported(input):
            bn.num_batches_tracked.add_(1)
            factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
            return torch.ops.mqbench.fold_bn_train(conv, scale_factor, self.bias, bn.weight,
                                                   bn.bias, bn.running_mean, bn.running_var,
                                                   factor, bn.eps, self._relu)[0]
        z = conv / scale_factor.reshape(1, -1, 1, 1)
        if self.bias is not None:
            z = z + self.bias.reshape(1, -1, 1, 1)
        y = bn(z)
        return F.relu(y) if self._relu else y

    @classmethod
    def from_float(cls, mod):
        assert type(mod) == cls._FLOAT_MODULE, \
            f"{cls.__name__}.from_float expects {cls._FLOAT_MODULE.__name__}, got {type(mod).__name__}"
        assert hasattr(mod, "qconfig") and mod.qconfig, "the float module needs a qconfig"
        d, bn = mod[0], mod[1]
        qat = cls(d.in_channels, d.out_channels, d.kernel_size, d.stride, d.padding,
                  d.output_padding, d.groups, d.bias is not None, d.dilation, d.padding_mode,
                  bn.eps, bn.momentum, False, mod.qconfig)
        return qat._share_float_state(d, bn)


class ConvTransposeBnReLU2d(ConvTransposeBn2d):
    _FLOAT_MODULE = _FloatBnReLU
    _relu = True
