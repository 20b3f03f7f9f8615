"""Empirical bias correction of a prepared, calibrated model (:func:`bias_correction`).

Quantizing a layer's weight shifts the mean of its output per channel; the correction adds
``E[y_float] - E[y_quant]`` (measured on calibration data, layer by layer in execution order) to
the bias. MQBench's users import it from :mod:`mqbench.weight_equalization`, which re-exports
it; docs/weight_equalization.md describes both.
"""
from collections import OrderedDict

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from mqbench._base import is_fake_quantizer
from mqbench._bn_fold import _bn_of, _fold_factor
from mqbench.nn.qat.modules.conv import quantized_bias
from mqbench.utils.logger import logger

__all__ = ["bias_correction"]


class _Stop(Exception):
    """Ends a forward pass once the layer being corrected has seen its input."""


def _quantized_layers(model, layers):
    """(name, module) of the weight-quantized conv / linear layers, in execution order."""
    named = OrderedDict((n, m) for n, m in model.named_modules()
                        if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear))
                        and not isinstance(m, nn.modules.conv._ConvTransposeNd)
                        and hasattr(m, "weight_fake_quant"))
    if isinstance(model, torch.fx.GraphModule):
        order = [n.target for n in model.graph.nodes if n.op == "call_module"]
        named = OrderedDict((t, named[t]) for t in dict.fromkeys(order) if t in named)
    if layers is not None:
        unknown = [n for n in layers if n not in named]
        if unknown:
            raise ValueError(f"bias_correction: {unknown} are not weight-quantized conv/linear "
                             f"layers of the model (those are: {list(named)})")
        named = OrderedDict((n, named[n]) for n in named if n in set(layers))
    return named


def _preactivation(module, x, quantize):
    """The layer's output before any fused ReLU, BatchNorm folded with its running statistics
    (the eval-mode function), with the weight (and bias) fake-quantized when ``quantize``."""
    w, b = module.weight, module.bias
    bn = _bn_of(module)
    if bn is not None:
        factor = _fold_factor(bn, w.dim())
        w = w * factor
        b = bn.bias + ((b if b is not None else 0) - bn.running_mean) * factor.reshape(-1)
    if quantize:
        w = module.weight_fake_quant(w)
        b = quantized_bias(module, b)
    if isinstance(module, nn.Linear):
        return F.linear(x, w, b)
    return module._conv_forward(x, w, b)


def _channel_sum(y, module):
    """(sum over every dim but the channel dim, count) of a layer output."""
    dim = y.dim() - 1 if isinstance(module, nn.Linear) else 1
    y = y.detach().double().movedim(dim, -1)
    return y.reshape(-1, y.shape[-1]).sum(0), y.numel() // y.shape[-1]


def _run(model, batch, device):
    if isinstance(batch, torch.Tensor):
        return model(batch.to(device))
    if isinstance(batch, (tuple, list)):
        return model(*[b.to(device) if isinstance(b, torch.Tensor) else b for b in batch])
    if isinstance(batch, dict):
        return model(**{k: v.to(device) if isinstance(v, torch.Tensor) else v
                        for k, v in batch.items()})
    raise TypeError(f"bias_correction: a calibration batch must be a tensor, a tuple/list of "
                    f"positional inputs or a dict of keyword inputs, got {type(batch).__name__}")


def _channel_means(model, cali_data, device, named, quantize, stop_after=None):
    """{name: per-channel mean pre-activation} over ``cali_data``, from hooks on the layers."""
    sums = {}

    def hook_for(name, module):
        def hook(mod, args):
            total, count = _channel_sum(_preactivation(mod, args[0], quantize), mod)
            prev = sums.get(name)
            sums[name] = (total, count) if prev is None else (prev[0] + total, prev[1] + count)
            if stop_after is not None:
                raise _Stop
        return hook

    handles = [m.register_forward_pre_hook(hook_for(n, m)) for n, m in named.items()]
    try:
        with torch.no_grad():
            for batch in cali_data:
                try:
                    _run(model, batch, device)
                except _Stop:
                    pass
    finally:
        for h in handles:
            h.remove()
    return {n: (t / c) for n, (t, c) in sums.items()}


def bias_correction(model, cali_data, layers=None):
    """Empirical bias correction of a prepared, calibrated model, in place.

    For each weight-quantized conv / linear layer in execution order, adds
    ``E[y_float] - E[y_quant]`` per output channel to its bias (a fused BatchNorm module: to
    the BatchNorm's ``bias``; a layer without bias gets one). ``y`` is the layer's output before
    any fused ReLU. ``E[y_float]`` comes from ``model`` with every fake quantizer off (the float
    function); ``E[y_quant]`` from the model as the caller left it (``enable_quantization``),
    with the layers before it already corrected, so each correction also absorbs the mean error
    its quantized inputs carry. Means run over all of ``cali_data`` (tensors, tuples of
    positional inputs, or dicts of keyword inputs), moved to the model's device; the model runs
    in eval mode with observers off, and its modes and quantizer switches are restored after.
    ``layers`` restricts the correction to those module names. Returns ``{name: correction}``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"bias_correction: model must be an nn.Module, got "
                        f"{type(model).__name__}")
    cali_data = list(cali_data) if not isinstance(cali_data, torch.Tensor) else [cali_data]
    if not cali_data:
        raise ValueError("bias_correction: cali_data is empty; pass a list of calibration "
                         "batches")
    named = _quantized_layers(model, layers)
    quantizers = [m for m in model.modules() if is_fake_quantizer(m)]
    saved = [(fq, int(fq.fake_quant_enabled[0]), int(fq.observer_enabled[0]))
             for fq in quantizers]
    if not any(on for _, on, _ in saved):
        raise ValueError("bias_correction: no fake quantizer of the model quantizes; calibrate "
                         "it and call mqbench.utils.state.enable_quantization(model) first")
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    modes = {m: m.training for m in model.modules()}
    corrections = OrderedDict()
    try:
        model.eval()
        for fq, _, _ in saved:
            fq.disable_observer()
            fq.disable_fake_quant()
        float_means = _channel_means(model, cali_data, device, named, quantize=False)
        for fq, on, _ in saved:
            fq.enable_fake_quant(bool(on))
        for name, module in named.items():
            quant_mean = _channel_means(model, cali_data, device, {name: module},
                                        quantize=True, stop_after=name).get(name)
            if quant_mean is None or name not in float_means:
                raise ValueError(f"bias_correction: layer {name} did not run on cali_data; "
                                 "leave it out with layers=[...]")
            delta = (float_means[name] - quant_mean)
            with torch.no_grad():
                bn = _bn_of(module)
                if bn is not None:
                    bn.bias.add_(delta.to(bn.bias.dtype))
                elif module.bias is not None:
                    module.bias.add_(delta.to(module.bias.dtype))
                else:
                    module.bias = nn.Parameter(delta.to(module.weight.dtype))
            corrections[name] = delta.to(module.weight.dtype)
            logger.debug(f"Bias correction of {name}: max |delta| = {float(delta.abs().max()):.3g}")
    finally:
        for fq, on, obs in saved:
            fq.enable_fake_quant(bool(on))
            fq.enable_observer(bool(obs))
        for m, mode in modes.items():
            m.training = mode
    logger.info(f"Bias correction: {len(corrections)} layer(s) corrected.")
    return corrections
