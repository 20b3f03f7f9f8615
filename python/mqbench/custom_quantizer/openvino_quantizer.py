"""``OPENVINOQuantizer`` (MQBench's ``mqbench.custom_quantizer.openvino_quantizer``)."""
from mqbench.custom_quantizer.model_quantizer import ModelQuantizer, _rule_data, _RuleList
from mqbench.custom_quantizer.type_table import resolve_type

__all__ = ["OPENVINOQuantizer"]


class OPENVINOQuantizer(ModelQuantizer):
    """OpenVINO: 7-bit weights, unsigned activations after ReLUs; ``academic_mode`` in
    ``extra_quantizer_dict`` skips fusion and quantizes plain Conv2d / Linear inputs."""
    rules = "OPENVINOQuantizer"

    @_RuleList
    def module_type_to_quant_input(self):
        """The rule set's qualified consumers; in academic mode plain Conv2d / Linear and the
        pools (+ additional_module_type), as MQBench's."""
        data = _rule_data(self.rules)
        names = data["academic_module_types"] if self.academic_mode else data["module_types"]
        return tuple(resolve_type(n) for n in names) + tuple(self.additional_module_type)
