"""MQBench's module path ``mqbench.nn.intrinsic.qat.modules``: the fused QAT modules of
``mqbench.nn.intrinsic.qat`` (the same class objects; they are defined one level up)."""
from mqbench.nn.intrinsic.qat.modules.conv_fused import (ConvBn2d, ConvBnReLU2d,  # noqa: F401
                                                         ConvReLU2d)
from mqbench.nn.intrinsic.qat.modules.deconv_fused import (ConvTransposeBn2d,  # noqa: F401
                                                           ConvTransposeBnReLU2d,
                                                           ConvTransposeReLU2d)
from mqbench.nn.intrinsic.qat.modules.freezebn import (ConvFreezebn2d,  # noqa: F401
                                                       ConvFreezebnReLU2d,
                                                       ConvTransposeFreezebn2d,
                                                       ConvTransposeFreezebnReLU2d)
from mqbench.nn.intrinsic.qat.modules.linear_fused import LinearBn1d, LinearReLU  # noqa: F401
