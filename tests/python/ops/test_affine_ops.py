"""Fixed and learnable affine ops against the spec's formulas (exactly) and torch's built-in
fake-quant ops (within reference.TORCH_RTOL / TORCH_ATOL)."""
import itertools

import pytest
import torch

import mqbench
from reference import assert_matches_torch, fake_quant_affine

ops = torch.ops.mqbench

RANGES = [(-128, 127), (0, 255), (-127, 127), (0, 15), (-8, 7), (0, 65535)]


def make_inputs(shape, dtype, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    if layout == "contiguous":
        return torch.randn(shape, generator=g, dtype=dtype) * 3
    if layout == "transposed":
        return (torch.randn(tuple(reversed(shape)), generator=g, dtype=dtype) * 3).permute(
            *reversed(range(len(shape))))
    if layout == "sliced":
        big = torch.randn(shape[:-1] + (shape[-1] * 2,), generator=g, dtype=dtype) * 3
        return big[..., ::2]
    if layout == "channels_last":
        return (torch.randn(shape, generator=g, dtype=dtype) * 3).contiguous(
            memory_format=torch.channels_last)
    raise ValueError(layout)


LAYOUTS = ["contiguous", "transposed", "sliced", "channels_last"]


def test_library_loaded():
    assert mqbench._C.cpu_capability() in ("avx2", "default")
    assert hasattr(ops, "fake_quantize_per_tensor_affine")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("qrange", RANGES)
def test_per_tensor_forward_bit_exact(dtype, layout, qrange):
    qmin, qmax = qrange
    x = make_inputs((2, 3, 17, 9), dtype, layout)
    zp = (qmin + qmax) // 3
    for s in [0.0173, 0.5, 1e-3, 3.0]:
        ref = fake_quant_affine(x, s, zp, qmin, qmax)
        for zp_dtype in (torch.int32, torch.int64):
            out = ops.fake_quantize_per_tensor_affine(
                x, torch.tensor([s]), torch.tensor([zp], dtype=zp_dtype), qmin, qmax)
            assert out.dtype == dtype and out.shape == x.shape
            assert torch.equal(out, ref), (s, zp_dtype)
        # 0-dim qparams are accepted too.
        out = ops.fake_quantize_per_tensor_affine(x, torch.tensor(s), torch.tensor(zp), qmin, qmax)
        assert torch.equal(out, ref)
        assert_matches_torch(out, torch.fake_quantize_per_tensor_affine(x, s, zp, qmin, qmax))


def test_per_tensor_ties_and_bounds():
    # With s = 0.5, x / s lands exactly on .5 ties: half to even, as torch.
    x = torch.arange(-140, 140, dtype=torch.float32) * 0.25
    for qmin, qmax in [(-128, 127), (0, 255), (-5, 5)]:
        out = ops.fake_quantize_per_tensor_affine(x, torch.tensor([0.5]), torch.tensor([0]), qmin, qmax)
        assert torch.equal(out, fake_quant_affine(x, 0.5, 0, qmin, qmax))
        assert torch.equal(out, torch.fake_quantize_per_tensor_affine(x, 0.5, 0, qmin, qmax))
    # Values exactly at the clamp bounds keep their gradient; just outside do not.
    x = torch.tensor([-64.0, -64.5, 63.5, 63.0, 64.0], requires_grad=True)
    ops.fake_quantize_per_tensor_affine(x, torch.tensor([0.5]), torch.tensor([0]), -128, 127).sum().backward()
    assert x.grad.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0]


def ambiguous_ties(k, n=4096, seed=0):
    """Scales s and inputs x = k * s (k a .5 tie) where float32 x / s and x * (1 / s) round to
    different integers (about one random scale in four). The case of the issue tracker: s =
    0.05062566, x = -0.37969244, x / s = -7.5 but x * (1 / s) = -7.4999995."""
    g = torch.Generator().manual_seed(seed)
    s = torch.rand(n * 8, generator=g) * 0.1 + 1e-3
    x = torch.full_like(s, k) * s
    differ = torch.round(x / s) != torch.round(x * (1.0 / s))
    return x[differ][:n], s[differ][:n]


@pytest.mark.parametrize("k", [-7.5, -2.5, 1.5, 3.5, 6.5])
def test_ambiguous_ties_round_as_torch_in_every_affine_path(k):
    # torch's fake-quant ops (which MQBench calls) multiply by the reciprocal scale: ours must
    # agree bit for bit on the inputs where dividing would round the other way.
    x, s = ambiguous_ties(k)
    assert x.numel() > 500
    zi = torch.zeros_like(s, dtype=torch.int32)
    zf = torch.zeros_like(s)
    col = x.reshape(-1, 1)
    assert torch.equal(ops.fake_quantize_per_channel_affine(col, s, zi, 0, -8, 7),
                       torch.fake_quantize_per_channel_affine(col, s, zi, 0, -8, 7))
    assert torch.equal(
        ops.fake_quantize_learnable_per_channel_affine(col, s, zf, 0, -8, 7, 1.0),
        torch._fake_quantize_learnable_per_channel_affine(col, s, zf, 0, -8, 7))
    for i in range(0, x.numel(), 97):
        xi, si = x[i:i + 1], s[i:i + 1]
        assert torch.equal(ops.fake_quantize_per_tensor_affine(xi, si, zi[:1], -8, 7),
                           torch.fake_quantize_per_tensor_affine(xi, si.item(), 0, -8, 7))
        assert torch.equal(
            ops.fake_quantize_learnable_per_tensor_affine(xi, si, zf[:1], -8, 7, 1.0),
            torch._fake_quantize_learnable_per_tensor_affine(xi, si, zf[:1], -8, 7))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("ch_axis", [0, 1, 3, -1])
def test_per_channel_forward_bit_exact(dtype, layout, ch_axis):
    x = make_inputs((4, 6, 5, 7), dtype, layout, seed=1)
    axis = ch_axis % x.dim()
    c = x.shape[axis]
    g = torch.Generator().manual_seed(2)
    scale = torch.rand(c, generator=g) * 0.05 + 0.005
    for qmin, qmax in [(-128, 127), (0, 255), (0, 15)]:
        zp = torch.randint(qmin, qmax + 1, (c,), generator=g, dtype=torch.int32)
        out = ops.fake_quantize_per_channel_affine(x, scale, zp, ch_axis, qmin, qmax)
        assert torch.equal(out, fake_quant_affine(x, scale, zp, qmin, qmax, ch_axis=axis))
        assert_matches_torch(out, torch.fake_quantize_per_channel_affine(x, scale, zp, axis, qmin, qmax))
        # Floating zero points follow torch's float-zero-point formula round(x/s + z).
        zpf = zp.float() + 0.3
        out = ops.fake_quantize_per_channel_affine(x, scale, zpf, ch_axis, qmin, qmax)
        assert torch.equal(out, fake_quant_affine(x, scale, zpf, qmin, qmax, ch_axis=axis, float_zp=True))
        assert_matches_torch(out, torch.fake_quantize_per_channel_affine(x, scale, zpf, axis, qmin, qmax))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fixed_backward_matches_torch(layout):
    x = make_inputs((3, 4, 8, 8), torch.float32, layout, seed=3).requires_grad_()
    dy = torch.randn(x.shape)
    x_ref = x.detach().clone().requires_grad_()
    ops.fake_quantize_per_tensor_affine(x, torch.tensor([0.02]), torch.tensor([3]), -20, 100).backward(dy)
    torch.fake_quantize_per_tensor_affine(x_ref, 0.02, 3, -20, 100).backward(dy)
    assert torch.equal(x.grad, x_ref.grad)

    x.grad = None
    x_ref.grad = None
    scale = torch.rand(4) * 0.05 + 0.01
    zp = torch.tensor([0, 5, 10, 20], dtype=torch.int32)
    ops.fake_quantize_per_channel_affine(x, scale, zp, 1, 0, 63).backward(dy)
    torch.fake_quantize_per_channel_affine(x_ref, scale, zp, 1, 0, 63).backward(dy)
    assert torch.equal(x.grad, x_ref.grad)


def learnable_pair(x, scale, zp, per_channel, qmin, qmax, g, dy):
    leaves = [t.detach().clone().requires_grad_() for t in (x, scale, zp)]
    refs = [t.detach().clone().requires_grad_() for t in (x, scale, zp)]
    if per_channel:
        out = ops.fake_quantize_learnable_per_channel_affine(*leaves, 1, qmin, qmax, g)
        ref = torch._fake_quantize_learnable_per_channel_affine(*refs, 1, qmin, qmax, g)
    else:
        out = ops.fake_quantize_learnable_per_tensor_affine(*leaves, qmin, qmax, g)
        ref = torch._fake_quantize_learnable_per_tensor_affine(*refs, qmin, qmax, g)
    out.backward(dy)
    ref.backward(dy)
    return out, ref, leaves, refs


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("qrange", [(-128, 127), (0, 255), (0, 15), (-127, 127)])
def test_learnable_forward_and_gradients_match_torch(per_channel, layout, qrange):
    qmin, qmax = qrange
    x = make_inputs((4, 5, 12, 10), torch.float32, layout, seed=4)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    c = x.shape[1] if per_channel else 1
    scale = torch.linspace(0.01, 0.04, c)
    # Non-negative z: torch's per-tensor backward rounds z with trunc(z + 0.5), which differs from
    # its forward's nearbyint(z) for negative z (see test_learnable_negative_zero_point).
    zp = torch.linspace(max(qmin, 0), qmax / 2, c).round() + 0.2
    g = 1.0 / (x.numel() * qmax) ** 0.5
    out, ref, leaves, refs = learnable_pair(x, scale, zp, per_channel, qmin, qmax, g, dy)
    assert torch.equal(out, ref)
    assert torch.equal(leaves[0].grad, refs[0].grad)
    torch.testing.assert_close(leaves[1].grad, refs[1].grad, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(leaves[2].grad, refs[2].grad, rtol=1e-4, atol=1e-7)


def test_learnable_negative_zero_point_uses_one_rounding():
    # z = -127.8 rounds to z' = -128 in forward and backward alike, so x receives a gradient
    # exactly where the forward output is not clamped (torch's per-tensor backward uses -127
    # there: docs/compatibility.md).
    x = (torch.randn(5000, generator=torch.Generator().manual_seed(11)) * 2).requires_grad_()
    s = torch.tensor([0.01], requires_grad=True)
    z = torch.tensor([-127.8], requires_grad=True)
    y = ops.fake_quantize_learnable_per_tensor_affine(x, s, z, -128, 127, 1.0)
    y.sum().backward()
    q = (x.detach() * float(torch.tensor(1 / 0.01, dtype=torch.float32))).round() - 128
    inside = (q >= -128) & (q <= 127)
    assert torch.equal(x.grad, inside.float())
    assert torch.equal(y, torch.fake_quantize_per_tensor_affine(x.detach(), 0.01, -128, -128, 127))


def test_learnable_reduced_gradients_over_many_elements():
    # 4M elements: the in-kernel reduction must stay accurate (double accumulators).
    x = torch.randn(4 * 1024 * 1024, generator=torch.Generator().manual_seed(6)) * 2
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(7))
    scale, zp = torch.tensor([0.02]), torch.tensor([10.0])
    out, ref, leaves, refs = learnable_pair(x, scale, zp, False, 0, 255, 1.0, dy)
    exact = ((torch.fake_quantize_per_tensor_affine(x.double(), 0.02, 10, 0, 255) - x.double()) / 0.02)
    inside = (x.double() / 0.02).round() + 10
    inside = (inside >= 0) & (inside <= 255)
    d_scale_exact = (dy.double() * torch.where(inside, exact, torch.where(
        (x.double() / 0.02).round() + 10 < 0, torch.tensor(-10.0, dtype=torch.float64),
        torch.tensor(245.0, dtype=torch.float64)))).sum()
    # Ours is at least as close to the float64 value as torch's float32 sum.
    assert abs(leaves[1].grad.double().item() - d_scale_exact.item()) <= \
        abs(refs[1].grad.double().item() - d_scale_exact.item()) + 1e-3 * abs(d_scale_exact.item())
    torch.testing.assert_close(leaves[1].grad, refs[1].grad, rtol=1e-4, atol=1e-3)


def test_double_input_learnable_gradients_use_float64():
    x = torch.randn(64, 8, dtype=torch.float64, requires_grad=True)
    s = torch.tensor([0.05], dtype=torch.float64, requires_grad=True)
    z = torch.tensor([2.0], dtype=torch.float64, requires_grad=True)
    y = ops.fake_quantize_learnable_per_tensor_affine(x, s, z, -8, 7, 0.5)
    y.backward(torch.ones_like(y))
    assert x.grad.dtype == s.grad.dtype == z.grad.dtype == torch.float64
    # Reference gradients from the LSQ formula.
    q = (x.detach() * float(torch.tensor(1 / 0.05, dtype=torch.float32))).round() + 2
    below, above = q < -8, q > 7
    xfq = (q.clamp(-8, 7) - 2) * 0.05
    ds = torch.where(below, torch.full_like(q, -10.0), torch.where(above, torch.full_like(q, 5.0),
                     (xfq - x.detach()) * float(torch.tensor(1 / 0.05, dtype=torch.float32))))
    torch.testing.assert_close(s.grad, (ds * 0.5).sum().reshape(1))
    dz = torch.where(below | above, torch.full_like(q, -0.05 * 0.5), torch.zeros_like(q)).sum()
    torch.testing.assert_close(z.grad, dz.reshape(1))


def test_nan_and_inf_inputs():
    # Documented difference from torch (docs/compatibility.md): NaN propagates and +-inf
    # saturate; torch maps all three to the qmin level.
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0], requires_grad=True)
    s, z = torch.tensor([0.1]), torch.tensor([0])
    y = ops.fake_quantize_per_tensor_affine(x, s, z, -128, 127)
    assert torch.isnan(y[0])
    assert y[1].item() == pytest.approx(12.7) and y[2].item() == pytest.approx(-12.8)
    y.sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.0, 1.0]
    sl, zl = torch.tensor([0.1], requires_grad=True), torch.tensor([0.0], requires_grad=True)
    yl = ops.fake_quantize_learnable_per_tensor_affine(x.detach()[1:], sl, zl, -128, 127, 1.0)
    yl.sum().backward()
    assert torch.isfinite(sl.grad).all() and torch.isfinite(zl.grad).all()


def test_empty_and_zero_dim_tensors():
    s, z = torch.tensor([0.1]), torch.tensor([0])
    x0 = torch.tensor(0.26, requires_grad=True)
    y0 = ops.fake_quantize_per_tensor_affine(x0, s, z, -128, 127)
    assert y0.shape == () and y0.item() == pytest.approx(0.3)
    y0.backward()
    assert x0.grad.item() == 1.0
    e = torch.empty(0, 3, requires_grad=True)
    assert ops.fake_quantize_per_tensor_affine(e, s, z, -128, 127).shape == (0, 3)
    ye = ops.fake_quantize_per_channel_affine(e, torch.ones(3), torch.zeros(3), 1, 0, 255)
    assert ye.shape == (0, 3)
    sl = torch.ones(3, requires_grad=True)
    zl = torch.zeros(3, requires_grad=True)
    ops.fake_quantize_learnable_per_channel_affine(e, sl, zl, 1, 0, 255, 1.0).sum().backward()
    assert sl.grad.tolist() == [0.0, 0.0, 0.0]


def test_torchscript_calls_the_ops():
    @torch.jit.script
    def fq(x: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return torch.ops.mqbench.fake_quantize_per_tensor_affine(x, s, z, -128, 127)

    x = torch.randn(100)
    assert torch.equal(fq(x, torch.tensor([0.05]), torch.tensor([0])),
                       torch.fake_quantize_per_tensor_affine(x, 0.05, 0, -128, 127))


def test_multithreaded_results_equal_single_threaded():
    x = torch.randn(3_000_000, generator=torch.Generator().manual_seed(8))
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(9))
    old = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            xs = x.clone().requires_grad_()
            s = torch.tensor([0.03], requires_grad=True)
            z = torch.tensor([0.0], requires_grad=True)
            y = ops.fake_quantize_learnable_per_tensor_affine(xs, s, z, -128, 127, 1.0)
            y.backward(dy)
            results.append((y.detach(), xs.grad, s.grad))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
    # The split into runs depends on the thread count, so float partial sums group differently
    # before their double flush: equal to ~1e-6 relative, not bit for bit.
    torch.testing.assert_close(results[0][2], results[1][2], rtol=1e-5, atol=0)


def test_all_ops_registered():
    names = {
        "fake_quantize_per_tensor_affine", "fake_quantize_per_channel_affine",
        "fake_quantize_learnable_per_tensor_affine", "fake_quantize_learnable_per_channel_affine",
        "fake_quantize_pact", "dorefa_normalize", "fake_quantize_dsq_per_tensor",
        "fake_quantize_dsq_per_channel", "fake_quantize_tqt", "fake_quantize_nnie",
        "fake_quantize_adaround_per_tensor", "fake_quantize_adaround_per_channel",
        "fake_quantize_qdrop_per_tensor", "fake_quantize_qdrop_per_channel", "pot_quantization",
    }
    for name in names:
        assert getattr(ops, name) is not None, name


BAD_CASES = [
    (lambda: ops.fake_quantize_per_tensor_affine(torch.randn(4), torch.tensor([0.0]), torch.tensor([0]), 0, 255),
     "scale must be positive and finite, got scale[0] = 0"),
    (lambda: ops.fake_quantize_per_tensor_affine(torch.randn(4), torch.tensor([-0.5]), torch.tensor([0]), 0, 255),
     "scale must be positive and finite, got scale[0] = -0.5"),
    (lambda: ops.fake_quantize_per_tensor_affine(torch.randn(4), torch.tensor([float("nan")]), torch.tensor([0]), 0, 255),
     "scale must be positive and finite, got scale[0] = nan"),
    (lambda: ops.fake_quantize_per_channel_affine(torch.randn(2, 3), torch.tensor([0.1, float("inf"), 0.1]), torch.zeros(3), 1, 0, 255),
     "scale must be positive and finite, got scale[1] = inf"),
    # Subnormal: 1/scale overflows and x = 0 became NaN (torch's op returns -1.28e-38 for 0).
    (lambda: ops.fake_quantize_per_tensor_affine(torch.zeros(4), torch.tensor([1e-40]), torch.tensor([0]), -128, 127),
     "is below float32's smallest normal number (1.17549e-38): its reciprocal overflows"),
    (lambda: ops.fake_quantize_learnable_per_channel_affine(torch.zeros(2, 3), torch.tensor([0.1, 0.1, 2.0 ** -130]), torch.zeros(3), 1, -128, 127, 1.0),
     "scale[2] = 7.34684e-40 is below float32's smallest normal number"),
    (lambda: ops.fake_quantize_per_tensor_affine(torch.randn(4), torch.tensor([0.1]), torch.tensor([0]), 10, 5),
     "quant_min (10) must be <= quant_max (5)"),
    (lambda: ops.fake_quantize_learnable_per_tensor_affine(torch.randn(4), torch.tensor([0.1]), torch.tensor([0.]), 10, 5, 1.0),
     "quant_min (10) must be <= quant_max (5)"),
    (lambda: ops.fake_quantize_per_channel_affine(torch.randn(2, 3), torch.ones(3), torch.zeros(3), 2, 0, 255),
     "ch_axis (2) is out of range for a 2-d input (valid: -2 to 1)"),
    (lambda: ops.fake_quantize_per_channel_affine(torch.randn(2, 4), torch.ones(3), torch.zeros(4), 1, 0, 255),
     "scale has 3 elements but x.size(1) is 4"),
    (lambda: ops.fake_quantize_learnable_per_channel_affine(torch.randn(2, 4), torch.ones(4), torch.zeros(5), 1, 0, 255, 1.0),
     "zero_point has 5 elements but x.size(1) is 4"),
    (lambda: ops.fake_quantize_per_tensor_affine(torch.randn(4), torch.ones(2), torch.zeros(1), 0, 255),
     "per-tensor scale must have one element, got 2"),
    (lambda: ops.fake_quantize_per_tensor_affine(torch.arange(4), torch.tensor([0.1]), torch.tensor([0]), 0, 255),
     "x must be a float32 or float64 tensor, got dtype Long"),
    (lambda: ops.fake_quantize_per_tensor_affine(torch.ones(4, dtype=torch.bool), torch.tensor([0.1]), torch.tensor([0]), 0, 255),
     "x must be a float32 or float64 tensor, got dtype Bool"),
    (lambda: ops.fake_quantize_per_tensor_affine(torch.randn(4).half(), torch.tensor([0.1]), torch.tensor([0]), 0, 255),
     "x has dtype Half; the CPU kernels compute in float32 or float64: call x.float() first"),
    (lambda: ops.fake_quantize_per_tensor_affine(torch.randn(4), torch.tensor([0.1]), torch.tensor([True]), 0, 255),
     "zero_point must be an integer or floating-point tensor, got dtype Bool"),
    (lambda: ops.fake_quantize_per_tensor_affine(torch.randn(4), torch.tensor([0.1], device="meta"), torch.tensor([0]), 0, 255),
     "scale is on meta but x is on cpu"),
    (lambda: ops.fake_quantize_learnable_per_channel_affine(torch.randn(2, 3), torch.ones(3), torch.zeros(3, device="meta"), 1, 0, 255, 1.0),
     "zero_point is on meta but x is on cpu"),
]


@pytest.mark.parametrize("call,message", BAD_CASES, ids=[m for _, m in BAD_CASES])
def test_bad_input_errors(call, message):
    with pytest.raises(RuntimeError) as info:
        call()
    assert message in str(info.value)
