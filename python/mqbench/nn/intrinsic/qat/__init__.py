"""Fused QAT modules (``mqbench.nn.intrinsic.qat``)."""
from mqbench.nn.intrinsic.qat.conv_fused import ConvBn2d, ConvBnReLU2d  # noqa: F401
