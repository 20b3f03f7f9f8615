"""MQBench's deploy steps, one at a time (``mqbench.deploy``).

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
from mqbench.deploy.deploy_linear import remove_fakequantize_and_collect_params
from mqbench.deploy.deploy_nnie import remove_fakequantize_and_collect_params_nnie
from mqbench.deploy.deploy_onnx_qlinear import ONNXQLinearPass
from mqbench.deploy.deploy_onnx_qnn import ONNXQNNPass
from mqbench.deploy.deploy_openvino import replace_fakequantize_and_collect_params_openvino
from mqbench.deploy.deploy_stpu import remove_fakequantize_and_collect_params_stpu
from mqbench.deploy.deploy_tengine import remove_fakequantize_and_collect_params_tengine

__all__ = ["remove_fakequantize_and_collect_params", "remove_fakequantize_and_collect_params_nnie",
           "ONNXQLinearPass", "ONNXQNNPass", "replace_fakequantize_and_collect_params_openvino",
           "remove_fakequantize_and_collect_params_tengine",
           "remove_fakequantize_and_collect_params_stpu"]
