"""Deploy-time BatchNorm merge (``mqbench.fusion_method``).

``convert_merge_bn(model)`` folds the BatchNorm of every fused module of a prepared
``GraphModule`` into its convolution / linear weights, in place, so that the exported graph has
no BatchNorm. A fused QAT module becomes the plain QAT module (``mqbench.nn.qat.Conv2d``,
``ConvTranspose2d``, ``Linear``) that keeps the original
``weight_fake_quant`` (and ``bias_fake_quant``), whose qparams were calibrated on the folded
weight, so the fake-quantized output is unchanged. A ReLU variant gets a ``relu`` call after it.
Handlers are registered per module type with
:func:`mqbench.utils.registry.register_convert_function`, as in MQBench; register one for a
fused module type of your own. A module with no handler of its exact type falls back to the
handler of the same canonical type name, so torch's fused modules in a user's model merge like
ours (without this package importing torch's deprecated ``nn.intrinsic``).
"""
import copy

import torch
import torch.nn as nn

import mqbench.nn.intrinsic as qnni
import mqbench.nn.intrinsic.qat as qnniqat
import mqbench.nn.qat as qnnqat
from mqbench.utils.module_types import canonical_type
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


def _qat_conv(mod, weight, bias):
    cls = {1: qnnqat.Conv1d, 2: qnnqat.Conv2d, 3: qnnqat.Conv3d}[mod.weight.dim() - 2]
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
    new = qnnqat.Linear(mod.in_features, mod.out_features, True, qconfig=mod.qconfig)
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
    for name in ("ConvBn1d", "ConvBn2d", "ConvBn3d", "ConvFreezebn2d"):
        register_convert_function(getattr(qnniqat, name))(_merge_qat_conv(False))
    for name in ("ConvBnReLU1d", "ConvBnReLU2d", "ConvBnReLU3d", "ConvFreezebnReLU2d"):
        register_convert_function(getattr(qnniqat, name))(_merge_qat_conv(True))
    register_convert_function(qnniqat.ConvTransposeBn2d)(_merge_qat_deconv(False))
    register_convert_function(qnniqat.ConvTransposeBnReLU2d)(_merge_qat_deconv(True))
    register_convert_function(qnniqat.LinearBn1d)(_merge_qat_linear)
    for name, kind, relu in [("ConvBn1d", "conv", False), ("ConvBn2d", "conv", False),
                             ("ConvBn3d", "conv", False), ("ConvBnReLU1d", "conv", True),
                             ("ConvBnReLU2d", "conv", True), ("ConvBnReLU3d", "conv", True),
                             ("LinearBn1d", "linear", False),
                             ("ConvTransposeBn2d", "deconv", False),
                             ("ConvTransposeBnReLU2d", "deconv", True),
                             ("ConvFreezebn2d", "conv", False),
                             ("ConvFreezebnReLU2d", "conv", True)]:
        register_convert_function(getattr(qnni, name))(_merge_float(kind, relu))


def _handler(mod):
    """The convert function of ``mod``'s exact type, else of a registered type with the same
    canonical name (torch's ``nn.intrinsic.qat.ConvBn2d`` uses ours)."""
    handler = FUSED_MODULE_CONVERT_FUNCTION.get(type(mod))
    if handler is not None:
        return handler
    name = canonical_type(type(mod))
    for cls, fn in FUSED_MODULE_CONVERT_FUNCTION.items():
        if canonical_type(cls) == name:
            return fn
    return None


_register_all()


def convert_merge_bn(model, **kwargs):
    """Folds every fused module's BatchNorm into its weights, in place (MQBench's
    ``convert_merge_bn``). Modules are matched by exact type in
    ``FUSED_MODULE_CONVERT_FUNCTION``, then by canonical type name."""
    for node in list(model.graph.nodes):
        if node.op != "call_module":
            continue
        mod = model.get_submodule(node.target)
        handler = _handler(mod)
        if handler is not None:
            handler(model, node)
    model.recompile()
    return model
