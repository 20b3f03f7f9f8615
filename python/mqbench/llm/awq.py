"""AWQ (Lin et al. 2024, "AWQ: Activation-aware Weight Quantization for LLM Compression and
Acceleration"): per-input-channel weight scales that protect the channels with large
activations from weight rounding.

For each group of Linears that read one producer's output (_mappings.py) with calibration inputs
X ([tokens, in]), AWQ's grid search over ratio r = i / grid, i = 0 .. grid-1 (duo scaling, as
AutoAWQ and llm-compressor):
    s(r) = clamp(mean|X_j|^r / mean_w_j^(1 - r), 1e-4);  s /= sqrt(max(s) * min(s))
    loss(r) = sum over the group's Linears of mean((X W^T - (X / s) Q(W * s)^T)^2)
where mean_w_j is the mean over output rows of |W| normalized by its group's max and Q is
round-to-nearest with min/max qparams on the ``w_qscheme`` grid. The best s is folded into the
producer (X / s) and the Linears (W * s), so the float function is unchanged; the weights stay
float and are rounded by the weight quantizer of ``prepare_by_platform`` (or ``rtn``).

The search runs in C++ (src/ops/llm_awq.cpp: ``torch.ops.mqbench.awq_search_scale``);
``awq_search_scale_reference`` is the same in torch, the oracle of the tests.
"""
import torch

from mqbench.llm import _common, _mappings
from mqbench.llm._common import rtn_weight
from mqbench.utils.logger import logger

__all__ = ["awq", "awq_search_scale_reference", "awq_weight_mean"]


def awq_weight_mean(weights, wq):
    """Per input channel: mean over every row of the group's weights of |W| / (its group's max)."""
    rows = []
    for w in weights:
        w = w.detach().float()
        out_f, in_f = w.shape
        gs = wq.group_size or in_f
        g = w.abs().reshape(out_f, in_f // gs, gs)
        g = g / g.amax(-1, keepdim=True).clamp(min=1e-12)
        rows.append(g.reshape(out_f, in_f))
    return torch.cat(rows, 0).mean(0)


def awq_search_scale_reference(x, weights, x_mean, w_mean, grid, wq):
    """The AWQ grid search. Returns (best scale [in], losses [grid + 1]): losses[i] of ratio
    i / grid, losses[grid] of no scaling (s = 1), which wins ties."""
    x = x.float()
    refs = [x @ w.detach().float().t() for w in weights]
    losses = torch.empty(grid + 1, dtype=torch.float64)
    best, best_loss = None, float("inf")
    for i in range(grid + 1):
        if i == grid:  # no scaling: AWQ never does worse than RTN on its objective
            s = torch.ones_like(x_mean, dtype=torch.float32)
        else:
            r = i / grid
            s = (x_mean.float().pow(r) / w_mean.float().pow(1 - r)).clamp(min=1e-4)
            s = s / (s.max() * s.min()).sqrt()
        loss = 0.0
        for w, ref in zip(weights, refs):
            q = rtn_weight(w.detach().float() * s.view(1, -1), wq)[0]
            loss += ((x / s.view(1, -1)) @ q.t() - ref).pow(2).mean().item()
        losses[i] = loss
        if loss < best_loss or (i == grid and loss <= best_loss):
            best, best_loss = s, loss
    return best, losses


def awq(model, calib_data, w_qscheme, grid=20, max_tokens=4096, layers=None,
        ignore=("lm_head",), skip_unreached=False, impl="auto"):
    """Searches and applies AWQ's activation-aware scales to ``model`` in place (float function
    unchanged); the weights are then rounded by ``prepare_by_platform``'s weight quantizer with
    the same ``w_qscheme`` (or by ``mqbench.llm.rtn``).

    Args:
        model: an nn.Module (transformers decoder, or any fx-traceable module of Linears).
        calib_data: iterable of model inputs (tensors, tuples, dicts of keyword inputs).
        w_qscheme: a QuantizeScheme or its dict, integer, bit in [2, 8].
        grid: number of ratios searched (r = 0, 1/grid, ..., (grid-1)/grid).
        max_tokens: calibration tokens kept per group for the search (evenly subsampled).
        layers / ignore / skip_unreached / impl: as in ``gptq``.

    Returns:
        dict producer name -> {"consumers", "scale", "ratio", "losses"}.

    Example::

        from mqbench.llm import awq
        awq(model, calib, {"bit": 4, "per_channel": True, "group_size": 128})
        model = prepare_by_platform(model, BackendType.Academic, {"extra_qconfig_dict": {
            "w_qscheme": {"bit": 4, "per_channel": True, "group_size": 128}, ...}})
    """
    wq = _common.resolve_w_qscheme(w_qscheme, "awq")
    grid = _common.check_positive_int(grid, "grid", "awq")
    max_tokens = _common.check_positive_int(max_tokens, "max_tokens", "awq")
    use_cpp = _common.want_cpp(impl)
    linears = _common.find_linears(model, layers, ignore)
    for name, mod in linears:
        wq.check_layer(name, mod.weight)
    calib, counts, dead = _common.check_calibration(model, linears, calib_data)
    _common.handle_dead(dead, skip_unreached, "awq")
    live = [(n, m) for n, m in linears if n not in dead]
    maps = _mappings.find_mappings(model, [n for n, _ in live])
    covered = {c for _, cons in maps for c in cons}
    lonely = [n for n, _ in live if n not in covered]
    if lonely:
        logger.info("awq: no producer to fold a scale into for %s (rounded without AWQ)", lonely)
    mods = dict(model.named_modules())
    out = {}
    # In module order. A Linear that produces for one group (up_proj -> down_proj) and consumes
    # in another (norm -> gate/up) has its rows divided by the later scale: its per-row (or
    # per-group) grid scales with the row, so its rounding is unchanged, and the earlier search
    # scored its error in the unscaled output space the next layer sees before scaling.
    for producer, cons in _common.progress(maps, "awq"):
        xs = []
        _common.capture(model, calib, counts, [(cons[0], mods[cons[0]])],
                        lambda _n, x: xs.append(x.float()))
        x = torch.cat(xs, 0)
        if x.shape[0] > max_tokens:
            x = x[torch.linspace(0, x.shape[0] - 1, max_tokens).long()]
        weights = [mods[c].weight.detach() for c in cons]
        x_mean = x.abs().mean(0)
        w_mean = awq_weight_mean(weights, wq)
        if use_cpp:
            s, losses = torch.ops.mqbench.awq_search_scale(x, weights, x_mean, w_mean, grid,
                                                           *wq.as_args())
        else:
            s, losses = awq_search_scale_reference(x, weights, x_mean, w_mean, grid, wq)
        if not torch.isfinite(s).all():
            raise RuntimeError(f"awq: non-finite scale for {producer} -> {cons}")
        _mappings.apply_scale(model, producer, cons, s)
        out[producer] = {"consumers": cons, "scale": s, "ratio": (None if int(losses.argmin()) == grid
                                                  else int(losses.argmin()) / grid),
                         "losses": losses}
    return out
