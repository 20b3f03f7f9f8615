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


def candidate_scale(x_mean, w_mean, i, grid):
    """Candidate i of the search: ratio i / grid, or s = 1 for i = grid."""
    if i == grid:  # no scaling: AWQ never does worse than RTN on its objective
        return torch.ones_like(x_mean, dtype=torch.float32)
    r = i / grid
    s = (x_mean.float().pow(r) / w_mean.float().pow(1 - r)).clamp(min=1e-4)
    return s / (s.max() * s.min()).sqrt()


def _first_tensor(out):
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out


def _detached(v):
    if isinstance(v, torch.Tensor):
        return v.detach()
    if isinstance(v, tuple):
        return tuple(_detached(a) for a in v)
    return v


def _block_search(model, calib, n_calls, block, cons_mods, x_mean, w_mean, grid, wq):
    """AWQ's search scored on the output of the block that holds the Linears (AutoAWQ's
    ``module2inspect``: the attention for q/k/v, the MLP for gate/up), so that the error is
    weighed as the block's nonlinearity (softmax, SiLU gate) weighs it. The candidate weights
    are Q(W * s) / s: (X / s) Q(W s)^T = X (Q(W s) / s)^T, the producer need not change."""
    recs, cur, item, calls = [], {}, [0], [0]

    def pre(_m, args, kwargs):
        kw = dict(kwargs)
        for key in ("past_key_values", "past_key_value"):  # never update a cache twice
            if key in kw:
                kw[key] = None
        cur["in"] = (_detached(tuple(args)), {k: _detached(v) for k, v in kw.items()})

    def post(_m, _args, _kwargs, output):
        recs.append((cur["in"], _first_tensor(output).detach().float()))
        calls[0] += 1
        if calls[0] >= n_calls[item[0]]:
            raise _common._StopForward

    h1 = block.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = block.register_forward_hook(post, with_kwargs=True)
    try:
        with torch.no_grad():
            for i, sample in enumerate(calib):
                item[0], calls[0] = i, 0
                if n_calls[i] == 0:
                    continue
                try:
                    _common.run_model(model, sample)
                except _common._StopForward:
                    pass
    finally:
        h1.remove()
        h2.remove()
    orig = [m.weight.detach().clone() for m in cons_mods]
    losses = torch.empty(grid + 1, dtype=torch.float64)
    best, best_loss = None, float("inf")
    try:
        with torch.no_grad():
            for i in range(grid + 1):
                s = candidate_scale(x_mean, w_mean, i, grid)
                for m, w in zip(cons_mods, orig):
                    q = rtn_weight(w.float() * s.view(1, -1), wq)[0] / s.view(1, -1)
                    m.weight.copy_(q.to(m.weight.dtype))
                loss = 0.0
                for (args, kwargs), ref in recs:
                    out = _first_tensor(block(*args, **kwargs)).float()
                    loss += (out - ref).pow(2).mean().item()
                losses[i] = loss / len(recs)
                if losses[i] < best_loss or (i == grid and losses[i] <= best_loss):
                    best, best_loss = s, losses[i].item()
    finally:
        with torch.no_grad():
            for m, w in zip(cons_mods, orig):
                m.weight.copy_(w)
    return best, losses


def awq_search_scale_reference(x, weights, x_mean, w_mean, grid, wq):
    """The AWQ grid search. Returns (best scale [in], losses [grid + 1]): losses[i] of ratio
    i / grid, losses[grid] of no scaling (s = 1), which wins ties."""
    x = x.float()
    refs = [x @ w.detach().float().t() for w in weights]
    losses = torch.empty(grid + 1, dtype=torch.float64)
    best, best_loss = None, float("inf")
    for i in range(grid + 1):
        s = candidate_scale(x_mean, w_mean, i, grid)
        loss = 0.0
        for w, ref in zip(weights, refs):
            q = rtn_weight(w.detach().float() * s.view(1, -1), wq)[0]
            loss += ((x / s.view(1, -1)) @ q.t() - ref).pow(2).mean().item()
        losses[i] = loss
        if loss < best_loss or (i == grid and loss <= best_loss):
            best, best_loss = s, loss
    return best, losses


def awq(model, calib_data, w_qscheme, grid=20, max_tokens=4096, objective="layer", layers=None,
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
        objective: "layer" (default): the summed output error of the scaled Linears (the C++
            search op); "block": where they are the q/k/v or gate/up of one attention / MLP
            block, score candidates on that block's output, as AutoAWQ does (runs the block once
            per candidate, in Python; other groups as "layer"). Measured equal on a tiny
            random Llama (docs/llm.md); which is better on trained models is for the benchmarks.
        layers / ignore / skip_unreached / impl: as in ``gptq``.

    Returns:
        dict producer name -> {"consumers", "scale", "ratio" (None: no scaling won), "losses",
        "block" (the block scored, or None)}.

    Example::

        from mqbench.llm import awq
        awq(model, calib, {"bit": 4, "per_channel": True, "group_size": 128})
        model = prepare_by_platform(model, BackendType.Academic, {"extra_qconfig_dict": {
            "w_qscheme": {"bit": 4, "per_channel": True, "group_size": 128}, ...}})
    """
    wq = _common.resolve_w_qscheme(w_qscheme, "awq")
    grid = _common.check_positive_int(grid, "grid", "awq")
    max_tokens = _common.check_positive_int(max_tokens, "max_tokens", "awq")
    if objective not in ("block", "layer"):
        raise ValueError(f"awq: objective must be 'block' or 'layer', got {objective!r}")
    use_cpp = _common.want_cpp(impl)
    linears, calib, counts, dead = _common.select_and_calibrate(
        model, layers, ignore, calib_data, skip_unreached, "awq", wq)
    live = [(n, m) for n, m in linears if n not in dead]
    maps = _mappings.mappings_of_live(model, live, "awq", "rounded without AWQ")
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
        block_name = _mappings.block_of(model, cons) if objective == "block" else None
        if block_name is not None:
            s, losses = _block_search(model, calib, counts[cons[0]], mods[block_name],
                                      [mods[c] for c in cons], x_mean, w_mean, grid, wq)
        elif use_cpp:
            s, losses = torch.ops.mqbench.awq_search_scale(x, weights, x_mean, w_mean, grid,
                                                           *wq.as_args())
        else:
            s, losses = awq_search_scale_reference(x, weights, x_mean, w_mean, grid, wq)
        if not torch.isfinite(s).all():
            raise RuntimeError(f"awq: non-finite scale for {producer} -> {cons}")
        _mappings.apply_scale(model, producer, cons, s)
        best = int(losses.argmin())
        out[producer] = {"consumers": cons, "scale": s,
                         "ratio": None if best == grid else best / grid,
                         "losses": losses, "block": block_name}
    return out
