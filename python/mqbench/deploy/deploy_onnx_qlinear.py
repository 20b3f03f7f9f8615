"""The standard QDQ model of a Tensorrt deploy (``mqbench.deploy.deploy_onnx_qlinear``),
what ``convert_deploy(..., deploy_to_qlinear=True)`` adds.

::

    from mqbench.deploy import ONNXQLinearPass
    ONNXQLinearPass("out/m.onnx").run()        # out/onnx_quantized_model.onnx

The work is the C++ ``tensorrt_qlinear`` translator: every fake quantizer becomes
QuantizeLinear -> DequantizeLinear (opset 13), 8-bit symmetric only, as MQBench 1.10.
"""
import numpy as np

from mqbench.deploy._step import output_dir_of
from mqbench.deploy.common import parse_qparams
from mqbench.deploy.deploy_onnx_qnn import FAKE_QUANTIZE_OP, ONNXQNNPass

__all__ = ["ONNXQLinearPass", "FAKE_QUANTIZE_OP"]


class ONNXQLinearPass(ONNXQNNPass):
    """MQBench's ONNXQLinearPass over the C++ ``tensorrt_qlinear`` translator."""

    translator = "tensorrt_qlinear"
    done_in_cpp = ONNXQNNPass.done_in_cpp + ("clip_weight", "parse_qparams")

    def parse_qparams(self, node, name2data):
        """``(tensor name, scale, zero point, qmin, qmax)`` of a fake-quantize node, as MQBench
        reads them; a helper for scripts."""
        return parse_qparams(node, name2data)

    def clip_weight(self, node, name2data, named_initializer):
        raise self._not_called("clip_weight")

    def wrap_onnx_constant(self, data):
        """A Constant's ``.tolist()`` value as an iterable numpy array."""
        return np.array(data) if isinstance(data, list) else np.array([data])

    def translate(self, model, model_name="mqbench_qmodel", qmin_max_dict=None):
        """``{'onnx_quantized_model.onnx': bytes}`` for ``model``, without writing."""
        return self._translate(model, self.translator, model_name, qmin_max_dict=qmin_max_dict)

    def run(self, qmin_max_dict=None):
        """Writes ``onnx_quantized_model.onnx`` next to the input file; returns its path (MQBench
        returns None)."""
        self._warn_not_called()
        files = self.translate(self._model(), qmin_max_dict=qmin_max_dict)
        return self.write_files(output_dir_of(self.onnx_model_path), files)
