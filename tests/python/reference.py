"""Reference implementations of the fake-quantize algorithms, written with plain torch ops the way
MQBench computes them (section A.3 of the MQBench behaviour spec, kept outside this repository), so
that autograd gives the reference gradients. The tests compare torch.ops.mqbench.* against these
exactly, and against torch's own fake-quant ops (whose float64 rounding moved between releases)
within a tolerance (TORCH_ATOL).

The LLM algorithms' heavy steps have their torch formulations here too (GPTQ's Hessian update and
column loop, AWQ's scale search): the C++ ops must give the same bits."""
import math
import warnings

import torch

from mqbench.llm._weights import fake_quant, minmax_qparams, rtn_weight


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


def round_grid(v, grid):
    """v rounded to the nearest value of `grid` (non-negative, in code order), ties to the even
    code, saturating at the largest; the sign kept (-0 for a negative that rounds to 0)."""
    if math.isnan(v):
        return v
    a = min(abs(v), grid[-1])
    hi = next(i for i, g in enumerate(grid) if g >= a)
    if grid[hi] == a or hi == 0:
        r = grid[hi]
    else:
        lo = hi - 1
        dl, dh = a - grid[lo], grid[hi] - a
        r = grid[lo] if dl < dh or (dl == dh and lo % 2 == 0) else grid[hi]
    return math.copysign(r, v)


# ---- LLM algorithms: GPTQ and AWQ in torch, the oracles of torch.ops.mqbench.gptq_* / awq_* ----

_MAX_DAMP_TRIES = 8
_GRAM_BLOCK = 128


def gram_update_reference(H, x, beta, alpha):
    """beta * H + alpha * x^T x from bands of _GRAM_BLOCK rows, each from its diagonal block
    rightwards (one addmm per band, written into the result; its diagonal block's upper triangle
    mirrored into the lower one), mirrored into the lower part: the calls of the C++ op (Note
    [Hessian from its upper blocks] in src/ops/llm_gptq.cpp), so the same bits, with about half
    the multiply-adds for wide x, exactly symmetric."""
    n = x.shape[1]
    G = torch.empty(n, n, dtype=x.dtype, device=x.device)
    for i0 in range(0, n, _GRAM_BLOCK):
        i1 = min(i0 + _GRAM_BLOCK, n)
        band = G[i0:i1, i0:]
        torch.addmm(H[i0:i1, i0:], x[:, i0:i1].t(), x[:, i0:], beta=beta, alpha=alpha, out=band)
        d = band[:, :i1 - i0]
        upper = torch.ones(i1 - i0, i1 - i0, dtype=torch.bool, device=x.device).triu_()
        d.copy_(torch.where(upper, d, d.t()))
        G[i1:, i0:i1] = band[:, i1 - i0:].t()
    return G


def hessian_update_reference(H, x, n_seen):
    """H of the first n_seen rows -> H of n_seen + len(x) rows: H = 2/N sum x x^T (float32)."""
    x = x.float()
    total = n_seen + x.shape[0]
    if total == 0:
        return H.float()
    return gram_update_reference(H.float(), x, n_seen / total, 2.0 / total)


def _group_qparams(cols, wq):
    """Qparams of a [out, k] slice (one group, or the whole row for per-channel)."""
    return minmax_qparams(cols.amin(1), cols.amax(1), wq.quant_min, wq.quant_max, wq.symmetric)


def gptq_quantize_weight_reference(W, H, wq, block_size=128, damp=0.01, act_order=False,
                                   name="layer"):
    """GPTQ of one [out, in] weight with its [in, in] Hessian. Returns (Q, scale, zero_point,
    damp_used): Q dequantized (float32, W's shape), scale / zero_point [out, groups] ([out, 1]
    per channel, [1, 1] per tensor), damp_used the relative damping that made H positive
    definite."""
    W = W.detach().float().clone()
    H = H.detach().float().clone()
    if not torch.isfinite(H).all():
        raise RuntimeError(f"gptq_quantize_weight: the Hessian of {name} has non-finite entries "
                           "(non-finite calibration activations)")
    out_f, n = W.shape
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    gs = wq.group_size or 0
    ngroups = n // gs if gs else 1
    scale = torch.empty(out_f if (wq.per_channel or gs) else 1, ngroups, device=W.device)
    zero = torch.empty_like(scale)
    static = False
    if not gs:  # one grid for the whole row (or tensor), from the weight before any update
        if wq.per_channel:
            s, z = _group_qparams(W, wq)
        else:
            s, z = minmax_qparams(W.min().reshape(1), W.max().reshape(1), wq.quant_min,
                                  wq.quant_max, wq.symmetric)
        scale[:, 0], zero[:, 0] = s, z
    elif act_order:  # groups stay contiguous in the original order: their grids come first
        static = True
        for g in range(ngroups):
            scale[:, g], zero[:, g] = _group_qparams(W[:, g * gs:(g + 1) * gs], wq)
    # the column loop on W^T (Note [GPTQ on the transposed weight] in src/ops/llm_gptq.cpp):
    # a column of W is a row, in act order
    WT = W.t().contiguous()
    perm = None
    if act_order:
        perm = torch.argsort(torch.diag(H), descending=True)
        WT = WT[perm]
        rev = perm.flip(0)
        Hr = H[rev][:, rev]
    else:
        Hr = H.flip(0, 1)
    # J H J (J reverses the order), as the factorization takes it; the mean in columns' order
    mean_diag = torch.mean(torch.diag(Hr).flip(0)).item()
    rel = damp
    G = None
    for _ in range(_MAX_DAMP_TRIES):
        # R upper with H = R R^T: with C^T C = J H J, R = J C^T J (Note [GPTQ from the factor
        # of H] in src/ops/llm_gptq.cpp); G[j, k] = R[j, k] / R[k, k]
        Hd = Hr.clone(memory_format=torch.contiguous_format)
        Hd.diagonal().add_(rel * mean_diag)
        C, info = torch.linalg.cholesky_ex(Hd, upper=True)
        if info.item() == 0:
            R = C.t().flip(0, 1)
            Gd = R / torch.diag(R)
            if torch.isfinite(Gd).all():
                G = Gd.contiguous()
                break
        new_rel = rel * 10 if rel > 0 else 1e-6
        warnings.warn(f"gptq: the Hessian of {name} is not positive definite with damp={rel:g}; "
                      f"raising damp to {new_rel:g}")
        rel = new_rel
    if G is None:
        raise RuntimeError(f"gptq: the Hessian of {name} stays singular up to damp={rel:g}")
    W0T = WT.clone()  # the weight before any update: each column's error is w0 - q
    QT = torch.empty_like(WT)
    order = perm.tolist() if perm is not None else None  # one read, not one per column
    for i1 in range(0, n, block_size):
        i2 = min(i1 + block_size, n)
        # the block's errors, a row per column
        ET = torch.empty(i2 - i1, out_f, device=W.device)
        for col in range(i1, i2):
            orig = order[col] if order is not None else col
            g = orig // gs if gs else 0
            if gs and not static and col % gs == 0:
                # the group's grid from its columns as they are now (updated by earlier errors)
                scale[:, g], zero[:, g] = _group_qparams(WT[col:col + gs].t(), wq)
            q = fake_quant(WT[col], scale[:, g], zero[:, g], wq.quant_min, wq.quant_max)
            QT[col] = q
            e = W0T[col] - q
            WT[col + 1:i2] += G[col, col + 1:i2].unsqueeze(1) * e.unsqueeze(0)
            ET[col - i1] = e
        if i2 < n:
            WT[i2:].addmm_(G[i1:i2, i2:].t(), ET)
    if perm is not None:
        QT = QT[torch.argsort(perm)]
    Q = QT.t().contiguous()
    return Q, scale, zero, rel


def awq_search_scale_reference(x, weights, x_mean, w_mean, grid, wq):
    """The AWQ grid search. Returns (best scale [in], losses [grid + 1]): losses[i] of ratio
    i / grid, losses[grid] of no scaling (s = 1), which wins ties.

    Each loss is computed through the inputs' Gram matrix G = X^T X: with D = Q(W s) / s - W,
    mean((X / s) Q(W s)^T - X W^T)^2 = mean(X D^T)^2 = sum(D * (D G)) / (tokens * out), which
    costs out * in^2 per candidate instead of tokens * in * out (5-16x less on a Llama block's
    shapes at 4096 tokens)."""
    from mqbench.llm.awq import candidate_scale

    x = x.float()
    gram = x.t() @ x
    n_tok = x.shape[0]
    losses = torch.empty(grid + 1, dtype=torch.float64)
    best, best_loss = None, float("inf")
    for i in range(grid + 1):
        s = candidate_scale(x_mean, w_mean, i, grid)
        loss = 0.0
        for w in weights:
            w = w.detach().float()
            d = rtn_weight(w * s.view(1, -1), wq)[0] / s.view(1, -1) - w
            loss += ((d @ gram) * d).sum(dtype=torch.float64).item() / (n_tok * w.shape[0])
        losses[i] = loss
        if loss < best_loss or (i == grid and loss <= best_loss):
            best, best_loss = s, loss
    return best, losses
