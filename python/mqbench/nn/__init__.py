"""MQBench's ``mqbench.nn``: ``FrozenBatchNorm2d``, fused float containers
(``mqbench.nn.intrinsic``), QAT modules (``mqbench.nn.qat``) and fused QAT modules
(``mqbench.nn.intrinsic.qat``)."""
from mqbench.nn.modules import FrozenBatchNorm2d  # noqa: F401
