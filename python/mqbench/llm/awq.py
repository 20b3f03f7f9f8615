"""AWQ (Lin et al. 2024, "AWQ: Activation-aware Weight Quantization for LLM Compression and
Acceleration"): per-input-channel weight scales that protect the channels with large
activations from weight rounding.

For each group of Linears that read one producer's output (_mappings.py) with calibration inputs
X ([tokens, in]), AWQ's grid search over ratio r = i / grid, i = 0 .. grid-1 (duo scaling, as
AutoAWQ and llm-compressor):
    s(r) = clamp(mean|X_j|^r / mean_w_j^(1 - r), 1e-4);  s /= sqrt(max(s) * min(s))
    loss(r) = sum over the group's Linears of mean((X W^T - (X / s) Q(W * s)^T)^2)
            (computed through X^T X)
where mean_w_j is the mean over output rows of |W| normalized by its group's max and Q is
round-to-nearest with min/max qparams on the ``w_qscheme`` grid. The best s is folded into the
producer (X / s) and the Linears (W * s), so the float function is unchanged; the weights stay
float and are rounded by the weight quantizer of ``prepare_by_platform`` (or ``rtn``).

Then, with ``clip=True``, AutoAWQ's weight clipping (``auto_clip``), block by block as AutoAWQ
orders it (a block's scale searches, then its clip searches, then the next block, which sees
this one scaled and clipped): for each Linear except the query / key projections, per output
row and per quantization group, the bound
    m(i) = (1 - i / clip_grid) * max|W_g|,  i = 0 .. max_shrink * clip_grid - 1
minimising
    err(i) = mean over tokens t of (X_g[t] . (Q(clamp(W_g, -m, m)) - W_g))^2
(X_g: the group's input columns, at most ~``clip_tokens`` tokens, subsampled with AutoAWQ's
stride) is found and the weight clamped to [-m, m]. i = 0 is no clipping and wins ties, so the
objective never grows. Q is the ``w_qscheme`` grid of the clamped group's min/max, what the
weight observer then computes.

The scale search runs in C++ (src/ops/llm_awq.cpp: ``torch.ops.mqbench.awq_search_scale``);
the tests hold it against the same search in torch (tests/python/reference.py). The clip search is
torch (``awq_search_clip``: batched matrix products, memory bounded by ``chunk``).
"""
import torch

from mqbench.llm import (_blocks, _calibration, _checks, _expert_runs, _experts, _layers,
                         _mappings, _prepared, _weights)
from mqbench.llm._weights import fake_quant, minmax_qparams, rtn_weight
from mqbench.utils.logger import logger

__all__ = ["awq", "awq_search_clip", "awq_weight_mean", "clip_objective"]

# Layers AutoAWQ does not clip ("due to qk bmm, it is hard to clip precisely"): their outputs
# meet in q k^T and a softmax, which a per-channel output error does not measure. Matched on the
# last name component (AutoAWQ matches substrings of the name, which also skips e.g. Mixtral's
# "block_sparse_moe" experts through "k_"); the fused q/k/v layers hold a query and a key too.
_NO_CLIP_PREFIXES = ("q_", "k_")
_NO_CLIP_NAMES = ("query", "key", "Wqkv", "qkv_proj", "query_key_value", "c_attn")


def skips_clip(name):
    """Whether ``awq(clip=True)`` leaves layer ``name`` unclipped (a query or key projection)."""
    last = name.rsplit(".", 1)[-1]
    return last.startswith(_NO_CLIP_PREFIXES) or last in _NO_CLIP_NAMES


class AWQResult(dict):
    """What ``awq`` returns: a dict producer name -> scale search result, and in ``clip`` the
    clip search's result per clipped layer (empty with ``clip=False``)."""

    def __init__(self):
        super().__init__()
        self.clip = {}


def _groups(w, wq):
    """[out, in] -> [rows, groups, k] as the weight grid groups it (per tensor: one group)."""
    out_f, in_f = w.shape
    if wq.group_size:
        return w.reshape(out_f, in_f // wq.group_size, wq.group_size)
    if wq.per_channel:
        return w.reshape(out_f, 1, in_f)
    return w.reshape(1, 1, -1)


def _quant_groups(g, wq):
    scale, zp = minmax_qparams(g.amin(-1), g.amax(-1), wq.quant_min, wq.quant_max, wq.symmetric)
    return fake_quant(g, scale.unsqueeze(-1), zp.unsqueeze(-1), wq.quant_min, wq.quant_max)


def clip_objective(x, weight, clipped, wq):
    """AWQ's clip objective of a clipped weight: the sum over output rows and groups of
    mean over tokens of (X_g . (Q(clipped_g) - W_g))^2 (per tensor: mean over tokens of the
    summed squared output error). ``clipped = weight`` gives the unclipped objective."""
    w = weight.detach().float()
    q = rtn_weight(clipped.detach().float(), wq)[0]
    if not wq.group_size and not wq.per_channel:
        return (x.float() @ (q - w).t()).pow(2).sum(1).mean().item()
    d = _groups(q - w, wq)  # [out, G, k]
    xg = x.float().reshape(x.shape[0], d.shape[1], d.shape[2])  # [t, G, k]
    return torch.einsum("tgk,ogk->tog", xg, d).pow(2).mean(0).sum().item()


def awq_search_clip(x, weight, wq, grid=20, max_shrink=0.5, chunk=1 << 24):
    """AutoAWQ's clip search of one [out, in] weight on inputs ``x`` [tokens, in].

    Candidates i = 0 .. n-1, n = int(max_shrink * grid): bound (1 - i / grid) * max|W_g| per
    output row and group (per tensor: one bound). Returns (max_val, errs): max_val [out, groups]
    ([1, 1] per tensor) the best bound, errs [n, out, groups] the objective of each candidate
    (``clip_objective``'s terms). Memory: about ``chunk`` floats of partial outputs at a time.
    """
    amax, errs = _clip_errors(x, weight, wq, grid, max_shrink, chunk)
    return _best_bound(amax, errs, grid), errs


def _best_bound(amax, errs, grid):
    """The bound of the first smallest error per row and group: no clipping (i = 0) wins
    ties."""
    return amax * (1 - errs.argmin(0).float() / grid)


def _clip_errors(x, weight, wq, grid, max_shrink, chunk=1 << 24):
    """(max|W_g| [out, groups] ([1, 1] per tensor), errs [n, out, groups]): ``awq_search_clip``'s
    objective of each candidate bound."""
    w = weight.detach().float()
    x = x.float()
    n = max(1, int(max_shrink * grid))
    if not wq.group_size and not wq.per_channel:
        amax = w.abs().amax().reshape(1, 1)
        errs = torch.empty(n, 1, 1, device=w.device)
        for i in range(n):
            mv = amax * (1 - i / grid)
            q = rtn_weight(torch.clamp(w, -mv, mv), wq)[0]
            errs[i] = (x @ (q - w).t()).pow(2).sum(1).mean()
        return amax, errs
    g_all = _groups(w, wq)  # [out, G, k]
    out_f, n_g, k = g_all.shape
    xg = x.reshape(x.shape[0], n_g, k).transpose(0, 1)  # [G, t, k]
    rows = max(1, chunk // max(1, n_g * x.shape[0]))
    errs = torch.empty(n, out_f, n_g, device=w.device)
    for r0 in range(0, out_f, rows):
        g = g_all[r0:r0 + rows]
        amax = g.abs().amax(-1, keepdim=True)  # [r, G, 1]
        for i in range(n):
            mv = amax * (1 - i / grid)
            d = _quant_groups(torch.maximum(torch.minimum(g, mv), -mv), wq) - g
            # partial outputs of each group: [G, t, k] @ [G, k, r] -> [G, t, r]
            errs[i, r0:r0 + rows] = torch.bmm(xg, d.permute(1, 2, 0)).pow(2).mean(1).t()
    return g_all.abs().amax(-1), errs


def apply_clip(weight, max_val, wq):
    """Clamps an [out, in] weight (in place) to [-max_val, max_val] per row and group."""
    with torch.no_grad():
        mv = max_val.to(weight.dtype)
        if not wq.group_size and not wq.per_channel:
            weight.clamp_(-mv.item(), mv.item())
            return
        g = _groups(weight.detach().clone(), wq)
        g = torch.maximum(torch.minimum(g, mv.unsqueeze(-1)), -mv.unsqueeze(-1))
        weight.copy_(g.reshape(weight.shape))


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


def _block_search(cal, block_name, block, n_calls, cons_mods, x_mean, w_mean, grid, wq):
    """AWQ's search scored on the output of the block that holds the Linears (AutoAWQ's
    ``module2inspect``: the attention for q/k/v, the MLP for gate/up), so that the error is
    weighed as the block's nonlinearity (softmax, SiLU gate) weighs it. The candidate weights
    are Q(W * s) / s: (X / s) Q(W s)^T = X (Q(W s) / s)^T, the producer need not change.
    (best scale, losses), or None when the block is never called."""
    recs = cal.record_block_io(block_name, block, n_calls)
    if not recs:
        logger.info("awq: %s is never called; its group is scored on the layers' outputs",
                    block_name)
        return None
    orig = [_layers.weight_2d(m).detach().clone() for m in cons_mods]
    losses = torch.empty(grid + 1, dtype=torch.float64)
    best, best_loss = None, float("inf")
    try:
        with torch.no_grad():
            for i in range(grid + 1):
                s = candidate_scale(x_mean, w_mean, i, grid)
                for m, w in zip(cons_mods, orig):
                    q = rtn_weight(w.float() * s.view(1, -1), wq)[0] / s.view(1, -1)
                    _layers.weight_2d(m).copy_(q.to(m.weight.dtype))
                loss = 0.0  # summed on the device in float64: one read per candidate
                for (args, kwargs), ref in recs:
                    out = _blocks.first_tensor(block(*args, **kwargs)).float()
                    loss = loss + (out - ref).pow(2).mean().double()
                losses[i] = loss / len(recs)
                if losses[i] < best_loss or (i == grid and losses[i] <= best_loss):
                    best, best_loss = s, losses[i].item()
    finally:
        with torch.no_grad():
            for m, w in zip(cons_mods, orig):
                _layers.weight_2d(m).copy_(w)
    return best, losses


def _best_candidate(losses, grid):
    """The candidate the search op picks from its losses: the first smallest ratio, unless no
    scaling (the last) does at least as well; a NaN never wins, and with no candidate left the
    search fails, as the op's does."""
    best, best_loss = None, float("inf")
    for i in range(grid + 1):
        loss = float(losses[i])
        if loss < best_loss or (i == grid and loss <= best_loss):
            best, best_loss = i, loss
    if best is None:
        raise RuntimeError("awq: every candidate scale gave a non-finite error (non-finite "
                           "calibration activations)")
    return best


def _search_scale(x, weights, x_mean, w_mean, grid, wq):
    """The AWQ grid search (the C++ op). Returns (best scale [in], losses [grid + 1]): losses[i]
    of ratio i / grid, losses[grid] of no scaling (s = 1), which wins ties."""
    return torch.ops.mqbench.awq_search_scale(x, weights, x_mean, w_mean, grid, *wq.as_args())


def awq(model, calib_data, w_qscheme, grid=20, max_tokens=4096, objective="layer", clip=True,
        clip_grid=20, max_shrink=0.5, clip_tokens=512, layers=None, ignore=("lm_head",),
        skip_unreached=False, impl="auto", cache_blocks=True, calibrate_all_experts=False,
        min_expert_tokens=_experts.MIN_EXPERT_TOKENS):
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
            random Llama (docs/benchmarks.md); trained models may differ.
        clip: after the scales, search and apply AutoAWQ's weight clipping (``auto_clip``) on
            every layer but the query / key projections (``skips_clip``; GPT-2's fused
            ``c_attn`` too). On by default, as in AutoAWQ (docs/llm.md). The clamped weights
            are float; the grid of the weight observer is then computed from them.
        clip_grid / max_shrink: clip bounds (1 - i / clip_grid) * max|W_g|, i < max_shrink *
            clip_grid (AutoAWQ: 20 and 0.5, bounds 1.0 down to 0.55).
        clip_tokens: tokens of each layer's inputs the clip search uses: every
            (N // clip_tokens)-th of the N captured (AutoAWQ's n_sample_token and stride).
        layers / ignore / skip_unreached / impl / cache_blocks: as in ``gptq``.

    Returns:
        ``AWQResult``: a dict producer name -> {"consumers", "scale", "ratio" (None: no scaling
        won), "losses", "block" (the block scored, or None)}; its ``clip`` attribute: layer name
        -> {"max_val" [out, groups], "ratio" (the bound / max|W_g| per group), "loss",
        "loss_unclipped"} (the clip objective, ``clip_objective``).

    On a model ``prepare_by_platform`` prepared, each layer's weight quantizer must hold the
    grid of ``w_qscheme`` (as for ``gptq``); the passes see the float model, each fold is checked
    on the output first, and quantizers that had already observed observe the changed values
    again (docs/llm.md, "On a prepared model"). ``objective="block"`` is "layer" there.

    Example::

        from mqbench.llm import awq
        awq(model, calib, {"bit": 4, "per_channel": True, "group_size": 128})
        model = prepare_by_platform(model, BackendType.Academic, {"extra_qconfig_dict": {
            "w_qscheme": {"bit": 4, "per_channel": True, "group_size": 128}, ...}})
    """
    return run_awq(model, calib_data, w_qscheme, grid, max_tokens, objective, clip, clip_grid,
                   max_shrink, clip_tokens, layers, ignore, skip_unreached, impl, cache_blocks,
                   calibrate_all_experts, min_expert_tokens)


@_expert_runs.per_expert
def run_awq(model, calib_data, w_qscheme, grid=20, max_tokens=4096, objective="layer", clip=True,
            clip_grid=20, max_shrink=0.5, clip_tokens=512, layers=None, ignore=("lm_head",),
            skip_unreached=False, impl="auto", cache_blocks=True, calibrate_all_experts=False,
            min_expert_tokens=_experts.MIN_EXPERT_TOKENS, comm=None):
    """``awq``; ``comm`` (``stream._dist.Comm``, under torchrun): ``calib_data`` is this rank's
    share of the items, each rank keeps its share of ``max_tokens`` and ``clip_tokens``, the
    inputs' channel means and each candidate's error (scales and clips) are reduced over the
    ranks, and every rank then applies the same scales and clips."""
    wq = _weights.resolve_w_qscheme(w_qscheme, "awq")
    grid = _checks.check_positive_int(grid, "grid", "awq")
    max_tokens = _checks.check_positive_int(max_tokens, "max_tokens", "awq")
    if objective not in ("block", "layer"):
        raise ValueError(f"awq: objective must be 'block' or 'layer', got {objective!r}")
    clip_grid = _checks.check_positive_int(clip_grid, "clip_grid", "awq")
    clip_tokens = _checks.check_positive_int(clip_tokens, "clip_tokens", "awq")
    if isinstance(max_shrink, bool) or not isinstance(max_shrink, (int, float)) or \
            not 0 <= max_shrink < 1:
        raise ValueError(f"awq: max_shrink must be a number in [0, 1), got {max_shrink!r}")
    _checks.check_impl(impl, "awq", "awq_search_scale")
    if comm is not None and objective == "block":
        raise ValueError("awq: objective='block' runs in one process; on several ranks the "
                         "candidates are scored on the layers' outputs (objective='layer')")
    # on a prepared model: fake quantizers off while it runs, folds checked, quantizers that had
    # observed observe again (_prepared.FoldingRun)
    with _prepared.FoldingRun(model, layers, ignore, wq, "awq") as run:
        if run.prepared and objective == "block":
            logger.info("awq: objective='block' runs the blocks, which a prepared graph does not "
                        "call; the candidates are scored on the layers' outputs")
            objective = "layer"
        return _awq(model, calib_data, wq, grid, max_tokens, objective, clip, clip_grid,
                    max_shrink, clip_tokens, layers, ignore, skip_unreached,
                    cache_blocks, run, comm)


def _share(tokens, comm):
    """This rank's share of a token budget (all of it in one process)."""
    return tokens if comm is None else comm.share(tokens)


def _awq(model, calib_data, wq, grid, max_tokens, objective, clip, clip_grid, max_shrink,
         clip_tokens, layers, ignore, skip_unreached, cache_blocks, run, comm=None):
    cal = _calibration.select_and_calibrate(model, layers, ignore, calib_data, skip_unreached,
                                            "awq", wq, cache_blocks)
    run.begin(cal.calib)
    live = cal.live
    maps = _mappings.mappings_of_live(model, live, "awq", "rounded without AWQ", run.run_one,
                                      run.prepared)
    run.settle()
    clipped = [lm for lm in live if not skips_clip(lm[0])] if clip else []
    stage = _stages(cal)
    steps = []  # per block (stage): its scale searches, then its clip searches, as AutoAWQ
    for st in sorted(set(stage.values())):
        steps += [("scale", m) for m in maps if stage[m[1][0]] == st]
        steps += [("clip", g) for g in cal.groups([lm for lm in clipped if stage[lm[0]] == st])]
    mods = dict(model.named_modules())
    out = AWQResult()
    # A Linear that produces for one group (up_proj -> down_proj) and consumes in another
    # (norm -> gate/up) has its rows divided by the later scale: its per-row (or per-group) grid
    # scales with the row, so its rounding is unchanged, and the earlier search scored its error
    # in the unscaled output space the next layer sees before scaling.
    for kind, step in _checks.progress(steps, "awq"):
        if kind == "clip":
            _clip_group(cal, step, wq, clip_grid, max_shrink, _share(clip_tokens, comm),
                        out.clip, comm)
            continue
        producer, cons = step
        xs = []
        cal.capture([(cons[0], mods[cons[0]])], lambda _n, x: xs.append(x))
        n = sum(x.shape[0] for x in xs)
        keep = _share(max_tokens, comm)
        x = _rows(xs, torch.linspace(0, n - 1, keep).long() if n > keep else None)
        weights = [_layers.weight_2d(mods[c]).detach() for c in cons]
        x_mean = x.abs().mean(0) if comm is None else \
            comm.mean_of_means(x.abs().mean(0), x.shape[0]).float()
        w_mean = awq_weight_mean(weights, wq)
        block_name = _mappings.block_of(model, cons) if objective == "block" else None
        found = None
        if block_name is not None:
            found = _block_search(cal, block_name, mods[block_name], cal.counts[cons[0]],
                                  [mods[c] for c in cons], x_mean, w_mean, grid, wq)
            block_name = block_name if found is not None else None
        if found is not None:
            s, losses = found
        elif comm is None:
            s, losses = _search_scale(x, weights, x_mean, w_mean, grid, wq)
        else:  # every rank's tokens: its losses (means over its own) weighed by their count
            losses = comm.mean_of_means(
                _search_scale(x, weights, x_mean, w_mean, grid, wq)[1], x.shape[0])
            s = candidate_scale(x_mean, w_mean, _best_candidate(losses, grid), grid)
        if not torch.isfinite(s).all():
            raise RuntimeError(f"awq: non-finite scale for {producer} -> {cons}")
        _mappings.apply_scale(model, producer, cons, s)
        best = int(losses.argmin())
        out[producer] = {"consumers": cons, "scale": s,
                         "ratio": None if best == grid else best / grid,
                         "losses": losses, "block": block_name}
    return out


def _rows(xs, idx):
    """Rows ``idx`` (ascending; None: all) of the captured inputs ``xs`` ([tokens, in] each, in
    the model's dtype) concatenated, as float32: the rows of ``torch.cat(xs)[idx]`` without that
    concatenation, nor a float32 copy of every token (128 items of 2048 tokens at an input of
    11008 are 11.5 GB in float32, for the few thousand rows kept)."""
    if idx is None:
        return torch.cat([x.float() for x in xs], 0)
    out, start = [], 0
    for x in xs:
        end = start + x.shape[0]
        lo, hi = torch.searchsorted(idx, torch.tensor([start, end])).tolist()
        if hi > lo:
            out.append(x[(idx[lo:hi] - start).to(x.device)].float())
        start = end
    return torch.cat(out, 0)


def _stages(cal):
    """Layer name -> the index of the block (``cal.block_index``) that holds it; a layer outside
    the blocks goes with the layer before it in module order (-1 before any block). One stage
    for all when the model has no blocks."""
    stage, cur = {}, -1
    for name, _ in cal.live:
        cur = cal.block_index.get(name, cur)
        stage[name] = cur
    return stage


def _clip_group(cal, group, wq, grid, max_shrink, n_tokens, results, comm=None):
    """The clip search of a group of layers on one input tensor (one layer, or several:
    ``_calibration.shared_input_groups``), on one capture of their inputs as the layers before them
    (scaled and already clipped) give them."""
    xs = []
    cal.capture(group[:1], lambda _n, x: xs.append(x))
    n = sum(x.shape[0] for x in xs)
    stride = max(1, n // n_tokens)  # AutoAWQ's stride: n_tokens to 2 n_tokens - 1
    x = _rows(xs, torch.arange(0, n, stride) if stride > 1 else None)
    for name, mod in group:
        _clip_layer(name, mod, x, wq, grid, max_shrink, results, comm)


def _clip_layer(name, mod, x, wq, grid, max_shrink, results, comm=None):
    weight = _layers.weight_2d(mod)  # [out, in] (Note [Conv1D weights])
    before = weight.detach().float().clone()
    if comm is None:
        max_val, errs = awq_search_clip(x, before, wq, grid, max_shrink)
    else:  # every rank's tokens: its errors (means over its own) weighed by their count
        amax, errs = _clip_errors(x, before, wq, grid, max_shrink)
        errs = comm.mean_of_means(errs, x.shape[0]).float()
        max_val = _best_bound(amax, errs, grid)
    apply_clip(weight, max_val, wq)
    amax = _groups(before, wq).abs().amax(-1)
    results[name] = {"max_val": max_val,
                     "ratio": max_val / amax.clamp(min=torch.finfo(torch.float32).tiny),
                     "loss": errs.min(0).values.sum().item(),
                     "loss_unclipped": errs[0].sum().item()}
