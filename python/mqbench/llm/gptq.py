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

The heavy parts run in C++ (src/ops/llm_gptq.cpp: ``torch.ops.mqbench.gptq_hessian_update_``,
``gptq_quantize_weight`` and ``gptq_quantize_weight_``), called through ``_hessian_update`` and
``_quantize_weight``; the tests hold them against the same algorithm in torch
(tests/python/reference.py).
"""
import warnings

import torch

from mqbench.llm import (_calibration, _checks, _expert_runs, _experts, _layers, _memory,
                         _prepared, _weights)

__all__ = ["gptq"]

def _hessian_update(H, x, n_seen):
    """H of the first n_seen rows -> H of n_seen + len(x) rows: H = 2/N sum x x^T (float32), in
    H's own buffer (``gptq_hessian_update_``: no second [in, in] matrix per update)."""
    return torch.ops.mqbench.gptq_hessian_update_(H, x, n_seen)


def _quantize_weight(weight, H, wq, block_size, damp, act_order, name, last_use=False):
    """GPTQ of one [out, in] weight with its [in, in] Hessian (the C++ op). Returns (Q, scale,
    zero_point, damp_used): Q dequantized (float32, the weight's shape), scale / zero_point
    [out, groups] ([out, 1] per channel, [1, 1] per tensor), damp_used the relative damping that
    made H positive definite. ``last_use``: H is not read again, and the op takes it as its work
    space (``gptq_quantize_weight_``: one [in, in] buffer fewer; Note [GPTQ's n x n buffers] in
    src/ops/llm_gptq.cpp)."""
    op = torch.ops.mqbench.gptq_quantize_weight_ if last_use else \
        torch.ops.mqbench.gptq_quantize_weight
    Q, scale, zero, used = op(weight.detach(), H, *wq.as_args(), block_size, float(damp),
                              bool(act_order), name)
    if used != damp:  # the op's TORCH_WARN does not reach Python's warnings
        warnings.warn(f"gptq: the Hessian of {name} is not positive definite with "
                      f"damp={damp:g}; raised damp to {used:g}")
    return Q, scale, zero, used


def gptq(model, calib_data, w_qscheme, block_size=128, damp=0.01, act_order=False, layers=None,
         ignore=("lm_head",), skip_unreached=False, impl="auto", cache_blocks=True,
         true_sequential=True, calibrate_all_experts=False,
         min_expert_tokens=_experts.MIN_EXPERT_TOKENS):
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
        impl: "auto" or "cpp": both run the C++ ops (the torch formulation of GPTQ is the
            tests' oracle, not part of the package).
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
        calibrate_all_experts: on a mixture-of-experts model (fused experts, as transformers 5
            stores them), run every token through every expert for the statistics (the output
            still takes the router's choice); by default each expert sees its routed tokens.
        min_expert_tokens: an expert routed fewer calibration tokens is rounded to nearest,
            with a warning naming it (docs/llm-scale.md, "Mixtures of experts").

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
    return run_gptq(model, calib_data, w_qscheme, block_size, damp, act_order, layers, ignore,
                    skip_unreached, impl, cache_blocks, true_sequential, calibrate_all_experts,
                    min_expert_tokens)


@_expert_runs.per_expert
def run_gptq(model, calib_data, w_qscheme, block_size=128, damp=0.01, act_order=False,
             layers=None, ignore=("lm_head",), skip_unreached=False, impl="auto",
             cache_blocks=True, true_sequential=True, calibrate_all_experts=False,
             min_expert_tokens=_experts.MIN_EXPERT_TOKENS, one_block=False, comm=None):
    """``gptq``; with ``one_block``, ``model`` is one block of a chain (``quantize_checkpoint``
    runs a decoder block alone): ``true_sequential=False`` then takes all its layers' Hessians
    from one pass, and the counting pass runs one item of each kind, as ``gptq`` does for a
    block of a whole model. ``comm`` (``stream._dist.Comm``, under torchrun): ``calib_data`` is
    this rank's share of the items; the Hessians are summed over the ranks and the layers are
    quantized by one rank each, the others taking the result."""
    wq = _weights.resolve_w_qscheme(w_qscheme, "gptq")
    block_size = _checks.check_positive_int(block_size, "block_size", "gptq")
    if not (isinstance(damp, (int, float)) and damp >= 0):
        raise ValueError(f"gptq: damp must be a number >= 0, got {damp!r}")
    _checks.check_impl(impl, "gptq", "gptq_quantize_weight")
    results = {}
    # on a prepared model: every fake quantizer off during the passes, the grids loaded into
    # these layers' weight quantizers at the end (_prepared.py)
    with _prepared.PreparedRun(model, layers, ignore, wq, "gptq") as prepared:
        cal = _calibration.select_and_calibrate(model, layers, ignore, calib_data, skip_unreached,
                                                "gptq", wq, cache_blocks, one_block)
        # Layers on one input (q, k, v; gate, up) share one capture and one Hessian; without
        # true_sequential a block's groups also share one pass of the block. A step whose layers
        # share a module inside their block with the previous step's runs that module alone
        # (Note [Captures from a sub-module's inputs] in _blocks.py).
        units = _units(cal, true_sequential, one_block)
        scope = None
        for t, unit in enumerate(_checks.progress(units, "gptq")):
            modules = [group[0] for group in unit]
            following = [m for group in units[t + 1] for m in group] if t + 1 < len(units) \
                else None
            record = cal.scope_between([m for group in unit for m in group], following)
            hessians = {}
            for group in unit:
                n_in = _layers.in_features(group[0][1])
                device = _layers.weight_2d(group[0][1]).device
                hessians[group[0][0]] = _Hessian(n_in, device)

            def accumulate(name, x, hessians=hessians):
                hessians[name].add(x)

            cal.capture(modules, accumulate, record=record, replay=scope)
            scope = record
            _memory.give_back()  # the pass's temporaries (Note [Freed memory given back])
            tasks = []  # (name, layer, its Hessian): independent of one another
            last = set()  # the layers that use their group's Hessian last
            for group in unit:
                hessian = hessians.pop(group[0][0])
                H = hessian.finish()
                if comm is not None:  # the Hessian of every rank's items
                    H = comm.reduce_hessian(H, hessian.n)
                tasks += [(name, mod, H) for name, mod in group]
                last.add(group[-1][0])
            hessian = H = None  # in the tasks alone: the last task of each takes it as work space

            def quantize(name, mod, H):
                return _quantize_layer(name, mod, H, wq, block_size, damp, act_order,
                                       last_use=name in last)
            # on several ranks each quantizes its share of the layers, then they exchange them
            done = comm.quantize_layers(tasks, quantize) if comm is not None else \
                [quantize(*task) for task in tasks]
            for (name, _, _), qp in zip(tasks, done):
                results[name] = qp
                prepared.done(name, qp)
    return results


# Note [Hessian updates in batches of rows]
# Each update rescales and rewrites the whole [in, in] H, so short calibration items (a sentence
# of 20 tokens) made the updates cost more than their products: on all-MiniLM-L6-v2, 64
# sentences, 1600 updates took 3.3 s of GPTQ's 8.9 s. The captured rows are buffered (copied:
# the model may change its tensors in place later) and added in batches of at least
# _HESSIAN_ROWS rows; an item that long alone goes through without a copy. The
# tests' torch formulation gets the same batches, so the two stay equal.
_HESSIAN_ROWS = 2048


class _Hessian(object):
    """H = 2/N X^T X of one layer group's inputs, from captured [tokens, in] batches."""

    def __init__(self, n_in, device):
        self.H = torch.zeros(n_in, n_in, device=device)
        self.n = 0
        self._update = _hessian_update
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
            freed = self._rows * self.H.shape[0] * 4 * 2  # the rows and their batch
            self._rows, self._pending = 0, []
            _memory.give_back(freed)  # Note [Freed memory given back]

    def finish(self):
        self._flush()
        return self.H


def _units(cal, true_sequential, one_block=False):
    """The steps of ``gptq``: lists of shared-input groups captured in one pass. One group per
    step (true sequential), or all of one block's consecutive groups (``true_sequential=False``,
    where the model has blocks, or is one: ``one_block``)."""
    groups = cal.groups(cal.live)
    if not true_sequential and one_block:
        return [groups]
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


def _quantize_layer(name, mod, H, wq, block_size, damp, act_order, last_use=False):
    """GPTQ of one layer with its Hessian H: writes the weight, returns its qparams entry.
    ``last_use``: H is not read again (``_quantize_weight``)."""
    weight = _layers.weight_2d(mod)  # [out, in], a view (Note [Conv1D weights])
    Q, scale, zero, used = _quantize_weight(weight, H, wq, block_size, damp, act_order, name,
                                            last_use=last_use)
    if not torch.isfinite(Q).all():  # never write a NaN weight
        raise RuntimeError(f"gptq: non-finite quantized weight for {name}")
    with torch.no_grad():
        weight.copy_(Q.to(weight.dtype))
    freed = Q.numel() * 4 * 4  # the op's buffers
    del Q
    _memory.give_back(freed)  # Note [Freed memory given back]
    return {"scale": scale, "zero_point": zero, "damp": used, "quant_min": wq.quant_min,
            "quant_max": wq.quant_max, "conv1d": _layers.is_conv1d(mod)}
