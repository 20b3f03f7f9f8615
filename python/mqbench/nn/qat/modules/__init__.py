"""MQBench's module path ``mqbench.nn.qat.modules``: the QAT layers, one module per family
(conv, deconv, linear, embedding); ``mqbench.nn.qat`` re-exports them."""
from mqbench.nn.qat.modules.conv import Conv1d, Conv2d, Conv3d  # noqa: F401
from mqbench.nn.qat.modules.deconv import ConvTranspose2d  # noqa: F401
from mqbench.nn.qat.modules.embedding import Embedding  # noqa: F401
from mqbench.nn.qat.modules.linear import Linear  # noqa: F401
