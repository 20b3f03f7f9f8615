"""PACT, DoReFa, DSQ, TQT, NNIE, AdaRound, QDrop and power-of-two rounding against the
MQBench-style references in reference.py, plus gradcheck where the op is differentiable."""
import math

import pytest
import torch

import reference as ref

ops = torch.ops.mqbench


def randn(*shape, seed=0, scale=1.0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


def grads(fn, *inputs, dy):
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    out.backward(dy)
    return out.detach(), [t.grad for t in leaves]


# ---- PACT ---------------------------------------------------------------------------------

@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_pact_matches_reference(symmetric, layout):
    x = randn(8, 16, 9, seed=1, scale=4)
    if layout == "transposed":
        x = x.transpose(0, 2)
    dy = randn(*x.shape, seed=2)
    alpha = torch.tensor([3.0])
    n_alpha = torch.tensor([-2.5])
    qmin, qmax = (-128, 127) if symmetric else (0, 255)
    lo = -3.0 if symmetric else -2.5
    scale = torch.tensor([(3.0 - lo) / (qmax - qmin)])
    zp = torch.tensor([0 if symmetric else 54])

    def ours(x, a, na):
        return ops.fake_quantize_pact(x, a, -a if symmetric else na, scale, zp, qmin, qmax)

    def theirs(x, a, na):
        return ref.pact(x, a, -a if symmetric else na, scale, zp, qmin, qmax)

    out, g = grads(ours, x, alpha, n_alpha, dy=dy)
    expected, g_ref = grads(theirs, x, alpha, n_alpha, dy=dy)
    assert torch.equal(out, expected)
    assert torch.equal(g[0], g_ref[0])
    torch.testing.assert_close(g[1], g_ref[1], rtol=1e-5, atol=1e-5)
    if not symmetric:
        torch.testing.assert_close(g[2], g_ref[2], rtol=1e-5, atol=1e-5)
    assert g[1].abs().sum() > 0  # some inputs were clipped, so alpha learns


def test_pact_without_lower_clip():
    x = randn(1000, seed=3, scale=3)
    out = ops.fake_quantize_pact(x, torch.tensor([2.0]), torch.tensor([-math.inf]),
                                 torch.tensor([0.05]), torch.tensor([0]), -128, 127)
    expected = torch.fake_quantize_per_tensor_affine(torch.clamp(x, max=2.0), 0.05, 0, -128, 127)
    assert torch.equal(out, expected)


def test_pact_bad_alpha():
    with pytest.raises(RuntimeError, match=r"n_alpha \(3\) must be <= alpha \(1\)"):
        ops.fake_quantize_pact(torch.randn(4), torch.tensor([1.0]), torch.tensor([3.0]),
                               torch.tensor([0.1]), torch.tensor([0]), 0, 255)
    with pytest.raises(RuntimeError, match="alpha must have exactly one element, got 2"):
        ops.fake_quantize_pact(torch.randn(4), torch.ones(2), torch.tensor([0.0]),
                               torch.tensor([0.1]), torch.tensor([0]), 0, 255)
    with pytest.raises(RuntimeError, match="alpha is NaN"):
        ops.fake_quantize_pact(torch.randn(4), torch.tensor([math.nan]), torch.tensor([0.0]),
                               torch.tensor([0.1]), torch.tensor([0]), 0, 255)


# ---- DoReFa -------------------------------------------------------------------------------

def test_dorefa_normalize_matches_reference_and_gradcheck():
    x = randn(6, 5, seed=4, dtype=torch.float64)
    dy = randn(6, 5, seed=5, dtype=torch.float64)
    out, g = grads(ops.dorefa_normalize, x, dy=dy)
    expected, g_ref = grads(ref.dorefa_normalize, x, dy=dy)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(g[0], g_ref[0], rtol=0, atol=0)
    assert torch.autograd.gradcheck(ops.dorefa_normalize, (x.clone().requires_grad_(),))


def test_dorefa_then_fixed_quantization_is_dorefa_fake_quantize():
    w = randn(16, 8, 3, 3, seed=6)
    n = ops.dorefa_normalize(w)
    assert n.abs().max() < 1.0
    y = ops.fake_quantize_per_tensor_affine(n, torch.tensor([2.0 / 255]), torch.tensor([0]), -128, 127)
    assert torch.equal(y, torch.fake_quantize_per_tensor_affine(ref.dorefa_normalize(w), 2.0 / 255, 0, -128, 127))


# ---- DSQ ----------------------------------------------------------------------------------

@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dsq_matches_reference(per_channel, dtype):
    x = randn(4, 6, 10, 10, seed=7, scale=2, dtype=dtype)
    dy = randn(*x.shape, seed=8, dtype=dtype)
    if per_channel:
        scale = torch.linspace(0.02, 0.05, 6)
        zp = torch.tensor([0, 1, 2, 3, 4, 5], dtype=torch.int32)
        s_b, z_b = ref.channel_view(scale, x, 1).to(dtype), ref.channel_view(zp, x, 1).to(dtype)

        def ours(t):
            return ops.fake_quantize_dsq_per_channel(t, scale, zp, 1, -8, 7, 0.4)
    else:
        scale, zp = torch.tensor([0.3]), torch.tensor([1])
        s_b, z_b = scale.to(dtype), zp.to(dtype)

        def ours(t):
            return ops.fake_quantize_dsq_per_tensor(t, scale, zp, -8, 7, 0.4)

    out, g = grads(ours, x, dy=dy)
    expected, g_ref = grads(lambda t: ref.dsq(t, s_b, z_b, -8, 7, 0.4), x, dy=dy)
    # tanh differs from torch's by an ulp at most; rounding of phi then agrees except on ties.
    mismatch = (out != expected).float().mean().item()
    assert mismatch < 1e-3, mismatch
    torch.testing.assert_close(g[0], g_ref[0], rtol=1e-4, atol=1e-5)


def test_dsq_bad_alpha():
    with pytest.raises(RuntimeError, match=r"alpha must be in \(0, 1\), got 1"):
        ops.fake_quantize_dsq_per_tensor(torch.randn(4), torch.tensor([0.1]), torch.tensor([0]), 0, 255, 1.0)


# ---- TQT ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mth", [2, 3])
@pytest.mark.parametrize("scale", [0.013, 0.25, 1e-6])
def test_tqt_matches_reference(mth, scale):
    x = randn(5000, seed=9, scale=2)
    # Exact negative and positive ties on the power-of-two grid exercise mth 2's rounding.
    sp = ref.tqt_step(scale)
    x[:8] = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -3.5, 3.5]) * sp
    xs = x.clone().requires_grad_()
    s = torch.tensor([scale], requires_grad=True)
    y = ops.fake_quantize_tqt(xs, s, torch.tensor([0.0]), -128, 127, mth)
    assert torch.equal(y, ref.tqt(x, scale, -128, 127, mth))
    dy = randn(5000, seed=10)
    y.backward(dy)
    # dx: straight through where round(x / s) (the original s) is in range, as MQBench.
    inside = ((x / scale).round() >= -128) & ((x / scale).round() <= 127)
    assert torch.equal(xs.grad, torch.where(inside, dy, torch.zeros_like(dy)))
    # d_scale: the TQT log2-threshold gradient, (s'/s) * (r - x/s' or the clamped level).
    t = x.double() / sp
    r = ref.tqt(x, scale, -128, 127, mth).double() / sp
    r_unclamped = ref.tqt(x, scale, -10 ** 6, 10 ** 6, mth).double() / sp
    local = torch.where(r_unclamped < -128, torch.full_like(t, -128.0),
                        torch.where(r_unclamped > 127, torch.full_like(t, 127.0), r - t))
    expected_ds = (dy.double() * local).sum() * sp / scale
    torch.testing.assert_close(s.grad.double(), expected_ds.reshape(1), rtol=1e-4, atol=1e-4)


def test_tqt_bad_method():
    with pytest.raises(RuntimeError, match="mth must be 2 .* or 3 .*, got 0"):
        ops.fake_quantize_tqt(torch.randn(4), torch.tensor([0.1]), torch.tensor([0.0]), -128, 127, 0)


# ---- NNIE ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nnie_matches_reference(dtype):
    x = randn(20000, seed=11, scale=3, dtype=dtype)
    x[:4] = torch.tensor([0.0, 1e-12, -1e-12, 100.0], dtype=dtype)
    data_max = torch.tensor(float(x.abs().max()))
    out = ops.fake_quantize_nnie(x, data_max)
    assert out.dtype == dtype
    # std::exp2 and torch.pow(2, .) may differ in the last bit of the float64 result.
    torch.testing.assert_close(out, ref.nnie(x, data_max), rtol=4e-16, atol=0)
    # Levels are signed powers of 2^(1/16), zero near zero.
    nz = out[out != 0].abs().double()
    k = 16 * torch.log2(nz)
    assert (k - k.round()).abs().max() < (1e-5 if dtype == torch.float32 else 1e-9)


def test_nnie_identity_gradient_and_bad_data_max():
    x = randn(100, seed=12).requires_grad_()
    ops.fake_quantize_nnie(x, torch.tensor(3.0)).sum().backward()
    assert torch.equal(x.grad, torch.ones(100))
    with pytest.raises(RuntimeError, match="data_max must be finite and >= 0, got -inf"):
        ops.fake_quantize_nnie(x, torch.tensor(-math.inf))
    with pytest.raises(RuntimeError, match="data_max must be finite and >= 0, got -1"):
        ops.fake_quantize_nnie(x, torch.tensor(-1.0))
    # a zero range (calibrated on all-zero data) quantizes everything to 0
    assert torch.equal(ops.fake_quantize_nnie(x, torch.tensor(0.0)), torch.zeros(100))


# ---- AdaRound -----------------------------------------------------------------------------

@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("hard", [False, True])
def test_adaround_matches_reference(per_channel, hard):
    w = randn(8, 4, 3, 3, seed=13, scale=0.3)
    alpha = randn(8, 4, 3, 3, seed=14, scale=2)
    dy = randn(8, 4, 3, 3, seed=15)
    if per_channel:
        scale = torch.linspace(0.01, 0.03, 8)
        zp = torch.zeros(8, dtype=torch.int32)
        s_b, z_b = ref.channel_view(scale, w, 0), ref.channel_view(zp.float(), w, 0)

        def ours(x, a):
            return ops.fake_quantize_adaround_per_channel(x, scale, zp, a, 0, -8, 7, hard)
    else:
        scale, zp = torch.tensor([0.02]), torch.tensor([0])
        s_b, z_b = scale, zp.float()

        def ours(x, a):
            return ops.fake_quantize_adaround_per_tensor(x, scale, zp, a, -8, 7, hard)

    out, g = grads(ours, w, alpha, dy=dy)
    expected, g_ref = grads(lambda x, a: ref.adaround(x, s_b, z_b, a, -8, 7, hard), w, alpha, dy=dy)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-7)
    assert torch.equal(g[0], torch.zeros_like(w))
    if hard:
        assert torch.equal(g[1], torch.zeros_like(alpha))
    else:
        torch.testing.assert_close(g[1], g_ref[1], rtol=1e-5, atol=1e-7)


def test_adaround_gradcheck_alpha():
    w = randn(4, 6, seed=16, dtype=torch.float64, scale=0.3)
    alpha = randn(4, 6, seed=17, dtype=torch.float64).requires_grad_()
    scale = torch.tensor([0.05, 0.04, 0.03, 0.02])
    zp = torch.zeros(4, dtype=torch.int32)
    assert torch.autograd.gradcheck(
        lambda a: ops.fake_quantize_adaround_per_channel(w, scale, zp, a, 0, -128, 127, False), (alpha,))


def test_adaround_init_reproduces_the_weight():
    # MQBench's init picks alpha so that h(alpha) = W/s - floor(W/s): the soft output is then W.
    w = randn(6, 5, seed=18, scale=0.2)
    s = 0.01
    rest = w / s - torch.floor(w / s)
    alpha = -torch.log((ref.ZETA - ref.GAMMA) / (rest - ref.GAMMA) - 1)
    out = ops.fake_quantize_adaround_per_tensor(w, torch.tensor([s]), torch.tensor([0]), alpha, -128, 127)
    torch.testing.assert_close(out, w, rtol=1e-4, atol=1e-5)


def test_adaround_alpha_shape_must_match():
    with pytest.raises(RuntimeError, match=r"alpha must have x's shape \[2, 3\], got \[3\]"):
        ops.fake_quantize_adaround_per_tensor(torch.randn(2, 3), torch.tensor([0.1]), torch.tensor([0]),
                                              torch.randn(3), -8, 7)


# ---- QDrop --------------------------------------------------------------------------------

@pytest.mark.parametrize("prob", [1.0, 0.5])
def test_qdrop_matches_reference_under_seed(prob):
    x = randn(64, 32, seed=19, scale=2)
    dy = randn(64, 32, seed=20)
    scale, zp = torch.tensor([0.05]), torch.tensor([3])

    torch.manual_seed(123)
    out, g = grads(lambda t, s: ops.fake_quantize_qdrop_per_tensor(t, s, zp, -128, 127, prob), x, scale, dy=dy)
    torch.manual_seed(123)
    expected, g_ref = grads(lambda t, s: ref.qdrop(t, s, zp.float(), -128, 127, prob), x, scale, dy=dy)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g[0], g_ref[0])
    torch.testing.assert_close(g[1], g_ref[1], rtol=1e-4, atol=1e-4)
    if prob < 1:
        kept = (out == x).float().mean().item()
        assert 0.35 < kept < 0.65
    # Same seed, same drop pattern.
    torch.manual_seed(7)
    a = ops.fake_quantize_qdrop_per_tensor(x, scale, zp, -128, 127, prob)
    torch.manual_seed(7)
    b = ops.fake_quantize_qdrop_per_tensor(x, scale, zp, -128, 127, prob)
    assert torch.equal(a, b)


def test_qdrop_per_channel_reshapes_scale_and_zero_point():
    x = randn(4, 8, 5, seed=21)
    scale = torch.linspace(0.01, 0.08, 8)
    zp = torch.arange(8, dtype=torch.int32)
    out = ops.fake_quantize_qdrop_per_channel(x, scale, zp, 1, 0, 255, 1.0)
    assert torch.equal(out, torch.fake_quantize_per_channel_affine(x, scale, zp, 1, 0, 255))


def test_qdrop_bad_prob():
    with pytest.raises(RuntimeError, match=r"prob must be in \[0, 1\], got 1.5"):
        ops.fake_quantize_qdrop_per_tensor(torch.randn(4), torch.tensor([0.1]), torch.tensor([0]), 0, 255, 1.5)


# ---- Power-of-two scale -------------------------------------------------------------------

def test_pot_quantization_value_and_gradient():
    s = torch.tensor([0.013, 0.25, 0.3, 7.0], dtype=torch.float64, requires_grad=True)
    out = ops.pot_quantization(s)
    assert out.tolist() == [2.0 ** -6, 0.25, 0.25, 8.0]
    out.sum().backward()
    s2 = s.detach().clone().requires_grad_()
    ref.pot_quantization(s2).sum().backward()
    torch.testing.assert_close(s.grad, s2.grad)
