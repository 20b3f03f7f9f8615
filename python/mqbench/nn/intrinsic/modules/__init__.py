from mqbench.nn.intrinsic.modules.fused import *  # noqa: F401,F403
from mqbench.nn.intrinsic.modules.fused import __all__  # noqa: F401
