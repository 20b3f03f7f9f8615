"""mqbench: MQBench's API on a native LibTorch core.

Importing the package loads libmqbench, which registers the fake-quantize ops as
``torch.ops.mqbench.*``, and registers their ONNX export symbolics.
"""
import torch  # noqa: F401  (loads libtorch before the extension that links it)

from mqbench import _C

__version__ = _C.__version__

from mqbench import custom_symbolic_opset  # noqa: E402,F401  (registers ONNX symbolics)
