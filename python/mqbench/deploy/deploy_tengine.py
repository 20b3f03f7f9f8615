"""Tengine_u8's deploy step (``mqbench.deploy.deploy_tengine``).

::

    from mqbench.deploy import remove_fakequantize_and_collect_params_tengine
    remove_fakequantize_and_collect_params_tengine("out/m.onnx", "m")
    # out/m_for_tengine.onnx, out/m_for_tengine.scale (lines "tensor scale zero_point")

The work is the C++ ``tengine_u8`` translator (MQBench also runs onnxsim on the model; the
translator folds what torch leaves itself). ``post_process_clip_ranges`` overrides are called
with ``{tensor: [scale, zero_point]}``.
"""
from onnx import numpy_helper

from mqbench.deploy.deploy_linear import LinearQuantizer_process

__all__ = ["Tengine_process", "remove_fakequantize_and_collect_params_tengine"]


class Tengine_process(LinearQuantizer_process):
    """MQBench's Tengine_process over the C++ ``tengine_u8`` translator."""

    translator = "tengine_u8"

    @staticmethod
    def get_constant(node):
        """The value of a Constant node, as ``.tolist()``."""
        for attr in node.attribute:
            if attr.name == "value":
                return numpy_helper.to_array(attr.t).tolist()
        raise ValueError(f"node '{node.name}' ({node.op_type}) has no 'value' tensor attribute")

    def translate(self, model, model_name, qmin_max_dict=None):
        """The Tengine files for ``model`` as ``{file name: bytes}``, without writing."""
        return self._translate(model, self.translator, model_name,
                               post_process_clip_ranges=self._post_process_hook(),
                               qmin_max_dict=qmin_max_dict)

    def remove_fakequantize_and_collect_params(self, onnx_path, model_name, qmin_max_dict=None):
        """Writes ``<model_name>_for_tengine.onnx`` and ``<model_name>_for_tengine.scale`` next
        to ``onnx_path``; returns their paths (MQBench returns None)."""
        return self._deploy(onnx_path, model_name,
                            lambda data: self.translate(data, model_name, qmin_max_dict))


remove_fakequantize_and_collect_params_tengine = \
    Tengine_process().remove_fakequantize_and_collect_params
