"""MQBench's module path ``mqbench.nn.intrinsic.qat.modules.conv_fused``: the classes of
``mqbench.nn.intrinsic.qat.conv_fused`` (the same objects)."""
from mqbench.nn.intrinsic.qat.conv_fused import *  # noqa: F401,F403
from mqbench.nn.intrinsic.qat.conv_fused import __all__  # noqa: F401
