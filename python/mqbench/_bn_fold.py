"""The BatchNorm a fused QAT module (``ConvBn2d``, ``LinearBn1d``, ...) folds into the weight its
``weight_fake_quant`` sees, read from outside the module: which BatchNorm, and its per-channel
factor ``gamma / sqrt(running_var + eps)``. Shared by cross-layer equalization
(:mod:`mqbench.weight_equalization`) and bias correction (:mod:`mqbench.bias_correction`).
"""
import torch
import torch.nn as nn


def _bn_of(module):
    """The folded BatchNorm of a fused QAT module (``module.bn``), else None."""
    bn = getattr(module, "bn", None)
    if isinstance(bn, nn.modules.batchnorm._BatchNorm):
        if bn.weight is None or bn.running_var is None:
            raise ValueError(f"{type(module).__name__}: its BatchNorm has no affine weight or "
                             "no running statistics; equalization needs both (affine=True, "
                             "track_running_stats=True)")
        return bn
    return None


def _fold_factor(bn, ndim):
    """``gamma / sqrt(running_var + eps)`` shaped to multiply a weight of ``ndim`` dims."""
    return (bn.weight / torch.sqrt(bn.running_var + bn.eps)).reshape([-1] + [1] * (ndim - 1))
