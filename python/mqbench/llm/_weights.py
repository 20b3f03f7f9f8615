"""The integer weight grid the LLM algorithms target (``WeightQuant``), how a user's scheme
becomes one (``resolve_w_qscheme``), and round-to-nearest on it: the qparams and fake
quantization every algorithm scores with."""
import torch

from mqbench.llm import _layers
from mqbench.scheme import QuantizeScheme

# Weight-only integer widths the algorithms accept: below 2 bits there is no rounding choice left
# to optimize, above 8 the rounding error is below float noise of a calibration Hessian.
MIN_WBIT, MAX_WBIT = 2, 8
_EPS = torch.finfo(torch.float32).eps


class WeightQuant(object):
    """The integer weight grid the algorithms target: ``[quant_min, quant_max]``, symmetric or
    affine, per tensor / per output channel / per ``group_size`` input channels, with the qparams
    of a min/max observer (Note [Observer qparams] in src/ops/common/qparams.h), so that the
    weights they produce are the ones ``prepare_by_platform``'s MinMax weight observer then sees.
    """

    def __init__(self, scheme):
        self.quant_min = scheme["quant_min"]
        self.quant_max = scheme["quant_max"]
        self.symmetric = scheme["symmetric"]
        self.per_channel = scheme["per_channel"]
        self.group_size = scheme["group_size"]
        self.bit = scheme["bit"]

    def as_args(self):
        """The op arguments (quant_min, quant_max, symmetric, per_channel, group_size: 0 none)."""
        return (self.quant_min, self.quant_max, self.symmetric, self.per_channel,
                self.group_size or 0)

    def check_layer(self, name, weight):
        in_features = weight.shape[1]
        if self.group_size and in_features % self.group_size:
            raise ValueError(f"w_qscheme group_size ({self.group_size}) does not divide layer "
                             f"{name!r}'s {in_features} input channels")


def resolve_w_qscheme(w_qscheme, algorithm):
    """A ``QuantizeScheme`` or the dict form of ``extra_qconfig_dict['w_qscheme']`` -> the fields
    the algorithms use. Refuses up front what they cannot target."""
    if w_qscheme is None:
        raise ValueError(f"{algorithm}: w_qscheme is required, e.g. QuantizeScheme(bit=4, "
                         "per_channel=True, group_size=128) or {'bit': 4, 'per_channel': True, "
                         "'group_size': 128}")
    if isinstance(w_qscheme, dict):
        w_qscheme = QuantizeScheme(**w_qscheme)
    if not isinstance(w_qscheme, QuantizeScheme):
        raise TypeError(f"{algorithm}: w_qscheme must be a QuantizeScheme or a dict of its "
                        f"arguments, got {type(w_qscheme).__name__}")
    if w_qscheme.is_float:
        raise ValueError(f"{algorithm}: w_qscheme dtype {w_qscheme.dtype!r} is not supported yet "
                         "(integer weights only; FP8 / MX / NVFP4 targets are owed, docs/llm.md)")
    if not MIN_WBIT <= w_qscheme.bit <= MAX_WBIT:
        raise ValueError(f"{algorithm}: w_qscheme bit must be in [{MIN_WBIT}, {MAX_WBIT}] for "
                         f"weight-only integer quantization, got {w_qscheme.bit}")
    if w_qscheme.pot_scale:
        raise ValueError(f"{algorithm}: w_qscheme pot_scale=True is not supported (power-of-two "
                         "scales are not searched by this algorithm)")
    p = w_qscheme.to_observer_params()
    return WeightQuant({"quant_min": int(p["quant_min"]), "quant_max": int(p["quant_max"]),
                        "symmetric": w_qscheme.symmetry, "per_channel": w_qscheme.per_channel,
                        "group_size": w_qscheme.group_size, "bit": w_qscheme.bit})


def minmax_qparams(w_min, w_max, quant_min, quant_max, symmetric):
    """Observer qparams from per-row min / max (float32 tensors of one shape)."""
    mn = torch.clamp(w_min, max=0.0)
    mx = torch.clamp(w_max, min=0.0)
    if symmetric:
        scale = torch.clamp(torch.maximum(-mn, mx) / ((quant_max - quant_min) / 2.0), min=_EPS)
        zero_point = torch.zeros_like(scale)
    else:
        scale = torch.clamp((mx - mn) / float(quant_max - quant_min), min=_EPS)
        zero_point = torch.clamp(quant_min - torch.round(mn / scale), quant_min, quant_max)
    return scale, zero_point


def fake_quant(x, scale, zero_point, quant_min, quant_max):
    """torch's fake_quantize formula: (clamp(round(x * (1/s)) + z, qmin, qmax) - z) * s."""
    q = torch.clamp(torch.round(x * (1.0 / scale)) + zero_point, quant_min, quant_max)
    return (q - zero_point) * scale


def rtn_weight(weight, wq):
    """Round-to-nearest fake quantization of a [out, in] weight with its own min/max qparams.
    Returns (dequantized weight, scale, zero_point); scale is [out, in/group] for groups, [out, 1]
    per channel, [1, 1] per tensor."""
    w = weight.float()
    out_f, in_f = w.shape
    if wq.group_size:
        g = w.reshape(out_f, in_f // wq.group_size, wq.group_size)
    elif wq.per_channel:
        g = w.reshape(out_f, 1, in_f)
    else:
        g = w.reshape(1, 1, -1)
    scale, zp = minmax_qparams(g.amin(-1), g.amax(-1), wq.quant_min, wq.quant_max, wq.symmetric)
    q = fake_quant(g, scale.unsqueeze(-1), zp.unsqueeze(-1), wq.quant_min, wq.quant_max)
    return q.reshape(out_f, in_f).to(weight.dtype), scale, zp


def round_layers(linears, wq):
    """Round to nearest of each [(name, Linear or Conv1D)] in place (``rtn_weight``); returns
    name -> the qparams entry ``rtn`` gives."""
    out = {}
    for name, mod in linears:
        weight = _layers.weight_2d(mod)  # [out, in] (Note [Conv1D weights])
        q, scale, zp = rtn_weight(weight.detach(), wq)
        with torch.no_grad():
            weight.copy_(q)
        out[name] = {"scale": scale, "zero_point": zp, "quant_min": wq.quant_min,
                     "quant_max": wq.quant_max, "conv1d": _layers.is_conv1d(mod)}
    return out
