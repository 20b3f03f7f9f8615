"""``OPENVINOQuantizer`` (MQBench's ``mqbench.custom_quantizer.openvino_quantizer``)."""
from mqbench.custom_quantizer.model_quantizer import ModelQuantizer

__all__ = ["OPENVINOQuantizer"]


class OPENVINOQuantizer(ModelQuantizer):
    """OpenVINO: 7-bit weights, unsigned activations after ReLUs; ``academic_mode`` in
    ``extra_quantizer_dict`` skips fusion and quantizes plain Conv2d / Linear inputs."""
    rules = "OPENVINOQuantizer"
