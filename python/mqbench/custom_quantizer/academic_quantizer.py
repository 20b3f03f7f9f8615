"""``AcademicQuantizer`` (MQBench's ``mqbench.custom_quantizer.academic_quantizer``): the
Academic backend's rules, no fusion, 8-bit first and last layers."""
from mqbench.custom_quantizer.model_quantizer import ModelQuantizer

__all__ = ["AcademicQuantizer"]


class AcademicQuantizer(ModelQuantizer):
    """No fusion; inputs of Conv2d / Linear; 8-bit IO layers (weights and input activations)."""
    rules = "AcademicQuantizer"
