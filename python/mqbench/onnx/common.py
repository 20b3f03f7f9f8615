"""What both ONNX exporters of the ``torch.ops.mqbench`` ops share: the node domain, the opsets,
the export format (state), the ONNX dtype codes and the op list.

A leaf module: :mod:`mqbench.onnx.symbolic` (TorchScript symbolics) and
:mod:`mqbench.onnx.dynamo` (dynamo translations) both read it, and neither imports the other
at module level. The public names are re-exported by ``mqbench.onnx`` and by
``mqbench.custom_symbolic_opset``, where MQBench
users import them.
"""
import contextlib

import torch

DOMAIN = "mqbench"
CUSTOM_OPSETS = {DOMAIN: 1}
FORMATS = ("mqbench", "qdq")
MIN_OPSET = 11
DEFAULT_OPSET = 13  # per-channel QuantizeLinear needs it (TorchScript exporter)
DYNAMO_OPSET = 18   # the dynamo exporter's default here (torchlib's opset; torch's own is 20)

#: The ``torch.ops.mqbench`` ops that export to ONNX: each has a TorchScript symbolic
#: (``onnx.symbolic.SYMBOLICS``) and a dynamo translation (``onnx.dynamo.TRANSLATIONS``)
#: of this name.
EXPORTED_OPS = (
    "fake_quantize_per_tensor_affine", "fake_quantize_per_channel_affine",
    "fake_quantize_learnable_per_tensor_affine", "fake_quantize_learnable_per_channel_affine",
    "fake_quantize_pact", "dorefa_normalize", "fake_quantize_dsq_per_tensor",
    "fake_quantize_dsq_per_channel", "fake_quantize_tqt", "fake_quantize_nnie",
    "fake_quantize_adaround_per_tensor", "fake_quantize_adaround_per_channel",
    "fake_quantize_qdrop_per_tensor", "fake_quantize_qdrop_per_channel", "pot_quantization",
)

# ONNX TensorProto data types.
ONNX_FLOAT, ONNX_UINT8, ONNX_INT8, ONNX_INT64 = 1, 2, 3, 7

_format = "mqbench"


def set_export_format(fmt):
    """Chooses how fake-quantize ops export: ``"mqbench"`` (default) or ``"qdq"``."""
    global _format
    if fmt not in FORMATS:
        raise ValueError(f"unknown ONNX export format {fmt!r}; choose one of {list(FORMATS)}")
    _format = fmt


def get_export_format():
    """The current export format (see :func:`set_export_format`)."""
    return _format


@contextlib.contextmanager
def export_format(fmt):
    """Context manager form of :func:`set_export_format`; restores the previous format."""
    previous = _format
    set_export_format(fmt)
    try:
        yield
    finally:
        set_export_format(previous)


def qdq_dtype(qmin, qmax, what):
    """The integer type of a QuantizeLinear for the range [qmin, qmax]: (ONNX dtype code,
    torch dtype, the type's own range). As MQBench: uint8 when the range starts at 0 or
    above, int8 otherwise; a ValueError naming ``what`` for a range that fits neither."""
    if 0 <= qmin and qmax <= 255:
        return ONNX_UINT8, torch.uint8, (0, 255)
    if -128 <= qmin and qmax <= 127:
        return ONNX_INT8, torch.int8, (-128, 127)
    raise ValueError(
        f"{what}: the range [{qmin}, {qmax}] fits neither int8 nor uint8, so it has no "
        f"QuantizeLinear/DequantizeLinear form; export it with the 'mqbench' format")
