"""MQBench's quantizer classes (``mqbench.custom_quantizer``). Each names one C++ rule set
(``src/quantizer/rules/``); ``mqbench.utils.registry.DEFAULT_MODEL_QUANTIZER`` maps every
backend to the class its BackendSpec names."""
from mqbench.custom_quantizer.model_quantizer import ModelQuantizer
from mqbench.custom_quantizer.tracer import CustomedTracer  # noqa: F401
from mqbench.utils.registry import DEFAULT_MODEL_QUANTIZER

__all__ = ["ModelQuantizer", "AcademicQuantizer", "TotalINTQuantizer", "ONNXQNNQuantizer",
           "TengineQuantizer", "OPENVINOQuantizer", "VitisQuantizer", "TensorrtNLPQuantizer",
           "AcademicNLPQuantizer", "quantizer_for"]


class AcademicQuantizer(ModelQuantizer):
    """No fusion; inputs of Conv2d / Linear; 8-bit IO layers."""
    rules = "AcademicQuantizer"


class TotalINTQuantizer(ModelQuantizer):
    """Inputs and outputs of every quant-input node (integer-only NPUs)."""
    rules = "TotalINTQuantizer"


class ONNXQNNQuantizer(ModelQuantizer):
    """QLinear ONNX: inputs and outputs; Linear layers stay float."""
    rules = "ONNXQNNQuantizer"


class TengineQuantizer(ModelQuantizer):
    """Tengine: inputs, outputs and graph outputs."""
    rules = "TengineQuantizer"


class OPENVINOQuantizer(ModelQuantizer):
    """OpenVINO: 7-bit weights, unsigned activations after ReLUs."""
    rules = "OPENVINOQuantizer"


class VitisQuantizer(ModelQuantizer):
    """Vitis DPU: outputs of the listed ops, TQT quant types set after insertion."""
    rules = "VitisQuantizer"

    def prepare(self, model, qconfig):
        model = super().prepare(model, qconfig)
        self._set_quant_type(model)
        return model

    @staticmethod
    def _set_quant_type(model):
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


class TensorrtNLPQuantizer(ModelQuantizer):
    """Transformers for TensorRT: linear, matmul and add inputs."""
    rules = "TensorrtNLPQuantizer"


class AcademicNLPQuantizer(ModelQuantizer):
    """Transformers, academic setting: linear and matmul inputs."""
    rules = "AcademicNLPQuantizer"


_BY_RULES = {cls.rules: cls for cls in (ModelQuantizer, AcademicQuantizer, TotalINTQuantizer,
                                        ONNXQNNQuantizer, TengineQuantizer, OPENVINOQuantizer,
                                        VitisQuantizer, TensorrtNLPQuantizer,
                                        AcademicNLPQuantizer)}


def quantizer_for(backend):
    """The quantizer class of a BackendType: a user registration, else the class of the rule
    set its BackendSpec names."""
    if backend in DEFAULT_MODEL_QUANTIZER:
        return DEFAULT_MODEL_QUANTIZER[backend]
    from mqbench import _C
    rules = _C.get_backend(backend.value)["model_quantizer"]
    if rules not in _BY_RULES:  # a rule set registered from C++: the generic class runs it
        return type(rules, (ModelQuantizer,), {"rules": rules})
    return _BY_RULES[rules]
