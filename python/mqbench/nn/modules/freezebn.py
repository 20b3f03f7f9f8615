"""MQBench's module path ``mqbench.nn.modules.freezebn``: ``FrozenBatchNorm2d`` (the class of
``mqbench.nn.modules.frozen_batchnorm``)."""
from mqbench.nn.modules.frozen_batchnorm import FrozenBatchNorm2d  # noqa: F401

__all__ = ["FrozenBatchNorm2d"]
