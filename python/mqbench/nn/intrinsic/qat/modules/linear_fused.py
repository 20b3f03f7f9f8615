"""MQBench's module path ``mqbench.nn.intrinsic.qat.modules.linear_fused``: the classes of
``mqbench.nn.intrinsic.qat.linear_fused`` (the same objects)."""
from mqbench.nn.intrinsic.qat.linear_fused import *  # noqa: F401,F403
from mqbench.nn.intrinsic.qat.linear_fused import __all__  # noqa: F401
