"""Deploy-time BatchNorm merge (``mqbench.fusion_method``).

``convert_merge_bn(model)`` folds the BatchNorm of every fused module of a prepared
``GraphModule`` into its convolution / linear weights, in place, so that the exported graph has
no BatchNorm. A fused QAT module becomes the plain QAT module (``mqbench.nn.qat.Conv2d``,
``ConvTranspose2d``, ``Linear``) that keeps the original
``weight_fake_quant`` (and ``bias_fake_quant``), whose qparams were calibrated on the folded
weight, so the fake-quantized output is unchanged. A ReLU variant gets a ``relu`` call after it.
Handlers are registered per module type with
:func:`mqbench.utils.registry.register_convert_function`, under MQBench's names
(``convert_nniqat_convbn``, ``convert_qnniqat_deconvbnrelu``, ...; each is
``fn(model, fused_node)``); register one for a fused module type of your own. A module with no
handler of its exact type falls back to the handler of the same canonical type name, so torch's
fused modules in a user's model merge like ours (without this package importing torch's
deprecated ``nn.intrinsic``).
"""
import copy

import torch
import torch.nn as nn

import mqbench.nn.intrinsic as qnni
import mqbench.nn.intrinsic.qat as qnniqat
import mqbench.nn.qat as qnnqat
from mqbench.quantization.default_bias_fake_quant import bias_fake_quantizer
from mqbench.utils.module_types import canonical_type
from mqbench.utils.registry import FUSED_MODULE_CONVERT_FUNCTION, register_convert_function

__all__ = ["convert_merge_bn", "fold_bn", "convert_qnni_linearbn", "convert_qnniqat_linearbn",
           "convert_nniqat_convbn", "convert_nniqat_convbnrelu", "convert_qnni_deconvbn",
           "convert_qnniqat_deconvbn", "convert_qnni_deconvbnrelu", "convert_qnniqat_deconvbnrelu",
           "convert_qnniqat_convbn", "convert_qnniqat_convbnrelu"]


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
    """conv -> relu: the folded module no longer applies the ReLU of its fused form. As in
    MQBench, the ReLU is a module named ``relu`` on the conv's parent (created when the parent
    has none; ResNet's blocks have one), so the exporter scopes it as MQBench's deployed models
    do (``/layer1/layer1.0/relu/Relu``) and the JSON keys match. A parent whose ``relu`` is
    something else gets a functional ReLU (MQBench asserts)."""
    parent_name, _, _ = node.target.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    existing = getattr(parent, "relu", None)
    if existing is None:
        existing = torch.nn.ReLU(inplace=True).train(model.get_submodule(node.target).training)
        parent.relu = existing
    with model.graph.inserting_after(node):
        if isinstance(existing, torch.nn.ReLU):
            target = f"{parent_name}.relu" if parent_name else "relu"
            relu = model.graph.call_module(target, (node,))
        else:
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


def _fold_qat_conv(model, node, keep_bias_quant):
    mod = model.get_submodule(node.target)
    weight, bias = fold_bn(mod.weight, mod.bias, mod.bn)
    new = _qat_conv(mod, weight, bias)
    _finish(model, node, mod, new, weight, bias, relu=False)
    if keep_bias_quant and "bias_fake_quant" not in mod._modules:
        fq = bias_fake_quantizer().to(mod.weight.device)
        fq.set_quant_type("param")
        with torch.no_grad():  # calibrated on the folded bias now, not on a first forward
            fq.enable_observer()
            fq(new.bias.detach())
        fq.disable_observer()
        new.bias_fake_quant = fq


def convert_nniqat_convbn(model, fused_node):
    """``ConvBn1d/2d/3d`` / ``ConvFreezebn2d`` (QAT) -> ``mqbench.nn.qat.Conv1d/2d/3d`` with
    BatchNorm folded in, keeping ``weight_fake_quant`` (and ``bias_fake_quant`` when the
    module has one, which MQBench's ``convert_qnniqat_convbn`` does for its Vitis class)."""
    _fold_qat_conv(model, fused_node, keep_bias_quant=False)


def convert_nniqat_convbnrelu(model, fused_node):
    """``ConvBnReLU1d/2d/3d`` / ``ConvFreezebnReLU2d`` (QAT): as :func:`convert_nniqat_convbn`,
    then a ReLU after the folded conv."""
    _fold_qat_conv(model, fused_node, keep_bias_quant=False)
    _insert_relu(model, fused_node)


def convert_qnniqat_convbn(model, fused_node):
    """MQBench's BN merge of its Vitis ``ConvBn2d``: as :func:`convert_nniqat_convbn`, and the
    folded conv always quantizes its bias: the module's ``bias_fake_quant``, or a new
    ``bias_fake_quantizer()`` set to ``'param'``. Our ``ConvBn2d`` is also torch's, so this is
    not the registered handler (that would add bias quantizers to every backend's deploy):
    :func:`convert_nniqat_convbn` is, and keeps a bias quantizer the module has. Register this
    one (``register_convert_function(ConvBn2d)(convert_qnniqat_convbn)``) for MQBench 1.10's
    Vitis behaviour."""
    _fold_qat_conv(model, fused_node, keep_bias_quant=True)


def convert_qnniqat_convbnrelu(model, fused_node):
    """:func:`convert_qnniqat_convbn`, then a ReLU after the folded conv."""
    _fold_qat_conv(model, fused_node, keep_bias_quant=True)
    _insert_relu(model, fused_node)


def _fold_qat_deconv(model, node):
    mod = model.get_submodule(node.target)
    weight, bias = fold_bn(mod.weight, mod.bias, mod.bn, transposed=True, groups=mod.groups)
    new = qnnqat.ConvTranspose2d(mod.in_channels, mod.out_channels, mod.kernel_size, mod.stride,
                                 mod.padding, mod.output_padding, mod.groups, True,
                                 mod.dilation, mod.padding_mode, qconfig=mod.qconfig)
    _finish(model, node, mod, new, weight, bias, relu=False)


def convert_qnniqat_deconvbn(model, fused_node):
    """``ConvTransposeBn2d`` / ``ConvTransposeFreezebn2d`` (QAT) -> ``mqbench.nn.qat.
    ConvTranspose2d`` with BatchNorm folded in (groups included), keeping
    ``weight_fake_quant``."""
    _fold_qat_deconv(model, fused_node)


def convert_qnniqat_deconvbnrelu(model, fused_node):
    """``ConvTransposeBnReLU2d`` / ``ConvTransposeFreezebnReLU2d`` (QAT): as
    :func:`convert_qnniqat_deconvbn`, then a ReLU."""
    _fold_qat_deconv(model, fused_node)
    _insert_relu(model, fused_node)


def convert_qnniqat_linearbn(model, fused_node):
    """``LinearBn1d`` (QAT) -> ``mqbench.nn.qat.Linear`` with BatchNorm folded in, keeping
    ``weight_fake_quant`` (MQBench installs the float Linear here and loses it, spec A.5.4)."""
    mod = model.get_submodule(fused_node.target)
    weight, bias = fold_bn(mod.weight, mod.bias, mod.bn)
    new = qnnqat.Linear(mod.in_features, mod.out_features, True, qconfig=mod.qconfig)
    _finish(model, fused_node, mod, new, weight, bias, relu=False)


def _fold_float(model, node, transposed):
    """Float fused containers (modules excluded from quantization keep these)."""
    fused = model.get_submodule(node.target)
    inner, bn = fused[0], fused[1]
    weight, bias = fold_bn(inner.weight, inner.bias, bn, transposed=transposed,
                           groups=getattr(inner, "groups", 1))
    new = copy.deepcopy(inner)
    new.weight, new.bias = weight, bias
    _set_module(model, node.target, new)


def convert_qnni_linearbn(model, fused_node):
    """Float ``LinearBn1d`` -> ``nn.Linear`` with BatchNorm folded in."""
    _fold_float(model, fused_node, transposed=False)


def convert_qnni_deconvbn(model, fused_node):
    """Float ``ConvTransposeBn2d`` / ``ConvTransposeFreezebn2d`` -> ``nn.ConvTranspose2d`` with
    BatchNorm folded in."""
    _fold_float(model, fused_node, transposed=True)


def convert_qnni_deconvbnrelu(model, fused_node):
    """Float ``ConvTransposeBnReLU2d`` / ``ConvTransposeFreezebnReLU2d``: as
    :func:`convert_qnni_deconvbn`, then a ReLU."""
    _fold_float(model, fused_node, transposed=True)
    _insert_relu(model, fused_node)


def _convert_float_convbn(model, fused_node):
    """Float ``ConvBn1d/2d/3d`` / ``ConvFreezebn2d`` -> the conv with BatchNorm folded in (torch's
    float containers; MQBench has no handler of its own for them)."""
    _fold_float(model, fused_node, transposed=False)


def _convert_float_convbnrelu(model, fused_node):
    _fold_float(model, fused_node, transposed=False)
    _insert_relu(model, fused_node)


def _register_all():
    handlers = [
        (convert_nniqat_convbn, qnniqat, ("ConvBn1d", "ConvBn2d", "ConvBn3d", "ConvFreezebn2d")),
        (convert_nniqat_convbnrelu, qnniqat,
         ("ConvBnReLU1d", "ConvBnReLU2d", "ConvBnReLU3d", "ConvFreezebnReLU2d")),
        (convert_qnniqat_deconvbn, qnniqat, ("ConvTransposeBn2d", "ConvTransposeFreezebn2d")),
        (convert_qnniqat_deconvbnrelu, qnniqat,
         ("ConvTransposeBnReLU2d", "ConvTransposeFreezebnReLU2d")),
        (convert_qnniqat_linearbn, qnniqat, ("LinearBn1d",)),
        (convert_qnni_linearbn, qnni, ("LinearBn1d",)),
        (convert_qnni_deconvbn, qnni, ("ConvTransposeBn2d", "ConvTransposeFreezebn2d")),
        (convert_qnni_deconvbnrelu, qnni, ("ConvTransposeBnReLU2d", "ConvTransposeFreezebnReLU2d")),
        (_convert_float_convbn, qnni, ("ConvBn1d", "ConvBn2d", "ConvBn3d", "ConvFreezebn2d")),
        (_convert_float_convbnrelu, qnni,
         ("ConvBnReLU1d", "ConvBnReLU2d", "ConvBnReLU3d", "ConvFreezebnReLU2d")),
    ]
    for fn, package, names in handlers:
        for name in names:
            register_convert_function(getattr(package, name))(fn)


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
