"""Reference observers written with plain torch ops the way MQBench computes them (section A.4 of
the MQBench behaviour spec, which is kept outside this repository): loops over candidates and bins
in Python, one fake-quant pass per candidate. The tests compare mqbench.observer against these, and
the qparam formula against torch's own observers."""
import torch
from torch.ao.quantization.observer import MinMaxObserver as TorchMinMax
from torch.ao.quantization.observer import PerChannelMinMaxObserver as TorchPerChannel

from reference import fake_quant_affine


def torch_qparams(min_val, max_val, qmin, qmax, qscheme, dtype):
    """torch's own _calculate_qparams (8-bit ranges only)."""
    per_channel = qscheme in (torch.per_channel_affine, torch.per_channel_symmetric)
    cls = TorchPerChannel if per_channel else TorchMinMax
    obs = cls(dtype=dtype, qscheme=qscheme, quant_min=qmin, quant_max=qmax)
    return obs._calculate_qparams(min_val, max_val)


def affine_qparams(mn, mx, qmin, qmax, symmetric, eps=torch.finfo(torch.float32).eps):
    """The observer formula on float32 scalars (any range width)."""
    mn = torch.clamp(torch.as_tensor(mn, dtype=torch.float32), max=0)
    mx = torch.clamp(torch.as_tensor(mx, dtype=torch.float32), min=0)
    if symmetric:
        s = torch.clamp(torch.maximum(-mn, mx) / ((qmax - qmin) / 2), min=eps)
        return s, torch.zeros((), dtype=torch.int32)
    s = torch.clamp((mx - mn) / float(qmax - qmin), min=eps)
    z = torch.clamp(qmin - torch.round(mn / s).to(torch.int32), qmin, qmax)
    return s, z


def mse_search(x, x_min, x_max, qmin, qmax, symmetric, iters, p=2.0):
    """MQBench's MSEObserver.mse: returns (best_min, best_max, best_score)."""
    best_score, best = 1e10, (x_min, x_max)
    for i in range(iters):
        new_min = x_min * (1.0 - (i * 0.01))
        new_max = x_max * (1.0 - (i * 0.01))
        s, z = affine_qparams(new_min, new_max, qmin, qmax, symmetric)
        xq = fake_quant_affine(x, float(s), int(z), qmin, qmax)
        score = float((xq - x).abs().pow(p).mean())
        if score < best_score:
            best_score, best = score, (new_min, new_max)
    return best[0], best[1], best_score


def mse_score(x, mn, mx, qmin, qmax, symmetric, p=2.0):
    s, z = affine_qparams(mn, mx, qmin, qmax, symmetric)
    xq = fake_quant_affine(x, float(s), int(z), qmin, qmax)
    return float((xq - x).abs().pow(p).mean())


def quantile_range(x, threshold=0.99999, bins=2048):
    """EMAQuantileObserver's batch range with a cumulative histogram (the spec's rule)."""
    mn, mx = torch.aminmax(x)
    r = torch.max(-mn, mx)
    hist = torch.histc(x.abs(), bins=bins, min=0.0, max=float(r))
    cum, clip = 0, r
    for i, cnt in enumerate(hist.tolist()):
        cum += cnt
        if cum >= threshold * x.numel():
            clip = (i + 0.5) * (r / bins)
            break
    return torch.max(mn, -clip), torch.min(mx, clip)


def pot_exponent(x, mn, mx, qmin, qmax, quant_type):
    """MinMaxFloorObserver.calculate_qparams' search (the exponent e, scale 2^-e)."""
    range_n = 1 if quant_type == "input" else 5
    mth = 3 if quant_type == "param" else 2
    s0 = max(mn / qmin, mx / qmax)
    e0 = 0 if s0 < 2 ** -15 else int(torch.floor(torch.log2(torch.tensor(1 / s0))))
    best, final = float("inf"), e0
    for e in range(e0, e0 + range_n):
        st = 1 / 2 ** e
        if mth == 3:
            nx = st * torch.clamp(torch.round(x / st), qmin, qmax)
        else:
            nx = torch.clamp(x / st, qmin, qmax)
            nx = torch.where((nx < 0) & (nx - nx.floor() == 0.5), nx.ceil(), nx.round()) * st
        loss = float(((nx - x) ** 2).sum())
        if loss < best:
            best, final = loss, e
    return min(final, 12)
