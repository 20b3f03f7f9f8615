"""``ONNXQNNQuantizer`` (MQBench's ``mqbench.custom_quantizer.onnx_qnn_quantizer``)."""
from mqbench.custom_quantizer.model_quantizer import ModelQuantizer

__all__ = ["ONNXQNNQuantizer"]


class ONNXQNNQuantizer(ModelQuantizer):
    """QLinear ONNX: inputs and outputs; Linear layers stay float."""
    rules = "ONNXQNNQuantizer"
