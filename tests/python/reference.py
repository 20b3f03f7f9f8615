"""Reference implementations of the fake-quantize algorithms, written with plain torch ops the
way MQBench computes them (../shared/mqbench-spec.md, section A.3), so that autograd gives the
reference gradients. The tests compare torch.ops.mqbench.* against these and against torch's
own fake-quant ops where the two overlap."""
import math

import torch


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
    return torch.fake_quantize_per_tensor_affine(x, float(scale), int(zero_point), qmin, qmax)


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
