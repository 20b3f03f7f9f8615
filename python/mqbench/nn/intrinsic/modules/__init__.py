"""MQBench's module path ``mqbench.nn.intrinsic.modules``: the fused float containers of
``fused.py`` (Conv / Linear / BatchNorm / ReLU sequences that fusion builds and the QAT swap
replaces)."""
from mqbench.nn.intrinsic.modules.fused import *  # noqa: F401,F403
from mqbench.nn.intrinsic.modules.fused import __all__  # noqa: F401
