"""STPU's deploy step (``mqbench.deploy.deploy_stpu``).

::

    from mqbench.deploy import remove_fakequantize_and_collect_params_stpu
    remove_fakequantize_and_collect_params_stpu("out/m.onnx", "m")
    # out/m_for_stpu.onnx, out/m_stpu_minmax.json

The work is the C++ ``stpu`` translator. ``post_process_clip_ranges`` overrides are called with
the min/max table (``{name: {"min", "max"}}``, biases ``{"alpha", "zero_point"}``) before the
ReLU merge and the ``emin`` entries.
"""
from mqbench.deploy.deploy_linear import LinearQuantizer_process

__all__ = ["STPU_process", "remove_fakequantize_and_collect_params_stpu"]


class STPU_process(LinearQuantizer_process):
    """MQBench's STPU_process over the C++ ``stpu`` translator."""

    translator = "stpu"
    done_in_cpp = LinearQuantizer_process.done_in_cpp + ("merge_relu_layer", "update_emin")

    def merge_relu_layer(self, graph, quant_params, out2node):
        raise self._not_called("merge_relu_layer")

    def update_emin(self, node, quant_params, named_initializer):
        raise self._not_called("update_emin")

    def translate(self, model, model_name, qmin_max_dict=None):
        """The STPU files for ``model`` as ``{file name: bytes}``, without writing."""
        return self._translate(model, self.translator, model_name,
                               post_process_clip_ranges=self._post_process_hook(),
                               qmin_max_dict=qmin_max_dict)

    def remove_fakequantize_and_collect_params(self, onnx_path, model_name, qmin_max_dict=None):
        """Writes ``<model_name>_for_stpu.onnx`` and ``<model_name>_stpu_minmax.json`` next to
        ``onnx_path``; returns their paths (MQBench returns None)."""
        return self._deploy(onnx_path, model_name,
                            lambda data: self.translate(data, model_name, qmin_max_dict))


remove_fakequantize_and_collect_params_stpu = STPU_process().remove_fakequantize_and_collect_params
