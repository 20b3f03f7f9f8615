"""Reference implementations of the fake-quantize algorithms, written with plain torch ops the way
MQBench computes them (section A.3 of the MQBench behaviour spec, kept outside this repository), so
that autograd gives the reference gradients. The tests compare torch.ops.mqbench.* against these
exactly, and against torch's own fake-quant ops (whose float64 rounding moved between releases)
within a tolerance (TORCH_ATOL)."""
import math

import torch


# torch's fake-quant kernels against ours. torch 2.11+ rounds float64 differently from 1.13 (its
# results moved by up to 1.1e-7 against the spec's formula), so exactness is checked against
# fake_quant_affine below, and torch's kernels are compared within this tolerance.
TORCH_RTOL = 1e-6
TORCH_ATOL = 1e-6


def assert_matches_torch(ours, theirs):
    """ours agrees with torch's own kernel within TORCH_RTOL / TORCH_ATOL."""
    torch.testing.assert_close(ours, theirs, rtol=TORCH_RTOL, atol=TORCH_ATOL)


def _affine_params(x, scale, zero_point, ch_axis, float_zp):
    s = torch.as_tensor(scale, dtype=torch.float32).reshape(-1)
    z = torch.as_tensor(zero_point).reshape(-1).to(torch.float32)
    if not float_zp:
        z = z.round()
    inv = 1.0 / s  # float32 reciprocal, also for float64 input
    if ch_axis is not None:
        s, z, inv = (channel_view(t, x, ch_axis) for t in (s, z, inv))
    return s, z, inv


def fake_quant_affine(x, scale, zero_point, qmin, qmax, ch_axis=None, float_zp=False):
    """The fixed affine formulas of docs/ops.md (Note [Zero point modes]), in x's dtype:
        inv = float32(1 / s)
        integer zero point: q = round_half_even(x * inv) + z
        floating zero point (float_zp): q = round_half_even(x * inv + z), output in float64
        out = (clamp(q, qmin, qmax) - z) * s
    Gradient dx = dy * (qmin <= q <= qmax) (straight-through). scale / zero_point: numbers, or
    per-channel vectors along ch_axis."""
    s, z, inv = _affine_params(x, scale, zero_point, ch_axis, float_zp)
    xd = x.detach()
    if float_zp:
        q = torch.round(xd * inv.to(x.dtype) + z.to(x.dtype))
        out = ((torch.clamp(q, qmin, qmax).double() - z.double()) * s.double()).to(x.dtype)
    else:
        s, z, inv = (t.to(x.dtype) for t in (s, z, inv))
        q = torch.round(xd * inv) + z
        out = (torch.clamp(q, qmin, qmax) - z) * s
    mask = (q >= qmin) & (q <= qmax)
    # The straight-through term is x - x.detach() where q is in range and 0 elsewhere, so +-inf
    # (never in range) gives the clamped end as the op does, not inf - inf = NaN.
    return out + torch.where(mask, x - xd, torch.zeros_like(xd))


def ste_round(x):
    """Round half to even with a straight-through gradient."""
    return (x.round() - x).detach() + x


def channel_view(t, x, ch_axis):
    """Reshapes a per-channel vector so it broadcasts along ch_axis of x."""
    shape = [1] * x.dim()
    shape[ch_axis] = -1
    return t.reshape(shape)


def pact(x, alpha, n_alpha, scale, zero_point, qmin, qmax):
    x = torch.where(x > alpha, alpha, x)
    x = torch.where(x < n_alpha, n_alpha, x)
    return fake_quant_affine(x, scale, zero_point, qmin, qmax)


def dsq(x, scale, zero_point, qmin, qmax, alpha):
    ks = 1.0 / (1.0 - alpha)
    k = math.log((ks + 1.0) / (ks - 1.0))
    u = torch.clamp(x / scale + zero_point, qmin, qmax)
    f = torch.floor(u)
    phi = f + 0.5 * ks * torch.tanh(k * (u - f - 0.5)) + 0.5
    return (ste_round(phi) - zero_point) * scale


def tqt_step(scale):
    s = float(scale)
    e = 0 if s < 2 ** -15 else math.floor(math.log2(1.0 / s))
    return 2.0 ** -e


def tqt(x, scale, qmin, qmax, mth):
    sp = tqt_step(scale)
    t = x / sp
    if mth == 3:
        r = t.round()
    else:
        t = torch.clamp(t, qmin, qmax)
        tie_neg = (t < 0) & (t - torch.floor(t) == 0.5)
        r = torch.where(tie_neg, torch.ceil(t), t.round())
    return torch.clamp(r, qmin, qmax) * sp


def nnie(x, data_max):
    xd = x.double()
    z = round_half_even(16.0 * math.log2(float(data_max))) - 127
    t_pos = 2.0 ** ((z - 16) / 16)
    t_neg = 2.0 ** ((z + 1 - 16) / 16)
    pos = torch.pow(2.0, (torch.clamp(torch.round(16 * torch.log2(xd.clamp_min(1e-300))) - z, 0, 127) + z) / 16)
    neg = -torch.pow(2.0, (torch.clamp(torch.round(16 * torch.log2((-xd).clamp_min(1e-300))) - z, 1, 127) + z) / 16)
    out = torch.where(xd > t_pos, pos, torch.where(xd < -t_neg, neg, torch.zeros_like(xd)))
    return out.to(x.dtype)


def round_half_even(v):
    return float(torch.tensor(v, dtype=torch.float64).round())


GAMMA, ZETA = -0.1, 1.1


def adaround(x, scale, zero_point, alpha, qmin, qmax, hard):
    if hard:
        h = (alpha >= 0).to(x.dtype)
    else:
        h = torch.clamp(torch.sigmoid(alpha) * (ZETA - GAMMA) + GAMMA, 0, 1)
    v = torch.floor(x / scale) + h
    q = torch.clamp(v + zero_point, qmin, qmax)
    return (q - zero_point) * scale


def qdrop(x, scale, zero_point, qmin, qmax, prob):
    xq = (torch.clamp(ste_round(x / scale) + zero_point, qmin, qmax) - zero_point) * scale
    if prob < 1.0:
        xq = torch.where(torch.rand_like(xq) < prob, xq, x)
    return xq


def dorefa_normalize(x):
    t = torch.tanh(x)
    return t / (t.abs().max() + 1e-5)


def pot_quantization(scale):
    log2t = torch.log2(scale)
    log2t = (torch.round(log2t) - log2t).detach() + log2t
    return 2 ** log2t
