"""``TengineQuantizer`` (MQBench's ``mqbench.custom_quantizer.tengine_u8_quantizer``)."""
from mqbench.custom_quantizer.model_quantizer import ModelQuantizer

__all__ = ["TengineQuantizer"]


class TengineQuantizer(ModelQuantizer):
    """Tengine: inputs, outputs and graph outputs."""
    rules = "TengineQuantizer"
