"""Fused QAT modules (``mqbench.nn.intrinsic.qat``)."""
from mqbench.nn.intrinsic.qat.conv_fused import ConvBn2d, ConvBnReLU2d  # noqa: F401
from mqbench.nn.intrinsic.qat.deconv_fused import (ConvTransposeBn2d,  # noqa: F401
                                                   ConvTransposeBnReLU2d, ConvTransposeReLU2d)
from mqbench.nn.intrinsic.qat.freezebn import ConvFreezebn2d, ConvFreezebnReLU2d  # noqa: F401
from torch.nn.intrinsic.qat import LinearBn1d  # noqa: F401,E402  (torch's BN-folding Linear)
