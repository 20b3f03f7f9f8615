"""BatchNorm folded into a transposed convolution (MQBench's ``mqbench.utils.fusion``).

torch's ``fuse_conv_bn_weights(..., transpose=True)`` scales the weight ``[in, out / groups,
kh, kw]`` along dimension 1 as if ``groups`` were 1, which is wrong for a grouped transposed
convolution (its dimension 1 holds only ``out / groups`` channels; MQBench's version has the
same limit). Here each group is scaled by the factors of its own output channels.

Example::

    >>> deconv, bn = nn.ConvTranspose2d(4, 6, 2, groups=2).eval(), nn.BatchNorm2d(6).eval()
    >>> fused = fuse_deconv_bn_eval(deconv, bn)       # bn(deconv(x)) == fused(x)
"""
import copy

import torch

__all__ = ["fuse_deconv_bn_weights", "fuse_deconv_bn_eval"]


def fuse_deconv_bn_weights(deconv_w, deconv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b, groups=None):
    """The (weight, bias) Parameters of a transposed convolution followed by a BatchNorm in
    eval mode: ``w' = w * gamma / sqrt(var + eps)`` per output channel, ``b' = (b - mean) *
    gamma / sqrt(var + eps) + beta``.

    Args:
        deconv_w: weight ``[in, out / groups, *kernel]``.
        deconv_b, bn_w, bn_b: the deconv bias and BatchNorm affine parameters ``[out]``; None
            means zeros (bias, beta) or ones (gamma).
        bn_rm, bn_rv, bn_eps: BatchNorm running mean / variance ``[out]`` and eps.
        groups: the deconv's groups; None infers it as ``out // deconv_w.shape[1]`` (MQBench's
            signature has no such argument).

    Returns:
        ``(Parameter(w'), Parameter(b'))``, ``w'`` shaped like ``deconv_w``; they require grad
        when ``deconv_w`` / ``deconv_b`` do (as torch's fusion helpers).
    """
    out = bn_rm.numel()
    per_group = deconv_w.shape[1]
    if groups is None:
        groups = out // per_group if per_group else 0
    if per_group * groups != out or groups < 1 or deconv_w.shape[0] % groups:
        raise ValueError(f"fuse_deconv_bn_weights: a weight of shape {list(deconv_w.shape)} with "
                         f"groups={groups} does not give the BatchNorm's {out} channels")
    bias_grad = deconv_b.requires_grad if deconv_b is not None else False
    if deconv_b is None:
        deconv_b = torch.zeros_like(bn_rm)
    if bn_w is None:
        bn_w = torch.ones_like(bn_rm)
    if bn_b is None:
        bn_b = torch.zeros_like(bn_rm)
    factor = bn_w * torch.rsqrt(bn_rv + bn_eps)  # [out] = [groups * out / groups]
    extra = [1] * (deconv_w.dim() - 2)
    w = deconv_w.reshape(groups, deconv_w.shape[0] // groups, *deconv_w.shape[1:])
    w = (w * factor.reshape(groups, 1, per_group, *extra)).reshape(deconv_w.shape)
    b = (deconv_b - bn_rm) * factor + bn_b
    return (torch.nn.Parameter(w, deconv_w.requires_grad),
            torch.nn.Parameter(b, bias_grad))


def fuse_deconv_bn_eval(deconv, bn):
    """A deep copy of ``deconv`` (``nn.ConvTranspose1d/2d/3d``, any groups) with ``bn`` (eval)
    folded into its weight and bias: ``fused(x) == bn(deconv(x))``. Both must be in eval mode."""
    if deconv.training or bn.training:
        raise ValueError("fuse_deconv_bn_eval folds BatchNorm's running statistics: call .eval() "
                         "on the transposed convolution and the BatchNorm first")
    fused = copy.deepcopy(deconv)
    fused.weight, fused.bias = fuse_deconv_bn_weights(
        fused.weight, fused.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias,
        groups=deconv.groups)
    return fused
