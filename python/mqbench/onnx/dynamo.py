"""onnxscript translations of the ``torch.ops.mqbench`` ops for torch's dynamo ONNX exporter.

``torch.onnx.export(..., dynamo=True)`` traces the model with ``torch.export`` (our ops have fake
kernels, ``_fake_kernels.py``) and turns each ``torch.ops.mqbench.<op>.default`` node into ONNX
with the function that :func:`translation_table` maps it to. Each translation writes the nodes
that the TorchScript symbolic of the same op writes (``mqbench.onnx.symbolic.SYMBOLICS``): in the
``"mqbench"`` format MQBench's custom nodes (domain ``mqbench``, version 1, same op_type names,
inputs and attributes), in the ``"qdq"`` format QuantizeLinear / [integer Clip] /
DequantizeLinear, with the same refusals and messages. The numerics are the symbolics': the
same ONNX ops in the same order.

The custom nodes need ONNX schemas for onnxscript to build them; :func:`_schemas` declares them
here (inputs, attribute names and types) and hands them to ``onnxscript.values.Op`` directly,
without adding them to onnx's global schema registry (which would change what ``onnx.checker``
and shape inference do for every other model in the process).

onnxscript is imported when a dynamo export is asked for, not by ``import mqbench``: this module
is imported lazily by :func:`mqbench.onnx.export_onnx`. Use it through that
function; :func:`translation_table` is the part a caller of ``torch.onnx.export`` itself needs::

    from mqbench.onnx.dynamo import translation_table
    torch.onnx.export(model, (x,), dynamo=True, opset_version=18,
                      custom_translation_table=translation_table("mqbench"))

Differences from the TorchScript export that the translations cannot remove (the deploy passes
accept both, docs/ops.md lists them): the exporter names nodes ``node_<fx name>`` and tensors
after the fx nodes, writes constants (quant_min, the Reshape shapes, ...) as initializers that
equal constants share, and folds the Cast / Reshape chains in front of QuantizeLinear into
initializers.
"""
import functools
import math
import os
import tempfile

try:
    import onnxscript
except ImportError as e:  # raised again, with what to do, when a dynamo export is asked for
    onnxscript = None
    _IMPORT_ERROR = e
else:
    import onnx
    from onnxscript import ir
    from onnxscript import opset18 as op
    from onnxscript.values import Op, Opset

    _IMPORT_ERROR = None

import torch

from mqbench.onnx import common as _fmt

__all__ = ["DEFAULT_OPSET", "MIN_OPSET", "export", "require_onnxscript", "translation_error", "translation_table"]

#: torch's ONNX functions (torchlib) are written for opset 18; the dynamo exporter converts to
#: older opsets with onnx's version converter, which does not know our domain, so we refuse them.
#: 18 is also our default (torch 2.14's own is 20: the deploy passes read both).
MIN_OPSET = 18
DEFAULT_OPSET = 18


def require_onnxscript():
    """Raises ImportError saying what to install when onnxscript is missing."""
    if onnxscript is None:
        raise ImportError(
            "the dynamo ONNX exporter (export_onnx(..., dynamo=True)) needs the onnxscript "
            "package: pip install onnxscript (requirements-dev.txt pins the tested version), or "
            f"export with dynamo=False. The import failed with: {_IMPORT_ERROR}") from _IMPORT_ERROR


# ---- schemas of MQBench's nodes -------------------------------------------------------------

# name: (inputs after x, attributes as (name, type, required)). An input called "int" is one of
# the int64 constants (quant_min, quant_max, ch_axis) that MQBench passes as inputs.
_INT, _FLOAT, _INTS = "int", "float", "ints"
_CUSTOM_NODES = {
    "FixedPerTensorAffine": (["scale", "zero_point", "quant_min", "quant_max"], []),
    "LearnablePerTensorAffine": (["scale", "zero_point", "quant_min", "quant_max"], []),
    "FixedPerChannelAffine": (["scale", "zero_point", "ch_axis", "quant_min", "quant_max"], []),
    "FakeQuantizeLearnablePerchannelAffine": (
        ["scale", "zero_point"],
        [("quant_min", _INT, True), ("quant_max", _INT, True), ("ch_axis", _INT, False)]),
    "FakeQuantizeDSQPertensor": (
        ["scale", "zero_point"],
        [("quant_min", _INT, True), ("quant_max", _INT, True), ("alpha", _FLOAT, True)]),
    "FakeQuantizeDSQPerchannel": (
        ["scale", "zero_point"],
        [("quant_min", _INT, True), ("quant_max", _INT, True), ("alpha", _FLOAT, True),
         ("ch_axis", _INT, False)]),
    "FakeQuantizeTqtAffine": (["scale", "zero_point"],
                              [("quant_min", _INT, True), ("quant_max", _INT, True)]),
    "NNIEQuantize": (["data_max"], []),
    # the block-scaled formats' deploy nodes (python/mqbench/onnx/mx.py: DEPLOY_NODES)
    **{name: (inputs, [("block_size", _INT, True), ("axis", _INT, True),
                       ("blocked_shape", _INTS, True)])
       for name, inputs in (("FakeQuantizeMXFP8", []), ("FakeQuantizeMXFP4", []),
                            ("FakeQuantizeNVFP4", ["global_amax"]))},
}

_FLOATS = ["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"]
_NUMBERS = _FLOATS + ["tensor(int32)", "tensor(int64)", "tensor(int8)", "tensor(uint8)"]


@functools.lru_cache(maxsize=None)
def _schemas():
    """{op_type: onnxscript Op} of MQBench's nodes in domain ``mqbench`` version 1."""
    defs = onnx.defs
    param = defs.OpSchema.FormalParameter
    attr_type = {_INT: defs.OpSchema.AttrType.INT, _FLOAT: defs.OpSchema.AttrType.FLOAT,
                 _INTS: defs.OpSchema.AttrType.INTS}
    domain = Opset(_fmt.DOMAIN, _fmt.CUSTOM_OPSETS[_fmt.DOMAIN])
    out = {}
    for name, (inputs, attributes) in _CUSTOM_NODES.items():
        formal = [param("x", "T")]
        constraints = [("T", _FLOATS, "the tensor fake-quantized and the output")]
        for k, input_name in enumerate(inputs):
            if input_name in ("quant_min", "quant_max", "ch_axis"):
                formal.append(param(input_name, "tensor(int64)"))
            else:  # scale, zero point, data_max: any number type, each its own
                formal.append(param(input_name, f"T{k}"))
                constraints.append((f"T{k}", _NUMBERS, input_name))
        schema = defs.OpSchema(
            name, _fmt.DOMAIN, domain.version,
            doc=f"MQBench's {name} fake-quantize node (docs/ops.md).",
            inputs=formal, outputs=[param("y", "T")], type_constraints=constraints,
            attributes=[defs.OpSchema.Attribute(a, attr_type[t], required=req)
                        for a, t, req in attributes])
        out[name] = Op(domain, name, schema)
    return out


def _node(op_type, x, *inputs, **attrs):
    return _schemas()[op_type](x, *inputs, **attrs)


# ---- helpers (the TorchScript symbolics' helpers, in onnxscript) ----------------------------

def _int64(v):
    return op.Constant(value_int=v)


# Note [No default attributes]: torch's graph builder writes every attribute the schema gives a
# default for (QuantizeLinear's axis=1, Reshape's allowzero=0, ReduceMax's
# noop_with_empty_axes=0) unless the call passes it as None. The symbolics write none of them,
# and a per-tensor QuantizeLinear with an axis reads as per-channel to some tools, so every call
# below whose schema has defaults passes them as None.

def _scalar(t):
    """Reshapes a one-element tensor to the 0-d tensor that ONNX per-tensor inputs want."""
    return op.Reshape(t, op.Constant(value=ir.tensor([], dtype=ir.DataType.INT64)),
                      allowzero=None)


def _rank(x):
    shape = getattr(x, "shape", None)
    return None if shape is None else len(shape)


def _axis(x, ch_axis):
    if ch_axis >= 0:
        return ch_axis
    rank = _rank(x)
    if rank is None:
        raise ValueError(f"a negative ch_axis ({ch_axis}) needs the input's rank at export time")
    return ch_axis + rank


def _channel_attrs(axis):
    # MQBench's per-channel nodes carry no axis (it assumes 0); we add one only when needed.
    return {} if axis == 0 else {"ch_axis": axis}


_ONNX_TYPES = {_fmt.ONNX_UINT8: "UINT8", _fmt.ONNX_INT8: "INT8"}


def _typed_constant(value, onnx_type):
    dtype = getattr(ir.DataType, _ONNX_TYPES[onnx_type])
    return op.Constant(value=ir.tensor(value, dtype=dtype))


def _qdq(x, scale, zero_point, qmin, qmax, axis, round_zero_point, what):
    """x -> QuantizeLinear -> [Clip] -> DequantizeLinear, saturating exactly to [qmin, qmax];
    the same nodes as the TorchScript symbolic's ``_qdq`` (opset >= 18: no opset refusals)."""
    onnx_dtype, _, type_range = _fmt.qdq_dtype(qmin, qmax, what)
    narrow = (qmin, qmax) != type_range
    s = op.Cast(scale, to=_fmt.ONNX_FLOAT)
    z = op.Cast(zero_point, to=_fmt.ONNX_FLOAT)
    if round_zero_point:
        z = op.Clip(op.Round(z), op.Constant(value_float=float(qmin)),
                    op.Constant(value_float=float(qmax)))
    z = op.Cast(z, to=onnx_dtype)
    attrs = {"axis": axis}  # None: no attribute (Note [No default attributes])
    if axis is None:
        s, z = _scalar(s), _scalar(z)
    q = op.QuantizeLinear(x, s, z, **attrs)
    if narrow:
        q = op.Clip(q, _typed_constant(qmin, onnx_dtype), _typed_constant(qmax, onnx_dtype))
    return op.DequantizeLinear(q, s, z, **attrs)


# ---- translations, one per op of symbolic.SYMBOLICS ----------------------------
# Each takes the op's schema arguments (tensors as onnxscript values, ints and floats as Python
# numbers) and the export format, bound by translation_table.

def fake_quantize_per_tensor_affine(fmt, x, scale, zero_point, quant_min, quant_max):
    if fmt == "qdq":
        return _qdq(x, scale, zero_point, quant_min, quant_max, None, False,
                    "fake_quantize_per_tensor_affine")
    return _node("FixedPerTensorAffine", x, scale, zero_point, _int64(quant_min),
                 _int64(quant_max))


def fake_quantize_per_channel_affine(fmt, x, scale, zero_point, ch_axis, quant_min, quant_max):
    axis = _axis(x, ch_axis)
    if fmt == "qdq":
        return _qdq(x, scale, zero_point, quant_min, quant_max, axis, False,
                    "fake_quantize_per_channel_affine")
    return _node("FixedPerChannelAffine", x, scale, zero_point, _int64(axis), _int64(quant_min),
                 _int64(quant_max))


def fake_quantize_learnable_per_tensor_affine(fmt, x, scale, zero_point, quant_min, quant_max,
                                              grad_factor=1.0):
    if fmt == "qdq":
        return _qdq(x, scale, zero_point, quant_min, quant_max, None, True,
                    "fake_quantize_learnable_per_tensor_affine")
    return _node("LearnablePerTensorAffine", x, scale, zero_point, _int64(quant_min),
                 _int64(quant_max))


def fake_quantize_learnable_per_channel_affine(fmt, x, scale, zero_point, ch_axis, quant_min,
                                               quant_max, grad_factor=1.0):
    axis = _axis(x, ch_axis)
    if fmt == "qdq":
        return _qdq(x, scale, zero_point, quant_min, quant_max, axis, True,
                    "fake_quantize_learnable_per_channel_affine")
    return _node("FakeQuantizeLearnablePerchannelAffine", x, scale, zero_point,
                 quant_min=quant_min, quant_max=quant_max, **_channel_attrs(axis))


def fake_quantize_pact(fmt, x, alpha, n_alpha, scale, zero_point, quant_min, quant_max):
    clipped = op.Clip(x, _scalar(n_alpha), _scalar(alpha))
    return fake_quantize_per_tensor_affine(fmt, clipped, scale, zero_point, quant_min, quant_max)


def dorefa_normalize(fmt, x):
    t = op.Tanh(x)
    m = op.ReduceMax(op.Abs(t), keepdims=0, noop_with_empty_axes=None)
    return op.Div(t, op.Add(m, op.Constant(value_float=1e-5)))


def fake_quantize_dsq_per_tensor(fmt, x, scale, zero_point, quant_min, quant_max, alpha):
    if fmt == "qdq":  # deployed hardware quantizes hard: the affine form
        return _qdq(x, scale, zero_point, quant_min, quant_max, None, False,
                    "fake_quantize_dsq_per_tensor")
    return _node("FakeQuantizeDSQPertensor", x, scale, zero_point, quant_min=quant_min,
                 quant_max=quant_max, alpha=alpha)


def fake_quantize_dsq_per_channel(fmt, x, scale, zero_point, ch_axis, quant_min, quant_max, alpha):
    axis = _axis(x, ch_axis)
    if fmt == "qdq":
        return _qdq(x, scale, zero_point, quant_min, quant_max, axis, False,
                    "fake_quantize_dsq_per_channel")
    return _node("FakeQuantizeDSQPerchannel", x, scale, zero_point, quant_min=quant_min,
                 quant_max=quant_max, alpha=alpha, **_channel_attrs(axis))


def fake_quantize_tqt(fmt, x, scale, zero_point, quant_min, quant_max, mth):
    if fmt == "qdq":
        # The power-of-two step s' = 2^-floor(log2(1/s)), computed in the graph.
        s = op.Cast(scale, to=_fmt.ONNX_FLOAT)
        e = op.Floor(op.Div(op.Log(op.Reciprocal(s)), op.Constant(value_float=math.log(2.0))))
        step = op.Pow(op.Constant(value_float=2.0), op.Neg(e))
        return _qdq(x, step, zero_point, quant_min, quant_max, None, False, "fake_quantize_tqt")
    return _node("FakeQuantizeTqtAffine", x, scale, zero_point, quant_min=quant_min,
                 quant_max=quant_max)


def fake_quantize_nnie(fmt, x, data_max):
    if fmt == "qdq":
        raise ValueError("fake_quantize_nnie: NNIE's logarithmic quantization has no "
                         "QuantizeLinear form; export it with the 'mqbench' format")
    return _node("NNIEQuantize", x, data_max)


def _adaround(fmt, x, scale, zero_point, alpha, axis, quant_min, quant_max):
    # Deployed AdaRound weights are the hard-rounded ones: v = floor(x/s) + [alpha >= 0], then
    # the fixed quantizer of v*s, which MQBench's deploy passes already understand.
    s = scale
    if axis is not None:
        rank = _rank(x)
        if rank is None:
            raise ValueError("fake_quantize_adaround_per_channel needs the input's rank at "
                             "export time")
        shape = [1] * rank
        shape[axis] = -1
        s = op.Reshape(scale, op.Constant(value_ints=shape), allowzero=None)
    up = op.Cast(op.Not(op.Less(alpha, op.Constant(value_float=0.0))), to=_fmt.ONNX_FLOAT)
    hard = op.Mul(op.Add(op.Floor(op.Div(x, s)), up), s)
    if axis is None:
        return fake_quantize_per_tensor_affine(fmt, hard, scale, zero_point, quant_min, quant_max)
    return fake_quantize_per_channel_affine(fmt, hard, scale, zero_point, axis, quant_min,
                                            quant_max)


def fake_quantize_adaround_per_tensor(fmt, x, scale, zero_point, alpha, quant_min, quant_max,
                                      hard=False):
    return _adaround(fmt, x, scale, zero_point, alpha, None, quant_min, quant_max)


def fake_quantize_adaround_per_channel(fmt, x, scale, zero_point, alpha, ch_axis, quant_min,
                                       quant_max, hard=False):
    return _adaround(fmt, x, scale, zero_point, alpha, _axis(x, ch_axis), quant_min, quant_max)


def fake_quantize_qdrop_per_tensor(fmt, x, scale, zero_point, quant_min, quant_max, prob=1.0):
    # Dropping is a training-time regularizer: the exported model always quantizes.
    return fake_quantize_learnable_per_tensor_affine(fmt, x, scale, zero_point, quant_min,
                                                     quant_max)


def fake_quantize_qdrop_per_channel(fmt, x, scale, zero_point, ch_axis, quant_min, quant_max,
                                    prob=1.0):
    return fake_quantize_learnable_per_channel_affine(fmt, x, scale, zero_point, ch_axis,
                                                      quant_min, quant_max)


def pot_quantization(fmt, scale):
    log2 = op.Div(op.Log(scale), op.Constant(value_float=math.log(2.0)))
    return op.Pow(op.Constant(value_float=2.0), op.Round(log2))


# FP8 and group-wise (docs/formats.md): standard nodes in both formats, as the TorchScript
# symbolics of python/mqbench/onnx/formats.py: QuantizeLinear with a float8 zero point (E4M3FN
# saturate=1, E5M2 saturate=0, opset 19), blocked Q/DQ (opset 21). The group-wise ops are
# CompositeImplicitAutograd: torch.export keeps them in its graph, and the exporter decomposes
# only ops that have no translation here, so these reach it whole.
_FP8_SATURATE = {"fp8_e4m3": ("FLOAT8E4M3FN", 1), "e4m3": ("FLOAT8E4M3FN", 1),
                 "fp8_e5m2": ("FLOAT8E5M2", 0), "e5m2": ("FLOAT8E5M2", 0)}
_export_opset = [DEFAULT_OPSET]


def _fp8(x, scale, ch_axis, dtype, what):
    if _export_opset[0] < 19:
        raise ValueError(f"{what}: QuantizeLinear with a float8 output needs ONNX opset 19 or "
                         f"later; export with opset_version=19 (got {_export_opset[0]})")
    if dtype not in _FP8_SATURATE:
        raise ValueError(f"{what}: dtype must be 'fp8_e4m3' or 'fp8_e5m2', got {dtype!r}")
    from onnxscript import opset19 as op19
    import numpy as np
    type_name, saturate = _FP8_SATURATE[dtype]
    axis = None if ch_axis is None else _axis(x, ch_axis)
    s = op.Cast(scale, to=_fmt.ONNX_FLOAT)
    # float8 zero is the byte 0 in both formats
    if axis is None:
        s = _scalar(s)
        zeros = np.zeros((), dtype=np.uint8)
    else:
        zeros = np.zeros((x.shape[axis],), dtype=np.uint8)
    z = op.Constant(value=ir.tensor(zeros, dtype=getattr(ir.DataType, type_name)))
    q = op19.QuantizeLinear(x, s, z, axis=axis, saturate=saturate)
    return op19.DequantizeLinear(q, s, z, axis=axis)


def fake_quantize_fp8(fmt, x, scale, ch_axis, dtype):
    return _fp8(x, scale, ch_axis, dtype, "fake_quantize_fp8")


def fake_quantize_learnable_fp8(fmt, x, scale, ch_axis, dtype, grad_factor=1.0):
    return _fp8(x, scale, ch_axis, dtype, "fake_quantize_learnable_fp8")


def _group(x, scale, zero_point, axis, group_size, qmin, qmax, round_zero_point, what):
    from mqbench.onnx.formats import BLOCK_OPSET
    if _export_opset[0] < BLOCK_OPSET:
        raise ValueError(f"{what}: blocked QuantizeLinear (block_size) needs ONNX opset "
                         f"{BLOCK_OPSET} or later; export with opset_version={BLOCK_OPSET} (got "
                         f"{_export_opset[0]})")
    from onnxscript import opset21 as op21
    onnx_dtype, _, type_range = _fmt.qdq_dtype(qmin, qmax, what)
    axis = _axis(x, axis)
    shape = list(getattr(x, "shape", None) or ())
    if axis >= len(shape) or not isinstance(shape[axis], int) or \
            not all(isinstance(d, int) for d in shape[axis:]):
        raise ValueError(f"{what}: blocked Q/DQ needs static sizes from the grouped axis on "
                         f"(got {shape})")
    shape = [d if isinstance(d, int) else 0 for d in shape]  # 0: Reshape keeps that size
    shape[axis] //= group_size
    target = op.Constant(value=ir.tensor(shape, dtype=ir.DataType.INT64))
    s = op.Reshape(op.Cast(scale, to=_fmt.ONNX_FLOAT), target, allowzero=None)
    z = op.Reshape(op.Cast(zero_point, to=_fmt.ONNX_FLOAT), target, allowzero=None)
    if round_zero_point:
        z = op.Clip(op.Round(z), op.Constant(value_float=float(qmin)),
                    op.Constant(value_float=float(qmax)))
    z = op.Cast(z, to=onnx_dtype)
    q = op21.QuantizeLinear(x, s, z, axis=axis, block_size=group_size, output_dtype=None,
                            saturate=None)
    if (qmin, qmax) != type_range:
        q = op.Clip(q, _typed_constant(qmin, onnx_dtype), _typed_constant(qmax, onnx_dtype))
    return op21.DequantizeLinear(q, s, z, axis=axis, block_size=group_size)


def fake_quantize_per_group_affine(fmt, x, scale, zero_point, axis, group_size, quant_min,
                                   quant_max):
    return _group(x, scale, zero_point, axis, group_size, quant_min, quant_max, False,
                  "fake_quantize_per_group_affine")


def fake_quantize_learnable_per_group_affine(fmt, x, scale, zero_point, axis, group_size,
                                             quant_min, quant_max, grad_factor=1.0):
    return _group(x, scale, zero_point, axis, group_size, quant_min, quant_max, True,
                  "fake_quantize_learnable_per_group_affine")


TRANSLATIONS = {name: globals()[name] for name in _fmt.EXPORTED_OPS + (
    "fake_quantize_fp8", "fake_quantize_learnable_fp8", "fake_quantize_per_group_affine",
    "fake_quantize_learnable_per_group_affine")}


def translation_table(fmt=None):
    """``{torch.ops.mqbench.<op>.default: translation}`` for ``custom_translation_table``.

    Args:
        fmt: ``"mqbench"`` or ``"qdq"`` (see :mod:`mqbench.onnx.common`); the current export
            format (``get_export_format()``) when None.
    """
    require_onnxscript()
    fmt = _fmt.get_export_format() if fmt is None else fmt
    if fmt not in _fmt.FORMATS:
        raise ValueError(f"unknown ONNX export format {fmt!r}; choose one of {list(_fmt.FORMATS)}")
    from mqbench.onnx import llm_ops  # hadamard_transform, fake_quantize_per_token
    from mqbench.onnx import mx as mx_export  # the block-scaled formats
    mx = mx_export.DYNAMO_TRANSLATIONS if fmt == "qdq" else _mx_deploy_translations(mx_export)
    table = dict(TRANSLATIONS, **mx, **llm_ops.dynamo_translations(lambda: _export_opset[0]))
    return {getattr(torch.ops.mqbench, name).default: _bind(fn, fmt)
            for name, fn in table.items()}


def _mx_deploy_translations(mx_export):
    """The block-scaled ops in the "mqbench" format: one deploy node each (mx_export.DEPLOY_NODES,
    with the attributes mx_export.deploy_node_attrs computes), as their TorchScript symbolics."""
    def mx(fmt_, x, elem_dtype, block_size=32, axis=-1):
        mx_export.refuse_mxfp6(elem_dtype, "fake_quantize_mx")
        return _node(mx_export.DEPLOY_NODES[elem_dtype], x,
                     **mx_export.deploy_node_attrs(x, block_size, axis, "fake_quantize_mx"))

    def nvfp4(fmt_, x, global_amax, block_size=16, axis=-1):
        return _node(mx_export.DEPLOY_NODES["nvfp4"], x, global_amax,
                     **mx_export.deploy_node_attrs(x, block_size, axis, "fake_quantize_nvfp4"))

    return {"fake_quantize_mx": mx, "fake_quantize_nvfp4": nvfp4}


def _bind(fn, fmt):
    def translation(*args, **kwargs):
        try:
            return fn(fmt, *args, **kwargs)
        except ValueError as e:  # a refusal (e.g. no QDQ form): export_onnx raises it as is
            e.mqbench_translation_error = True
            raise

    translation.__name__ = translation.__qualname__ = f"{fn.__name__}_{fmt}"
    translation.__doc__ = fn.__doc__
    return translation


def translation_error(exc):
    """The ValueError one of our translations raised, when torch's exporter wrapped it in its
    own errors (``exc`` or one of its causes), else None. The TorchScript exporter lets the
    symbolics' errors through unchanged; with this, export_onnx does the same."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if getattr(exc, "mqbench_translation_error", False):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


# ---- export ---------------------------------------------------------------------------------

def export(model, args, f, opset_version=None, **kwargs):
    """``torch.onnx.export(..., dynamo=True)`` with our translations; the dynamo half of
    :func:`mqbench.onnx.export_onnx` (see it for the arguments).

    Writes ``f`` (a path or a binary file object) as one self-contained file: the weights stay
    inside the model (torch's default, ``external_data=True``, would put them in a second file
    beside it, which the deploy passes do not read), unless the model is over protobuf's 2 GB,
    which only a path can take. Returns torch's ``ONNXProgram``.
    """
    require_onnxscript()
    opset_version = DEFAULT_OPSET if opset_version is None else opset_version
    if opset_version < MIN_OPSET:
        raise ValueError(
            f"the dynamo ONNX exporter writes opset {MIN_OPSET} or later (got opset_version="
            f"{opset_version}): torch converts older opsets with onnx's version converter, "
            f"which does not know the mqbench domain. Export with opset_version >= "
            f"{MIN_OPSET}, or with dynamo=False for opset {_fmt.DEFAULT_OPSET}")
    # Note [Constant folding]: torch's own optimizer (optimize=True) folds constant subgraphs
    # whose inputs hold at most 8192 values and then applies onnxscript's rewrite rules. The
    # TorchScript exporter's do_constant_folding folds every constant subgraph and rewrites
    # nothing. With the limit, a QAT conv-bn's weight * BN scale (resnet18's 7x7 stem: 9408
    # values) stays a Mul in front of the weight quantizer, where the deploy passes look for a
    # weight initializer; the rewrites change the float graph (a zero bias dropped from Gemm /
    # Conv, a Pad folded into Conv, BatchNormalization into Conv), and with it what some
    # backends write (STPU's "<node>_bias" entry). So unless optimize=True is asked for, the
    # export runs unoptimized and _fold_constants folds as TorchScript does.
    fold_all = kwargs.pop("do_constant_folding", True)
    # Its domain versions come from the translations (mqbench: 1), so custom_opsets says
    # nothing it would use.
    custom_opsets = kwargs.pop("custom_opsets", None)
    if custom_opsets and dict(custom_opsets) != _fmt.CUSTOM_OPSETS:
        raise ValueError(f"custom_opsets={dict(custom_opsets)!r}: the dynamo exporter writes the "
                         f"domains of its translations, {_fmt.CUSTOM_OPSETS}")
    _export_opset[0] = DEFAULT_OPSET if opset_version is None else opset_version
    table = translation_table()
    table.update(kwargs.pop("custom_translation_table", None) or {})
    dynamic_axes = kwargs.pop("dynamic_axes", None)
    if dynamic_axes:
        if kwargs.get("dynamic_shapes") is not None:
            raise ValueError("give dynamic_shapes or dynamic_axes, not both")
        kwargs["dynamic_shapes"] = _dynamic_shapes(args, kwargs.get("input_names"),
                                                   kwargs.get("output_names"), dynamic_axes)
    export_params = kwargs.pop("export_params", True)
    keep_initializers_as_inputs = kwargs.pop("keep_initializers_as_inputs", False)
    external_data = kwargs.pop("external_data", False)
    kwargs.setdefault("verbose", False)
    torch_optimizer = kwargs.pop("optimize", False)
    try:
        program = torch.onnx.export(model, args, None, dynamo=True, opset_version=opset_version,
                                    custom_translation_table=table, optimize=torch_optimizer,
                                    **kwargs)
    except Exception as e:
        refusal = translation_error(e)
        if refusal is None:
            raise
        raise refusal from None
    if fold_all:
        _fold_constants(program.model)
    if f is not None:
        _save(program, f, export_params, keep_initializers_as_inputs, external_data)
    return program


_NO_LIMIT = 2**62


def _fold_constants(model):
    """Folds every constant subgraph of the ir.Model in place, with no size limit, then lifts
    the constants to initializers: the TorchScript exporter's do_constant_folding, and no
    rewrite of the rest (Note [Constant folding]). Each quantizer keeps its own initializers
    (no deduplication), as in a TorchScript export."""
    import onnx_ir.passes.common as common
    import onnxscript.optimizer

    common.InlinePass()(model)  # the exporter's local functions, if any
    for _ in range(2):  # as torch's optimizer: fold, drop the dead nodes, once more
        folded = onnxscript.optimizer.fold_constants_ir(
            model, onnx_shape_inference=True, input_size_limit=_NO_LIMIT,
            output_size_limit=_NO_LIMIT)
        common.RemoveUnusedNodesPass()(model)
        if not folded.modified:
            break
    for p in (common.RemoveUnusedFunctionsPass(), common.RemoveUnusedOpsetsPass(),
              common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
              common.OutputFixPass(), common.NameFixPass()):
        p(model)


def _dynamic_shapes(args, input_names, output_names, dynamic_axes):
    """The TorchScript exporter's ``dynamic_axes`` ({input name: {axis: name} or [axes]}) as
    torch.export's ``dynamic_shapes`` (one entry per positional input, axes named by strings,
    which the exporter writes as the ONNX dim_params). torch's own conversion is deprecated.
    Output axes need no entry: they follow from the inputs."""
    args = (args,) if isinstance(args, torch.Tensor) else tuple(args)
    names = list(input_names or [])[:len(args)]
    unknown = set(dynamic_axes) - set(names) - set(output_names or [])
    if unknown:
        raise ValueError(f"dynamic_axes names {sorted(unknown)}, which are neither input_names "
                         f"({names}) nor output_names ({list(output_names or [])})")
    shapes = []
    for k in range(len(args)):
        axes = dynamic_axes.get(names[k]) if k < len(names) else None
        if axes is None:
            shapes.append(None)
        elif isinstance(axes, dict):
            shapes.append({int(a): str(n) for a, n in axes.items()})
        else:
            shapes.append({int(a): f"{names[k]}_dynamic_axes_{int(a) + 1}" for a in axes})
    return tuple(shapes)


def _save(program, f, export_params, keep_initializers_as_inputs, external_data):
    options = dict(include_initializers=export_params,
                   keep_initializers_as_inputs=keep_initializers_as_inputs)
    if isinstance(f, (str, os.PathLike)):
        program.save(f, external_data=external_data, **options)
        return
    if external_data:
        raise ValueError("external_data=True writes the weights to a file beside the model: "
                         "give a path, not a file object")
    # ONNXProgram.save takes paths only; it is what decides the file's contents (initializers
    # as inputs or not, external data past 2 GB), so a file object gets what it writes.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.onnx")
        program.save(path, external_data=False, **options)
        if os.listdir(d) != ["model.onnx"]:
            raise ValueError("the model is over protobuf's 2 GB: ONNX keeps its weights in "
                             "separate files, so export it to a path, not a file object")
        with open(path, "rb") as src:
            f.write(src.read())
