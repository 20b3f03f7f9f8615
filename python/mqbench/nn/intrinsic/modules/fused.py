"""Fused float containers: the chains the model quantizer fuses (conv / linear / transposed conv
with BatchNorm and/or ReLU, BatchNorm with ReLU), as Sequentials that the QAT swap turns into
one QAT module.

The ones torch also has (``ConvBn2d``, ``ConvBnReLU2d``, ``LinearReLU``, ...) are ours too, with
torch's names, layout (children ``0``, ``1``, ``2``) and state-dict keys, so nothing here imports
the deprecated ``torch.nn.intrinsic``. Each answers to torch's canonical type name
(``_canonical_name``, read by ``graph_ir.canonical_type``), so the C++ rules, written against
those names, treat a user's torch container and ours alike.
"""
import torch.nn as nn

from mqbench.nn.modules import FrozenBatchNorm2d

__all__ = ["ConvReLU1d", "ConvReLU2d", "ConvReLU3d", "ConvBn1d", "ConvBn2d", "ConvBn3d",
           "ConvBnReLU1d", "ConvBnReLU2d", "ConvBnReLU3d", "LinearReLU", "LinearBn1d",
           "BNReLU2d", "BNReLU3d", "ConvTransposeBn2d", "ConvTransposeReLU2d",
           "ConvTransposeBnReLU2d", "ConvFreezebn2d", "ConvFreezebnReLU2d",
           "ConvTransposeFreezebn2d", "ConvTransposeFreezebnReLU2d"]


class _FusedModule(nn.Sequential):
    """A fused chain: a Sequential of the modules, checked at construction."""

    _parts = ()

    def __init__(self, *modules):
        got = [type(m).__name__ for m in modules]
        ok = len(modules) == len(self._parts) and all(
            isinstance(m, t) for m, t in zip(modules, self._parts))
        if not ok:
            raise TypeError(f"{type(self).__name__} expects "
                            f"{[t.__name__ for t in self._parts]}, got {got}")
        super().__init__(*modules)


def _fused(name, parts, torch_has_it=True):
    cls = type(name, (_FusedModule,), {
        "_parts": tuple(parts),
        "__doc__": f"Sequential of {', '.join(p.__name__ for p in parts)} (fused as one).",
        "__module__": __name__,
    })
    if torch_has_it:
        cls._canonical_name = f"nn.intrinsic.{name}"
    return cls


ConvReLU1d = _fused("ConvReLU1d", (nn.Conv1d, nn.ReLU))
ConvReLU2d = _fused("ConvReLU2d", (nn.Conv2d, nn.ReLU))
ConvReLU3d = _fused("ConvReLU3d", (nn.Conv3d, nn.ReLU))
ConvBn1d = _fused("ConvBn1d", (nn.Conv1d, nn.BatchNorm1d))
ConvBn2d = _fused("ConvBn2d", (nn.Conv2d, nn.BatchNorm2d))
ConvBn3d = _fused("ConvBn3d", (nn.Conv3d, nn.BatchNorm3d))
ConvBnReLU1d = _fused("ConvBnReLU1d", (nn.Conv1d, nn.BatchNorm1d, nn.ReLU))
ConvBnReLU2d = _fused("ConvBnReLU2d", (nn.Conv2d, nn.BatchNorm2d, nn.ReLU))
ConvBnReLU3d = _fused("ConvBnReLU3d", (nn.Conv3d, nn.BatchNorm3d, nn.ReLU))
LinearReLU = _fused("LinearReLU", (nn.Linear, nn.ReLU))
LinearBn1d = _fused("LinearBn1d", (nn.Linear, nn.BatchNorm1d))
BNReLU2d = _fused("BNReLU2d", (nn.BatchNorm2d, nn.ReLU))
BNReLU3d = _fused("BNReLU3d", (nn.BatchNorm3d, nn.ReLU))
# MQBench's own (torch has none of these)
ConvTransposeBn2d = _fused("ConvTransposeBn2d", (nn.ConvTranspose2d, nn.BatchNorm2d), False)
ConvTransposeReLU2d = _fused("ConvTransposeReLU2d", (nn.ConvTranspose2d, nn.ReLU), False)
ConvTransposeBnReLU2d = _fused("ConvTransposeBnReLU2d",
                               (nn.ConvTranspose2d, nn.BatchNorm2d, nn.ReLU), False)
ConvFreezebn2d = _fused("ConvFreezebn2d", (nn.Conv2d, FrozenBatchNorm2d), False)
ConvFreezebnReLU2d = _fused("ConvFreezebnReLU2d", (nn.Conv2d, FrozenBatchNorm2d, nn.ReLU), False)
ConvTransposeFreezebn2d = _fused("ConvTransposeFreezebn2d", (nn.ConvTranspose2d, FrozenBatchNorm2d),
                                 False)
ConvTransposeFreezebnReLU2d = _fused("ConvTransposeFreezebnReLU2d",
                                     (nn.ConvTranspose2d, FrozenBatchNorm2d, nn.ReLU), False)
