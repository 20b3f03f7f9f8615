"""ONNX export of the ``torch.ops.mqbench`` fake-quantize ops.

Importing :mod:`mqbench` registers a symbolic for every op (opset 11 and later), so
``torch.onnx.export`` turns each one into the node MQBench emits. Two formats exist:

* ``"mqbench"`` (default): MQBench's own fake-quantize nodes, with MQBench's op_type names,
  inputs and attributes (``FixedPerTensorAffine``, ``LearnablePerTensorAffine``,
  ``FixedPerChannelAffine``, ``FakeQuantizeLearnablePerchannelAffine``,
  ``FakeQuantizeDSQPertensor``/``Perchannel``, ``FakeQuantizeTqtAffine``, ``NNIEQuantize``).
  They carry the exact quantization range, so any bit width deploys. The nodes live in the
  ``mqbench`` domain (MQBench put them in the default domain, which ``onnx.checker`` rejects);
  our deploy passes accept both. Pass ``custom_opsets=CUSTOM_OPSETS`` to ``torch.onnx.export``.
* ``"qdq"``: standard ``QuantizeLinear``/``DequantizeLinear`` pairs (per-channel needs opset 13),
  runnable by any ONNX runtime. A range narrower than int8/uint8 adds an integer ``Clip``
  between the pair (opset 12 or later); ranges that fit neither type are refused.

Two exporters write these formats (:func:`export_onnx`'s ``dynamo`` argument):

* the TorchScript exporter (``dynamo=False``), through the symbolics registered here; opset 13
  by default. torch deprecates it and since 2.9 no longer picks it by default;
* the dynamo exporter (``dynamo=True``: ``torch.export``, then onnxscript), through the
  translations of :mod:`mqbench.onnx.dynamo` (needs the ``onnxscript`` package, imported only
  then); opset 18 by default, 18 or later. Same nodes, inputs and attributes; node and tensor
  names follow torch.export's graph (``node_Conv_0``-style names, docs/ops.md).

``dynamo=None`` (the default) takes the TorchScript exporter while torch has it, the dynamo one
after. convert_deploy, the tests, the examples and the benchmarks all export through
:func:`export_onnx`.

Example::

    import mqbench, torch
    from mqbench.onnx import export_format, export_onnx

    export_onnx(model, (x,), "model.onnx")                 # opset 13, MQBench's nodes
    with export_format("qdq"):
        export_onnx(model, (x,), "model_qdq.onnx")
    export_onnx(model, (x,), "model18.onnx", dynamo=True)  # opset 18, the same nodes
"""
import contextlib
import inspect
import math
import warnings

import torch

try:  # the TorchScript exporter, deprecated by torch; a torch without it exports with dynamo
    from torch.onnx import register_custom_op_symbolic, symbolic_helper
except ImportError:
    register_custom_op_symbolic = symbolic_helper = None

# The shared names live in the leaf module common (read by the dynamo translations too); MQBench's
# users import them from mqbench.custom_symbolic_opset, which re-exports this module.
from mqbench.onnx.common import (  # noqa: F401  (re-exported)
    CUSTOM_OPSETS, DEFAULT_OPSET, DOMAIN, DYNAMO_OPSET, FORMATS, MIN_OPSET, export_format,
    get_export_format, set_export_format)
from mqbench.onnx import common

_EXPORT_PARAMS = inspect.signature(torch.onnx.export).parameters
# torch.onnx.export grew `dynamo` in 2.5 (default False) and made True the default in 2.9;
# custom_translation_table, which our ops need, came in 2.6.
_EXPORT_HAS_DYNAMO = "dynamo" in _EXPORT_PARAMS
HAS_TORCHSCRIPT_EXPORTER = symbolic_helper is not None
HAS_DYNAMO_EXPORTER = "custom_translation_table" in _EXPORT_PARAMS


# ---- helpers ------------------------------------------------------------------------------

_ONNX_FLOAT = common.ONNX_FLOAT


def _const(g, value, dtype=torch.int64):
    return g.op("Constant", value_t=torch.tensor(value, dtype=dtype))


# torch's ONNX shape inference warns that our custom nodes have no shape inference of their
# own; _node gives each one x's type and shape (what every fake-quantize node outputs), so the
# warning says nothing for them. The filter matches our domain only.
warnings.filterwarnings("ignore", message=r"The shape inference of mqbench::", category=UserWarning)


def _node(g, op_type, x, *inputs, **attrs):
    out = g.op(f"{DOMAIN}::{op_type}", x, *inputs, **attrs)
    out.setType(x.type())
    return out


def _scalar(g, t):
    """Reshapes a one-element tensor to the 0-d tensor that ONNX per-tensor inputs want."""
    return g.op("Reshape", t, _const(g, [], torch.int64))


_qdq_dtype = common.qdq_dtype


def _qdq(g, x, scale, zero_point, qmin, qmax, axis, round_zero_point, what):
    """x -> QuantizeLinear -> [Clip] -> DequantizeLinear, saturating exactly to [qmin, qmax]."""
    onnx_dtype, torch_dtype, type_range = _qdq_dtype(qmin, qmax, what)
    if axis is not None and g.opset < 13:
        raise ValueError(f"{what}: per-channel QuantizeLinear needs opset 13 or later, "
                         f"export with opset_version=13 (got {g.opset})")
    narrow = (qmin, qmax) != type_range
    if narrow and g.opset < 12:
        raise ValueError(f"{what}: the range [{qmin}, {qmax}] needs an integer Clip between "
                         f"QuantizeLinear and DequantizeLinear, which needs opset 12 or later")
    s = g.op("Cast", scale, to_i=_ONNX_FLOAT)
    z = g.op("Cast", zero_point, to_i=_ONNX_FLOAT)
    if round_zero_point:
        z = g.op("Clip", g.op("Round", z), _const(g, float(qmin), torch.float32),
                 _const(g, float(qmax), torch.float32))
    z = g.op("Cast", z, to_i=onnx_dtype)
    attrs = {}
    if axis is None:
        s, z = _scalar(g, s), _scalar(g, z)
    else:
        attrs["axis_i"] = axis
    q = g.op("QuantizeLinear", x, s, z, **attrs)
    if narrow:
        q = g.op("Clip", q, _const(g, qmin, torch_dtype), _const(g, qmax, torch_dtype))
    out = g.op("DequantizeLinear", q, s, z, **attrs)
    out.setType(x.type())
    return out


def _axis(g, x, ch_axis):
    if ch_axis >= 0:
        return ch_axis
    rank = symbolic_helper._get_tensor_rank(x)
    if rank is None:
        raise ValueError(f"a negative ch_axis ({ch_axis}) needs the input's rank at export time")
    return ch_axis + rank


def _channel_attrs(axis):
    # MQBench's per-channel nodes carry no axis (it assumes 0); we add one only when needed.
    return {} if axis == 0 else {"ch_axis_i": axis}


def _qdq_mode():
    return get_export_format() == "qdq"


# ---- symbolics ------------------------------------------------------------------------------

# Without the TorchScript exporter the symbolics stay defined (SYMBOLICS names the ops that
# mqbench.onnx.dynamo translates) but nothing registers them.
_parse_args = symbolic_helper.parse_args if HAS_TORCHSCRIPT_EXPORTER else (lambda *kinds: (lambda fn: fn))

@_parse_args("v", "v", "v", "i", "i")
def fake_quantize_per_tensor_affine(g, x, scale, zero_point, qmin, qmax):
    if _qdq_mode():
        return _qdq(g, x, scale, zero_point, qmin, qmax, None, False, "fake_quantize_per_tensor_affine")
    return _node(g, "FixedPerTensorAffine", x, scale, zero_point, _const(g, qmin), _const(g, qmax))


@_parse_args("v", "v", "v", "i", "i", "i")
def fake_quantize_per_channel_affine(g, x, scale, zero_point, ch_axis, qmin, qmax):
    axis = _axis(g, x, ch_axis)
    if _qdq_mode():
        return _qdq(g, x, scale, zero_point, qmin, qmax, axis, False, "fake_quantize_per_channel_affine")
    return _node(g, "FixedPerChannelAffine", x, scale, zero_point, _const(g, axis),
                 _const(g, qmin), _const(g, qmax))


@_parse_args("v", "v", "v", "i", "i", "f")
def fake_quantize_learnable_per_tensor_affine(g, x, scale, zero_point, qmin, qmax, grad_factor):
    if _qdq_mode():
        return _qdq(g, x, scale, zero_point, qmin, qmax, None, True,
                    "fake_quantize_learnable_per_tensor_affine")
    return _node(g, "LearnablePerTensorAffine", x, scale, zero_point, _const(g, qmin), _const(g, qmax))


@_parse_args("v", "v", "v", "i", "i", "i", "f")
def fake_quantize_learnable_per_channel_affine(g, x, scale, zero_point, ch_axis, qmin, qmax, grad_factor):
    axis = _axis(g, x, ch_axis)
    if _qdq_mode():
        return _qdq(g, x, scale, zero_point, qmin, qmax, axis, True,
                    "fake_quantize_learnable_per_channel_affine")
    return _node(g, "FakeQuantizeLearnablePerchannelAffine", x, scale, zero_point,
                 quant_min_i=qmin, quant_max_i=qmax, **_channel_attrs(axis))


@_parse_args("v", "v", "v", "v", "v", "i", "i")
def fake_quantize_pact(g, x, alpha, n_alpha, scale, zero_point, qmin, qmax):
    clipped = g.op("Clip", x, _scalar(g, n_alpha), _scalar(g, alpha))
    return fake_quantize_per_tensor_affine(g, clipped, scale, zero_point, qmin, qmax)


@_parse_args("v")
def dorefa_normalize(g, x):
    t = g.op("Tanh", x)
    m = g.op("ReduceMax", g.op("Abs", t), keepdims_i=0)
    return g.op("Div", t, g.op("Add", m, _const(g, 1e-5, torch.float32)))


@_parse_args("v", "v", "v", "i", "i", "f")
def fake_quantize_dsq_per_tensor(g, x, scale, zero_point, qmin, qmax, alpha):
    if _qdq_mode():  # deployed hardware quantizes hard: the affine form
        return _qdq(g, x, scale, zero_point, qmin, qmax, None, False, "fake_quantize_dsq_per_tensor")
    return _node(g, "FakeQuantizeDSQPertensor", x, scale, zero_point,
                 quant_min_i=qmin, quant_max_i=qmax, alpha_f=alpha)


@_parse_args("v", "v", "v", "i", "i", "i", "f")
def fake_quantize_dsq_per_channel(g, x, scale, zero_point, ch_axis, qmin, qmax, alpha):
    axis = _axis(g, x, ch_axis)
    if _qdq_mode():
        return _qdq(g, x, scale, zero_point, qmin, qmax, axis, False, "fake_quantize_dsq_per_channel")
    return _node(g, "FakeQuantizeDSQPerchannel", x, scale, zero_point,
                 quant_min_i=qmin, quant_max_i=qmax, alpha_f=alpha, **_channel_attrs(axis))


@_parse_args("v", "v", "v", "i", "i", "i")
def fake_quantize_tqt(g, x, scale, zero_point, qmin, qmax, mth):
    if _qdq_mode():
        # The power-of-two step s' = 2^-floor(log2(1/s)), computed in the graph.
        s = g.op("Cast", scale, to_i=_ONNX_FLOAT)
        e = g.op("Floor", g.op("Div", g.op("Log", g.op("Reciprocal", s)),
                               _const(g, math.log(2.0), torch.float32)))
        step = g.op("Pow", _const(g, 2.0, torch.float32), g.op("Neg", e))
        return _qdq(g, x, step, zero_point, qmin, qmax, None, False, "fake_quantize_tqt")
    return _node(g, "FakeQuantizeTqtAffine", x, scale, zero_point, quant_min_i=qmin, quant_max_i=qmax)


@_parse_args("v", "v")
def fake_quantize_nnie(g, x, data_max):
    if _qdq_mode():
        raise ValueError("fake_quantize_nnie: NNIE's logarithmic quantization has no "
                         "QuantizeLinear form; export it with the 'mqbench' format")
    return _node(g, "NNIEQuantize", x, data_max)


def _adaround(g, x, scale, zero_point, alpha, axis, qmin, qmax):
    # Deployed AdaRound weights are the hard-rounded ones: v = floor(x/s) + [alpha >= 0], then
    # the fixed quantizer of v*s, which MQBench's deploy passes already understand.
    s = scale
    if axis is not None:
        rank = symbolic_helper._get_tensor_rank(x)
        shape = [1] * rank
        shape[axis] = -1
        s = g.op("Reshape", scale, _const(g, shape))
    up = g.op("Cast", g.op("Not", g.op("Less", alpha, _const(g, 0.0, torch.float32))), to_i=_ONNX_FLOAT)
    hard = g.op("Mul", g.op("Add", g.op("Floor", g.op("Div", x, s)), up), s)
    if axis is None:
        return fake_quantize_per_tensor_affine(g, hard, scale, zero_point, qmin, qmax)
    return fake_quantize_per_channel_affine(g, hard, scale, zero_point, axis, qmin, qmax)


@_parse_args("v", "v", "v", "v", "i", "i", "b")
def fake_quantize_adaround_per_tensor(g, x, scale, zero_point, alpha, qmin, qmax, hard):
    return _adaround(g, x, scale, zero_point, alpha, None, qmin, qmax)


@_parse_args("v", "v", "v", "v", "i", "i", "i", "b")
def fake_quantize_adaround_per_channel(g, x, scale, zero_point, alpha, ch_axis, qmin, qmax, hard):
    return _adaround(g, x, scale, zero_point, alpha, _axis(g, x, ch_axis), qmin, qmax)


@_parse_args("v", "v", "v", "i", "i", "f")
def fake_quantize_qdrop_per_tensor(g, x, scale, zero_point, qmin, qmax, prob):
    # Dropping is a training-time regularizer: the exported model always quantizes.
    return fake_quantize_learnable_per_tensor_affine(g, x, scale, zero_point, qmin, qmax, 1.0)


@_parse_args("v", "v", "v", "i", "i", "i", "f")
def fake_quantize_qdrop_per_channel(g, x, scale, zero_point, ch_axis, qmin, qmax, prob):
    return fake_quantize_learnable_per_channel_affine(g, x, scale, zero_point, ch_axis, qmin, qmax, 1.0)


@_parse_args("v")
def pot_quantization(g, scale):
    log2 = g.op("Div", g.op("Log", scale), _const(g, math.log(2.0), torch.float32))
    return g.op("Pow", _const(g, 2.0, torch.float32), g.op("Round", log2))


SYMBOLICS = {name: globals()[name] for name in common.EXPORTED_OPS}


def _register():
    if not HAS_TORCHSCRIPT_EXPORTER:
        return
    for name, fn in SYMBOLICS.items():
        register_custom_op_symbolic(f"mqbench::{name}", fn, MIN_OPSET)


_register()


def use_dynamo(dynamo=None):
    """Which exporter :func:`export_onnx` runs for ``dynamo``: True for the dynamo exporter.

    None picks the TorchScript exporter while torch has it, the dynamo exporter after. Asking for
    one this torch lacks raises ValueError."""
    if dynamo is None:
        return not HAS_TORCHSCRIPT_EXPORTER
    if not isinstance(dynamo, bool):
        raise TypeError(f"dynamo must be True, False or None, got {dynamo!r}")
    if dynamo and not HAS_DYNAMO_EXPORTER:
        raise ValueError(f"torch {torch.__version__} has no dynamo ONNX exporter with "
                         f"custom_translation_table (torch >= 2.6): export with dynamo=False")
    if not dynamo and not HAS_TORCHSCRIPT_EXPORTER:
        raise ValueError(f"torch {torch.__version__} no longer has the TorchScript ONNX exporter: "
                         f"export with dynamo=True (or None)")
    return dynamo


@contextlib.contextmanager
def _no_attention_fastpath():
    """nn.MultiheadAttention's eval-mode fast path (``aten::_native_multi_head_attention``) has
    no ONNX export; off it, attention is ``scaled_dot_product_attention`` (opset 14+)."""
    mha = getattr(torch.backends, "mha", None)
    if mha is None or not hasattr(mha, "set_fastpath_enabled"):
        yield
        return
    was = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(was)


def has_attention(model):
    """True when ``model`` contains an nn.MultiheadAttention (its export needs opset 14)."""
    return any(isinstance(m, torch.nn.MultiheadAttention) for m in model.modules())


def export_onnx(model, args, f, opset_version=None, dynamo=None, **kwargs):
    """``torch.onnx.export`` with our ops' ONNX export, through either of torch's exporters.

    Every export of a model with fake-quantize ops goes through here (convert_deploy, tests,
    examples, benchmarks). Both exporters write the nodes of the current format
    (:func:`export_format`) with the same inputs and attributes; they differ in opset and in
    node and tensor names (docs/ops.md, "ONNX export").

    * ``dynamo=False``: the TorchScript exporter, which our symbolics extend; opset 13 by
      default (11 or later). ``custom_opsets=CUSTOM_OPSETS`` in the ``"mqbench"`` format unless
      given; torch's notice that this exporter is the legacy one and its tracer warnings are
      silenced.
    * ``dynamo=True``: ``torch.export`` then the dynamo exporter with the onnxscript
      translations of :mod:`mqbench.onnx.dynamo` (needs ``onnxscript``); opset 18 by default
      (18 or later). ``f`` gets one self-contained file (``external_data=False`` unless given).
      ``do_constant_folding`` (default True) folds every constant subgraph, as TorchScript's
      does, and nothing else is rewritten: torch's optimizer (folding up to 8192 values, then
      onnxscript's rewrites: a zero bias dropped, Pad and BatchNormalization folded into Conv)
      runs only when ``optimize=True`` is given. A ``custom_opsets`` equal to
      ``CUSTOM_OPSETS`` is dropped; ``dynamic_axes`` of inputs become
      ``dynamic_shapes`` with the same dim names (or give ``dynamic_shapes``); a
      ``custom_translation_table`` is merged over ours. The ValueErrors of our translations (a range with no QDQ form, ...)
      come out unwrapped, as with the symbolics.
    * ``dynamo=None`` (default): the TorchScript exporter while torch has it, dynamo after.

    Args:
        model: the ``nn.Module`` to export.
        args: tuple of example inputs.
        f: a path or a binary file object (``io.BytesIO``).
        opset_version: ONNX opset; None for the exporter's default above.
        dynamo: which exporter (above).
        **kwargs: any other ``torch.onnx.export`` argument (input_names, dynamic_axes, ...).

    Returns what ``torch.onnx.export`` returns: None (TorchScript) or an ``ONNXProgram``.

    Example::

        export_onnx(model, (x,), "fq.onnx")                  # TorchScript, opset 13
        export_onnx(model, (x,), "fq18.onnx", dynamo=True)   # dynamo, opset 18
    """
    if use_dynamo(dynamo):
        from mqbench.onnx import dynamo  # imports onnxscript
        from mqbench.onnx.plain_export import own_export

        with own_export():  # our translations, not the plain export's symbolic nodes
            return dynamo.export(model, args, f, opset_version, **kwargs)
    opset_version = DEFAULT_OPSET if opset_version is None else opset_version
    kwargs.setdefault("custom_opsets", CUSTOM_OPSETS if get_export_format() == "mqbench" else None)
    if _EXPORT_HAS_DYNAMO:
        kwargs["dynamo"] = False
    with warnings.catch_warnings(), _no_attention_fastpath():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.onnx")
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export",
                                category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        return torch.onnx.export(model, args, f, opset_version=opset_version, **kwargs)
