"""MXFP6 (``fake_quantize_mx`` with elem_dtype "mxfp6_e3m2" / "mxfp6_e2m3"; OCP MX spec v1.0:
FP6 E3M2 and E2M3 elements, one E8M0 scale per 32) bit for bit against a reference written here:
the 32 non-negative codes of each element format decoded from their bits, round to nearest on
that table with ties to the even code, saturation at the largest code, and the spec's shared
scale X = 2^(floor(log2(amax)) - emax_elem) (>= 2^-127); and against torchao 0.18's to_mx
(FLOOR scale) with its FP6 elements. Then the module, the scheme, the
straight-through gradient, the fake kernel, and the refusal of the ONNX export and of
convert_deploy (no ONNX model these exporters write holds FP6 elements: mqbench.onnx.mx).
The CUDA kernel is checked against the CPU op in test_cuda_formats.py."""
import io
import math
import os

import pytest
import torch
import torch.nn as nn

import mqbench  # noqa: F401
from mqbench import _C
from mqbench.convert_deploy import convert_deploy
from mqbench.custom_symbolic_opset import export_format, export_onnx
from mqbench.fake_quantize.mx import MXFakeQuantize
from mqbench.observer import MinMaxObserver
from mqbench.onnx import mx as onnx_mx
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.scheme import QuantizeScheme
from mqbench.utils.state import enable_calibration, enable_quantization
from reference import round_grid

ops = torch.ops.mqbench

# format -> (exponent bits, mantissa bits, exponent bias); OCP MX v1.0 section 5.3.2
FP6 = {"mxfp6_e2m3": (2, 3, 1), "mxfp6_e3m2": (3, 2, 3)}
FORMATS = list(FP6)


def decode(code, fmt):
    """The value of a 6-bit code (sign bit 5) of `fmt`: every code is a number (no inf, no NaN)."""
    ebits, mbits, bias = FP6[fmt]
    sign = -1.0 if code >> 5 else 1.0
    e, m = (code >> mbits) & ((1 << ebits) - 1), code & ((1 << mbits) - 1)
    if e == 0:  # subnormal
        return sign * m / 2 ** mbits * 2.0 ** (1 - bias)
    return sign * (1 + m / 2 ** mbits) * 2.0 ** (e - bias)


GRID = {f: [decode(c, f) for c in range(32)] for f in FORMATS}  # the 32 non-negative codes
EMAX = {f: math.frexp(GRID[f][-1])[1] - 1 for f in FORMATS}      # exponent of the largest


def block_exponent(amax):
    """floor(log2(amax)) as the op reads it from a float32 amax's exponent field: 128 for inf,
    -127 for 0 and float32 subnormals."""
    if math.isinf(amax):
        return 128
    if amax < 2.0 ** -126:
        return -127
    return math.frexp(amax)[1] - 1


def reference(x, fmt, block=32, axis=-1):
    """The MXFP6 fake quantization of x (any float dtype; computed from x's float32 values, as
    the op computes float64 input) in float32, blocks of `block` along `axis` (a shorter last
    block as if zero-padded)."""
    xt = x.detach().float().movedim(axis, -1).contiguous()
    rows = xt.reshape(-1, xt.shape[-1]).double().tolist()
    out = []
    for row in rows:
        res = []
        for c in range(0, len(row), block):
            vals = row[c:c + block]
            if any(math.isnan(v) for v in vals):
                res += [math.nan] * len(vals)
                continue
            e = max(block_exponent(max(abs(v) for v in vals)) - EMAX[fmt], -127)
            res += [round_grid(v / 2.0 ** e, GRID[fmt]) * 2.0 ** e for v in vals]
        out.append(res)
    # float64 -> float32: exact, or overflow to inf (an infinite element times its scale)
    y = torch.tensor(out, dtype=torch.float64).float().reshape(xt.shape)
    return y.movedim(-1, axis)


def assert_bits_equal(got, want):
    """Same float32 bits (-0 apart from 0), NaN where NaN."""
    got, want = got.detach().float().contiguous(), want.float().contiguous()
    assert got.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))


def test_the_decoded_grids_are_the_spec_formats():
    for fmt, smallest, largest in (("mxfp6_e2m3", 0.125, 7.5), ("mxfp6_e3m2", 0.0625, 28.0)):
        g = GRID[fmt]
        assert len(g) == 32 and g[0] == 0.0 and g[1] == smallest and g[-1] == largest
        assert all(a < b for a, b in zip(g, g[1:]))
        assert [decode(c | 32, fmt) for c in range(1, 32)] == [-v for v in g[1:]]
    assert EMAX == {"mxfp6_e2m3": 2, "mxfp6_e3m2": 4}


def unit_scale_blocks(fmt, values):
    """Blocks of 32 whose first element (the largest of the format) sets the scale to 1, the
    others `values` (31 per block)."""
    top = GRID[fmt][-1]
    blocks = []
    for i in range(0, len(values), 31):
        part = values[i:i + 31]
        blocks.append([top] + part + [0.0] * (31 - len(part)))
    return torch.tensor(blocks, dtype=torch.float32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_code_every_tie_and_its_neighbours(fmt):
    g = torch.tensor(GRID[fmt], dtype=torch.float32)
    mid = (g[:-1] + g[1:]) / 2                                  # the ties (exact in float32)
    vals = torch.cat([g, mid, torch.nextafter(mid, g[1:]), torch.nextafter(mid, g[:-1])])
    vals = torch.cat([vals, -vals]).tolist()
    x = unit_scale_blocks(fmt, vals)
    y = ops.fake_quantize_mx(x, fmt)
    assert_bits_equal(y, reference(x, fmt))
    # the ties go to the even code: codes 0-1 to 0, codes 1-2 to 2, codes 30-31 to 30
    def out(i):  # the output of vals[i]
        return y[i // 31, i % 31 + 1].item()
    assert (out(32), out(33), out(32 + 30)) == (0.0, GRID[fmt][2], GRID[fmt][30])


@pytest.mark.parametrize("fmt", FORMATS)
def test_max_beyond_max_zeros_nan_inf(fmt):
    top = GRID[fmt][-1]
    # amax in [2^emax, 2^(emax+1)): scale 1; top < v < 2^(emax+1) saturates to top
    beyond = [top, math.nextafter(top, 99.0), 2.0 ** (EMAX[fmt] + 1) - 1e-3, -2.0 ** EMAX[fmt]]
    x = torch.tensor([beyond + [0.0] * 28,
                      [0.0] * 32,                                  # an all-zero block
                      [-0.0, 1.0, -1.0] + [0.0] * 29,              # -0 kept
                      [math.nan, 1.0] + [2.0] * 30,                # a NaN block
                      [math.inf, 1.0, -3e38] + [0.5] * 29,         # an infinite element
                      [1e-40, -3e-39] + [0.0] * 30,                # float32 subnormals: 2^-127
                      [3e38, -1e38] + [1e30] * 30])                # near float32's max
    y = ops.fake_quantize_mx(x, fmt)
    assert_bits_equal(y, reference(x, fmt))
    assert y[0, :3].tolist() == [top, top, top] and y[0, 3].item() == -2.0 ** EMAX[fmt]
    assert torch.isnan(y[3]).all()
    assert y[4, 0].item() == math.inf and y[4, 1].item() == 0.0
    assert y[2, 0].item() == 0.0 and math.copysign(1.0, y[2, 0].item()) == -1.0


def random_data(shape, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    # blocks of very different magnitudes
    x = x * torch.exp2(torch.randint(-60, 60, shape[:-1] + (1,), generator=g)).double()
    flat = x.view(-1)
    flat[5] = 0.0
    flat[7] = -0.0
    return x.to(dtype)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("block,axis", [(32, -1), (16, -1), (32, 0), (7, 1)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_random_blocks_match_the_reference(fmt, block, axis, dtype, layout):
    x = random_data((6, 70), seed=block + axis, dtype=dtype)   # 70: a short last block
    if layout == "transposed":
        x = x.t().contiguous().t()
    elif layout == "sliced":
        big = torch.zeros(6, 140, dtype=dtype)
        big[:, ::2] = x
        x = big[:, ::2]
    y = ops.fake_quantize_mx(x, fmt, block, axis)
    assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
    assert_bits_equal(y, reference(x, fmt, block, axis))


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_blocks_match_torchao(fmt):
    """torchao 0.18's to_mx(x, fp6, 32, FLOOR) then to_dtype: the same bits (blocks whose amax
    is below 2^(-127 + emax_elem) are left out: torchao halves them, test_mx_ops.py says why)."""
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    elem = {"mxfp6_e2m3": "fp6_e2m3", "mxfp6_e3m2": "fp6_e3m2"}[fmt]
    x = random_data((64, 256), seed=11, dtype=torch.float32)
    scale, data = mx.to_mx(x, elem, 32, ScaleCalculationMode.FLOOR)
    want = mx.to_dtype(data, scale, elem, 32, torch.float32).reshape(x.shape)
    assert_bits_equal(ops.fake_quantize_mx(x, fmt), want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_gradient_is_straight_through(fmt):
    x = random_data((4, 64), seed=3, dtype=torch.float32).requires_grad_()
    dy = torch.randn(4, 64, generator=torch.Generator().manual_seed(4))
    ops.fake_quantize_mx(x, fmt).backward(dy)
    assert torch.equal(x.grad, dy)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fake_kernel(fmt):
    torch.library.opcheck(ops.fake_quantize_mx.default,
                          (torch.randn(4, 64, requires_grad=True), fmt, 32, -1))
    with torch._subclasses.fake_tensor.FakeTensorMode():
        y = ops.fake_quantize_mx(torch.empty(3, 64), fmt)
    assert y.shape == (3, 64)


@pytest.mark.parametrize("fmt,qmax", [("mxfp6_e3m2", 28), ("mxfp6_e2m3", 7)])
def test_scheme(fmt, qmax):
    s = QuantizeScheme(dtype=fmt)
    assert s.bit == 6 and s.is_float and QuantizeScheme(dtype=fmt, bit=6) == s
    p = s.to_observer_params()
    # torch has no FP6 dtype: the observer's dtype is the format's name; the range is integer
    assert (p["quant_min"], p["quant_max"], p["dtype"], p["format"]) == (-qmax, qmax, fmt, fmt)
    assert QuantizeScheme.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match=r"per_channel does not apply to dtype"):
        QuantizeScheme(dtype=fmt, per_channel=True)
    with pytest.raises(ValueError, match=r"bit \(4\) does not apply.*6 bits wide"):
        QuantizeScheme(dtype=fmt, bit=4)
    # the C++ registry (src/scheme.cpp) takes the scheme and checks it the same way
    spec = dict(_C.get_backend("Tensorrt"), params_of="", order=999)
    with pytest.raises(ValueError, match="per_channel does not apply to dtype"):
        _C.register_backend(dict(spec, name=f"BadChip_{fmt}", w_qscheme=dict(
            s.to_dict(), per_channel=True)))
    _C.register_backend(dict(spec, name=f"Chip_{fmt}", w_qscheme=s.to_dict()))
    assert QuantizeScheme.from_dict(_C.get_backend(f"Chip_{fmt}")["w_qscheme"]) == s


@pytest.mark.parametrize("fmt", FORMATS)
def test_module_is_the_op(fmt):
    fq = MXFakeQuantize(MinMaxObserver, **QuantizeScheme(dtype=fmt).to_observer_params())
    assert fq.format == fmt and fq.bitwidth == 6 and fq.block_size == 32
    w = torch.randn(8, 64)
    fq.disable_observer()
    assert torch.equal(fq(w), ops.fake_quantize_mx(w, fmt, 32, -1))
    conv_w = torch.randn(4, 64, 3, 3)  # blocks along the input channels (axis 1)
    assert torch.equal(fq(conv_w), ops.fake_quantize_mx(conv_w, fmt, 32, 1))
    fq.disable_fake_quant()
    assert torch.equal(fq(w), w)


@pytest.mark.parametrize("fmt,qmax", [("mxfp6_e3m2", 28), ("mxfp6_e2m3", 7)])
def test_module_takes_the_format_from_a_dtype_name_alone(fmt, qmax):
    """Observer arguments naming the format by ``dtype`` only (no ``format``) run that format,
    never another one silently; an unknown name is refused."""
    fq = MXFakeQuantize(MinMaxObserver, dtype=fmt)
    assert (fq.format, fq.quant_max) == (fmt, qmax)
    fq.disable_observer()
    w = torch.randn(8, 64)
    assert torch.equal(fq(w), ops.fake_quantize_mx(w, fmt, 32, -1))
    with pytest.raises(ValueError, match="got format 'mxfp6'"):
        MXFakeQuantize(MinMaxObserver, dtype="mxfp6")


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 64), nn.Linear(64, 32)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _prepared(backend, w_dtype, a_dtype):
    torch.manual_seed(0)
    extra = {"w_qscheme": {"dtype": w_dtype}, "a_qscheme": {"dtype": a_dtype}}
    if backend == BackendType.Academic:  # no defaults: MQBench's names, given their twins
        extra.update(w_fakequantize="FixedFakeQuantize", a_fakequantize="LearnableFakeQuantize",
                     w_observer="MinMaxObserver", a_observer="EMAMinMaxObserver")
    return prepare_by_platform(_Mlp().eval(), backend, {"extra_qconfig_dict": extra})


@pytest.mark.parametrize("backend", ["Tensorrt", "QDQ", "Academic"])
@pytest.mark.parametrize("w_dtype,a_dtype", [("mxfp6_e2m3", "mxfp8_e4m3"),
                                             ("mxfp6_e3m2", "mxfp6_e2m3")])
def test_prepare_by_platform(backend, w_dtype, a_dtype):
    prepared = _prepared(getattr(BackendType, backend), w_dtype, a_dtype)
    wfq = prepared.fc1.weight_fake_quant
    assert type(wfq) is MXFakeQuantize and wfq.format == w_dtype and wfq.bitwidth == 6
    afqs = [m for n, m in prepared.named_modules() if n.endswith("post_act_fake_quantizer")]
    assert afqs and all(type(m) is MXFakeQuantize and m.format == a_dtype for m in afqs)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(7))
    enable_calibration(prepared)
    prepared(x)
    enable_quantization(prepared)
    y = prepared(x)
    w = prepared.fc1.weight
    assert torch.equal(wfq(w), ops.fake_quantize_mx(w, w_dtype, 32, -1))
    y.sum().backward()
    assert prepared.fc1.weight.grad.abs().sum() > 0


def _refusal(what, fmt):
    return onnx_mx.NO_FP6_EXPORT.format(what=what, fmt=fmt)


class _Op(nn.Module):
    def __init__(self, fmt):
        super().__init__()
        self.fmt = fmt

    def forward(self, x):
        return ops.fake_quantize_mx(x, self.fmt, 32, -1)


@pytest.mark.filterwarnings("ignore:Exporting to ONNX opset version")
@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("export", ["qdq", "mqbench"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_onnx_export_is_refused_with_the_reason(fmt, export, dynamo):
    if dynamo:
        pytest.importorskip("onnxscript")
    want = _refusal("fake_quantize_mx", fmt)
    assert "FLOAT6E2M3, FLOAT6E3M2" in want and "opset 28" in want and "MXFP8" in want
    with pytest.raises(ValueError) as info:
        with export_format(export):
            export_onnx(_Op(fmt).eval(), (torch.randn(2, 64),), io.BytesIO(), opset_version=23,
                        dynamo=dynamo)
    assert want in str(info.value)


@pytest.mark.parametrize("backend", ["Tensorrt", "QDQ", "Academic"])
def test_convert_deploy_is_refused_before_any_file(backend, tmp_path):
    prepared = _prepared(BackendType.Tensorrt, "mxfp6_e2m3", "mxfp8_e4m3")
    with pytest.raises(ValueError) as info:
        convert_deploy(prepared, getattr(BackendType, backend), {"x": [16, 64]},
                       output_path=str(tmp_path))
    assert str(info.value) == _refusal("fake quantizer 'fc1.weight_fake_quant'", "mxfp6_e2m3")
    assert os.listdir(tmp_path) == []
