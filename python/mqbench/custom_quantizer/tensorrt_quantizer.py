"""MQBench's ``mqbench.custom_quantizer.tensorrt_quantizer``: ``TRTModelQuantizer`` (not the
default of any backend: Tensorrt uses ``ModelQuantizer``) and ``TensorrtNLPQuantizer``."""
from mqbench.custom_quantizer.model_quantizer import ModelQuantizer

__all__ = ["TRTModelQuantizer", "TensorrtNLPQuantizer"]


class TRTModelQuantizer(ModelQuantizer):
    """The base rules, but an add keeps unquantized one input that is a float nn.Conv2d /
    nn.Linear used only by the add (TensorRT fuses the add into that layer). Register it for
    a backend with ``register_model_quantizer``."""
    rules = "TRTModelQuantizer"


class TensorrtNLPQuantizer(ModelQuantizer):
    """Transformers for TensorRT: linear, matmul and add inputs."""
    rules = "TensorrtNLPQuantizer"
