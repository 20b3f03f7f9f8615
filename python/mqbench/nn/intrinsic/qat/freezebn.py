"""Convolution / transposed convolution + FrozenBatchNorm2d (+ ReLU) QAT modules: the
BN-folding modules whose BatchNorm stays frozen (running statistics, never updated), whatever
train() is called with. The transposed forms fold along weight dimension 1, groups included."""
from mqbench.nn.intrinsic import ConvFreezebn2d as _FloatFreezebn
from mqbench.nn.intrinsic import ConvFreezebnReLU2d as _FloatFreezebnReLU
from mqbench.nn.intrinsic import ConvTransposeFreezebn2d as _FloatDeconvFreezebn
from mqbench.nn.intrinsic import ConvTransposeFreezebnReLU2d as _FloatDeconvFreezebnReLU
from mqbench.nn.intrinsic.qat.conv_fused import ConvBn2d, ConvBnReLU2d
from mqbench.nn.intrinsic.qat.deconv_fused import ConvTransposeBn2d, ConvTransposeBnReLU2d

__all__ = ["ConvFreezebn2d", "ConvFreezebnReLU2d", "ConvTransposeFreezebn2d",
           "ConvTransposeFreezebnReLU2d"]


class _Frozen:
    def update_bn_stats(self):  # frozen from the start, for good
        return self.freeze_bn_stats()

    @classmethod
    def from_float(cls, mod):
        return super().from_float(mod).freeze_bn_stats()


class ConvFreezebn2d(_Frozen, ConvBn2d):
    _FLOAT_MODULE = _FloatFreezebn


class ConvFreezebnReLU2d(_Frozen, ConvBnReLU2d):
    _FLOAT_MODULE = _FloatFreezebnReLU


class _FrozenDeconv(_Frozen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.freeze_bn_stats()  # a directly constructed module is frozen too, as MQBench's


class ConvTransposeFreezebn2d(_FrozenDeconv, ConvTransposeBn2d):
    """ConvTranspose2d + FrozenBatchNorm2d QAT module (same constructor and state dict as
    ``ConvTransposeBn2d``)."""
    _FLOAT_MODULE = _FloatDeconvFreezebn


class ConvTransposeFreezebnReLU2d(_FrozenDeconv, ConvTransposeBnReLU2d):
    """ConvTranspose2d + FrozenBatchNorm2d + ReLU QAT module."""
    _FLOAT_MODULE = _FloatDeconvFreezebnReLU
