"""MQBench's module path ``mqbench.nn.intrinsic.qat.modules.deconv_fused``: the classes of
``mqbench.nn.intrinsic.qat.deconv_fused`` (the same objects)."""
from mqbench.nn.intrinsic.qat.deconv_fused import *  # noqa: F401,F403
from mqbench.nn.intrinsic.qat.deconv_fused import __all__  # noqa: F401
