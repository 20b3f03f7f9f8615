"""MQBench's module path ``mqbench.nn.modules``: ``FrozenBatchNorm2d`` and ``FXFloatFunctional``
(the traceable ``FloatFunctional``), one module each."""
from mqbench.nn.modules.frozen_batchnorm import FrozenBatchNorm2d  # noqa: F401
from mqbench.nn.modules.functional import FXFloatFunctional  # noqa: F401
