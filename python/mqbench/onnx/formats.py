"""ONNX export (TorchScript exporter) of the format ops (docs/formats.md) as standard ONNX, in
both export formats ("mqbench" and "qdq": no MQBench node exists for these formats, and the
standard nodes are what TensorRT's and onnxruntime's parsers read):

* ``fake_quantize_fp8`` / ``fake_quantize_learnable_fp8``: ``QuantizeLinear`` with a float8
  zero point (output FLOAT8E4M3FN or FLOAT8E5M2, opset 19) -> ``DequantizeLinear``. E4M3FN has
  ``saturate=1`` (clamp to +-448, as our op), E5M2 ``saturate=0`` (overflow to +-inf, as our
  op); per channel with ``axis``.
* ``fake_quantize_(learnable_)per_group_affine``: blocked ``QuantizeLinear`` /
  ``DequantizeLinear`` (``axis``, ``block_size``, opset 21) with an int8 / uint8 zero point,
  and an integer ``Clip`` between them for ranges narrower than 8 bits (INT4: [-8, 7]), as the
  per-channel export does; the scale and zero point have x's shape with size(axis) /
  block_size there.

Both raise a ValueError naming the opset they need when exported with an older one.
"""
import torch

from mqbench.onnx import common

try:
    from torch.onnx import register_custom_op_symbolic, symbolic_helper
except ImportError:  # a torch without the TorchScript exporter
    register_custom_op_symbolic = symbolic_helper = None

__all__ = ["FP8_OPSET", "BLOCK_OPSET"]

FP8_OPSET = 19
BLOCK_OPSET = 21
_ONNX_FLOAT = common.ONNX_FLOAT
_FP8 = {"fp8_e4m3": (torch.float8_e4m3fn, 1), "e4m3": (torch.float8_e4m3fn, 1),
        "fp8_e5m2": (torch.float8_e5m2, 0), "e5m2": (torch.float8_e5m2, 0)}


def _need(g, opset, what, why):
    if g.opset < opset:
        raise ValueError(f"{what}: {why} needs ONNX opset {opset} or later; export with "
                         f"opset_version={opset} (got {g.opset})")


def _const(g, value, dtype):
    return g.op("Constant", value_t=torch.tensor(value, dtype=dtype))


def _axis_of(g, x, ch_axis):
    if symbolic_helper._is_none(ch_axis):
        return None
    axis = symbolic_helper._get_const(ch_axis, "i", "ch_axis")
    if axis < 0:
        axis += symbolic_helper._get_tensor_rank(x)
    return axis


def _fp8(g, x, scale, ch_axis, dtype, what):
    _need(g, FP8_OPSET, what, "QuantizeLinear with a float8 output")
    dtype = symbolic_helper._get_const(dtype, "s", "dtype") if not isinstance(dtype, str) \
        else dtype
    if dtype not in _FP8:
        raise ValueError(f"{what}: dtype must be 'fp8_e4m3' or 'fp8_e5m2', got {dtype!r}")
    fp8, saturate = _FP8[dtype]
    axis = _axis_of(g, x, ch_axis)
    s = g.op("Cast", scale, to_i=_ONNX_FLOAT)
    attrs = {}
    if axis is None:
        s = g.op("Reshape", s, _const(g, [], torch.int64))
        z = g.op("Constant", value_t=torch.zeros((), dtype=fp8))
    else:
        n = symbolic_helper._get_tensor_sizes(x)[axis]
        z = g.op("Constant", value_t=torch.zeros((n,), dtype=fp8))
        attrs["axis_i"] = axis
    q = g.op("QuantizeLinear", x, s, z, saturate_i=saturate, **attrs)
    out = g.op("DequantizeLinear", q, s, z, **attrs)
    out.setType(x.type())
    return out


def fake_quantize_fp8(g, x, scale, ch_axis, dtype):
    return _fp8(g, x, scale, ch_axis, dtype, "fake_quantize_fp8")


def fake_quantize_learnable_fp8(g, x, scale, ch_axis, dtype, grad_factor):
    return _fp8(g, x, scale, ch_axis, dtype, "fake_quantize_learnable_fp8")


def _group(g, x, scale, zero_point, axis, group_size, qmin, qmax, round_zp, what):
    _need(g, BLOCK_OPSET, what, "blocked QuantizeLinear (block_size)")
    axis = symbolic_helper._get_const(axis, "i", "axis")
    group_size = symbolic_helper._get_const(group_size, "i", "group_size")
    qmin = symbolic_helper._get_const(qmin, "i", "quant_min")
    qmax = symbolic_helper._get_const(qmax, "i", "quant_max")
    sizes = symbolic_helper._get_tensor_sizes(x)
    if axis < 0:
        axis += len(sizes)
    onnx_dtype, torch_dtype, type_range = common.qdq_dtype(qmin, qmax, what)
    shape = list(sizes)
    shape[axis] //= group_size
    s = g.op("Reshape", g.op("Cast", scale, to_i=_ONNX_FLOAT), _const(g, shape, torch.int64))
    z = g.op("Reshape", g.op("Cast", zero_point, to_i=_ONNX_FLOAT), _const(g, shape, torch.int64))
    if round_zp:
        z = g.op("Clip", g.op("Round", z), _const(g, float(qmin), torch.float32),
                 _const(g, float(qmax), torch.float32))
    z = g.op("Cast", z, to_i=onnx_dtype)
    attrs = {"axis_i": axis, "block_size_i": group_size}
    q = g.op("QuantizeLinear", x, s, z, **attrs)
    if (qmin, qmax) != type_range:
        q = g.op("Clip", q, _const(g, qmin, torch_dtype), _const(g, qmax, torch_dtype))
    out = g.op("DequantizeLinear", q, s, z, **attrs)
    out.setType(x.type())
    return out


def fake_quantize_per_group_affine(g, x, scale, zero_point, axis, group_size, qmin, qmax):
    return _group(g, x, scale, zero_point, axis, group_size, qmin, qmax, False,
                  "fake_quantize_per_group_affine")


def fake_quantize_learnable_per_group_affine(g, x, scale, zero_point, axis, group_size, qmin,
                                             qmax, grad_factor):
    return _group(g, x, scale, zero_point, axis, group_size, qmin, qmax, True,
                  "fake_quantize_learnable_per_group_affine")


SYMBOLICS = {name: globals()[name] for name in (
    "fake_quantize_fp8", "fake_quantize_learnable_fp8", "fake_quantize_per_group_affine",
    "fake_quantize_learnable_per_group_affine")}

if register_custom_op_symbolic is not None:
    for _name, _fn in SYMBOLICS.items():
        register_custom_op_symbolic(f"mqbench::{_name}", _fn, common.MIN_OPSET)
