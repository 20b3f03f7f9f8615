"""``AcademicNLPQuantizer`` (MQBench's ``mqbench.custom_quantizer.nlp_quantizer``)."""
from mqbench.custom_quantizer.model_quantizer import ModelQuantizer

__all__ = ["AcademicNLPQuantizer"]


class AcademicNLPQuantizer(ModelQuantizer):
    """Transformers, academic setting: linear and matmul inputs."""
    rules = "AcademicNLPQuantizer"
