"""SmoothQuant (Xiao et al. 2023, "SmoothQuant: Accurate and Efficient Post-Training
Quantization for Large Language Models"): migrates activation outliers into the weights before
W8A8 quantization.

For each group of Linears that read one producer's output (a norm, or a Linear through ReLU-like
ops: _mappings.py), per input channel j:
    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)      (max over tokens / over the group's rows)
then X_j / s_j is folded into the producer and W[:, j] * s_j into the consumers, so the float
model computes the same function, with flatter activations and slightly rougher weights.
"""
import torch

from mqbench.llm import _common, _mappings, _prepared

__all__ = ["smoothquant", "smooth_scale"]


def smooth_scale(act_max, weight_max, alpha):
    """s = act_max^alpha / weight_max^(1-alpha), 1 where either is 0 (a dead channel)."""
    act_max, weight_max = act_max.float(), weight_max.float()
    s = act_max.pow(alpha) / weight_max.pow(1.0 - alpha)
    s = torch.where((act_max > 0) & (weight_max > 0), s, torch.ones_like(s))
    return s.clamp(min=1e-5)


def smoothquant(model, calib_data, alpha=0.5, layers=None, ignore=("lm_head",),
                skip_unreached=False):
    """Applies SmoothQuant's scales to ``model`` in place (float function unchanged).

    Run it before ``prepare_by_platform`` for a W8A8 backend (e.g. ``BackendType.Tensorrt_NLP``):
    on a model that already holds fake quantizers it raises ValueError (docs/llm.md).

    Args:
        model: an nn.Module (transformers decoder, or any fx-traceable module of Linears).
        calib_data: iterable of model inputs (tensors, tuples, dicts of keyword inputs).
        alpha: migration strength in [0, 1] (0.5 in the paper; 0.75-0.85 for harder models).
        layers / ignore / skip_unreached: as in ``gptq``.

    Returns:
        dict producer name -> {"consumers": [...], "scale": s} of every group smoothed. Linears
        with no producer a scale can fold into are listed in the log (docs/llm.md).

    Example::

        from mqbench.llm import smoothquant
        smoothquant(model, calib, alpha=0.5)
        model = prepare_by_platform(model, BackendType.Tensorrt_NLP, ...)
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"smoothquant: alpha must be a number in [0, 1], got {alpha!r}")
    _prepared.refuse_prepared(model, "smoothquant")
    cal = _common.select_and_calibrate(model, layers, ignore, calib_data, skip_unreached,
                                       "smoothquant", cache_blocks=False)  # one capture
    maps = _mappings.mappings_of_live(model, cal.live, "smoothquant", "left as they are")
    if not maps:
        return {}
    mods = dict(model.named_modules())
    first = [(cons[0], mods[cons[0]]) for _, cons in maps]
    act_max = {}

    def record(name, x):
        m = x.abs().amax(0).float()
        act_max[name] = m if name not in act_max else torch.maximum(act_max[name], m)

    cal.capture(first, record)
    out = {}
    for producer, cons in _common.progress(maps, "smoothquant"):
        w_max = torch.stack([_common.weight_2d(mods[c]).detach().abs().amax(0).float()
                             for c in cons]).amax(0)
        s = smooth_scale(act_max[cons[0]], w_max, alpha)
        _mappings.apply_scale(model, producer, cons, s)
        out[producer] = {"consumers": cons, "scale": s}
    return out
