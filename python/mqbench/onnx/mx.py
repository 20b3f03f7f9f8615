"""ONNX export of the block-scaled format ops (docs/formats-mx.md) from both exporters:
TorchScript symbolics, and onnxscript translations that write the same nodes (DYNAMO_TRANSLATIONS
for the "qdq" format; mqbench.onnx.dynamo writes the "mqbench" format's node with
deploy_node_attrs).

In the "mqbench" export format (convert_deploy's), each op is one node of domain ``mqbench``
(DEPLOY_NODES: FakeQuantizeMXFP8 / FakeQuantizeMXFP4 ``(x)``, FakeQuantizeNVFP4 ``(x,
global_amax)``; attributes ``block_size``, ``axis`` (>= 0) and ``blocked_shape``, the Reshape
target that splits the axis into blocks), which the deploy passes turn into standard ONNX: a
weight's codes and block scales become initializers, an activation gets the graph below
(src/deploy/block_formats.cpp; docs/design/formats.md).

In the "qdq" format, standard ONNX:

* ``fake_quantize_mx(x, "mxfp8_e4m3")``: the block scale computed in the graph from the data,
  ``X = 2^clip(floor(log2(amax)) - 8, -127, 128)`` with ``amax = ReduceMax(Abs(x))`` per block,
  then blocked ``QuantizeLinear`` (``axis``, ``block_size``, ``output_dtype`` FLOAT8E4M3FN,
  ``saturate=1``; opset 21) -> ``DequantizeLinear``. onnxruntime (1.32) runs it, bit for bit
  equal to the op.
* ``fake_quantize_mx(x, "mxfp4")``: the same with ``output_dtype`` FLOAT4E2M1 (opset 23),
  ``floor(log2(amax)) - 2``.
* ``fake_quantize_nvfp4(x, global_amax)``: NVIDIA's two-level scale as TensorRT reads it: the
  per-block scale ``amax / 6 / g`` (``g = global_amax / 2688``) quantized to FLOAT8E4M3FN by a
  ``QuantizeLinear`` (scale 1, ``saturate=1``) after clipping it to [2^-6, 448], and dequantized
  with ``g`` by a ``DequantizeLinear`` (the first of TensorRT's two DequantizeLinear); that float
  scale quantizes x to FLOAT4E2M1 with blocked ``QuantizeLinear`` -> ``DequantizeLinear``
  (``block_size`` 16; opset 23).

floor(log2(amax)) is computed exactly: ``Floor(Log(amax) / ln 2)``, then corrected by one where
``2^(e+1) <= amax`` or ``2^e > amax`` (the float logarithm can land on either side of an exact
power of two). onnxruntime 1.32 implements neither QuantizeLinear nor DequantizeLinear for
FLOAT4E2M1 (NOT_IMPLEMENTED): the FP4 graphs pass onnx's full checker, and the tests run them
in onnx's reference evaluator instead.

Each symbolic raises a ValueError naming the opset it needs, and one naming the axis when the
blocked axis is not a multiple of the block size (the op pads the last block; QuantizeLinear
does not).

MXFP6 (``"mxfp6_e3m2"``, ``"mxfp6_e2m3"``) is refused in both formats with NO_FP6_EXPORT (see
its comment): no standard ONNX graph these exporters write holds FP6 elements, and the deploy
passes could not turn a deploy node into one either.
"""
import contextlib
import math

import torch

try:
    from torch.onnx import register_custom_op_symbolic, symbolic_helper
except ImportError:  # a torch without the TorchScript exporter
    register_custom_op_symbolic = symbolic_helper = None
try:
    from torch.onnx._internal.torchscript_exporter._globals import GLOBALS as _GLOBALS
except ImportError:  # older torch: the exporter's globals live elsewhere
    try:
        from torch.onnx._globals import GLOBALS as _GLOBALS
    except ImportError:
        _GLOBALS = None

from mqbench.onnx import common

__all__ = ["DEPLOY_NODES", "MX_OPSETS", "NO_FP6_EXPORT", "NVFP4_OPSET", "deploy_node_attrs",
           "refuse_mxfp6"]

_ONNX_FLOAT, _ONNX_FLOAT8E4M3FN, _ONNX_FLOAT4E2M1 = 1, 17, 23
# format -> (opset, ONNX element type, emax_elem)
MX_OPSETS = {"mxfp8_e4m3": (21, _ONNX_FLOAT8E4M3FN, 8), "mxfp4": (23, _ONNX_FLOAT4E2M1, 2)}
NVFP4_OPSET = 23
#: format -> op_type of its node in the "mqbench" export format (domain mqbench)
DEPLOY_NODES = {"mxfp8_e4m3": "FakeQuantizeMXFP8", "mxfp4": "FakeQuantizeMXFP4",
                "nvfp4": "FakeQuantizeNVFP4"}
MXFP6_FORMATS = ("mxfp6_e3m2", "mxfp6_e2m3")
#: Why MXFP6 is not exported. onnx 1.23 defines FLOAT6E2M3 / FLOAT6E3M2 as outputs of
#: QuantizeLinear and inputs of DequantizeLinear from opset 28 on; torch's TorchScript exporter
#: writes opsets up to 23 and onnxscript's opset modules (the dynamo translations) stop at 23, so
#: neither can write that node; onnxruntime 1.32 registers no FP6 type ("MLDataType for
#: tensor(float6e2m3) is not currently registered") and TensorRT has no FP6 data type, so no
#: deploy target could load it.
NO_FP6_EXPORT = ("{what}: MXFP6 ({fmt!r}) has no ONNX export: ONNX holds FP6 elements "
                 "(FLOAT6E2M3, FLOAT6E3M2) in QuantizeLinear / DequantizeLinear only from opset "
                 "28, beyond what the exporters write (TorchScript and onnxscript's opsets stop "
                 "at 23), and neither onnxruntime 1.32 nor TensorRT loads FP6 tensors. Keep MXFP6 "
                 "as fake quantization in PyTorch, or export and deploy MXFP8 (dtype "
                 "'mxfp8_e4m3') or MXFP4 (dtype 'mxfp4') instead")
_ELEM_DTYPES = "'mxfp8_e4m3', 'mxfp6_e3m2', 'mxfp6_e2m3' or 'mxfp4'"


def refuse_mxfp6(fmt, what):
    """Raises NO_FP6_EXPORT's ValueError for an MXFP6 format, and one naming the valid values for
    a name that is no MX format."""
    if fmt in MXFP6_FORMATS:
        raise ValueError(NO_FP6_EXPORT.format(what=what, fmt=fmt))
    if fmt not in MX_OPSETS:
        raise ValueError(f"{what}: elem_dtype must be {_ELEM_DTYPES}, got {fmt!r}")


def _deploy_form():
    return common.get_export_format() == "mqbench"


def _need(g, opset, what, why):
    if g.opset < opset:
        raise ValueError(f"{what}: {why} needs ONNX opset {opset} or later; export with "
                         f"opset_version={opset} (got {g.opset})")


def _f(g, value):
    return g.op("Constant", value_t=torch.tensor(value, dtype=torch.float32))


def _i64(g, value):
    return g.op("Constant", value_t=torch.tensor(value, dtype=torch.int64))


def _split_shape(sizes, block_size, axis, what):
    """(axis wrapped, the Reshape target that splits `axis` into [blocks, block_size]). Leading
    dimensions may be dynamic (copied: 0, the block count then -1); the blocked axis and those
    after it must be static, except that a blocked last axis may be dynamic too (-1)."""
    if not sizes:
        raise ValueError(f"{what}: the export needs x's rank (got sizes {sizes})")
    if axis < 0:
        axis += len(sizes)
    n, rest = sizes[axis], list(sizes[axis + 1:])
    if n is not None and n % block_size:
        raise ValueError(f"{what}: axis {axis} of x has {n} elements, not a multiple of "
                         f"block_size {block_size}; QuantizeLinear has no partial block")
    if any(d is None for d in rest) or (n is None and rest):
        raise ValueError(f"{what}: the export needs static sizes from the blocked axis {axis} "
                         f"on (got {sizes})")
    lead = [0 if d is None else d for d in sizes[:axis]]
    # a copied (0) dimension wants a -1 beside it (torch's TorchScript shape inference)
    blocks = -1 if n is None or 0 in lead else n // block_size
    return axis, lead + [blocks, block_size] + rest


def _blocks(g, x, block_size, axis, what):
    """(axis, the block amax shaped as the blocked scale: x's shape with size(axis) / block)."""
    axis, split = _split_shape(symbolic_helper._get_tensor_sizes(x), block_size, axis, what)
    split = _i64(g, split)
    red = _i64(g, [axis + 1])
    amax = g.op("ReduceMax", g.op("Reshape", g.op("Abs", x), split), red, keepdims_i=0)
    # ReduceMax may skip NaN (onnxruntime's does): a block with a NaN gets a NaN amax, as the op
    nan = g.op("ReduceMax", g.op("Cast", g.op("IsNaN", g.op("Reshape", x, split)),
                                 to_i=_ONNX_FLOAT), red, keepdims_i=0)
    amax = g.op("Where", g.op("Greater", nan, _f(g, 0.0)), _f(g, math.nan), amax)
    return axis, amax


def _floor_log2(g, a):
    """floor(log2(a)) exactly (for a > 0; -inf for 0, inf for inf, NaN for NaN)."""
    two = _f(g, 2.0)
    one = _f(g, 1.0)
    e = g.op("Floor", g.op("Div", g.op("Log", a), _f(g, math.log(2.0))))
    up = g.op("Add", e, one)
    e = g.op("Where", g.op("LessOrEqual", g.op("Pow", two, up), a), up, e)
    down = g.op("Sub", e, one)
    return g.op("Where", g.op("Greater", g.op("Pow", two, e), a), down, e)


@contextlib.contextmanager
def _no_node_shape_inference():
    """The TorchScript exporter's per-node shape inference knows no FLOAT4E2M1 ("ONNX type 23 is
    an unexpected tensor scalar type"): the FP4 QuantizeLinear is created without it (its
    output's type is set by onnx's own inference on the saved model)."""
    if _GLOBALS is None:
        yield
        return
    before = _GLOBALS.onnx_shape_inference
    _GLOBALS.onnx_shape_inference = False
    try:
        yield
    finally:
        _GLOBALS.onnx_shape_inference = before


def _deploy_node(g, fmt, what, x, *inputs, block_size, axis):
    """The "mqbench" format's node for `fmt` (DEPLOY_NODES), with the checks of the QDQ form."""
    axis, split = _split_shape(symbolic_helper._get_tensor_sizes(x), block_size, axis, what)
    out = g.op(f"{common.DOMAIN}::{DEPLOY_NODES[fmt]}", x, *inputs,
               block_size_i=block_size, axis_i=axis, blocked_shape_i=split)
    out.setType(x.type())
    return out


def _qdq(g, x, scale, axis, block_size, onnx_type):
    attrs = {"axis_i": axis, "block_size_i": block_size, "output_dtype_i": onnx_type}
    if onnx_type == _ONNX_FLOAT8E4M3FN:
        attrs["saturate_i"] = 1
        q = g.op("QuantizeLinear", x, scale, **attrs)
    else:
        with _no_node_shape_inference():
            q = g.op("QuantizeLinear", x, scale, **attrs)
    out = g.op("DequantizeLinear", q, scale, axis_i=axis, block_size_i=block_size)
    out.setType(x.type())
    return out


def fake_quantize_mx(g, x, elem_dtype, block_size, axis):
    what = "fake_quantize_mx"
    fmt = symbolic_helper._get_const(elem_dtype, "s", "elem_dtype")
    refuse_mxfp6(fmt, what)
    opset, onnx_type, emax = MX_OPSETS[fmt]
    _need(g, opset, what, f"QuantizeLinear to {'FLOAT8E4M3FN' if opset == 21 else 'FLOAT4E2M1'}"
          " with block_size")
    block_size = symbolic_helper._get_const(block_size, "i", "block_size")
    axis = symbolic_helper._get_const(axis, "i", "axis")
    if _deploy_form():
        return _deploy_node(g, fmt, what, x, block_size=block_size, axis=axis)
    axis, amax = _blocks(g, x, block_size, axis, what)
    # amax = inf: exponent 128 (the op reads amax's exponent field), so X = 2^(128 - emax)
    e = g.op("Clip", _floor_log2(g, amax), _f(g, -254.0), _f(g, 128.0))
    e = g.op("Clip", g.op("Sub", e, _f(g, float(emax))), _f(g, -127.0), _f(g, 128.0))
    # amax NaN: the E8M0 NaN scale, a NaN block
    e = g.op("Where", g.op("IsNaN", amax), amax, e)
    scale = g.op("Pow", _f(g, 2.0), e)
    return _qdq(g, x, scale, axis, block_size, onnx_type)


def fake_quantize_nvfp4(g, x, global_amax, block_size, axis):
    what = "fake_quantize_nvfp4"
    _need(g, NVFP4_OPSET, what, "QuantizeLinear to FLOAT4E2M1 with block_size")
    block_size = symbolic_helper._get_const(block_size, "i", "block_size")
    axis = symbolic_helper._get_const(axis, "i", "axis")
    if _deploy_form():
        return _deploy_node(g, "nvfp4", what, x, global_amax, block_size=block_size, axis=axis)
    axis, amax = _blocks(g, x, block_size, axis, what)
    gs = g.op("Div", g.op("Reshape", g.op("Cast", global_amax, to_i=_ONNX_FLOAT), _i64(g, [])),
              _f(g, 448.0 * 6.0))
    s = g.op("Div", g.op("Div", amax, _f(g, 6.0)), gs)
    s = g.op("Clip", s, _f(g, 2.0 ** -6), _f(g, 448.0))
    s8 = g.op("QuantizeLinear", s, _f(g, 1.0), output_dtype_i=_ONNX_FLOAT8E4M3FN, saturate_i=1)
    scale = g.op("DequantizeLinear", s8, gs)  # TensorRT's first DequantizeLinear: s8 * g
    return _qdq(g, x, scale, axis, block_size, _ONNX_FLOAT4E2M1)


SYMBOLICS = {"fake_quantize_mx": fake_quantize_mx, "fake_quantize_nvfp4": fake_quantize_nvfp4}

if register_custom_op_symbolic is not None:
    for _name, _fn in SYMBOLICS.items():
        register_custom_op_symbolic(f"mqbench::{_name}", _fn, common.MIN_OPSET)


# ---- dynamo exporter: the same nodes as onnxscript translations ------------------------------

def _dynamo_blocks(op, x, block_size, axis, what):
    shape = getattr(x, "shape", None)
    sizes = None if shape is None else [d if isinstance(d, int) else None for d in shape]
    axis, split = _split_shape(sizes, block_size, axis, what)
    split = op.Constant(value_ints=split)
    red = op.Constant(value_ints=[axis + 1])
    amax = op.ReduceMax(op.Reshape(op.Abs(x), split), red, keepdims=0)
    nan = op.ReduceMax(op.Cast(op.IsNaN(op.Reshape(x, split)), to=_ONNX_FLOAT), red, keepdims=0)
    amax = op.Where(op.Greater(nan, op.Constant(value_float=0.0)),
                    op.Constant(value_float=math.nan), amax)
    return axis, amax


def _dynamo_floor_log2(op, a):
    two, one = op.Constant(value_float=2.0), op.Constant(value_float=1.0)
    e = op.Floor(op.Div(op.Log(a), op.Constant(value_float=math.log(2.0))))
    up = op.Add(e, one)
    e = op.Where(op.LessOrEqual(op.Pow(two, up), a), up, e)
    return op.Where(op.Greater(op.Pow(two, e), a), op.Sub(e, one), e)


def _dynamo_qdq(op, x, scale, axis, block_size, onnx_type):
    attrs = {"saturate": 1} if onnx_type == _ONNX_FLOAT8E4M3FN else {}
    q = op.QuantizeLinear(x, scale, axis=axis, block_size=block_size, output_dtype=onnx_type,
                          **attrs)
    return op.DequantizeLinear(q, scale, axis=axis, block_size=block_size)


def deploy_node_attrs(x, block_size, axis, what):
    """The "mqbench" format node's attributes for an onnxscript value x (the dynamo exporter's
    translations in mqbench.onnx.dynamo write the node: that module imports this one, not the
    other way)."""
    shape = getattr(x, "shape", None)
    sizes = None if shape is None else [d if isinstance(d, int) else None for d in shape]
    axis, split = _split_shape(sizes, block_size, axis, what)
    return {"block_size": block_size, "axis": axis, "blocked_shape": split}


def _dynamo_mx(fmt_, x, elem_dtype, block_size=32, axis=-1):
    import onnxscript
    what = "fake_quantize_mx"
    refuse_mxfp6(elem_dtype, what)
    opset, onnx_type, emax = MX_OPSETS[elem_dtype]
    op = onnxscript.opset21 if opset == 21 else onnxscript.opset23
    axis, amax = _dynamo_blocks(op, x, block_size, axis, what)
    e = op.Clip(_dynamo_floor_log2(op, amax), op.Constant(value_float=-254.0),
                op.Constant(value_float=128.0))
    e = op.Clip(op.Sub(e, op.Constant(value_float=float(emax))),
                op.Constant(value_float=-127.0), op.Constant(value_float=128.0))
    e = op.Where(op.IsNaN(amax), amax, e)
    scale = op.Pow(op.Constant(value_float=2.0), e)
    return _dynamo_qdq(op, x, scale, axis, block_size, onnx_type)


def _dynamo_nvfp4(fmt_, x, global_amax, block_size=16, axis=-1):
    import onnxscript
    op = onnxscript.opset23
    axis, amax = _dynamo_blocks(op, x, block_size, axis, "fake_quantize_nvfp4")
    gs = op.Div(op.Reshape(op.Cast(global_amax, to=_ONNX_FLOAT), op.Constant(value_ints=[])),
                op.Constant(value_float=448.0 * 6.0))
    s = op.Div(op.Div(amax, op.Constant(value_float=6.0)), gs)
    s = op.Clip(s, op.Constant(value_float=2.0 ** -6), op.Constant(value_float=448.0))
    s8 = op.QuantizeLinear(s, op.Constant(value_float=1.0), output_dtype=_ONNX_FLOAT8E4M3FN,
                           saturate=1)
    scale = op.DequantizeLinear(s8, gs)
    return _dynamo_qdq(op, x, scale, axis, block_size, _ONNX_FLOAT4E2M1)


#: For the dynamo exporter (python/mqbench/onnx/dynamo.py adds them to its table). The export's
#: opset_version must be at least the op's (21 for MXFP8, 23 for the FP4 formats).
DYNAMO_TRANSLATIONS = {"fake_quantize_mx": _dynamo_mx, "fake_quantize_nvfp4": _dynamo_nvfp4}
