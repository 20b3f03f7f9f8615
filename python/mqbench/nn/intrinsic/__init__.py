"""Fused float containers (``mqbench.nn.intrinsic``): torch's set (``ConvBn2d``, ``LinearReLU``,
...) owned here, and MQBench's transposed-convolution and frozen-BatchNorm chains."""
from mqbench.nn.intrinsic.modules import *  # noqa: F401,F403
from mqbench.nn.intrinsic.modules import __all__  # noqa: F401
