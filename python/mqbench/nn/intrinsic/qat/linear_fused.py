"""Fused linear QAT modules: Linear + ReLU, and Linear + BatchNorm1d with BatchNorm folded into
the weight before ``weight_fake_quant`` (torch's ``nn.intrinsic.qat`` modules, owned here: same
constructor, parameters, buffers and state-dict keys)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.fusion import fuse_linear_bn_weights

import mqbench.nn.intrinsic as qnni
from mqbench.nn.intrinsic.qat._bn_state import BnStateMixin
from mqbench.nn.qat.modules.conv import qat_from_float
from mqbench.nn.qat.modules.linear import Linear as _QATLinear

__all__ = ["LinearReLU", "LinearBn1d"]


class LinearReLU(_QATLinear):
    """QAT Linear followed by a ReLU."""

    _FLOAT_MODULE = qnni.LinearReLU
    _canonical_name = "nn.intrinsic.qat.LinearReLU"

    def forward(self, input):
        return F.relu(super().forward(input))

    def to_float(self):
        out = qnni.LinearReLU(super().to_float(), nn.ReLU())
        out.train(self.training)
        return out


class LinearBn1d(BnStateMixin, nn.Linear):
    """Linear + BatchNorm1d QAT: ``linear(x, fq(w * gamma / running_std)) / factor + bias -> bn``.
    ``freeze_bn_stats`` / ``update_bn_stats`` and the frozen-BN ``train()`` rule as the conv
    modules."""

    _FLOAT_MODULE = qnni.LinearBn1d
    _canonical_name = "nn.intrinsic.qat.LinearBn1d"

    def __init__(self, in_features, out_features, bias=True, eps=1e-05, momentum=0.1,
                 freeze_bn=False, qconfig=None):
        super().__init__(in_features, out_features, bias)
        if not qconfig:
            raise ValueError("LinearBn1d: a QAT module needs a qconfig")
        self.qconfig = qconfig
        self.freeze_bn = freeze_bn if self.training else True
        self.bn = nn.BatchNorm1d(out_features, eps, momentum, True, True)
        self.weight_fake_quant = qconfig.weight()
        self.reset_bn_parameters()
        self._set_bn_mode(freeze_bn)

    def reset_bn_parameters(self):
        self._reset_bn()

    def forward(self, input):
        running_std = torch.sqrt(self.bn.running_var + self.bn.eps)
        scale_factor = self.bn.weight / running_std
        scaled_weight = self.weight_fake_quant(self.weight * scale_factor.reshape(-1, 1))
        out = F.linear(input, scaled_weight, torch.zeros_like(scale_factor))
        out = out / scale_factor.reshape(1, -1)
        if self.bias is not None:
            out = out + self.bias.reshape(1, -1)
        return self.bn(out)

    @classmethod
    def from_float(cls, mod, use_precomputed_fake_quant=False):
        def build(linear, qconfig):
            bn = mod[1]
            qat = cls(linear.in_features, linear.out_features, linear.bias is not None, bn.eps,
                      bn.momentum, False, qconfig)
            return qat._share_float_state(linear, bn)
        return qat_from_float(cls, mod, build)

    def to_float(self):
        linear = nn.Linear(self.in_features, self.out_features)
        bias = self.bias.detach() if self.bias is not None else None
        linear.weight, linear.bias = fuse_linear_bn_weights(
            self.weight.detach(), bias, self.bn.running_mean, self.bn.running_var, self.bn.eps,
            self.bn.weight.detach(), self.bn.bias.detach())
        linear.train(self.training)
        return linear
