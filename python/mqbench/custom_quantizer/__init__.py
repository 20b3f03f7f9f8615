"""MQBench's quantizer classes (``mqbench.custom_quantizer``), one module per backend family
as in MQBench. Each names one C++ rule set (``src/quantizer/rules/``);
``mqbench.prepare_by_platform`` fills ``mqbench.utils.registry.DEFAULT_MODEL_QUANTIZER`` with
the class each backend's BackendSpec names, unless the user registered one."""
from mqbench.custom_quantizer.model_quantizer import ModelQuantizer
from mqbench.custom_quantizer.academic_quantizer import AcademicQuantizer
from mqbench.custom_quantizer.openvino_quantizer import OPENVINOQuantizer
from mqbench.custom_quantizer.vitis_quantizer import VitisQuantizer
from mqbench.custom_quantizer.total_int_quantizer import TotalINTQuantizer
from mqbench.custom_quantizer.tensorrt_quantizer import TRTModelQuantizer, TensorrtNLPQuantizer
from mqbench.custom_quantizer.tengine_u8_quantizer import TengineQuantizer
from mqbench.custom_quantizer.onnx_qnn_quantizer import ONNXQNNQuantizer
from mqbench.custom_quantizer.nlp_quantizer import AcademicNLPQuantizer
from mqbench.custom_quantizer.tracer import CustomedTracer  # noqa: F401

__all__ = ["ModelQuantizer", "AcademicQuantizer", "OPENVINOQuantizer", "VitisQuantizer",
           "TotalINTQuantizer", "TRTModelQuantizer", "TensorrtNLPQuantizer", "TengineQuantizer",
           "ONNXQNNQuantizer", "AcademicNLPQuantizer", "quantizer_for"]

_BY_RULES = {cls.rules: cls for cls in (ModelQuantizer, AcademicQuantizer, TotalINTQuantizer,
                                        ONNXQNNQuantizer, TengineQuantizer, OPENVINOQuantizer,
                                        VitisQuantizer, TRTModelQuantizer, TensorrtNLPQuantizer,
                                        AcademicNLPQuantizer)}


def quantizer_for(backend):
    """The quantizer class of a BackendType: a registration (the user's, or the default
    ``prepare_by_platform`` made), else the class of the rule set its BackendSpec names."""
    from mqbench.utils.registry import DEFAULT_MODEL_QUANTIZER
    if backend in DEFAULT_MODEL_QUANTIZER:
        return DEFAULT_MODEL_QUANTIZER[backend]
    return class_of_rules(_rules_of(backend))


def _rules_of(backend):
    from mqbench import _C
    return _C.get_backend(backend.value)["model_quantizer"]


def class_of_rules(rules):
    """Our class for a rule set; a rule set registered from C++ gets the generic class."""
    if rules not in _BY_RULES:
        _BY_RULES[rules] = type(rules, (ModelQuantizer,), {"rules": rules})
    return _BY_RULES[rules]
