"""Fused float containers (``mqbench.nn.intrinsic``)."""
from mqbench.nn.intrinsic.modules import (ConvFreezebn2d, ConvFreezebnReLU2d,  # noqa: F401
                                          ConvTransposeBn2d, ConvTransposeBnReLU2d,
                                          ConvTransposeReLU2d)
from torch.nn.intrinsic import LinearBn1d  # noqa: F401,E402  (torch has it: same class)
