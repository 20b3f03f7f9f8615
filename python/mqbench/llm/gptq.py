"""GPTQ (Frantar et al. 2023, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers"): second-order weight rounding, one Linear at a time.

For a layer y = W x with calibration inputs X ([tokens, in]), the Hessian of the layer's
reconstruction error ||W X^T - Q X^T||^2 is H = 2/N X^T X. GPTQ quantizes W column by column
(optionally in order of decreasing diag(H): act_order) and after each column j spreads its
rounding error over the columns not yet quantized. The paper does it through the upper Cholesky
factor U of H^-1: err = (w_j - q_j) / U[j, j]; W[:, k] -= err * U[j, k] for k > j. Here the same
updates come from R, the upper triangular factor of H = R R^T, with no inverse (Note [GPTQ from
the factor of H] in src/ops/llm_gptq.cpp): with w0 the weight before any update,
    W[:, k] += (w0_j - q_j) * R[j, k] / R[k, k]   for k > j
in blocks of ``block_size`` columns (the lazy batch update of the paper). Dead inputs
(diag(H) = 0) get their column zeroed; H gets ``damp * mean(diag(H))`` on its diagonal, raised
tenfold (with a warning) while it is not positive definite.

The heavy parts run in C++ (src/ops/llm_gptq.cpp: ``torch.ops.mqbench.gptq_hessian_update``,
``gptq_quantize_weight``); ``gptq_quantize_weight_reference`` below is the same algorithm in
torch, the oracle of the tests.
"""
import warnings

import torch

from mqbench.llm import _common, _prepared
from mqbench.llm._common import fake_quant, minmax_qparams

__all__ = ["gptq", "gptq_quantize_weight_reference", "hessian_update_reference"]

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
            WT[i2:] += G[i1:i2, i2:].t() @ ET
    if perm is not None:
        QT = QT[torch.argsort(perm)]
    Q = QT.t().contiguous()
    return Q, scale, zero, rel


def gptq(model, calib_data, w_qscheme, block_size=128, damp=0.01, act_order=False, layers=None,
         ignore=("lm_head",), skip_unreached=False, impl="auto", cache_blocks=True,
         true_sequential=True):
    """Quantizes the weights of ``model``'s Linear layers with GPTQ, in place.

    Each layer, in module order, gets its Hessian from the calibration data as it flows through
    the layers already quantized (sequential GPTQ), then its weight is replaced by the
    dequantized GPTQ weight Q (float, on the ``w_qscheme`` grid). Memory: one layer's [in, in]
    Hessian at a time. Run it before ``prepare_by_platform`` with the same scheme as weight
    scheme (``extra_qconfig_dict['w_qscheme']``): the MinMax weight observer then finds the grid
    again in most groups; ``load_weight_qparams`` sets exactly GPTQ's grid (docs/llm.md).
    Consecutive layers called on one input tensor (q, k and v; gate and up) share one pass of the
    data and one Hessian: the result of processing them one by one, in fewer forwards.

    It also runs on a model ``prepare_by_platform`` already prepared, with the same result:
    its passes see the float model inside (every fake quantizer off while it runs, then back
    as it was), and each quantized layer's ``weight_fake_quant`` then holds GPTQ's grid, its
    observer off, as ``load_weight_qparams`` sets it (docs/llm.md, "On a prepared model").
    The block cache does not apply there (the prepared graph calls no block module).

    Args:
        model: an nn.Module (a transformers decoder or encoder, or any module of Linears).
        calib_data: iterable of model inputs: tensors, tuples of positional inputs, or dicts of
            keyword inputs (a tokenizer's output).
        w_qscheme: a QuantizeScheme or its dict, integer, bit in [2, 8], e.g.
            ``{"bit": 4, "per_channel": True, "group_size": 128}``.
        block_size: columns per lazy-update block.
        damp: relative damping added to diag(H) (times its mean).
        act_order: quantize columns in order of decreasing diag(H) (with groups: the groups'
            grids are fixed from the float weight first, "static groups").
        layers / ignore: which Linears (qualified names); ``lm_head`` is left float by default.
        skip_unreached: a layer the data never reaches raises ValueError naming it (default), or
            is left float with a warning.
        impl: "auto" (C++ ops when built), "cpp" or "python" (the reference).
        cache_blocks: where the model's layers sit in a chain of blocks (a decoder's layers),
            keep each block's inputs and run only that block for a capture, with the same
            result (docs/llm.md); memory: one block's inputs for all calibration items. False
            runs the model from its input for every capture.
        true_sequential: each layer's Hessian from the inputs the layers before it, already
            quantized, give (default, the paper's order; a step whose layers share a module
            inside the block with the step before, a Llama's ``mlp``, runs that module alone).
            False: the layers of one block of the chain (a decoder layer) all get their
            Hessians from one pass of the block as it was before any of them was quantized
            (llm-compressor's and AutoGPTQ's ``true_sequential=False``): fewer partial block
            forwards; memory: the block's Hessians at once. Layers outside the blocks run one
            group at a time.

    Returns:
        dict name -> {"scale", "zero_point", "damp", "quant_min", "quant_max", "conv1d"} of
        every quantized layer (``load_weight_qparams`` takes it). Scales are [out, groups] of
        the [out, in] weight, also for a transformers ``Conv1D`` (``conv1d`` True), whose
        weight is stored [in, out] and written back in that layout.

    Example::

        from mqbench.llm import gptq
        qparams = gptq(model, [tok(t, return_tensors="pt") for t in texts],
                       {"bit": 4, "per_channel": True, "group_size": 128})
    """
    wq = _common.resolve_w_qscheme(w_qscheme, "gptq")
    block_size = _common.check_positive_int(block_size, "block_size", "gptq")
    if not (isinstance(damp, (int, float)) and damp >= 0):
        raise ValueError(f"gptq: damp must be a number >= 0, got {damp!r}")
    use_cpp = _common.want_cpp(impl)
    results = {}
    # on a prepared model: every fake quantizer off during the passes, the grids loaded into
    # these layers' weight quantizers at the end (_prepared.py)
    with _prepared.PreparedRun(model, layers, ignore, wq, "gptq") as prepared:
        cal = _common.select_and_calibrate(model, layers, ignore, calib_data, skip_unreached,
                                           "gptq", wq, cache_blocks)
        # Layers on one input (q, k, v; gate, up) share one capture and one Hessian; without
        # true_sequential a block's groups also share one pass of the block. A step whose layers
        # share a module inside their block with the previous step's runs that module alone
        # (Note [Captures from a sub-module's inputs] in _blocks.py).
        units = _units(cal, true_sequential)
        scope = None
        for t, unit in enumerate(_common.progress(units, "gptq")):
            modules = [group[0] for group in unit]
            following = [m for group in units[t + 1] for m in group] if t + 1 < len(units) \
                else None
            record = cal.scope_between([m for group in unit for m in group], following)
            hessians = {}
            for group in unit:
                n_in = _common.in_features(group[0][1])
                device = _common.weight_2d(group[0][1]).device
                hessians[group[0][0]] = _Hessian(n_in, device, use_cpp)

            def accumulate(name, x, hessians=hessians):
                hessians[name].add(x)

            cal.capture(modules, accumulate, record=record, replay=scope)
            scope = record
            for group in unit:
                H = hessians.pop(group[0][0]).finish()  # both copy it before damping
                for name, mod in group:
                    results[name] = _quantize_layer(name, mod, H, wq, block_size, damp,
                                                    act_order, use_cpp)
                    prepared.done(name, results[name])
    return results


# Note [Hessian updates in batches of rows]
# Each update rescales and rewrites the whole [in, in] H, so short calibration items (a sentence
# of 20 tokens) made the updates cost more than their products: on all-MiniLM-L6-v2, 64
# sentences, 1600 updates took 3.3 s of GPTQ's 8.9 s. The captured rows are buffered (copied:
# the model may change its tensors in place later) and added in batches of at least
# _HESSIAN_ROWS rows; an item that long alone goes through without a copy. Both
# implementations get the same batches, so they stay equal.
_HESSIAN_ROWS = 2048


class _Hessian(object):
    """H = 2/N X^T X of one layer group's inputs, from captured [tokens, in] batches."""

    def __init__(self, n_in, device, use_cpp):
        self.H = torch.zeros(n_in, n_in, device=device)
        self.n = 0
        self._update = torch.ops.mqbench.gptq_hessian_update if use_cpp \
            else hessian_update_reference
        self._rows, self._pending = 0, []

    def add(self, x):
        # the layer's device: a forward pre-hook runs before accelerate's hook moves the input
        # of a Linear that is a device_map leaf of its own (a model over several GPUs)
        x = x.to(self.H.device)
        if not self._pending and x.shape[0] >= _HESSIAN_ROWS:
            self._apply(x)
            return
        self._pending.append(x.to(torch.float32, copy=True))
        self._rows += x.shape[0]
        if self._rows >= _HESSIAN_ROWS:
            self._flush()

    def _apply(self, x):
        self.H = self._update(self.H, x, self.n)
        self.n += x.shape[0]

    def _flush(self):
        if self._pending:
            self._apply(torch.cat(self._pending))
        self._rows, self._pending = 0, []

    def finish(self):
        self._flush()
        return self.H


def _units(cal, true_sequential):
    """The steps of ``gptq``: lists of shared-input groups captured in one pass. One group per
    step (true sequential), or all of one block's consecutive groups (``true_sequential=False``,
    where the model has blocks)."""
    groups = cal.groups(cal.live)
    if true_sequential or not cal.blocks:
        return [[g] for g in groups]
    units, last = [], None
    for g in groups:
        b = cal.block_of(n for n, _ in g)
        if units and b is not None and b == last:
            units[-1].append(g)
        else:
            units.append([g])
        last = b
    return units


def _quantize_layer(name, mod, H, wq, block_size, damp, act_order, use_cpp):
    """GPTQ of one layer with its Hessian H: writes the weight, returns its qparams entry."""
    weight = _common.weight_2d(mod)  # [out, in], a view (Note [Conv1D weights])
    if use_cpp:
        Q, scale, zero, used = torch.ops.mqbench.gptq_quantize_weight(
            weight.detach(), H, *wq.as_args(), block_size, float(damp), bool(act_order), name)
        if used != damp:  # the op's TORCH_WARN does not reach Python's warnings
            warnings.warn(f"gptq: the Hessian of {name} is not positive definite with "
                          f"damp={damp:g}; raised damp to {used:g}")
    else:
        Q, scale, zero, used = gptq_quantize_weight_reference(
            weight, H, wq, block_size, damp, act_order, name)
    if not torch.isfinite(Q).all():  # never write a NaN weight
        raise RuntimeError(f"gptq: non-finite quantized weight for {name}")
    with torch.no_grad():
        weight.copy_(Q.to(weight.dtype))
    return {"scale": scale, "zero_point": zero, "damp": used, "quant_min": wq.quant_min,
            "quant_max": wq.quant_max, "conv1d": _common.is_conv1d(mod)}
