"""FP8 fake quantization (E4M3FN, E5M2) against torch's own float8 casts, bit for bit:
x / s -> (E4M3FN: clamp to +-448) -> .to(torch.float8_*) -> back -> * s, on random and edge-case
values; the straight-through and learnable-scale (LSQ) gradients against autograd of the same
reference written with torch ops."""
import math

import pytest
import torch

import mqbench  # noqa: F401

ops = torch.ops.mqbench

FORMATS = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}


def _scale_view(scale, x, ch_axis):
    if ch_axis is None:
        return scale.reshape(())
    shape = [1] * x.dim()
    shape[ch_axis] = -1
    return scale.reshape(shape)


def reference(x, scale, ch_axis, dtype):
    """torch's casts: E4M3FN saturates first (torch's own cast gives NaN at |v| >= 464); E5M2
    is the plain cast (overflow to +-inf)."""
    fp8, m = FORMATS[dtype]
    s = _scale_view(scale, x, ch_axis).to(x.dtype)
    v = x / s
    if dtype == "fp8_e4m3":
        v = v.clamp(-m, m)
    return v.to(fp8).to(x.dtype) * s


def assert_bits_equal(out, ref):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(out), nan)
    itype = torch.int32 if out.dtype == torch.float32 else torch.int64
    a, b = out.contiguous().view(itype), ref.contiguous().view(itype)
    bad = (a != b) & ~nan
    assert not bad.any(), (out[bad][:8], ref[bad][:8])


def edge_values(dtype):
    """Subnormals, the smallest normal, ties between neighbours, +-max and just above, the
    overflow threshold, float32 subnormals, huge values, +-0, +-inf, NaN (in FP8 units)."""
    fp8, m = FORMATS[dtype]
    finfo = torch.finfo(fp8)
    sub = finfo.smallest_normal * 2.0 ** -(3 if dtype == "fp8_e4m3" else 2)  # subnormal step
    vals = [0.0, -0.0, sub, -sub, sub / 2, sub * 1.5, sub * 2.5, sub / 2 * 0.999, sub / 2 * 1.001,
            finfo.smallest_normal, finfo.smallest_normal * (1 - 2 ** -10), 1.0, 1.0625, 1.1875,
            -1.0625, 3.0 + 1 / 8, m, -m, m * 1.01, m * 1.03, m * 1.04, m * 1.0715, m * 1.1,
            m * 1.2, -m * 1.5, 1e-40, -1e-40, 1e30, -1e30, 3.4e38, math.inf, -math.inf,
            math.nan, 2.0 ** -20, 2.0 ** -17, 100.5, 96.0 + 4.0, 240.0 + 8.0]
    # every FP8 value and every midpoint between neighbours (exact ties)
    grid = torch.arange(256, dtype=torch.uint8).view(fp8).float()
    grid = grid[torch.isfinite(grid)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    return torch.cat([torch.tensor(vals), grid, mids, mids.nextafter(torch.tensor(math.inf)),
                      mids.nextafter(torch.tensor(-math.inf))])


@pytest.mark.parametrize("dtype", list(FORMATS))
@pytest.mark.parametrize("xdtype", [torch.float32, torch.float64])
def test_edge_values_bit_exact(device, dtype, xdtype):
    v = edge_values(dtype)
    for s in (1.0, 0.5, 0.0173, 3.0):
        x = (v.to(xdtype) * s).to(device)
        out = ops.fake_quantize_fp8(x, torch.tensor([s], device=device), None, dtype)
        assert_bits_equal(out.cpu(), reference(x.cpu(), torch.tensor([s]), None, dtype))


def test_what_happens_at_the_edges():
    """Documented behaviour (docs/formats.md): E4M3FN saturates (inf -> 448, 500 -> 448),
    E5M2 overflows to inf at 61440 and keeps inf; NaN stays NaN; -0 stays -0."""
    one = torch.tensor([1.0])
    x = torch.tensor([math.inf, -math.inf, 500.0, -470.0, math.nan, -0.0, 61439.0, 61440.0])
    e4 = ops.fake_quantize_fp8(x, one, None, "fp8_e4m3")
    assert e4[:4].tolist() == [448.0, -448.0, 448.0, -448.0]
    assert math.isnan(e4[4]) and math.copysign(1.0, e4[5]) == -1.0
    e5 = ops.fake_quantize_fp8(x, one, None, "fp8_e5m2")
    assert e5[:2].tolist() == [math.inf, -math.inf]
    assert e5[6:].tolist() == [57344.0, math.inf]
    assert math.isnan(e5[4])


@pytest.mark.parametrize("dtype", list(FORMATS))
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "channels_last"])
def test_random_per_tensor_and_per_channel(device, dtype, layout):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, 7, 9, generator=g) * torch.logspace(-6, 6, 9)
    if layout == "transposed":
        x = x.transpose(1, 3).contiguous().transpose(1, 3)
    elif layout == "sliced":
        x = torch.randn(4, 6, 7, 18, generator=g)[..., ::2] * 100
    elif layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    x = x.to(device)
    s = torch.tensor([0.37])
    out = ops.fake_quantize_fp8(x, s.to(device), None, dtype)
    assert_bits_equal(out.cpu(), reference(x.cpu(), s, None, dtype))
    for axis in (0, 1, 3, -1):
        sc = torch.rand(x.shape[axis], generator=g) * 0.1 + 1e-3
        out = ops.fake_quantize_fp8(x, sc.to(device), axis, dtype)
        assert_bits_equal(out.cpu(), reference(x.cpu(), sc, axis % x.dim(), dtype))


@pytest.mark.parametrize("dtype", list(FORMATS))
def test_ste_backward(device, dtype):
    _, m = FORMATS[dtype]
    x = torch.tensor([0.5, -3.0, m * 0.9, m * 1.2, -m * 2, math.inf, math.nan, 0.0]) * 0.25
    x = x.to(device).requires_grad_()
    s = torch.tensor([0.25], device=device)
    ops.fake_quantize_fp8(x, s, None, dtype).backward(torch.arange(1.0, 9.0, device=device))
    assert x.grad.cpu().tolist() == [1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 8.0]


def lsq_reference(x, scale, ch_axis, dtype, g):
    """LSQ on the FP8 grid with torch ops: grad-scaled s, clamp, STE through the cast."""
    fp8, m = FORMATS[dtype]
    s = scale * g + (scale - scale * g).detach()
    s = _scale_view(s, x, ch_axis).to(x.dtype)
    r = (x / s).clamp(-m, m)
    q = r + (r.to(fp8).to(x.dtype) - r).detach()
    return q * s


@pytest.mark.parametrize("dtype", list(FORMATS))
@pytest.mark.parametrize("ch_axis", [None, 1])
@pytest.mark.parametrize("xdtype", [torch.float32, torch.float64])
def test_learnable_gradients_match_the_lsq_reference(device, dtype, ch_axis, xdtype):
    _, m = FORMATS[dtype]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 4, 6, generator=gen, dtype=xdtype) * 3
    x[0, 0, :3] = torch.tensor([m, -m * 1.5, m * 1.05], dtype=xdtype) * 0.05  # saturated
    n = 1 if ch_axis is None else 4
    scale = torch.rand(n, generator=gen) * 0.04 + 0.01
    dy = torch.randn(x.shape, generator=gen, dtype=xdtype)
    xa = x.clone().to(device).requires_grad_()
    sa = scale.clone().to(device).requires_grad_()
    out = ops.fake_quantize_learnable_fp8(xa, sa, ch_axis, dtype, 0.3)
    out.backward(dy.to(device))
    xr, sr = x.clone().requires_grad_(), scale.clone().requires_grad_()
    ref = lsq_reference(xr, sr, ch_axis, dtype, 0.3)
    ref.backward(dy)
    assert_bits_equal(out.detach().cpu(), reference(x, scale, ch_axis, dtype))
    mask = (x / _scale_view(scale, x, ch_axis).to(xdtype)).abs() <= m
    assert torch.equal(xa.grad.cpu(), dy * mask)
    torch.testing.assert_close(sa.grad.cpu(), sr.grad, rtol=1e-4, atol=1e-5)


def test_nan_input_gives_no_scale_gradient():
    x = torch.tensor([1.0, math.nan, 2.0], requires_grad=True)
    s = torch.tensor([0.1], requires_grad=True)
    ops.fake_quantize_learnable_fp8(x, s, None, "fp8_e4m3", 1.0).sum().backward()
    assert torch.isfinite(s.grad).all()


def test_errors_name_the_argument():
    x = torch.randn(4, 3)
    with pytest.raises(RuntimeError, match="dtype must be 'fp8_e4m3' or 'fp8_e5m2', got 'e3m4'"):
        ops.fake_quantize_fp8(x, torch.tensor([1.0]), None, "e3m4")
    with pytest.raises(RuntimeError, match="scale has 2 elements but x.size\\(1\\) is 3"):
        ops.fake_quantize_fp8(x, torch.tensor([1.0, 2.0]), 1, "fp8_e4m3")
    with pytest.raises(RuntimeError, match="positive and finite"):
        ops.fake_quantize_fp8(x, torch.tensor([0.0]), None, "fp8_e4m3")


def test_meta_shapes():
    x = torch.empty(2, 3, 4, device="meta")
    out = ops.fake_quantize_fp8(x, torch.empty(3, device="meta"), 1, "fp8_e5m2")
    assert out.shape == x.shape and out.device.type == "meta"
