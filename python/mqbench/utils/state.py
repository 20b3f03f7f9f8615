"""Switch the fake quantizers of a prepared model between calibration and quantization
(MQBench's ``mqbench.utils.state``). Each function walks ``model.named_modules()`` and acts on
every fake quantizer (ours, or torch's ``FakeQuantizeBase`` subclasses); names match by
substring of the module path.

Example::

    enable_calibration(model)          # observers on, fake quantization off
    for batch in calib_loader: model(batch)
    enable_quantization(model)         # observers off, fake quantization on: train / evaluate
"""
import math
import warnings

import torch

from mqbench._base import is_fake_quantizer
from mqbench.utils.logger import logger

__all__ = ["enable_calibration", "enable_calibration_woquantization",
           "enable_calibration_quantization", "enable_quantization", "disable_all", "enable_all",
           "uncalibrated_quantizers", "warn_uncalibrated"]


def _quantizers(model):
    for name, module in model.named_modules():
        if is_fake_quantizer(module):
            yield name, module


def _never_calibrated(fq):
    """True when ``fq``'s observer never saw data (its range is still empty: ``min_val`` +inf or
    no channel yet) and its qparams are still the constructor's (scale 1, or NNIE's data_max
    -inf). A quantizer whose scale was set by hand or loaded from a checkpoint is calibrated."""
    observer = getattr(fq, "activation_post_process", None)
    min_val = getattr(observer, "min_val", None)
    if not isinstance(min_val, torch.Tensor):
        return False  # an observer of another kind: nothing to tell
    if min_val.numel() and bool(torch.isfinite(min_val).all()):
        return False
    data_max = getattr(fq, "data_max", None)
    if isinstance(data_max, torch.Tensor):
        return not math.isfinite(float(data_max.max()))
    scale = getattr(fq, "scale", None)
    return isinstance(scale, torch.Tensor) and bool((scale.detach() == 1).all())


def uncalibrated_quantizers(model, observing=True):
    """Names of the fake quantizers of ``model`` with fake quantization on that were never
    calibrated, so quantize with scale 1 (``_never_calibrated`` says how this is told).
    ``observing=False`` leaves out those whose observer is on (they calibrate as they run)."""
    return [name for name, fq in _quantizers(model)
            if int(fq.fake_quant_enabled[0]) == 1 and _never_calibrated(fq)
            and (observing or int(fq.observer_enabled[0]) == 0)]


def warn_uncalibrated(model, when, observing=True):
    """Warns (``UserWarning``, once per call) naming the quantizers that would quantize
    uncalibrated; returns their names."""
    names = uncalibrated_quantizers(model, observing)
    if names:
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        warnings.warn(
            f"{when}: {len(names)} fake quantizer(s) were never calibrated and quantize with "
            f"scale 1.0: {shown}. Run enable_calibration(model) and a few batches first.",
            UserWarning, stacklevel=3)
    return names


def enable_calibration(model):
    """Observers on, fake quantization off, for every quantizer."""
    logger.info("Enable observer and Disable quantize.")
    for name, fq in _quantizers(model):
        logger.debug("Enable observer and Disable quant: {}".format(name))
        fq.enable_observer()
        fq.disable_fake_quant()


def _by_name(model, quantizer_type, observer, fake_quant, what):
    logger.info("{} for {}".format(what, quantizer_type))
    for name, fq in _quantizers(model):
        on = quantizer_type in name
        if on:
            logger.debug("{}: {}".format(what, name))
        fq.enable_observer(on and observer)
        fq.enable_fake_quant(on and fake_quant)


def enable_calibration_woquantization(model, quantizer_type="fake_quant"):
    """Observers on only for quantizers whose name contains ``quantizer_type``; fake
    quantization off for all."""
    _by_name(model, quantizer_type, True, False, "Enable observer and Disable quantize")


def enable_calibration_quantization(model, quantizer_type="fake_quant"):
    """Observers and fake quantization on for quantizers whose name contains ``quantizer_type``,
    off for the others."""
    _by_name(model, quantizer_type, True, True, "Enable observer and Enable quantize")


def enable_quantization(model, weight_cali_on=False, act_cali_on=False):
    """Fake quantization on for every quantizer; observers off, except weight quantizers
    (``weight_cali_on``) or activation quantizers (``act_cali_on``, names ``*_post_act_fake_quantizer``)."""
    logger.info("Disable observer and Enable quantize.")
    for name, fq in _quantizers(model):
        if (weight_cali_on and "weight_fake_quant" in name) or \
                (act_cali_on and "act_fake_quant" in name):
            fq.enable_observer()
        else:
            logger.debug("Disable observer and Enable quant: {}".format(name))
            fq.disable_observer()
        fq.enable_fake_quant()
    # Quantizers whose observer stays on calibrate as they run; the others must have been.
    warn_uncalibrated(model, "enable_quantization", observing=False)


def disable_all(model):
    """Observers and fake quantization off: the model computes in float."""
    logger.info("Disable observer and Disable quantize.")
    for _, fq in _quantizers(model):
        fq.disable_observer()
        fq.disable_fake_quant()


def enable_all(model):
    """Observers and fake quantization on."""
    logger.info("Enable observer and Enable quantize.")
    for _, fq in _quantizers(model):
        fq.enable_observer()
        fq.enable_fake_quant()
