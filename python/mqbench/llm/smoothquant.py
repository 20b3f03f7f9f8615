"""SmoothQuant (Xiao et al. 2023, "SmoothQuant: Accurate and Efficient Post-Training
Quantization for Large Language Models"): migrates activation outliers into the weights before
W8A8 quantization.

For each group of Linears that read one producer's output (a norm, or a Linear through ReLU-like
ops: _mappings.py), per input channel j:
    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)      (max over tokens / over the group's rows)
then X_j / s_j is folded into the producer and W[:, j] * s_j into the consumers, so the float
model computes the same function, with flatter activations and slightly rougher weights.

``alpha="auto"`` picks alpha per group: the one whose W8A8 simulation (Tensorrt's INT8 scheme)
moves the group's output least on the calibration data (Note [SmoothQuant's alpha search]).
"""
import math

import torch

from mqbench.llm import _blocks, _calibration, _checks, _layers, _mappings, _prepared, _weights
from mqbench.utils.logger import logger

__all__ = ["smoothquant", "smooth_scale", "smoothquant_search_alpha"]

# Note [SmoothQuant's alpha search]
# One alpha for the whole model (the paper: 0.5, 0.75-0.85 for harder models; modelopt: 1.0)
# is a compromise between groups whose inputs have outlier channels (they want a large alpha)
# and groups whose weights are the harder side (they want a small one). With alpha="auto", each
# group takes the alpha in {0, 1/grid, ..., 1}, or no scaling at all, whose W8A8 simulation
# moves the output least:
#   * the simulation: Qw rounds W s to INT8 per output channel, Qa rounds X / s to INT8 per
#     tensor with the scale of max|X / s| over all the calibration tokens (a static, max-
#     calibrated activation quantizer: max_j(max|X_j| / s_j), exact from the per-channel
#     maxima); both on Tensorrt's symmetric range [-127, 127] with the MinMax observers' scale
#     (amax / 127).
#   * the error (``token_error``): each token's |error|^2 / |float output|^2, averaged over the
#     tokens. A plain mean squared error is decided by the few tokens of very large norm (a
#     decoder's first token); on the trained decoder of docs/benchmarks.md it chose alphas whose
#     KL to float was 0.062e-3 nats against 0.058e-3 with the relative error.
#   * the output: the group's Linears' (``objective="layer"``: X (Qw / s)^T on up to
#     ``max_tokens`` tokens) or the module holding producer and consumers (``"block"``, run
#     again on its recorded inputs).
# The float function is unchanged by every candidate, so a group's choice does not move the
# reference of the others. No scaling wins ties: a group whose error does not drop keeps its
# weights.

_W8 = {"bit": 8, "per_channel": True, "symmetry": True, "symmetric_range": True}


def smooth_scale(act_max, weight_max, alpha):
    """s = act_max^alpha / weight_max^(1-alpha), 1 where either is 0 (a dead channel)."""
    act_max, weight_max = act_max.float(), weight_max.float()
    s = act_max.pow(alpha) / weight_max.pow(1.0 - alpha)
    s = torch.where((act_max > 0) & (weight_max > 0), s, torch.ones_like(s))
    return s.clamp(min=1e-5)


def token_error(out, ref):
    """Mean over tokens (rows of the last dimension) of |out - ref|^2 / |ref|^2: each token's
    relative error, so that a few tokens of large norm (the "massive activations" of a first or
    separator token) do not decide the search alone. A 0-dim float64 tensor on the outputs'
    device: the searches sum it there and read one value per candidate."""
    out, ref = out.reshape(-1, out.shape[-1]), ref.reshape(-1, ref.shape[-1])
    err = (out - ref).pow(2).sum(1, dtype=torch.float64)
    return (err / ref.pow(2).sum(1, dtype=torch.float64).clamp(min=1e-30)).mean()


def _act_scale(act_max, s, wq):
    """The static per-tensor INT8 scale of X / s: max_j(max|X_j| / s_j) / 127."""
    amax = (act_max / s).amax()
    return _weights.minmax_qparams(-amax, amax, wq.quant_min, wq.quant_max, True)[0]


def _layer_error(x, refs, weights, act_max, s, wq):
    """``token_error`` summed over the Linears ``weights`` ([out, in] each) on tokens ``x``
    [tokens, in] under INT8 with smoothing scale ``s``; ``refs``: the float outputs x @ w^T."""
    xq = _weights.fake_quant(x / s, _act_scale(act_max, s, wq), 0.0, wq.quant_min, wq.quant_max)
    return sum(token_error(xq @ _weights.rtn_weight(w * s.view(1, -1), wq)[0].t(), ref)
               for w, ref in zip(weights, refs))


def _candidates(act_max, w_max, grid):
    """Scale of candidate i: alpha i / grid for i <= grid, none (ones) for i = grid + 1."""
    for i in range(grid + 2):
        yield i, smooth_scale(act_max, w_max, i / grid) if i <= grid else torch.ones_like(act_max)


def _pick(losses, act_max, w_max, grid):
    """(scale, alpha or None) of the smallest loss; no scaling wins ties. A non-finite loss (an
    overflow in a half-precision block) never wins."""
    finite = torch.where(torch.isfinite(losses), losses, torch.full_like(losses, float("inf")))
    best = int(finite.argmin())
    if finite[grid + 1] <= finite[best]:  # also when every loss is non-finite (inf <= inf)
        return torch.ones_like(act_max), None
    return smooth_scale(act_max, w_max, best / grid), best / grid


def smoothquant_search_alpha(x, weights, act_max, grid=20):
    """The alpha search of one group on its Linears' outputs (``objective="layer"``, Note
    [SmoothQuant's alpha search]).

    Args:
        x: [tokens, in] calibration inputs of the group (float).
        weights: the group's [out, in] weights (in their current, float function-keeping state).
        act_max: [in] max |X_j| over all the calibration tokens (not only ``x``).
        grid: candidates alpha = i / grid, i = 0..grid, then no scaling.

    Returns:
        (scale [in], alpha or None (no scaling won), losses [grid + 2] float64: losses[i] of
        alpha i / grid, losses[grid + 1] of no scaling).
    """
    grid = _checks.check_positive_int(grid, "grid", "smoothquant")
    losses, w_max = _layer_losses(x, weights, act_max, grid)
    return _pick(losses, act_max.float(), w_max, grid) + (losses,)


def _layer_losses(x, weights, act_max, grid):
    """(losses [grid + 2] float64, w_max [in]) of ``smoothquant_search_alpha``'s candidates on
    the tokens ``x``."""
    wq = _weights.resolve_w_qscheme(_W8, "smoothquant")
    x, act_max = x.float(), act_max.float()
    weights = [w.detach().float() for w in weights]
    w_max = torch.stack([w.abs().amax(0) for w in weights]).amax(0)
    refs = [x @ w.t() for w in weights]
    losses = torch.empty(grid + 2, dtype=torch.float64)
    for i, s in _candidates(act_max, w_max, grid):
        losses[i] = _layer_error(x, refs, weights, act_max, s, wq)
    return losses, w_max


def _block_search(block, recs, cons_mods, act_max, grid):
    """The alpha search of one group on the output of ``block``, the module holding its producer
    and consumers, run again on its recorded calls ``recs`` (``_calibration.record_block_io``) with
    the consumers in INT8: weights Q(W s) / s, inputs Qa(X / s) s (the producer unchanged: the
    same products as folding s). Returns what ``smoothquant_search_alpha`` does."""
    wq = _weights.resolve_w_qscheme(_W8, "smoothquant")
    act_max = act_max.float()
    orig = [_layers.weight_2d(m).detach().clone() for m in cons_mods]
    w_max = torch.stack([w.float().abs().amax(0) for w in orig]).amax(0)
    losses = torch.empty(grid + 2, dtype=torch.float64)
    cur = {}

    def quantize(x):
        xq = _weights.fake_quant(x.float() / cur["s"], cur["a_scale"], 0.0, wq.quant_min,
                                 wq.quant_max) * cur["s"]
        return xq.to(x.dtype)

    def quantize_input(_m, args, kwargs):  # the input, positional or the one keyword argument
        if args:
            return (quantize(args[0]),) + tuple(args[1:]), kwargs
        key = next(iter(kwargs))
        return args, dict(kwargs, **{key: quantize(kwargs[key])})

    hooks = [m.register_forward_pre_hook(quantize_input, with_kwargs=True) for m in cons_mods]
    try:
        with torch.no_grad():
            for i, s in _candidates(act_max, w_max, grid):
                cur["s"], cur["a_scale"] = s, _act_scale(act_max, s, wq)
                for m, w in zip(cons_mods, orig):
                    q = _weights.rtn_weight(w.float() * s.view(1, -1), wq)[0] / s.view(1, -1)
                    _layers.weight_2d(m).copy_(q.to(m.weight.dtype))
                losses[i] = sum(token_error(_blocks.first_tensor(block(*a, **kw)).float(), ref)
                                for (a, kw), ref in recs) / len(recs)
    finally:
        for h in hooks:
            h.remove()
        with torch.no_grad():
            for m, w in zip(cons_mods, orig):
                _layers.weight_2d(m).copy_(w)
    return _pick(losses, act_max, w_max, grid) + (losses,)


def _check_alpha(alpha):
    if alpha == "auto":
        return alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"smoothquant: alpha must be a number in [0, 1] or 'auto', got {alpha!r}")
    return float(alpha)


def smoothquant(model, calib_data, alpha=0.5, layers=None, ignore=("lm_head",),
                skip_unreached=False, grid=20, objective="layer", max_tokens=2048):
    """Applies SmoothQuant's scales to ``model`` in place (float function unchanged).

    Run it before ``prepare_by_platform`` for a W8A8 backend (e.g. ``BackendType.Tensorrt_NLP``),
    or on the prepared model: its passes then see the float model (fake quantizers off), each
    fold is checked on the output first, and quantizers that had already observed observe the
    changed values again (docs/llm.md, "On a prepared model").

    Args:
        model: an nn.Module (transformers decoder, or any fx-traceable module of Linears).
        calib_data: iterable of model inputs (tensors, tuples, dicts of keyword inputs).
        alpha: migration strength in [0, 1] (0.5 in the paper; 0.75-0.85 for harder models), or
            "auto": per group, the alpha of {0, 1/grid, ..., 1} (or no scaling) whose INT8
            simulation moves the output least (Note [SmoothQuant's alpha search]).
        layers / ignore / skip_unreached: as in ``gptq``.
        grid: with alpha="auto", the number of alpha steps.
        objective: with alpha="auto", the output the candidates are scored on: "layer"
            (default): the group's Linears' outputs, on ``max_tokens`` of their calibration
            tokens (evenly subsampled); "block": the module holding the group's producer and
            Linears (a decoder layer for norm -> q/k/v, the attention for v_proj -> o_proj,
            BERT's attention with its LayerNorm), run again on its recorded inputs. Measured
            equal on a trained decoder and MiniLM, "block" 5-8x slower (docs/benchmarks.md). A
            prepared graph calls no block: there "layer" is used (logged).

    Returns:
        dict producer name -> {"consumers": [...], "scale": s, "alpha": the alpha used (None:
        no scaling won the search); with alpha="auto", "losses" (the search's errors, the last
        one of no scaling) and "scored_on" (the module name, or "layer")} of every group
        smoothed. Linears with no producer a scale can fold into are listed in the log
        (docs/llm.md).

    Example::

        from mqbench.llm import smoothquant
        smoothquant(model, calib, alpha=0.5)      # or alpha="auto"
        model = prepare_by_platform(model, BackendType.Tensorrt_NLP, ...)
    """
    return run_smoothquant(model, calib_data, alpha, layers, ignore, skip_unreached, grid,
                           objective, max_tokens)


def run_smoothquant(model, calib_data, alpha=0.5, layers=None, ignore=("lm_head",),
                    skip_unreached=False, grid=20, objective="layer", max_tokens=2048,
                    comm=None):
    """``smoothquant``; ``comm`` (``stream._dist.Comm``, under torchrun): ``calib_data`` is this
    rank's share of the items; the inputs' channel maxima are reduced over the ranks (a fixed
    alpha then gives one process's scales exactly), and with alpha="auto" each rank keeps its
    share of ``max_tokens`` and each candidate's error is reduced over the ranks."""
    alpha = _check_alpha(alpha)
    grid = _checks.check_positive_int(grid, "grid", "smoothquant")
    if comm is not None and alpha == "auto" and objective == "block":
        raise ValueError("smoothquant: objective='block' runs in one process; on several ranks "
                         "the candidates are scored on the layers' outputs (objective='layer')")
    max_tokens = _checks.check_positive_int(max_tokens, "max_tokens", "smoothquant")
    if objective not in ("block", "layer"):
        raise ValueError(f"smoothquant: objective must be 'block' or 'layer', got {objective!r}")
    # on a prepared model: fake quantizers off while it runs, folds checked, quantizers that had
    # observed observe again (_prepared.FoldingRun)
    with _prepared.FoldingRun(model, layers, ignore, None, "smoothquant") as run:
        if run.prepared and alpha == "auto" and objective == "block":
            logger.info("smoothquant: objective='block' runs the blocks, which a prepared graph "
                        "does not call; the candidates are scored on the layers' outputs")
            objective = "layer"
        return _smoothquant(model, calib_data, alpha, layers, ignore, skip_unreached, grid,
                            objective, max_tokens, run, comm)


def _smoothquant(model, calib_data, alpha, layers, ignore, skip_unreached, grid, objective,
                 max_tokens, run, comm=None):
    auto = alpha == "auto"
    # a fixed alpha needs one capture of the model; the search captures group by group, each
    # from its block's cached inputs
    cal = _calibration.select_and_calibrate(model, layers, ignore, calib_data, skip_unreached,
                                            "smoothquant", cache_blocks=auto)
    run.begin(cal.calib)
    maps = _mappings.mappings_of_live(model, cal.live, "smoothquant", "left as they are",
                                      run.run_one, run.prepared)
    run.settle()
    if not maps:
        return {}
    mods = dict(model.named_modules())
    out = {}
    if auto:
        for producer, cons in _checks.progress(maps, "smoothquant"):
            out[producer] = _search_group(model, cal, mods, producer, cons, grid, objective,
                                          max_tokens, comm)
            _mappings.apply_scale(model, producer, cons, out[producer]["scale"])
        return out
    first = [(cons[0], mods[cons[0]]) for _, cons in maps]
    act_max = {}

    def record(name, x):
        m = x.abs().amax(0).float()
        act_max[name] = m if name not in act_max else torch.maximum(act_max[name], m)

    cal.capture(first, record)
    if comm is not None:  # every rank's tokens (in the same order on every rank)
        act_max = {name: comm.max(act_max[name]) for name, _ in first}
    for producer, cons in _checks.progress(maps, "smoothquant"):
        w_max = torch.stack([_layers.weight_2d(mods[c]).detach().abs().amax(0).float()
                             for c in cons]).amax(0)
        s = smooth_scale(act_max[cons[0]], w_max, alpha)
        _mappings.apply_scale(model, producer, cons, s)
        out[producer] = {"consumers": cons, "scale": s, "alpha": alpha}
    return out


def _search_group(model, cal, mods, producer, cons, grid, objective, max_tokens, comm=None):
    """The result entry of one group's alpha search (``smoothquant``'s Returns); on several
    ranks (``comm``) from every rank's tokens."""
    if comm is not None:
        max_tokens = comm.share(max_tokens)
    act_max, x = _capture_group(cal, cons[0], mods[cons[0]], max_tokens, objective == "layer")
    if comm is not None:
        act_max = comm.max(act_max)
    cons_mods = [mods[c] for c in cons]
    scope = _mappings.scope_of(producer, cons) if objective == "block" else None
    recs = None
    if scope is not None:
        recs = cal.record_block_io(scope, mods[scope], cal.counts[cons[0]])
        why = "is never called" if not recs else "holds no tensor" \
            if any(o is None for _, o in recs) else None
        if why is not None:
            logger.info("smoothquant: the output of %s %s; %s -> %s scored on the layers' "
                        "outputs", scope or type(model).__name__, why, producer, cons)
            recs = None
    if recs is not None:
        s, a, losses = _block_search(mods[scope], recs, cons_mods, act_max, grid)
    else:
        if x is None:
            x = _capture_group(cal, cons[0], mods[cons[0]], max_tokens, True)[1]
        weights = [_layers.weight_2d(m) for m in cons_mods]
        if comm is None:
            s, a, losses = smoothquant_search_alpha(x, weights, act_max, grid)
        else:  # each rank's errors (means over its tokens) weighed by their count
            losses, w_max = _layer_losses(x, weights, act_max, grid)
            losses = comm.mean_of_means(losses, x.shape[0])
            s, a = _pick(losses, act_max.float(), w_max, grid)
        scope = "layer"
    return {"consumers": cons, "scale": s, "alpha": a, "losses": losses, "scored_on": scope}


def _capture_group(cal, name, mod, max_tokens, keep):
    """(max |X_j| over all of layer ``name``'s calibration inputs, and when ``keep`` at most
    ``max_tokens`` of those inputs, else None). The tokens kept are the centres of equal strides
    of each call (not its first and last rows: a first token's massive activations and
    right padding), then of the whole when the calls gave more than ``max_tokens``."""
    per_call = math.ceil(max_tokens / max(1, sum(cal.counts[name])))
    state = {"max": None, "xs": []}

    def record(_n, x):
        m = x.abs().amax(0).float()
        state["max"] = m if state["max"] is None else torch.maximum(state["max"], m)
        if keep:
            state["xs"].append(_centres(x, per_call).float())

    cal.capture([(name, mod)], record)
    if not keep:
        return state["max"], None
    return state["max"], _centres(torch.cat(state["xs"], 0), max_tokens)


def _centres(x, k):
    """Up to k rows of x: the centre row of each of k equal strides."""
    n = x.shape[0]
    if n <= k:
        return x
    return x[((torch.arange(k, dtype=torch.float64) + 0.5) * (n / k)).long()]
