"""OPENVINO's deploy step (``mqbench.deploy.deploy_openvino``).

::

    from mqbench.deploy import replace_fakequantize_and_collect_params_openvino
    replace_fakequantize_and_collect_params_openvino("out/m.onnx", "m")
    # out/m_deploy_model.onnx with org.openvinotoolkit FakeQuantize nodes

The work is the C++ ``openvino`` translator.
"""
from mqbench.deploy._step import DeployStep
from mqbench.deploy.common import parse_qparams

__all__ = ["OPENVINO_process", "replace_fakequantize_and_collect_params_openvino"]


class OPENVINO_process(DeployStep):
    """MQBench's OPENVINO_process over the C++ ``openvino`` translator."""

    translator = "openvino"
    done_in_cpp = ("parse_qparams",)

    def parse_qparams(self, node, name2data):
        """``(tensor name, scale, zero point, qmin, qmax)`` of a fake-quantize node (qmin and
        qmax None when the node carries neither), as MQBench reads them; a helper for scripts."""
        return parse_qparams(node, name2data, required=False)

    def translate(self, model, model_name, qmin_max_dict=None):
        """The OPENVINO model for ``model`` as ``{file name: bytes}``, without writing."""
        return self._translate(model, self.translator, model_name, qmin_max_dict=qmin_max_dict)

    def replace_fakequantize_and_collect_params(self, onnx_path, model_name, qmin_max_dict=None):
        """Writes ``<model_name>_deploy_model.onnx`` next to ``onnx_path``; returns its path
        (MQBench returns None)."""
        return self._deploy(onnx_path, model_name,
                            lambda data: self.translate(data, model_name, qmin_max_dict))


replace_fakequantize_and_collect_params_openvino = \
    OPENVINO_process().replace_fakequantize_and_collect_params
