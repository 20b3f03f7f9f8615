from mqbench.nn.intrinsic.modules.fused import (ConvFreezebn2d, ConvFreezebnReLU2d,  # noqa: F401
                                                ConvTransposeBn2d, ConvTransposeBnReLU2d,
                                                ConvTransposeReLU2d)
