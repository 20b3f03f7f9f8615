"""Fused convolution QAT modules: Conv + BatchNorm (+ ReLU) with BatchNorm folded into the
weight before ``weight_fake_quant``, and Conv + ReLU (1d, 2d, 3d).

They are torch's ``nn.intrinsic.qat`` modules, owned here (the torch package is deprecated):
same constructor, parameters, buffers and state-dict keys (``weight``, ``bias``, ``bn.*``,
``weight_fake_quant.*``; version 2 layout), ``freeze_bn_stats`` / ``update_bn_stats``,
``from_float`` / ``to_float``, the frozen-BN ``train()`` rule and the eval-mode path. The
training forward differs in how it runs, not in what it computes: torch divides every conv
output by the folding scale, adds the bias back and runs BatchNorm and ReLU as separate
full-size passes, forward and backward; here float32 CPU training runs that tail as one C++ op
(``torch.ops.mqbench.fold_bn_train``, Note [Fused BN folding] in src/ops/bn_fold.cpp). The two
agree to float rounding (tests/python/ops/test_bn_fold.py compares them with torch's modules).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn import init
from torch.nn.utils.fusion import fuse_conv_bn_weights

import mqbench.nn.intrinsic as qnni
from mqbench.nn.intrinsic.qat._bn_state import BnStateMixin
from mqbench.nn.qat.modules.conv import Conv1d as _QATConv1d
from mqbench.nn.qat.modules.conv import Conv2d as _QATConv2d
from mqbench.nn.qat.modules.conv import Conv3d as _QATConv3d
from mqbench.nn.qat.modules.conv import (bias_fake_quant_from, fill_missing_bias_quant,
                                         mark_bias_quant_layout, qat_from_float,
                                         quantized_bias)

__all__ = ["ConvBn1d", "ConvBnReLU1d", "ConvReLU1d", "ConvBn2d", "ConvBnReLU2d", "ConvReLU2d",
           "ConvBn3d", "ConvBnReLU3d", "ConvReLU3d", "freeze_bn_stats", "update_bn_stats"]



def _fused_fold_supported(input):
    """Whether ``fold_bn_train`` has a kernel for this input: float32 on the CPU; float32,
    float16 or bfloat16 (autocast) on CUDA."""
    if input.device.type == "cpu":
        return input.dtype == torch.float32
    return input.device.type == "cuda" and input.dtype in (torch.float32, torch.float16,
                                                           torch.bfloat16)


class _ConvBnNd(BnStateMixin, nn.modules.conv._ConvNd):
    """Conv + BatchNorm QAT: ``conv(x, fq(w * gamma / running_std)) / factor + bias -> bn``."""

    _version = 2  # torch's: BatchNorm state under ``bn.``
    _relu = False

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation,
                 transposed, output_padding, groups, bias, padding_mode, eps=1e-05, momentum=0.1,
                 freeze_bn=False, qconfig=None, dim=2):
        nn.modules.conv._ConvNd.__init__(self, in_channels, out_channels, kernel_size, stride,
                                         padding, dilation, transposed, output_padding, groups,
                                         False, padding_mode)
        if not qconfig:
            raise ValueError(f"{type(self).__name__}: a QAT module needs a qconfig")
        self.qconfig = qconfig
        self.freeze_bn = freeze_bn if self.training else True
        self.bn = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[dim](
            out_channels, eps, momentum, True, True)
        self.weight_fake_quant = qconfig.weight()
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        bias_fq = bias_fake_quant_from(qconfig)  # Note [Bias fake quantizers]
        if bias_fq is not None:
            self.bias_fake_quant = bias_fq
        self._register_state_dict_hook(mark_bias_quant_layout)
        self.reset_bn_parameters()
        self._set_bn_mode(freeze_bn)
        self._enable_slow_path_for_better_numerical_stability = False

    def reset_bn_parameters(self):
        self._reset_bn()
        if self.bias is not None:  # the conv's own bias, initialised as nn.Conv does
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in)
            init.uniform_(self.bias, -bound, bound)

    # -- forward ---------------------------------------------------------------------------
    def _shapes(self):
        weight_shape = [1] * self.weight.dim()
        weight_shape[0] = -1
        bias_shape = [1] * self.weight.dim()
        bias_shape[1] = -1
        return weight_shape, bias_shape

    def _forward(self, input):
        if "bias_fake_quant" in self._modules:
            out = self._forward_quantized_bias(input)
            return F.relu(out) if self._relu else out
        if self._enable_slow_path_for_better_numerical_stability:
            out = self._forward_slow(input)
            return F.relu(out) if self._relu else out
        bn = self.bn
        scaled_weight, running_std = self._folded_weight()
        scale_factor = bn.weight / running_std
        _, bias_shape = self._shapes()
        fused = bn.training and bn.track_running_stats and _fused_fold_supported(input)
        if fused:
            conv = self._conv_forward(input, scaled_weight, None)
            bn.num_batches_tracked.add_(1)
            # BatchNorm's running-average factor
            factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
            return torch.ops.mqbench.fold_bn_train(conv, scale_factor, self.bias, bn.weight,
                                                   bn.bias, bn.running_mean, bn.running_var,
                                                   factor, bn.eps, self._relu)[0]
        # conv without bias, unscaled back, the conv bias added, then BatchNorm itself
        zero_bias = torch.zeros(self.out_channels, device=scaled_weight.device, dtype=input.dtype)
        conv = self._conv_forward(input, scaled_weight, zero_bias)
        conv_orig = conv / scale_factor.reshape(bias_shape)
        if self.bias is not None:
            conv_orig = conv_orig + self.bias.reshape(bias_shape)
        out = bn(conv_orig)
        return F.relu(out) if self._relu else out

    def _forward_quantized_bias(self, input):
        """MQBench's Vitis ConvBn forward, with the folded bias through ``bias_fake_quant``:
        ``full_bias = (b - running_mean) * gamma / running_std + beta``, ``y = conv(x,
        fq(w * gamma / running_std), bfq(full_bias))``, then ``(y - full_bias) / factor + b``
        into the BatchNorm (batch statistics in training, running ones when frozen or in
        eval). Note [Bias fake quantizers] in mqbench.nn.qat.modules.conv."""
        bn = self.bn
        scaled_weight, running_std = self._folded_weight()
        scale_factor = bn.weight / running_std
        _, bias_shape = self._shapes()
        conv_bias = self.bias if self.bias is not None else torch.zeros_like(bn.running_mean)
        full_bias = (conv_bias - bn.running_mean) / running_std * bn.weight + bn.bias
        conv = self._conv_forward(input, scaled_weight, self.bias_fake_quant(full_bias))
        conv_orig = (conv - full_bias.reshape(bias_shape)) / scale_factor.reshape(bias_shape) \
            + conv_bias.reshape(bias_shape)
        return bn(conv_orig)

    def _folded_weight(self):
        bn = self.bn
        running_std = torch.sqrt(bn.running_var + bn.eps)
        weight_shape, _ = self._shapes()
        factor = (bn.weight / running_std).reshape(weight_shape)
        return self.weight_fake_quant(self.weight * factor), running_std

    def _forward_slow(self, input):
        """The two-pass folding (Jacob et al. 2018, section 3.2), which stays exact when a
        BatchNorm weight is 0: training normalises with the batch statistics of the unfolded
        conv (after updating the running ones from it), eval with the running ones."""
        bn = self.bn
        _, bias_shape = self._shapes()
        zero_bias = torch.zeros(self.out_channels, device=self.weight.device, dtype=input.dtype)
        if bn.training:
            conv_out = self._conv_forward(input, self.weight, zero_bias)
            with torch.no_grad():  # BatchNorm's running statistics, from the unfolded conv
                bn(conv_out if self.bias is None else conv_out + self.bias.reshape(bias_shape))
            scaled_weight, running_std = self._folded_weight()
            conv_bn = self._conv_forward(input, scaled_weight, zero_bias)
            dims = [0] + list(range(2, self.weight.dim()))
            mean = conv_out.mean(dims)
            std = torch.sqrt(torch.square(conv_out - mean.reshape(bias_shape)).mean(dims) + bn.eps)
            conv_bn = conv_bn * (running_std / std).reshape(bias_shape)
        else:
            scaled_weight, running_std = self._folded_weight()
            conv_bn = self._conv_forward(input, scaled_weight, zero_bias)
            mean = bn.running_mean - (self.bias if self.bias is not None else 0)
            std = running_std
        conv_bn = conv_bn + (bn.bias - bn.weight * mean / std).reshape(bias_shape)
        if self.bias is not None:  # keeps the conv bias in the graph (DDP needs every grad)
            conv_bn = conv_bn + (self.bias - self.bias).reshape(bias_shape)
        return conv_bn

    def forward(self, input):
        return self._forward(input)

    # -- state-dict versions ---------------------------------------------------------------
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        if local_metadata.get("version", None) in (None, 1):
            # version 1 kept BatchNorm's state on the module itself (gamma, beta, ...)
            for new, old in (("bn.weight", "gamma"), ("bn.bias", "beta"),
                             ("bn.running_mean", "running_mean"),
                             ("bn.running_var", "running_var"),
                             ("bn.num_batches_tracked", "num_batches_tracked")):
                if prefix + old in state_dict:
                    state_dict[prefix + new] = state_dict.pop(prefix + old)
        fill_missing_bias_quant(self, state_dict, prefix, local_metadata)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    # -- conversion ------------------------------------------------------------------------
    @classmethod
    def from_float(cls, mod, use_precomputed_fake_quant=False):
        """From the fused float container (ours or torch's of the same name): shares the conv's
        and BatchNorm's parameters and buffers."""
        def build(conv, qconfig):
            bn = mod[1]
            qat = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                      conv.padding, conv.dilation, conv.groups, conv.bias is not None,
                      conv.padding_mode, bn.eps, bn.momentum, False, qconfig)
            return qat._share_float_state(conv, bn)
        return qat_from_float(cls, mod, build)

    def to_float(self):
        """The float conv with BatchNorm folded in (and a ReLU container for the ReLU forms)."""
        conv = self._FLOAT_CONV_MODULE(self.in_channels, self.out_channels, self.kernel_size,
                                       self.stride, self.padding, self.dilation, self.groups,
                                       True, self.padding_mode)
        bias = self.bias.detach() if self.bias is not None else None
        conv.weight, conv.bias = fuse_conv_bn_weights(
            self.weight.detach(), bias, self.bn.running_mean, self.bn.running_var, self.bn.eps,
            self.bn.weight.detach(), self.bn.bias.detach())
        out = self._FUSED_FLOAT_RELU(conv, nn.ReLU()) if self._relu else conv
        out.train(self.training)
        return out


def _conv_bn_class(name, conv_cls, dim, relu, float_module, fused_float_relu):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=None, padding_mode="zeros", eps=1e-05, momentum=0.1,
                 freeze_bn=False, qconfig=None):
        to_tuple = nn.modules.utils._ntuple(dim)
        _ConvBnNd.__init__(self, in_channels, out_channels, to_tuple(kernel_size),
                           to_tuple(stride), padding if isinstance(padding, str)
                           else to_tuple(padding), to_tuple(dilation), False, to_tuple(0),
                           groups, bias, padding_mode, eps, momentum, freeze_bn, qconfig, dim)

    return type(name, (_ConvBnNd, conv_cls), {
        "__doc__": f"{conv_cls.__name__} + BatchNorm{dim}d{' + ReLU' if relu else ''} QAT "
                   "module with BatchNorm folded into the weight.",
        "__module__": __name__, "__init__": __init__, "_relu": relu,
        "_FLOAT_MODULE": float_module, "_FLOAT_CONV_MODULE": conv_cls,
        "_FUSED_FLOAT_RELU": fused_float_relu, "_canonical_name": f"nn.intrinsic.qat.{name}",
    })


def _conv_relu_class(name, qat_conv, float_module):
    def forward(self, input):
        return F.relu(self._conv_forward(input, self.weight_fake_quant(self.weight),
                                         quantized_bias(self, self.bias)))

    def to_float(self):
        out = float_module(qat_conv.to_float(self), nn.ReLU())
        out.train(self.training)
        return out

    return type(name, (qat_conv,), {
        "__doc__": f"QAT {qat_conv.__name__} followed by a ReLU.", "__module__": __name__,
        "forward": forward, "to_float": to_float, "_FLOAT_MODULE": float_module,
        "_canonical_name": f"nn.intrinsic.qat.{name}",
    })


ConvBn1d = _conv_bn_class("ConvBn1d", nn.Conv1d, 1, False, qnni.ConvBn1d, qnni.ConvReLU1d)
ConvBnReLU1d = _conv_bn_class("ConvBnReLU1d", nn.Conv1d, 1, True, qnni.ConvBnReLU1d,
                              qnni.ConvReLU1d)
ConvBn2d = _conv_bn_class("ConvBn2d", nn.Conv2d, 2, False, qnni.ConvBn2d, qnni.ConvReLU2d)
ConvBnReLU2d = _conv_bn_class("ConvBnReLU2d", nn.Conv2d, 2, True, qnni.ConvBnReLU2d,
                              qnni.ConvReLU2d)
ConvBn3d = _conv_bn_class("ConvBn3d", nn.Conv3d, 3, False, qnni.ConvBn3d, qnni.ConvReLU3d)
ConvBnReLU3d = _conv_bn_class("ConvBnReLU3d", nn.Conv3d, 3, True, qnni.ConvBnReLU3d,
                              qnni.ConvReLU3d)
ConvReLU1d = _conv_relu_class("ConvReLU1d", _QATConv1d, qnni.ConvReLU1d)
ConvReLU2d = _conv_relu_class("ConvReLU2d", _QATConv2d, qnni.ConvReLU2d)
ConvReLU3d = _conv_relu_class("ConvReLU3d", _QATConv3d, qnni.ConvReLU3d)


def update_bn_stats(mod):
    """``model.apply(update_bn_stats)``: BatchNorm statistics of fused QAT modules update again."""
    if hasattr(mod, "update_bn_stats") and isinstance(mod, nn.Module) and hasattr(mod, "bn"):
        mod.update_bn_stats()


def freeze_bn_stats(mod):
    """``model.apply(freeze_bn_stats)``: fused QAT modules use (and stop updating) their
    BatchNorm running statistics."""
    if hasattr(mod, "freeze_bn_stats") and isinstance(mod, nn.Module) and hasattr(mod, "bn"):
        mod.freeze_bn_stats()
