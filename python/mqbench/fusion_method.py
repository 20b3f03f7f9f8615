"""Deploy-time BatchNorm merge (``mqbench.fusion_method``).

``convert_merge_bn(model)`` folds the BatchNorm of every fused module of a prepared
``GraphModule`` into its convolution / linear weights, in place, so that the exported graph has
no BatchNorm. A fused QAT module becomes the plain QAT module (``nn.qat.Conv2d``,
``mqbench.nn.qat.ConvTranspose2d``, ``nn.qat.Linear``) that keeps the original
``weight_fake_quant`` (and ``bias_fake_quant``), whose qparams were calibrated on the folded
weight, so the fake-quantized output is unchanged. A ReLU variant gets a ``relu`` call after it.
Handlers are registered per module type with
:func:`mqbench.utils.registry.register_convert_function`, as in MQBench; register one for a
fused module type of your own.
"""
import copy

import torch
import torch.nn as nn
import torch.nn.intrinsic as nni
import torch.nn.intrinsic.qat as nniqat
import torch.nn.qat as nnqat

import mqbench.nn.intrinsic as qnni
import mqbench.nn.intrinsic.qat as qnniqat
import mqbench.nn.qat as qnnqat
from mqbench.utils.registry import FUSED_MODULE_CONVERT_FUNCTION, register_convert_function

__all__ = ["convert_merge_bn", "fold_bn"]


def fold_bn(weight, bias, bn, transposed=False, groups=1):
    """Returns (weight, bias) Parameters with ``bn``'s eval statistics folded in.

    The weight is scaled exactly as the fused QAT modules scale it before ``weight_fake_quant``
    (``w * gamma / sqrt(running_var + eps)``, the same float operations), so the deployed weight
    quantizes to the same integers as in training. Transposed convolution weights
    ``[in, out / groups, ...]`` are scaled along their output channels."""
    with torch.no_grad():
        factor = torch.sqrt(bn.running_var + bn.eps)
        factor = bn.weight / factor if bn.weight is not None else 1.0 / factor
        if transposed:
            w = weight.reshape(groups, weight.shape[0] // groups, *weight.shape[1:])
            w = (w * factor.reshape(groups, 1, -1, *([1] * (weight.dim() - 2)))).reshape(weight.shape)
        else:
            w = weight * factor.reshape(-1, *([1] * (weight.dim() - 1)))
        b = bias if bias is not None else torch.zeros_like(bn.running_mean)
        b = (b - bn.running_mean) * factor
        if bn.bias is not None:
            b = b + bn.bias
    return nn.Parameter(w.detach().clone()), nn.Parameter(b.detach().clone())


def _set_module(model, name, module):
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, module)


def _insert_relu(model, node):
    """conv -> relu: the folded module no longer applies the ReLU of its fused form."""
    with model.graph.inserting_after(node):
        relu = model.graph.call_function(torch.nn.functional.relu, (node,))
    node.replace_all_uses_with(relu)
    relu.args = (node,)  # replace_all_uses_with also rewired relu's own input


def _conv_class(module):
    dims = module.weight.dim() - 2
    return {1: getattr(nnqat, "Conv1d", None), 2: nnqat.Conv2d, 3: getattr(nnqat, "Conv3d", None)}[dims]


def _qat_conv(mod, weight, bias):
    cls = _conv_class(mod)
    if cls is None:
        raise TypeError(f"no QAT convolution class for {type(mod).__name__} in this torch")
    conv = cls(mod.in_channels, mod.out_channels, mod.kernel_size, mod.stride, mod.padding,
               mod.dilation, mod.groups, True, mod.padding_mode, qconfig=mod.qconfig)
    return conv


def _finish(model, node, mod, new, weight, bias, relu):
    new.weight, new.bias = weight, bias
    for attr in ("weight_fake_quant", "bias_fake_quant"):
        if hasattr(mod, attr):
            setattr(new, attr, getattr(mod, attr))
    new.train(mod.training)
    _set_module(model, node.target, new.to(mod.weight.device))
    if relu:
        _insert_relu(model, node)


def _merge_qat_conv(relu):
    def convert(model, node):
        mod = model.get_submodule(node.target)
        weight, bias = fold_bn(mod.weight, mod.bias, mod.bn)
        _finish(model, node, mod, _qat_conv(mod, weight, bias), weight, bias, relu)
    return convert


def _merge_qat_deconv(relu):
    def convert(model, node):
        mod = model.get_submodule(node.target)
        weight, bias = fold_bn(mod.weight, mod.bias, mod.bn, transposed=True, groups=mod.groups)
        new = qnnqat.ConvTranspose2d(mod.in_channels, mod.out_channels, mod.kernel_size, mod.stride,
                                     mod.padding, mod.output_padding, mod.groups, True,
                                     mod.dilation, mod.padding_mode, qconfig=mod.qconfig)
        _finish(model, node, mod, new, weight, bias, relu)
    return convert


def _merge_qat_linear(model, node):
    # MQBench installs the float Linear here and loses weight_fake_quant (spec A.5.4); we keep it.
    mod = model.get_submodule(node.target)
    weight, bias = fold_bn(mod.weight, mod.bias, mod.bn)
    new = nnqat.Linear(mod.in_features, mod.out_features, True, qconfig=mod.qconfig)
    _finish(model, node, mod, new, weight, bias, relu=False)


def _merge_float(kind, relu):
    """Float fused containers (modules excluded from quantization keep these)."""
    def convert(model, node):
        fused = model.get_submodule(node.target)
        inner, bn = fused[0], fused[1]
        weight, bias = fold_bn(inner.weight, inner.bias, bn, transposed=kind == "deconv",
                               groups=getattr(inner, "groups", 1))
        new = copy.deepcopy(inner)
        new.weight, new.bias = weight, bias
        _set_module(model, node.target, new)
        if relu:
            _insert_relu(model, node)
    return convert


def _register_all():
    conv_types = [(nniqat.ConvBn1d, False), (nniqat.ConvBn2d, False), (nniqat.ConvBn3d, False),
                  (nniqat.ConvBnReLU1d, True), (nniqat.ConvBnReLU2d, True),
                  (nniqat.ConvBnReLU3d, True), (qnniqat.ConvBn2d, False),
                  (qnniqat.ConvBnReLU2d, True), (qnniqat.ConvFreezebn2d, False),
                  (qnniqat.ConvFreezebnReLU2d, True)]
    for cls, relu in conv_types:
        register_convert_function(cls)(_merge_qat_conv(relu))
    register_convert_function(qnniqat.ConvTransposeBn2d)(_merge_qat_deconv(False))
    register_convert_function(qnniqat.ConvTransposeBnReLU2d)(_merge_qat_deconv(True))
    register_convert_function(nniqat.LinearBn1d)(_merge_qat_linear)
    for cls, kind, relu in [(nni.ConvBn1d, "conv", False), (nni.ConvBn2d, "conv", False),
                            (nni.ConvBn3d, "conv", False), (nni.ConvBnReLU1d, "conv", True),
                            (nni.ConvBnReLU2d, "conv", True), (nni.ConvBnReLU3d, "conv", True),
                            (nni.LinearBn1d, "linear", False),
                            (qnni.ConvTransposeBn2d, "deconv", False),
                            (qnni.ConvTransposeBnReLU2d, "deconv", True),
                            (qnni.ConvFreezebn2d, "conv", False),
                            (qnni.ConvFreezebnReLU2d, "conv", True)]:
        register_convert_function(cls)(_merge_float(kind, relu))


_register_all()


def convert_merge_bn(model, **kwargs):
    """Folds every fused module's BatchNorm into its weights, in place (MQBench's
    ``convert_merge_bn``). Modules are matched by exact type in
    ``FUSED_MODULE_CONVERT_FUNCTION``."""
    for node in list(model.graph.nodes):
        if node.op != "call_module":
            continue
        mod = model.get_submodule(node.target)
        handler = FUSED_MODULE_CONVERT_FUNCTION.get(type(mod))
        if handler is not None:
            handler(model, node)
    model.recompile()
    return model
