"""Round-to-nearest weight quantization, in place: the baseline GPTQ and AWQ are measured
against, and the rounding ``prepare_by_platform``'s MinMax weight observer + fake quantizer
apply to a group-wise / per-channel integer scheme."""

from mqbench.llm import _expert_runs, _layers, _prepared, _weights

__all__ = ["rtn"]


@_expert_runs.per_expert
def rtn(model, w_qscheme, layers=None, ignore=("lm_head",)):
    """Replaces each Linear's (or transformers Conv1D's) weight by its round-to-nearest
    dequantized value on the ``w_qscheme`` grid (min/max qparams per tensor / channel / group).
    Returns name -> {"scale", "zero_point", "quant_min", "quant_max", "conv1d"}. On a model
    already prepared by ``prepare_by_platform``, each layer's ``weight_fake_quant`` then holds
    that grid, its observer off (docs/llm.md, "On a prepared model").

    Example::

        from mqbench.llm import rtn
        rtn(model, {"bit": 4, "per_channel": True, "group_size": 128})
    """
    wq = _weights.resolve_w_qscheme(w_qscheme, "rtn")
    linears = _layers.find_linears(model, layers, ignore)
    for name, mod in linears:
        wq.check_layer(name, _layers.weight_2d(mod))
    out = {}
    # on a prepared model, the weight quantizers get these grids (_prepared.py)
    with _prepared.PreparedRun(model, layers, ignore, wq, "rtn") as prepared:
        for name, mod in linears:
            out.update(_weights.round_layers([(name, mod)], wq))
            prepared.done(name, out[name])
    return out
