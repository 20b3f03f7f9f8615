"""The linear backends' deploy step (``mqbench.deploy.deploy_linear``): Tensorrt, SNPE,
PPLW8A16, Vitis, PPLCUDA.

::

    from mqbench.deploy import remove_fakequantize_and_collect_params
    remove_fakequantize_and_collect_params("out/resnet18.onnx", "resnet18", "tensorrt")
    # out/resnet18_deploy_model.onnx, out/resnet18_clip_ranges.json, out/resnet18_calib.cache:
    # the files convert_deploy writes for BackendType.Tensorrt, byte for byte

The work is the backend's C++ translator (``src/deploy/translators/``). A subclass may override
``post_process_clip_ranges`` (the translator calls it with the table of ranges and the deploy
graph), ``translate`` or ``write_files``::

    class WithReshape(LinearQuantizer_process):
        def post_process_clip_ranges(self, clip_ranges, graph, inp2node):
            clip_ranges = super().post_process_clip_ranges(clip_ranges, graph, inp2node)
            ...  # e.g. give more tensors a range
            return clip_ranges

    WithReshape().remove_fakequantize_and_collect_params("out/m.onnx", "m", "tensorrt")
"""
import copy
import inspect
import json

import onnx

from mqbench import _C
from mqbench.deploy._step import DeployStep, json_default
from mqbench.deploy.common import parse_qparams

__all__ = ["LinearQuantizer_process", "remove_fakequantize_and_collect_params",
           "PERCHANNEL_FAKEQUANTIZER", "PERTENSOR_FAKEQUANTIZER", "ALL_FAKEQUANTIZER",
           "LINEAR_BACKENDS"]

PERCHANNEL_FAKEQUANTIZER = ["FakeQuantizeLearnablePerchannelAffine",
                            "FixedPerChannelAffine",
                            "FakeQuantizeDSQPerchannel"]
PERTENSOR_FAKEQUANTIZER = ["LearnablePerTensorAffine",
                           "FixedPerTensorAffine",
                           "FakeQuantizeDSQPertensor",
                           "FakeQuantizeTqtAffine"]
ALL_FAKEQUANTIZER = PERCHANNEL_FAKEQUANTIZER + PERTENSOR_FAKEQUANTIZER

#: MQBench's ``backend`` argument -> the C++ translator (convert_deploy's for that backend).
LINEAR_BACKENDS = {"tensorrt": "tensorrt", "snpe": "snpe", "ppl": "pplw8a16", "vitis": "vitis",
                   "ppl-cuda": "pplcuda"}


class LinearQuantizer_process(DeployStep):
    """MQBench's linear deploy process over the C++ translators."""

    done_in_cpp = ("weight_preprocess", "deal_with_weight_fakequant",
                   "deal_with_activation_fakequant", "parse_qparams", "clip_weight")

    # -- MQBench's internal steps: the translator does them ---------------------------------
    def weight_preprocess(self, target_tensor, out2node, inp2node, named_initializer):
        raise self._not_called("weight_preprocess")

    def deal_with_weight_fakequant(self, node, out2node, inp2node, named_initializer):
        raise self._not_called("deal_with_weight_fakequant")

    def deal_with_activation_fakequant(self, node, inp2node):
        raise self._not_called("deal_with_activation_fakequant")

    def clip_weight(self, node, name2data, inp2node, named_initializer):
        raise self._not_called("clip_weight")

    def parse_qparams(self, node, name2data):
        """``(tensor name, scale, zero point, qmin, qmax)`` of a fake-quantize node, as MQBench
        reads them (a helper for scripts; the translator reads its own)."""
        return parse_qparams(node, name2data)

    # -- the step the translator calls back -------------------------------------------------
    def post_process_clip_ranges(self, clip_ranges, graph, inp2node, out2node=None):
        """Gives each Flatten / Resize / Reshape input without a range the range found
        downstream (through further such nodes), as the translators do; returns the table.

        Args:
            clip_ranges: ``{tensor name: the backend's entry}``.
            graph: the deploy graph (``onnx.GraphProto``), fake quantization removed; edits to it
                are kept when the translator calls this.
            inp2node, out2node: MQBench's maps (common.update_inp2node_out2node); not used.
        """
        model = onnx.ModelProto()
        model.ir_version = onnx.IR_VERSION
        model.graph.CopyFrom(graph)
        for to, source in _C.deploy_post_process_clip_ranges(model.SerializeToString(),
                                                               list(clip_ranges)):
            clip_ranges[to] = copy.deepcopy(clip_ranges[source])
        return clip_ranges

    def _post_process_hook(self):
        """The translator's callback when a subclass overrides post_process_clip_ranges; None
        otherwise (the translator's own rule gives the same table without the round trip)."""
        method = type(self).post_process_clip_ranges
        if method is LinearQuantizer_process.post_process_clip_ranges:
            return None
        bound = self.post_process_clip_ranges
        params = inspect.signature(bound).parameters.values()
        takes_out2node = any(p.kind == p.VAR_POSITIONAL for p in params) or \
            sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) >= 4

        def hook(ranges_json, model_bytes):
            from mqbench.deploy.common import update_inp2node_out2node
            model = onnx.load_from_string(model_bytes)
            out2node, inp2node = update_inp2node_out2node(model.graph)
            clip_ranges = json.loads(ranges_json)
            args = (clip_ranges, model.graph, inp2node) + ((out2node,) if takes_out2node else ())
            result = bound(*args)
            if result is None:  # edited in place
                result = clip_ranges
            if not isinstance(result, dict):
                raise TypeError(f"{type(self).__name__}.post_process_clip_ranges must return a "
                                f"dict {{tensor name: range}}, got {type(result).__name__}")
            try:
                text = json.dumps(result, default=json_default, allow_nan=False)
            except ValueError as e:
                raise ValueError(f"{type(self).__name__}.post_process_clip_ranges returned a "
                                 f"range that is not a finite number: {e}") from e
            return text, model.SerializeToString()
        return hook

    # -- the step ---------------------------------------------------------------------------
    def translate(self, model, model_name, backend, qmin_max_dict=None, *,
                  allow_float_layers=False):
        """The files of ``backend`` for ``model`` (a path, bytes, ModelProto or ONNXGraph), as
        ``{file name: bytes}``, without writing."""
        return self._translate(model, _translator(backend), model_name,
                               post_process_clip_ranges=self._post_process_hook(),
                               qmin_max_dict=qmin_max_dict, allow_float_layers=allow_float_layers)

    def remove_fakequantize_and_collect_params(self, onnx_path, model_name, backend,
                                               qmin_max_dict=None, *, allow_float_layers=False):
        """Removes the fake quantization of the ONNX file ``onnx_path`` and writes, next to it,
        ``<model_name>_deploy_model.onnx`` and ``<model_name>_clip_ranges.json`` (PPLCUDA:
        plain text; Tensorrt also ``<model_name>_calib.cache``, TensorRT's calibration cache),
        the files convert_deploy writes for that backend.

        Args:
            onnx_path: the model with fake-quantize nodes (convert_deploy's ``<name>.onnx``).
            model_name: the file name stem; one file name (no ``/``).
            backend: ``'tensorrt'``, ``'snpe'``, ``'ppl'``, ``'vitis'`` or ``'ppl-cuda'``.
            qmin_max_dict: MQBench main's ``{node name: (quant_min, quant_max)}`` for
                QuantizeLinear nodes whose attributes were stripped (optional).
            allow_float_layers: ``'tensorrt'``: deploy a layer whose weight is quantized but
                whose input is not (TensorRT runs it in float), with a warning naming it;
                False (default) raises ``ValueError`` naming each such layer (keyword only).

        Returns the paths written (MQBench returns None).
        """
        _translator(backend)
        # only when asked: a subclass's translate() of MQBench's signature keeps working
        extra = {"allow_float_layers": True} if allow_float_layers else {}
        return self._deploy(onnx_path, model_name,
                            lambda data: self.translate(data, model_name, backend, qmin_max_dict,
                                                        **extra))


def _translator(backend):
    if backend not in LINEAR_BACKENDS:
        raise ValueError(f"unknown linear backend {backend!r}; the backends are "
                         f"{', '.join(repr(b) for b in LINEAR_BACKENDS)}")
    return LINEAR_BACKENDS[backend]


remove_fakequantize_and_collect_params = \
    LinearQuantizer_process().remove_fakequantize_and_collect_params
