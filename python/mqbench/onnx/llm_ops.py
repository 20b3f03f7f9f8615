"""ONNX export of the LLM activation ops, from both exporters, as standard ONNX only (no custom
domain: any runtime runs them; the same nodes in the "mqbench" and "qdq" export formats):

* ``hadamard_transform(x, had, scale)``, n = x.size(-1) = m * p (p a power of two), in one of two
  forms, by n (``BUTTERFLY_MIN_N`` = 2048):

  - n < 2048: ``MatMul(x, M^T)`` with the dense matrix ``M^T = scale * kron(had^T, S_p)`` (S_p
    Sylvester's Hadamard matrix). Without ``had``, M^T is written as one constant; with ``had``,
    M^T is computed in the graph from ``had`` (Transpose, Reshape, Mul with S_p), which constant
    folding (both exporters fold by default) turns into one constant when ``had`` is a constant
    or a buffer. It sums in MatMul's order: it agrees with the op to rounding.
  - n >= 2048: the op's butterflies. For h = 1, 2, ..., p / 2: Reshape to [-1, p / 2h, 2, h],
    two Slices of the pair axis, Add and Sub, Concat; then, with ``had``, MatMul(had,
    Reshape(y, [-1, m, p])) along m; Reshape to x's shape (a constant when x's sizes are static,
    else Shape(x)); Mul by scale. float16 / bfloat16 inputs run in float32 and are cast back, as
    the op. The butterflies add in the op's order (onnxruntime matched it bit for bit in the
    tests; the product with ``had`` agrees to rounding). No n^2 constant (M^T would be 64 MiB in
    float32 at n = 4096).

  Why 2048: onnxruntime 1.32 on CPU (2 cores), 2048 rows of float32, medians over 3
  processes, MatMul / butterfly ms, 1 thread: n = 256 1.08 / 2.92, 512 4.41 / 6.59, 1024
  19.3 / 14.5, 2048 74.7 / 41.7, 4096 309 / 113; 2 threads: 256 1.10 / 1.64, 1024 9.7 / 8.3,
  2048 39.8 / 23.8, 4096 155 / 69. At 1024 the butterflies are ahead by 1.2-1.3x only; from
  2048 by 1.7x and more (``bench/bench_hadamard_onnx.py``, docs/benchmarks.md).
* ``fake_quantize_per_token(x, quant_min, quant_max, symmetric, format)``: the row's range
  ``ReduceMin`` / ``ReduceMax`` over the last axis (keepdims; NaN replaced by 0 first, which
  the formula's min(., 0) / max(., 0) include anyway, so NaN is skipped as in the op; then
  clipped to [-FLT_MAX, 0] and [0, FLT_MAX]), then the observers' qparam arithmetic (Min, Max,
  Neg, Div, Round, Sub, Clip), then for "int"
  ``Round(x * Reciprocal(s)) + z``, ``Clip``, ``Sub``, ``Mul`` (the op's formula, operation for
  operation: onnxruntime agrees with the op bit for bit); for "fp8_e4m3" / "fp8_e5m2"
  ``Div(x, s)``, ``Cast`` to FLOAT8E4M3FN (``saturate=1``) / FLOAT8E5M2 (``saturate=0``) and
  back, ``Mul`` (opset 19 or later; a ValueError names it below). float16 / bfloat16 inputs are
  cast to float32 and the result back; float64 inputs compute the range's qparams in float32 and
  the elements in float64, as the op.

Formulas: docs/ops.md ("Hadamard transform", "Per-token fake quantization"). Each graph is
written once (``_hadamard_graph``, ``_per_token_graph``) against a small builder, which the
TorchScript symbolics (``SYMBOLICS``, registered on import) and the onnxscript translations of the
dynamo exporter (``dynamo_translations``, which :mod:`mqbench.onnx.dynamo` adds to its table)
each provide, so both exporters write the same nodes.
"""
import torch

from mqbench.onnx import common

try:
    from torch.onnx import register_custom_op_symbolic, symbolic_helper
except ImportError:  # a torch without the TorchScript exporter
    register_custom_op_symbolic = symbolic_helper = None

__all__ = ["BUTTERFLY_MIN_N", "FP8_CAST_OPSET", "SYMBOLICS", "dynamo_translations",
           "hadamard_dense", "per_token_composite", "sylvester"]

#: Cast to a float8 type with ``saturate`` needs opset 19.
FP8_CAST_OPSET = 19
#: hadamard_transform exports as the butterflies from this x.size(-1) on, as one dense MatMul
#: below it (onnxruntime's CPU timings: module docstring).
BUTTERFLY_MIN_N = 2048

# ONNX TensorProto data types
_FLOAT, _DOUBLE, _FLOAT16, _BFLOAT16 = 1, 11, 10, 16
_FLOAT8E4M3FN, _FLOAT8E5M2 = 17, 19
_TS_TYPES = {"Float": _FLOAT, "Double": _DOUBLE, "Half": _FLOAT16, "BFloat16": _BFLOAT16}
_FP8 = {"fp8_e4m3": (_FLOAT8E4M3FN, 1, 448.0), "fp8_e5m2": (_FLOAT8E5M2, 0, 57344.0)}
_EPS = torch.finfo(torch.float32).eps
_FLT_MAX = torch.finfo(torch.float32).max


def sylvester(p, dtype=torch.float32):
    """Sylvester's Hadamard matrix of order p (a power of two) in natural order:
    S_1 = [1], S_2j = [[S_j, S_j], [S_j, -S_j]]."""
    if p < 1 or p & (p - 1):
        raise ValueError(f"sylvester: the order must be a power of two, got {p}")
    s = torch.ones(1, 1, dtype=dtype)
    while s.shape[0] < p:
        s = torch.cat([torch.cat([s, s], 1), torch.cat([s, -s], 1)], 0)
    return s


def hadamard_dense(x, had=None, scale=1.0):
    """``hadamard_transform`` as a dense product, ``x @ M^T`` with ``M^T = scale * kron(had^T,
    S_p)``, in torch ops (the form of a plain dynamo export, :mod:`mqbench.onnx.plain_export`; the
    exporters write it below BUTTERFLY_MIN_N). Agrees with the op to rounding."""
    n = x.shape[-1]
    m = 1 if had is None else had.shape[0]
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    s = sylvester(n // m, dtype).to(x.device)
    mt = s if had is None else torch.kron(had.detach().t().contiguous().to(dtype), s)
    return torch.matmul(x, (mt * scale).to(x.dtype))


def per_token_composite(x, quant_min, quant_max, symmetric, format="int"):
    """``fake_quantize_per_token`` in torch ops, operation for operation the graph the exporters
    write (so equal to the op bit for bit; no gradient of its own: straight-through only in the
    op). The form of a plain dynamo export (:mod:`mqbench.onnx.plain_export`)."""
    _check_per_token(quant_min, quant_max, format, FP8_CAST_OPSET, "fake_quantize_per_token")
    xc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    xr = torch.where(torch.isnan(xc), torch.zeros((), dtype=xc.dtype, device=xc.device), xc)
    mn = xr.amin(-1, keepdim=True).float().clamp(-_FLT_MAX, 0.0)
    mx = xr.amax(-1, keepdim=True).float().clamp(0.0, _FLT_MAX)
    if format == "int":
        qmin, qmax = float(quant_min), float(quant_max)
        if symmetric:
            s = torch.maximum(-mn, mx) / ((quant_max - quant_min) / 2.0)
        else:
            s = (mx - mn) / (qmax - qmin)
        s = s.clamp(min=_EPS).clamp(max=_FLT_MAX)
        if symmetric:
            zs = 0 if quant_min < 0 else (quant_min + quant_max + 1) // 2
            z = torch.full_like(s, float(zs))
        else:
            z = (qmin - torch.round(mn / s)).clamp(qmin, qmax)
        inv = torch.reciprocal(s)
        zc = z.to(xc.dtype)
        q = torch.round(xc * inv.to(xc.dtype)) + zc
        y = (q.clamp(qmin, qmax) - zc) * s.to(xc.dtype)
    else:
        fp8_type, _, max_finite = _FP8[format]
        s = (torch.maximum(-mn, mx) / max_finite).clamp(min=_EPS).clamp(max=_FLT_MAX)
        v = (xc / s.to(xc.dtype)).float()
        if fp8_type == _FLOAT8E4M3FN:
            v = v.clamp(-max_finite, max_finite)
        fp8 = torch.float8_e4m3fn if fp8_type == _FLOAT8E4M3FN else torch.float8_e5m2
        y = v.to(fp8).float().to(xc.dtype) * s.to(xc.dtype)
    return y.to(x.dtype)


# ---- the graphs, written once ---------------------------------------------------------------

def _hadamard_graph(b, x, had, scale, sizes, m, x_type, what):
    """The op's y_r = scale * (had kron S_p) x_r (Note [Hadamard transform]): one MatMul with the
    dense M^T below BUTTERFLY_MIN_N, the butterflies from it on. ``sizes``: x's sizes as known at
    export time (an int for each static one), or None."""
    n = sizes[-1] if sizes else None
    if not isinstance(n, int):
        raise ValueError(f"{what}: the ONNX export needs the size of x's last axis at export "
                         f"time, got {n!r}")
    if had is None:
        m = 1
    elif not isinstance(m, int):
        raise ValueError(f"{what}: the ONNX export needs had's size at export time, got {m!r}")
    p = n // m if m else 0
    if n % m or p < 1 or p & (p - 1):
        raise ValueError(f"{what}: x.size(-1) ({n}) must be m * 2^k (m = {m})")
    if n >= BUTTERFLY_MIN_N:
        return _hadamard_butterfly(b, x, had, scale, sizes, m, p, x_type)
    dtype = torch.float64 if x_type == _DOUBLE else torch.float32
    c_type = _DOUBLE if x_type == _DOUBLE else _FLOAT
    s = sylvester(p, dtype)
    if had is None:
        mt = b.const(s * scale)
    else:
        a = b.op("Transpose", b.op("Cast", had, to=c_type), perm=[1, 0])
        a = b.op("Reshape", a, b.const(torch.tensor([m, 1, m, 1])))
        k = b.op("Mul", a, b.const(s.reshape(1, p, 1, p)))
        k = b.op("Reshape", k, b.const(torch.tensor([n, n])))
        mt = b.op("Mul", k, b.const(torch.tensor(scale, dtype=dtype)))
    if x_type != c_type:
        mt = b.op("Cast", mt, to=x_type)
    return b.op("MatMul", x, mt)


def _hadamard_butterfly(b, x, had, scale, sizes, m, p, x_type):
    """The op's order: the butterflies (a, b) -> (a + b, a - b) of the p axis for h = 1, 2, 4,
    ..., p / 2 (each a Reshape to [-1, p / 2h, 2, h], two Slices of the pair axis, Add, Sub,
    Concat), then MatMul(had, [-1, m, p]) along m, Reshape to x's shape (a constant when all its
    sizes are static, else Shape(x)), Mul by scale; float16 / bfloat16 inputs in float32 (the
    op's compute type)."""
    half = x_type in (_FLOAT16, _BFLOAT16)
    c_type = _DOUBLE if x_type == _DOUBLE else _FLOAT

    def ints(*v):
        return b.const(torch.tensor(v, dtype=torch.int64))

    zero, one, two, pair_axis = ints(0), ints(1), ints(2), ints(-2)
    static = all(isinstance(d, int) for d in sizes)
    shape = ints(*sizes) if static else b.op("Shape", x)
    y = b.op("Cast", x, to=_FLOAT) if half else x
    h = 1
    while h < p:
        v = b.op("Reshape", y, ints(-1, p // (2 * h), 2, h))
        lo = b.op("Slice", v, zero, one, pair_axis)
        hi = b.op("Slice", v, one, two, pair_axis)
        y = b.op("Concat", b.op("Add", lo, hi), b.op("Sub", lo, hi), axis=-2)
        h *= 2
    if had is not None:
        y = b.op("MatMul", b.op("Cast", had, to=c_type), b.op("Reshape", y, ints(-1, m, p)))
    dtype = torch.float64 if c_type == _DOUBLE else torch.float32
    y = b.op("Mul", b.op("Reshape", y, shape), b.const(torch.tensor(scale, dtype=dtype)))
    return b.op("Cast", y, to=x_type) if half else y


def _check_per_token(qmin, qmax, fmt, opset, what):
    if fmt not in ("int",) + tuple(_FP8):
        raise ValueError(f"{what}: format must be 'int', 'fp8_e4m3' or 'fp8_e5m2', got {fmt!r}")
    if fmt == "int" and not qmin < qmax:
        raise ValueError(f"{what}: quant_min ({qmin}) must be < quant_max ({qmax})")
    if fmt != "int" and opset < FP8_CAST_OPSET:
        raise ValueError(f"{what}: format {fmt!r} exports as a Cast to a float8 type, which "
                         f"needs ONNX opset {FP8_CAST_OPSET} or later; export with "
                         f"opset_version={FP8_CAST_OPSET} (got {opset})")


def _per_token_graph(b, x, qmin, qmax, symmetric, fmt, x_type, what):
    """The op's formulas (Note [Per-token fake quantization]) in standard ONNX ops."""
    _check_per_token(qmin, qmax, fmt, b.opset, what)
    double = x_type == _DOUBLE
    half = x_type in (_FLOAT16, _BFLOAT16)
    xc = b.op("Cast", x, to=_FLOAT) if half else x
    c_dtype = torch.float64 if double else torch.float32

    def f32(v):
        return b.const(torch.tensor(v, dtype=torch.float32))

    def to_c(t):  # a float32 qparam in the compute type
        return b.op("Cast", t, to=_DOUBLE) if double else t

    # the row's range: NaN -> 0, which min(., 0) and max(., 0) below include anyway
    xr = b.op("Where", b.op("IsNaN", xc), b.const(torch.tensor(0.0, dtype=c_dtype)), xc)
    mn, mx = b.reduce("ReduceMin", xr), b.reduce("ReduceMax", xr)
    if double:
        mn, mx = b.op("Cast", mn, to=_FLOAT), b.op("Cast", mx, to=_FLOAT)
    # min(mn, 0), max(mx, 0), with +-inf counted as +-FLT_MAX (the op's finite range)
    mn = b.op("Clip", mn, f32(-_FLT_MAX), f32(0.0))
    mx = b.op("Clip", mx, f32(0.0), f32(_FLT_MAX))
    if fmt == "int":
        if symmetric:
            s = b.op("Div", b.op("Max", b.op("Neg", mn), mx), f32((qmax - qmin) / 2.0))
        else:
            s = b.op("Div", b.op("Sub", mx, mn), f32(float(qmax - qmin)))
        s = b.op("Min", b.op("Max", s, f32(_EPS)), f32(_FLT_MAX))
        if symmetric:
            z = f32(0.0 if qmin < 0 else float((qmin + qmax + 1) // 2))
        else:
            z = b.op("Sub", f32(float(qmin)), b.op("Round", b.op("Div", mn, s)))
            z = b.op("Clip", z, f32(float(qmin)), f32(float(qmax)))
        inv = b.op("Reciprocal", s)
        lo = b.const(torch.tensor(float(qmin), dtype=c_dtype))
        hi = b.const(torch.tensor(float(qmax), dtype=c_dtype))
        zc = to_c(z)
        q = b.op("Add", b.op("Round", b.op("Mul", xc, to_c(inv))), zc)
        y = b.op("Mul", b.op("Sub", b.op("Clip", q, lo, hi), zc), to_c(s))
    else:
        fp8_type, saturate, max_finite = _FP8[fmt]
        amax = b.op("Max", b.op("Neg", mn), mx)
        s = b.op("Div", amax, f32(max_finite))
        s = b.op("Min", b.op("Max", s, f32(_EPS)), f32(_FLT_MAX))
        v = b.op("Div", xc, to_c(s))
        if double:  # the op rounds x / s to float32 first, as torch's double -> float8 cast
            v = b.op("Cast", v, to=_FLOAT)
        q = b.op("Cast", b.fp8_cast(v, fp8_type, saturate), to=_FLOAT)
        y = b.op("Mul", to_c(q), to_c(s))
    return b.op("Cast", y, to=x_type) if half else y


# ---- the TorchScript exporter ---------------------------------------------------------------

class _TorchScriptBuilder:
    def __init__(self, g):
        self.g = g
        self.opset = g.opset

    def op(self, name, *inputs, **attributes):
        kw = {}
        for key, value in attributes.items():
            suffix = "f" if isinstance(value, float) else "s" if isinstance(value, str) else "i"
            kw[f"{key}_{suffix}"] = value
        return self.g.op(name, *inputs, **kw)

    def const(self, value):
        return self.g.op("Constant", value_t=value)

    def reduce(self, name, x):
        if self.opset >= 18:  # axes became an input
            return self.g.op(name, x, self.const(torch.tensor([-1])), keepdims_i=1)
        return self.g.op(name, x, axes_i=[-1], keepdims_i=1)

    def fp8_cast(self, v, fp8_type, saturate):
        return self.g.op("Cast", v, to_i=fp8_type, saturate_i=saturate)


def _ts_type(x):
    name = x.type().scalarType() if hasattr(x.type(), "scalarType") else None
    return _TS_TYPES.get(name, _FLOAT)


def _ts_sizes(v):
    sizes = symbolic_helper._get_tensor_sizes(v)
    return list(sizes) if sizes is not None else None


def _ts_hadamard_transform(g, x, had, scale):
    what = "hadamard_transform"
    scale = symbolic_helper._get_const(scale, "f", "scale")
    sizes = _ts_sizes(x)
    if symbolic_helper._is_none(had):
        had, m = None, 1
    else:
        had_sizes = _ts_sizes(had)
        m = had_sizes[0] if had_sizes else None
    out = _hadamard_graph(_TorchScriptBuilder(g), x, had, float(scale), sizes, m, _ts_type(x),
                          what)
    out.setType(x.type())
    return out


def _ts_fake_quantize_per_token(g, x, quant_min, quant_max, symmetric, format_):
    args = (symbolic_helper._get_const(quant_min, "i", "quant_min"),
            symbolic_helper._get_const(quant_max, "i", "quant_max"),
            bool(symbolic_helper._get_const(symmetric, "b", "symmetric")),
            format_ if isinstance(format_, str) else symbolic_helper._get_const(format_, "s",
                                                                                 "format"))
    out = _per_token_graph(_TorchScriptBuilder(g), x, *args, _ts_type(x),
                           "fake_quantize_per_token")
    out.setType(x.type())
    return out


#: The TorchScript symbolics, registered for opset 11 and later.
SYMBOLICS = {"hadamard_transform": _ts_hadamard_transform,
             "fake_quantize_per_token": _ts_fake_quantize_per_token}

if register_custom_op_symbolic is not None:
    for _name, _fn in SYMBOLICS.items():
        register_custom_op_symbolic(f"mqbench::{_name}", _fn, common.MIN_OPSET)


# ---- the dynamo exporter (onnxscript, imported only when a dynamo export runs) --------------

class _OnnxscriptBuilder:
    # attributes whose schema default torch's graph builder would write unless given as None
    # (Note [No default attributes] in mqbench.onnx.dynamo)
    _NO_DEFAULTS = {"Reshape": {"allowzero": None}}

    def __init__(self, opset):
        import onnxscript
        from onnxscript import ir

        self.opset = opset
        self._ops = onnxscript.opset18
        self._ops19 = onnxscript.opset19
        self._ir = ir

    def op(self, name, *inputs, **attributes):
        attributes = {**self._NO_DEFAULTS.get(name, {}), **attributes}
        return getattr(self._ops, name)(*inputs, **attributes)

    def const(self, value):
        return self._ops.Constant(value=self._ir.tensor(value.numpy()))

    def reduce(self, name, x):
        return getattr(self._ops, name)(x, self.const(torch.tensor([-1])), keepdims=1,
                                        noop_with_empty_axes=None)

    def fp8_cast(self, v, fp8_type, saturate):
        return self._ops19.Cast(v, to=fp8_type, saturate=saturate)


def _onnx_type(v):
    dtype = getattr(v, "dtype", None)
    return int(dtype) if dtype is not None else _FLOAT


def _static(shape, k):
    if shape is None or len(shape) == 0:
        return None
    d = shape[k]
    return d if isinstance(d, int) else getattr(d, "value", d)


def dynamo_translations(opset):
    """{op name: translation(fmt, *op arguments)} for :func:`mqbench.onnx.dynamo.translation_table`;
    ``opset()`` returns the opset of the export being run."""

    def hadamard(fmt, x, had=None, scale=1.0):
        shape = getattr(x, "shape", None)
        sizes = None if shape is None else [_static(shape, k) for k in range(len(shape))]
        m = 1 if had is None else _static(getattr(had, "shape", None), 0)
        return _hadamard_graph(_OnnxscriptBuilder(opset()), x, had, float(scale), sizes, m,
                               _onnx_type(x), "hadamard_transform")

    def per_token(fmt, x, quant_min, quant_max, symmetric, format="int"):
        return _per_token_graph(_OnnxscriptBuilder(opset()), x, int(quant_min), int(quant_max),
                                bool(symmetric), format, _onnx_type(x),
                                "fake_quantize_per_token")

    return {"hadamard_transform": hadamard, "fake_quantize_per_token": per_token}
