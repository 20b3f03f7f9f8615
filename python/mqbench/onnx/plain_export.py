"""A plain ``torch.onnx.export`` of a prepared model, with either of torch's exporters.

Users export prepared models themselves, not only through ``convert_deploy`` /
:func:`mqbench.onnx.export_onnx`. The TorchScript exporter (``dynamo=False``)
finds our symbolics, registered on import. The dynamo exporter (torch's default since 2.9) only
knows the ops of its translation table, which ``export_onnx`` extends with
``mqbench.onnx.dynamo``'s but a plain call does not. So, while a plain dynamo export traces the
model (``torch.onnx.is_in_onnx_export()`` without TorchScript tracing and outside
``export_onnx``), the fake quantizers call the ops of :data:`SYMBOLIC` instead of
``torch.ops.mqbench``: each writes the node ``export_onnx`` writes in the ``"mqbench"`` format
(MQBench's op_type, inputs and attributes, domain ``mqbench`` version 1) through torch's public
hook ``torch.onnx.ops.symbolic`` (torch 2.8 and later), and the ops that have no node of their
own (PACT's clip, DoReFa's normalisation, AdaRound's hard rounding, the power-of-two scale; the
Hadamard rotation and per-token fake quantization, whose graphs are standard ONNX: their torch
forms in :mod:`mqbench.onnx.llm_ops`) as the torch ops they compute. Where torch has no such
hook (2.5-2.7), or the export format is ``"qdq"``, the export fails at once with an error that
names ``export_onnx``.

Fake quantizers get their op namespace from :func:`ops`::

    X = ops().fake_quantize_per_tensor_affine(X, scale, zero_point, quant_min, quant_max)
"""
import contextlib
import threading

import torch

from mqbench.onnx import common as _ts  # the leaf both exporters read (no import circle)
from mqbench.onnx import llm_ops

__all__ = ["SYMBOLIC", "ops", "own_export"]

_HAS_HOOK = hasattr(torch.onnx, "ops") and hasattr(getattr(torch.onnx, "ops", None), "symbolic")
_state = threading.local()


@contextlib.contextmanager
def own_export():
    """Marks an export run by ``export_onnx``, which brings its own translations."""
    before = getattr(_state, "own", False)
    _state.own = True
    try:
        yield
    finally:
        _state.own = before


def _plain_dynamo_export():
    return (torch.onnx.is_in_onnx_export() and not torch.jit.is_tracing()
            and not getattr(_state, "own", False))


def _is_exporting():
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    if is_exporting is None:  # an older torch: an ONNX export is what can be told
        return torch.onnx.is_in_onnx_export() and not torch.jit.is_tracing()
    return is_exporting()


# Note [Refusals survive the capture fallback]: the dynamo exporter captures with
# torch.export(strict=False) and, when that raises, tries again with strict=True, where dynamo
# reads torch.onnx.is_in_onnx_export() as False: the second capture would trace our ops, and the
# user would see torch's "No ONNX function found" instead of our message. So once a plain ONNX
# export has been seen, every traced call refuses again, until the model runs outside an export.
_onnx_export_seen = False


def _refusal():
    """Why this plain dynamo export cannot write our nodes, or None."""
    if not _HAS_HOOK:
        return (f"torch.onnx.export(..., dynamo=True) of a model with mqbench fake quantizers "
                f"needs torch.onnx.ops.symbolic (torch >= 2.8; this is {torch.__version__}): "
                "export with mqbench.onnx.export_onnx(model, args, f, "
                "dynamo=True), or with torch.onnx.export(..., dynamo=False)")
    if _ts.get_export_format() != "mqbench":
        return (f"a plain torch.onnx.export writes MQBench's nodes (the 'mqbench' format); the "
                f"{_ts.get_export_format()!r} format is written by "
                "mqbench.onnx.export_onnx(model, args, f, dynamo=True)")
    return None


def ops():
    """``torch.ops.mqbench``, or :data:`SYMBOLIC` during a plain dynamo ONNX export."""
    global _onnx_export_seen
    if not _is_exporting():
        if _onnx_export_seen:  # written only on a change: torch.compile traces this function
            _onnx_export_seen = False
        return torch.ops.mqbench
    if _plain_dynamo_export():
        _onnx_export_seen = True
    elif not _onnx_export_seen:  # torch.export of the model, or our own export_onnx
        return torch.ops.mqbench
    why = _refusal()
    if why is not None:
        raise RuntimeError(why)
    return SYMBOLIC if _plain_dynamo_export() else torch.ops.mqbench


def _int64(v):
    return torch.tensor(int(v), dtype=torch.int64)


def _axis(x, ch_axis):
    return ch_axis + x.dim() if ch_axis < 0 else ch_axis


def _node(op_type, x, inputs, attrs=None):
    return torch.onnx.ops.symbolic(f"{_ts.DOMAIN}::{op_type}", [x, *inputs], attrs or {},
                                   dtype=x.dtype, shape=x.shape,
                                   version=_ts.CUSTOM_OPSETS[_ts.DOMAIN])


def _channel_attrs(axis):
    # MQBench's per-channel nodes carry no axis (it assumes 0); one is added only when needed.
    return {} if axis == 0 else {"ch_axis": axis}


class _Symbolic:
    """The ``torch.ops.mqbench`` ops a fake quantizer calls, as the nodes ``export_onnx`` writes
    in the "mqbench" format (``mqbench.onnx.dynamo``'s translations, node for node)."""

    @staticmethod
    def fake_quantize_per_tensor_affine(x, scale, zero_point, quant_min, quant_max):
        return _node("FixedPerTensorAffine", x,
                     [scale, zero_point, _int64(quant_min), _int64(quant_max)])

    @staticmethod
    def fake_quantize_per_channel_affine(x, scale, zero_point, ch_axis, quant_min, quant_max):
        return _node("FixedPerChannelAffine", x, [scale, zero_point, _int64(_axis(x, ch_axis)),
                                                  _int64(quant_min), _int64(quant_max)])

    @staticmethod
    def fake_quantize_learnable_per_tensor_affine(x, scale, zero_point, quant_min, quant_max,
                                                  grad_factor=1.0):
        return _node("LearnablePerTensorAffine", x,
                     [scale, zero_point, _int64(quant_min), _int64(quant_max)])

    @staticmethod
    def fake_quantize_learnable_per_channel_affine(x, scale, zero_point, ch_axis, quant_min,
                                                   quant_max, grad_factor=1.0):
        return _node("FakeQuantizeLearnablePerchannelAffine", x, [scale, zero_point],
                     {"quant_min": int(quant_min), "quant_max": int(quant_max),
                      **_channel_attrs(_axis(x, ch_axis))})

    @staticmethod
    def fake_quantize_pact(x, alpha, n_alpha, scale, zero_point, quant_min, quant_max):
        clipped = torch.minimum(torch.maximum(x, n_alpha.reshape(())), alpha.reshape(()))
        return _Symbolic.fake_quantize_per_tensor_affine(clipped, scale, zero_point, quant_min,
                                                         quant_max)

    @staticmethod
    def dorefa_normalize(x):
        t = torch.tanh(x)
        return t / (t.abs().max() + 1e-5)

    @staticmethod
    def fake_quantize_dsq_per_tensor(x, scale, zero_point, quant_min, quant_max, alpha):
        return _node("FakeQuantizeDSQPertensor", x, [scale, zero_point],
                     {"quant_min": int(quant_min), "quant_max": int(quant_max),
                      "alpha": float(alpha)})

    @staticmethod
    def fake_quantize_dsq_per_channel(x, scale, zero_point, ch_axis, quant_min, quant_max, alpha):
        return _node("FakeQuantizeDSQPerchannel", x, [scale, zero_point],
                     {"quant_min": int(quant_min), "quant_max": int(quant_max),
                      "alpha": float(alpha), **_channel_attrs(_axis(x, ch_axis))})

    @staticmethod
    def fake_quantize_tqt(x, scale, zero_point, quant_min, quant_max, mth):
        return _node("FakeQuantizeTqtAffine", x, [scale, zero_point],
                     {"quant_min": int(quant_min), "quant_max": int(quant_max)})

    @staticmethod
    def fake_quantize_nnie(x, data_max):
        return _node("NNIEQuantize", x, [data_max])

    @staticmethod
    def _adaround_hard(x, scale, alpha, axis):
        s = scale
        if axis is not None:
            shape = [1] * x.dim()
            shape[axis] = -1
            s = scale.reshape(shape)
        # deployed AdaRound weights are the hard-rounded ones: floor(x/s) + [alpha >= 0]
        return (torch.floor(x / s) + (alpha >= 0).to(x.dtype)) * s

    @staticmethod
    def fake_quantize_adaround_per_tensor(x, scale, zero_point, alpha, quant_min, quant_max,
                                          hard=False):
        hard_x = _Symbolic._adaround_hard(x, scale, alpha, None)
        return _Symbolic.fake_quantize_per_tensor_affine(hard_x, scale, zero_point, quant_min,
                                                         quant_max)

    @staticmethod
    def fake_quantize_adaround_per_channel(x, scale, zero_point, alpha, ch_axis, quant_min,
                                           quant_max, hard=False):
        axis = _axis(x, ch_axis)
        hard_x = _Symbolic._adaround_hard(x, scale, alpha, axis)
        return _Symbolic.fake_quantize_per_channel_affine(hard_x, scale, zero_point, axis,
                                                          quant_min, quant_max)

    @staticmethod
    def fake_quantize_qdrop_per_tensor(x, scale, zero_point, quant_min, quant_max, prob=1.0):
        # dropping is a training-time regularizer: the exported model always quantizes
        return _Symbolic.fake_quantize_learnable_per_tensor_affine(x, scale, zero_point,
                                                                   quant_min, quant_max)

    @staticmethod
    def fake_quantize_qdrop_per_channel(x, scale, zero_point, ch_axis, quant_min, quant_max,
                                        prob=1.0):
        return _Symbolic.fake_quantize_learnable_per_channel_affine(x, scale, zero_point, ch_axis,
                                                                    quant_min, quant_max)

    @staticmethod
    def pot_quantization(scale):
        return torch.pow(2.0, torch.round(torch.log2(scale)))

    @staticmethod
    def hadamard_transform(x, had=None, scale=1.0):
        return llm_ops.hadamard_dense(x, had, scale)

    @staticmethod
    def fake_quantize_per_token(x, quant_min, quant_max, symmetric, format="int"):
        return llm_ops.per_token_composite(x, quant_min, quant_max, symmetric, format)

    def __getattr__(self, name):  # an op with no export form here: say what to use
        raise RuntimeError(f"torch.ops.mqbench.{name} has no form for a plain torch.onnx.export; "
                           "export with mqbench.onnx.export_onnx")


#: The op namespace of a plain dynamo export (see the module docstring).
SYMBOLIC = _Symbolic()
