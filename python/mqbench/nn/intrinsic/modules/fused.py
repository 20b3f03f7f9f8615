"""Fused float containers for the chains torch.nn.intrinsic has no class for: transposed
convolutions with BatchNorm and/or ReLU, and convolutions with a FrozenBatchNorm2d. Like
torch's, they are Sequentials that the QAT swap turns into one QAT module."""
import torch.nn as nn
from torch.nn.intrinsic import _FusedModule

from mqbench.nn.modules import FrozenBatchNorm2d

__all__ = ["ConvTransposeBn2d", "ConvTransposeReLU2d", "ConvTransposeBnReLU2d", "ConvFreezebn2d",
           "ConvFreezebnReLU2d"]


def _check(name, mods, types):
    got = [type(m).__name__ for m in mods]
    ok = len(mods) == len(types) and all(isinstance(m, t) for m, t in zip(mods, types))
    if not ok:
        raise TypeError(f"{name} expects {[t.__name__ for t in types]}, got {got}")


class ConvTransposeBn2d(_FusedModule):
    def __init__(self, deconv, bn):
        _check("ConvTransposeBn2d", (deconv, bn), (nn.ConvTranspose2d, nn.BatchNorm2d))
        super().__init__(deconv, bn)


class ConvTransposeReLU2d(_FusedModule):
    def __init__(self, deconv, relu):
        _check("ConvTransposeReLU2d", (deconv, relu), (nn.ConvTranspose2d, nn.ReLU))
        super().__init__(deconv, relu)


class ConvTransposeBnReLU2d(_FusedModule):
    def __init__(self, deconv, bn, relu):
        _check("ConvTransposeBnReLU2d", (deconv, bn, relu),
               (nn.ConvTranspose2d, nn.BatchNorm2d, nn.ReLU))
        super().__init__(deconv, bn, relu)


class ConvFreezebn2d(_FusedModule):
    def __init__(self, conv, bn):
        _check("ConvFreezebn2d", (conv, bn), (nn.Conv2d, FrozenBatchNorm2d))
        super().__init__(conv, bn)


class ConvFreezebnReLU2d(_FusedModule):
    def __init__(self, conv, bn, relu):
        _check("ConvFreezebnReLU2d", (conv, bn, relu), (nn.Conv2d, FrozenBatchNorm2d, nn.ReLU))
        super().__init__(conv, bn, relu)
