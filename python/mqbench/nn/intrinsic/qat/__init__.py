"""Fused QAT modules (``mqbench.nn.intrinsic.qat``): torch's set (``ConvBn2d``, ``ConvReLU2d``,
``LinearBn1d``, ...) owned here, and MQBench's transposed-convolution and frozen-BatchNorm
modules. ``model.apply(freeze_bn_stats)`` / ``update_bn_stats`` switch the BatchNorm of all."""
from mqbench.nn.intrinsic.qat.conv_fused import (ConvBn1d, ConvBn2d, ConvBn3d,  # noqa: F401
                                                 ConvBnReLU1d, ConvBnReLU2d, ConvBnReLU3d,
                                                 ConvReLU1d, ConvReLU2d, ConvReLU3d,
                                                 freeze_bn_stats, update_bn_stats)
from mqbench.nn.intrinsic.qat.deconv_fused import (ConvTransposeBn2d,  # noqa: F401
                                                   ConvTransposeBnReLU2d, ConvTransposeReLU2d)
from mqbench.nn.intrinsic.qat.freezebn import (ConvFreezebn2d, ConvFreezebnReLU2d,  # noqa: F401
                                               ConvTransposeFreezebn2d,
                                               ConvTransposeFreezebnReLU2d)
from mqbench.nn.intrinsic.qat.linear_fused import LinearBn1d, LinearReLU  # noqa: F401
