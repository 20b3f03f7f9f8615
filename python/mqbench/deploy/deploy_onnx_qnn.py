"""ONNX_QNN's deploy step (``mqbench.deploy.deploy_onnx_qnn``): the QLinear model for TVM and
onnxruntime.

::

    from mqbench.deploy import ONNXQNNPass
    ONNXQNNPass("out/m.onnx").run("m_qnn")     # out/m_qnn.onnx: QLinearConv, QLinearAdd, ...

The work is the C++ ``onnx_qnn`` translator. MQBench saves ``<model_name>.onnx`` in the current
directory; here it goes next to the input file (docs/compatibility.md), and with the input's own
name (``run("m")`` above) it replaces the input, as convert_deploy does for ONNX_QNN.
``onnx_model`` (an ``ONNXGraph``) is loaded when first used; ``run()`` deploys it with the edits
made to it, or the file when it was never loaded.
"""
from mqbench.deploy._io import check_input_path, read_onnx
from mqbench.deploy._step import DeployStep, check_model_name, output_dir_of

__all__ = ["ONNXQNNPass", "FAKE_QUANTIZE_OP"]

FAKE_QUANTIZE_OP = ["FakeQuantizeLearnablePerchannelAffine", "FixedPerChannelAffine",
                    "FakeQuantizeDSQPerchannel", "LearnablePerTensorAffine", "FixedPerTensorAffine",
                    "FakeQuantizeDSQPertensor"]


class ONNXQNNPass(DeployStep):
    """MQBench's ONNXQNNPass over the C++ ``onnx_qnn`` translator.

    Args:
        onnx_model_path: the model with fake-quantize nodes; checked here (a missing file is a
            FileNotFoundError), read by ``run()``.
    """

    translator = "onnx_qnn"
    done_in_cpp = ("quantize_weight", "quantize_bias", "replace_conv_gemm",
                   "replace_add_to_qlinearadd", "replace_pool_to_qlinearpool",
                   "get_node_output_qparams", "replace_op_pass", "replace_qlinear_layer_pass",
                   "merge_relu_pass", "format_qlinear_dtype_pass")

    def __init__(self, onnx_model_path):
        self.onnx_model_path = check_input_path(onnx_model_path)
        self._onnx_model = None

    @property
    def onnx_model(self):
        """The input as an ``ONNXGraph`` (loaded on first use)."""
        if self._onnx_model is None:
            from mqbench.deploy.common import ONNXGraph
            self._onnx_model = ONNXGraph(self.onnx_model_path)
        return self._onnx_model

    @onnx_model.setter
    def onnx_model(self, value):
        self._onnx_model = value

    @property
    def qlinear_op_type(self):
        return ["QuantizeLinear", "QLinearConv", "QLinearAdd", "QLinearGemm",
                "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearConcat"]

    @property
    def node_without_qparams(self):
        return ["Flatten"]

    @staticmethod
    def attribute_to_kwarg(attribute):
        """``{name: value}`` of an AttributeProto, for ``onnx.helper.make_node``."""
        if attribute.type == 0:
            raise ValueError(f"attribute {attribute.name} does not have type specified.")
        fields = {1: "f", 2: "i", 3: "s", 4: "t", 5: "g", 6: "floats", 7: "ints", 8: "strings",
                  9: "tensors", 10: "graphs"}
        if attribute.type not in fields:
            raise ValueError(f"attribute {attribute.name} has unsupported type {attribute.type}.")
        return {attribute.name: getattr(attribute, fields[attribute.type])}

    def quantize_weight(self, weight_name, scale_name, zero_point_name):
        raise self._not_called("quantize_weight")

    def quantize_bias(self, bias, x_scale, w_scale):
        raise self._not_called("quantize_bias")

    def replace_conv_gemm(self, node, idx, is_conv):
        raise self._not_called("replace_conv_gemm")

    def replace_add_to_qlinearadd(self, node, idx):
        raise self._not_called("replace_add_to_qlinearadd")

    def replace_pool_to_qlinearpool(self, node, idx, is_global):
        raise self._not_called("replace_pool_to_qlinearpool")

    def get_node_output_qparams(self, node):
        raise self._not_called("get_node_output_qparams")

    def replace_op_pass(self):
        raise self._not_called("replace_op_pass")

    def replace_qlinear_layer_pass(self):
        raise self._not_called("replace_qlinear_layer_pass")

    def merge_relu_pass(self):
        raise self._not_called("merge_relu_pass")

    def format_qlinear_dtype_pass(self):
        raise self._not_called("format_qlinear_dtype_pass")

    def _model(self):
        """What run() deploys: the loaded ONNXGraph with its edits, else the file."""
        return self._onnx_model if self._onnx_model is not None else read_onnx(self.onnx_model_path)

    def translate(self, model, model_name, qmin_max_dict=None):
        """The QLinear model for ``model`` as ``{file name: bytes}``, without writing."""
        return self._translate(model, self.translator, model_name, qmin_max_dict=qmin_max_dict)

    def run(self, model_name, qmin_max_dict=None):
        """Writes ``<model_name>.onnx``, the QLinear model, next to the input file; returns its
        path (MQBench returns None and writes into the current directory).

        Args:
            model_name: the file name stem; one file name (no ``/``).
            qmin_max_dict: MQBench main's ``{node name: (quant_min, quant_max)}`` (optional).
        """
        self._warn_not_called()
        check_model_name(model_name)
        files = self.translate(self._model(), model_name, qmin_max_dict)
        return self.write_files(output_dir_of(self.onnx_model_path), files)
