"""NNIE's deploy step (``mqbench.deploy.deploy_nnie``).

::

    from mqbench.deploy import remove_fakequantize_and_collect_params_nnie
    remove_fakequantize_and_collect_params_nnie("out/m.onnx", "m")
    # out/m_deploy_model.onnx (Resize as Upsample), out/m_gfpq_param_dict.json

The work is the C++ ``nnie`` translator.
"""
from mqbench.deploy._step import DeployStep

__all__ = ["NNIE_process", "remove_fakequantize_and_collect_params_nnie"]


class NNIE_process(DeployStep):
    """MQBench's NNIE_process over the C++ ``nnie`` translator."""

    translator = "nnie"
    done_in_cpp = ("gen_gfpq_param_file",)

    def gen_gfpq_param_file(self, graph, clip_val):
        raise self._not_called("gen_gfpq_param_file")

    def translate(self, model, model_name):
        """The NNIE files for ``model`` as ``{file name: bytes}``, without writing."""
        return self._translate(model, self.translator, model_name)

    def remove_fakequantize_and_collect_params(self, onnx_path, model_name):
        """Writes ``<model_name>_deploy_model.onnx`` and ``<model_name>_gfpq_param_dict.json``
        next to ``onnx_path``; returns their paths (MQBench returns None)."""
        return self._deploy(onnx_path, model_name, lambda data: self.translate(data, model_name))


remove_fakequantize_and_collect_params_nnie = NNIE_process().remove_fakequantize_and_collect_params
