"""``VitisQuantizer`` (MQBench's ``mqbench.custom_quantizer.vitis_quantizer``)."""
from mqbench.custom_quantizer.graph_ir import resolve_function
from mqbench.custom_quantizer.model_quantizer import ModelQuantizer, _rule_data, _RuleList
from mqbench.custom_quantizer.type_table import resolve_type
from mqbench.quantization.default_bias_fake_quant import bias_fake_quantizer
from mqbench.utils.module_types import canonical_type

__all__ = ["VitisQuantizer"]


# MQBench 1.10 maps these to its own QAT classes, which fake-quantize the (folded) bias.
_BIAS_QUANTIZED = ("nn.intrinsic.qat.ConvBn2d", "nn.intrinsic.qat.ConvBnReLU2d",
                   "nn.intrinsic.qat.ConvReLU2d")


class VitisQuantizer(ModelQuantizer):
    """Vitis DPU: outputs of the listed ops, TQT quant types set after insertion. The lists are
    ``module_type_to_quant_output`` / ``function_type_to_quant_output`` (a subclass may
    override them); the input lists are not used, as in MQBench. The fused convolutions
    (conv + BN (+ ReLU), conv + ReLU) quantize their bias with a power-of-two TQT quantizer
    (``bias_fake_quantizer``), as MQBench 1.10's Vitis modules do; the deployed JSON gets the
    bias scales."""
    rules = "VitisQuantizer"
    _rule_lists = {"function_type_to_quant_output": "function_types",
                   "module_type_to_quant_output": "module_types",
                   "implicit_merge_patterns": "implicit_merges"}

    @_RuleList
    def function_type_to_quant_output(self):
        """Functions whose outputs get a quantizer (+ additional_function_type)."""
        out = [resolve_function(n) for n in _rule_data(self.rules)["function_types"]]
        return out + list(self.additional_function_type)

    @_RuleList
    def module_type_to_quant_output(self):
        """Module classes (isinstance) whose outputs get a quantizer (+ additional)."""
        types = tuple(resolve_type(n) for n in _rule_data(self.rules)["module_types"])
        return types + tuple(self.additional_module_type)

    def _qat_swap_modules(self, root, additional_qat_module_mapping, backend_config=None,
                          freeze_bn=None):
        root = super()._qat_swap_modules(root, additional_qat_module_mapping, backend_config,
                                         freeze_bn)
        for module in root.modules():
            if canonical_type(type(module)) in _BIAS_QUANTIZED and \
                    "bias_fake_quant" not in module._modules:
                module.bias_fake_quant = bias_fake_quantizer().to(module.weight.device)
        return root

    def prepare(self, model, qconfig, is_qat=None, backend_config=None, freeze_bn=None):
        model = super().prepare(model, qconfig, is_qat, backend_config, freeze_bn)
        self._set_quant_type(model)
        return model

    @staticmethod
    def _set_quant_type(model):
        """'param' on weight / bias TQT quantizers, 'input' on the quantizer a model input
        feeds first; activation quantizers got 'tensor' when inserted."""
        for module in model.modules():
            for attr in ("weight_fake_quant", "bias_fake_quant"):
                fq = getattr(module, attr, None)
                if fq is not None and hasattr(fq, "set_quant_type"):
                    fq.set_quant_type("param")
        for node in model.graph.nodes:
            if node.op != "placeholder" or not node.users:
                continue
            user = next(iter(node.users))
            if user.op == "call_module":
                fq = model.get_submodule(user.target)
                if hasattr(fq, "set_quant_type"):
                    fq.set_quant_type("input")
