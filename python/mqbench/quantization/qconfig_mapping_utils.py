"""MQBench main's ``mqbench.quantization.qconfig_mapping_utils``: ``get_flattened_qconfig_dict``
(the function of ``mqbench.utils``; MQBench 1.10 took torch's)."""
from mqbench.utils.utils import get_flattened_qconfig_dict  # noqa: F401

__all__ = ["get_flattened_qconfig_dict"]
