"""MQBench's module path ``mqbench.nn.intrinsic.qat.modules.freezebn``: the classes of
``mqbench.nn.intrinsic.qat.freezebn`` (the same objects)."""
from mqbench.nn.intrinsic.qat.freezebn import *  # noqa: F401,F403
from mqbench.nn.intrinsic.qat.freezebn import __all__  # noqa: F401
