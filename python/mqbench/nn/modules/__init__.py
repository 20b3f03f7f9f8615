from mqbench.nn.modules.frozen_batchnorm import FrozenBatchNorm2d  # noqa: F401
from mqbench.nn.modules.functional import FXFloatFunctional  # noqa: F401
