from mqbench.nn.modules.frozen_batchnorm import FrozenBatchNorm2d  # noqa: F401
