"""``TotalINTQuantizer`` (MQBench's ``mqbench.custom_quantizer.total_int_quantizer``): SNPE,
PPLW8A16, PPLCUDA and STPU."""
from mqbench.custom_quantizer.model_quantizer import ModelQuantizer

__all__ = ["TotalINTQuantizer"]


class TotalINTQuantizer(ModelQuantizer):
    """Inputs and outputs of every quant-input node (integer-only NPUs)."""
    rules = "TotalINTQuantizer"
