"""MQBench's fusers (``mqbench.fuser_method_mappings``) and its ``fuse_custom_config_dict``.

Each fuser takes the modules of one chain and returns what replaces it: the fused float
container (``mqbench.nn.intrinsic``, which the QAT swap turns into a QAT module) or, for
inference, the layer with BatchNorm folded in. Both of MQBench's call forms work::

    fuse_deconv_bn(True, deconv, bn)   # main (torch >= 1.11 style): is_qat decides
    fuse_deconv_bn(deconv, bn)         # 1.10: the modules' train / eval mode decides

``is_qat=True`` (or training mode) gives the container; ``is_qat=False`` (or eval mode) folds,
which needs eval mode. A FrozenBatchNorm2d is always in eval mode, so for the ``freezebn``
fusers the convolution's mode is the one that counts.

``fuse_custom_config_dict`` is MQBench 1.10's dictionary, with our classes, usable as
``prepare_custom_config_dict['extra_fuse_dict']``. MQBench 1.10 also patched torch's global
fusion and QAT tables with it when this module was imported; we change no torch global
(docs/compatibility.md, row 90).
"""
import inspect

import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.fusion import fuse_conv_bn_eval, fuse_linear_bn_eval

import mqbench.nn.intrinsic as qnni
import mqbench.nn.intrinsic.qat as qnniqat
import mqbench.nn.qat as qnnqat
from mqbench.nn.modules import FrozenBatchNorm2d
from mqbench.utils.fusion import fuse_deconv_bn_eval

__all__ = ["fuse_linear_bn", "fuse_deconv_bn", "fuse_deconv_bn_relu", "fuse_conv_freezebn",
           "fuse_conv_freezebn_relu", "fuse_deconv_freezebn", "fuse_deconv_freezebn_relu",
           "fuse_custom_config_dict"]


def _fuser(*names, frozen=False):
    """Decorator: ``fn(is_qat, *modules)`` becomes a fuser that also takes 1.10's
    ``(*modules)``. ``is_qat`` None means: decide by the train / eval mode of the first module.
    The fuser's signature is MQBench main's ``(is_qat, <names>)``."""
    def wrap(fn):
        def fuser(*args):
            if len(args) == len(names) + 1 and isinstance(args[0], bool):
                is_qat, modules = args[0], args[1:]
            elif len(args) == len(names) and all(isinstance(a, nn.Module) for a in args):
                is_qat, modules = None, args
            else:
                raise TypeError(f"{fn.__name__} takes ({', '.join(names)}) or (is_qat, "
                                f"{', '.join(names)}), got {len(args)} arguments")
            _check_modes(fn.__name__, modules, frozen)
            layer = modules[0]
            if is_qat is None:
                is_qat = layer.training
            if is_qat:
                _check_bn(fn.__name__, layer, modules[1])
            elif layer.training:
                raise ValueError(f"{fn.__name__}(is_qat=False) folds BatchNorm into "
                                 f"{type(layer).__name__}, which needs eval mode: call .eval() "
                                 "on the modules first")
            return fn(bool(is_qat), *modules)

        fuser.__name__ = fuser.__qualname__ = fn.__name__
        fuser.__doc__ = fn.__doc__
        fuser.__module__ = fn.__module__
        params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                  for n in ("is_qat",) + names]
        fuser.__signature__ = inspect.Signature(params)  # MQBench main's, which _call_fuser reads
        return fuser
    return wrap


def _check_modes(name, modules, frozen):
    if frozen:
        bn = modules[1]
        if bn.training:
            raise ValueError(f"{name}: the frozen BatchNorm must be in eval mode (use "
                             "mqbench.nn.FrozenBatchNorm2d)")
        others = [m for i, m in enumerate(modules) if i != 1]
    else:
        others = list(modules)
    if len({m.training for m in others}) > 1:
        raise ValueError(f"{name}: {', '.join(type(m).__name__ for m in others)} must all be in "
                         "the same mode (train or eval)")


def _check_bn(name, layer, bn):
    out = layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels
    if bn.num_features != out:
        raise ValueError(f"{name}: {type(layer).__name__} has {out} output channels but the "
                         f"BatchNorm has {bn.num_features} features")
    if not (bn.affine and bn.track_running_stats):
        raise ValueError(f"{name}: only a BatchNorm with affine=True and "
                         "track_running_stats=True can be fused")


@_fuser("linear", "bn")
def fuse_linear_bn(is_qat, linear, bn):
    """Linear + BatchNorm1d -> ``mqbench.nn.intrinsic.LinearBn1d`` (QAT) or the Linear with
    BatchNorm folded in (``torch.nn.utils.fusion.fuse_linear_bn_eval``)."""
    return qnni.LinearBn1d(linear, bn) if is_qat else fuse_linear_bn_eval(linear, bn)


@_fuser("deconv", "bn")
def fuse_deconv_bn(is_qat, deconv, bn):
    """ConvTranspose2d + BatchNorm2d -> ``ConvTransposeBn2d`` (QAT) or the folded deconv
    (:func:`mqbench.utils.fusion.fuse_deconv_bn_eval`, groups included)."""
    return qnni.ConvTransposeBn2d(deconv, bn) if is_qat else fuse_deconv_bn_eval(deconv, bn)


@_fuser("deconv", "bn", "relu")
def fuse_deconv_bn_relu(is_qat, deconv, bn, relu):
    """ConvTranspose2d + BatchNorm2d + ReLU -> ``ConvTransposeBnReLU2d`` (QAT) or
    ``ConvTransposeReLU2d(folded deconv, relu)``."""
    if is_qat:
        return qnni.ConvTransposeBnReLU2d(deconv, bn, relu)
    return qnni.ConvTransposeReLU2d(fuse_deconv_bn_eval(deconv, bn), relu)


@_fuser("conv", "bn", frozen=True)
def fuse_conv_freezebn(is_qat, conv, bn):
    """Conv2d + FrozenBatchNorm2d -> ``ConvFreezebn2d`` (QAT) or the folded conv."""
    return qnni.ConvFreezebn2d(conv, bn) if is_qat else fuse_conv_bn_eval(conv, bn)


@_fuser("conv", "bn", "relu", frozen=True)
def fuse_conv_freezebn_relu(is_qat, conv, bn, relu):
    """Conv2d + FrozenBatchNorm2d + ReLU -> ``ConvFreezebnReLU2d`` (QAT) or
    ``ConvReLU2d(folded conv, relu)``."""
    if is_qat:
        return qnni.ConvFreezebnReLU2d(conv, bn, relu)
    return qnni.ConvReLU2d(fuse_conv_bn_eval(conv, bn), relu)


@_fuser("deconv", "bn", frozen=True)
def fuse_deconv_freezebn(is_qat, deconv, bn):
    """ConvTranspose2d + FrozenBatchNorm2d -> ``ConvTransposeFreezebn2d`` (QAT) or the folded
    deconv."""
    if is_qat:
        return qnni.ConvTransposeFreezebn2d(deconv, bn)
    return fuse_deconv_bn_eval(deconv, bn)


@_fuser("deconv", "bn", "relu", frozen=True)
def fuse_deconv_freezebn_relu(is_qat, deconv, bn, relu):
    """ConvTranspose2d + FrozenBatchNorm2d + ReLU -> ``ConvTransposeFreezebnReLU2d`` (QAT) or
    ``ConvTransposeReLU2d(folded deconv, relu)``."""
    if is_qat:
        return qnni.ConvTransposeFreezebnReLU2d(deconv, bn, relu)
    return qnni.ConvTransposeReLU2d(fuse_deconv_bn_eval(deconv, bn), relu)


_QAT_MAPPING = {
    nn.ConvTranspose2d: qnnqat.ConvTranspose2d,
    qnni.LinearBn1d: qnniqat.LinearBn1d,
    qnni.ConvTransposeBn2d: qnniqat.ConvTransposeBn2d,
    qnni.ConvTransposeReLU2d: qnniqat.ConvTransposeReLU2d,
    qnni.ConvTransposeBnReLU2d: qnniqat.ConvTransposeBnReLU2d,
    qnni.ConvFreezebn2d: qnniqat.ConvFreezebn2d,
    qnni.ConvFreezebnReLU2d: qnniqat.ConvFreezebnReLU2d,
    qnni.ConvTransposeFreezebn2d: qnniqat.ConvTransposeFreezebn2d,
    qnni.ConvTransposeFreezebnReLU2d: qnniqat.ConvTransposeFreezebnReLU2d,
    nn.Embedding: qnnqat.Embedding,
}

# MQBench 1.10's entries, in data-flow order. A three-module chain comes before its two-module
# prefix, and each ReLU chain also in its F.relu form (1.10's fusion patterns had both), because
# extra_fuse_dict patterns are tried in order before the built-in rules: deconv + bn would
# otherwise leave the relu of deconv + bn + relu unfused.
_RELU_CHAINS = {
    (nn.ConvTranspose2d, nn.BatchNorm2d): fuse_deconv_bn_relu,
    (nn.ConvTranspose2d, FrozenBatchNorm2d): fuse_deconv_freezebn_relu,
    (nn.Conv2d, FrozenBatchNorm2d): fuse_conv_freezebn_relu,
}
fuse_custom_config_dict = {
    "additional_fuser_method_mapping": {
        **{head + (relu,): fuser for head, fuser in _RELU_CHAINS.items()
           for relu in (nn.ReLU, F.relu)},
        (nn.Linear, nn.BatchNorm1d): fuse_linear_bn,
        (nn.ConvTranspose2d, nn.BatchNorm2d): fuse_deconv_bn,
        (nn.ConvTranspose2d, nn.ReLU): qnni.ConvTransposeReLU2d,
        (nn.ConvTranspose2d, F.relu): qnni.ConvTransposeReLU2d,
        (nn.Conv2d, FrozenBatchNorm2d): fuse_conv_freezebn,
        (nn.ConvTranspose2d, FrozenBatchNorm2d): fuse_deconv_freezebn,
    },
    # MQBench 1.10 mapped reversed patterns to torch's fusion-handler classes here; the C++
    # rules find the chains, so there is no handler to name.
    "additional_fusion_pattern": {},
    # The key our quantizer reads, and MQBench 1.10's plural spelling (the same dict).
    "additional_qat_module_mapping": _QAT_MAPPING,
    "additional_qat_module_mappings": _QAT_MAPPING,
}
