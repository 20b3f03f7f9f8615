"""Conv2d + FrozenBatchNorm2d (+ ReLU) QAT modules: torch's BN-folding ConvBn modules whose
BatchNorm stays frozen (running statistics, never updated), whatever train() is called with."""
from mqbench.nn.intrinsic import ConvFreezebn2d as _FloatFreezebn
from mqbench.nn.intrinsic import ConvFreezebnReLU2d as _FloatFreezebnReLU
from mqbench.nn.intrinsic.qat.conv_fused import ConvBn2d, ConvBnReLU2d

__all__ = ["ConvFreezebn2d", "ConvFreezebnReLU2d"]


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
