"""MQBench's deploy steps, one at a time, and the check of a deployed file
(``mqbench.deploy``).

``convert_deploy`` runs these for each backend; here each can run on its own, on the ONNX file
``convert_deploy`` (or ``mqbench.onnx.export_onnx``) wrote, with the same
output files::

    from mqbench.deploy import remove_fakequantize_and_collect_params, ONNXQNNPass
    remove_fakequantize_and_collect_params("out/m.onnx", "m", "tensorrt")
    ONNXQNNPass("out/m.onnx").run("m_qnn")

Every step runs mqbench's C++ translator of its backend (``src/deploy/translators/``) and
writes its files atomically next to the input file. The names are bound methods of module-level
instances, as in MQBench; subclass the process class to change one step (docs/deploy.md,
"mqbench.deploy: one step at a time").
"""
import importlib

# name -> the module defining it. The names load on first use (PEP 562), so that
# ``mqbench.deploy.check`` (the check of two files, ``mqbench-deploy check``) imports without
# the translators and their native module, on a machine without torch.
_NAMES = {
    "remove_fakequantize_and_collect_params": "deploy_linear",
    "remove_fakequantize_and_collect_params_nnie": "deploy_nnie",
    "ONNXQLinearPass": "deploy_onnx_qlinear",
    "ONNXQNNPass": "deploy_onnx_qnn",
    "replace_fakequantize_and_collect_params_openvino": "deploy_openvino",
    "remove_fakequantize_and_collect_params_tengine": "deploy_tengine",
    "remove_fakequantize_and_collect_params_stpu": "deploy_stpu",
    "check_deploy": "check",
    "DeployCheckReport": "check",
}
__all__ = list(_NAMES)


def __getattr__(name):
    if name not in _NAMES:
        try:  # a submodule (mqbench.deploy.deploy_linear) read as an attribute
            return importlib.import_module(f"mqbench.deploy.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"mqbench.deploy.{name}":
                raise
        raise AttributeError(f"module 'mqbench.deploy' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mqbench.deploy.{_NAMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NAMES))
