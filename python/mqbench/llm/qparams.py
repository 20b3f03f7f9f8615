"""Hands the weight grid GPTQ (or RTN) chose to the weight fake quantizers of a prepared model.

GPTQ's weights lie on the grid of the qparams it computed, but a MinMax weight observer that
re-observes them finds another grid wherever a group's extreme level is not used (with MQBench's
symmetric [-8, 7] range, scale = amax / 7.5, nearly always), and rounding again loses much of
GPTQ's gain (docs/llm.md, "Composing with prepare_by_platform"). ``load_weight_qparams`` sets
the scale and zero point of each layer's ``weight_fake_quant`` to GPTQ's and turns its observer
off, so the prepared model computes exactly GPTQ's weights.
"""
import torch

__all__ = ["load_weight_qparams"]


def _target_shape(fq, scale, weight_shape):
    """GPTQ's [rows, groups] qparams in the fake quantizer's layout."""
    if getattr(fq, "group_size", None):  # GroupFakeQuantize: the weight's shape, axis 1 grouped
        return (weight_shape[0], weight_shape[1] // fq.group_size) + tuple(weight_shape[2:])
    if getattr(fq, "is_per_channel", False) or getattr(fq, "ch_axis", -1) != -1:
        return (weight_shape[fq.ch_axis],)
    return (1,)


def load_weight_qparams(model, qparams):
    """Sets ``<layer>.weight_fake_quant``'s scale / zero_point from ``qparams`` (what ``gptq`` or
    ``rtn`` returned: name -> {"scale", "zero_point"}) and disables its observer.

    Call it after ``prepare_by_platform`` with the same ``w_qscheme``, then calibrate only the
    activations (``enable_calibration_woquantization(model, "act_fake_quant")``) so the weight
    observers stay off.

    Raises:
        ValueError: a layer without a ``weight_fake_quant``, or a fake quantizer whose layout
            (per tensor / channel / group) differs from the qparams' (another w_qscheme). A
            transformers ``Conv1D`` (GPT-2) has one once prepared: the capture puts the
            ``nn.Linear`` of its transposed weight in its place, and the qparams are already
            [out, groups] of that weight.

    Example::

        qp = gptq(model, calib, {"bit": 4, "per_channel": True, "group_size": 128})
        model = prepare_by_platform(model, BackendType.Academic, {"extra_qconfig_dict": {
            "w_qscheme": {"bit": 4, "per_channel": True, "group_size": 128}, ...}})
        load_weight_qparams(model, qp)
    """
    mods = dict(model.named_modules())
    for name, qp in qparams.items():
        mod = mods.get(name)
        fq = getattr(mod, "weight_fake_quant", None)
        if fq is None:
            raise ValueError(f"load_weight_qparams: {name!r} has no weight_fake_quant in this "
                             "model (prepare it with prepare_by_platform first)")
        scale, zero = qp["scale"], qp["zero_point"]
        shape = _target_shape(fq, scale, tuple(mod.weight.shape))
        if scale.numel() != int(torch.tensor(shape).prod()):
            raise ValueError(f"load_weight_qparams: {name!r}'s weight_fake_quant wants "
                             f"{list(shape)} qparams but got {list(scale.shape)}: prepare with the "
                             "w_qscheme the algorithm used")
        if fq.quant_min != int(qp.get("quant_min", fq.quant_min)) or \
                fq.quant_max != int(qp.get("quant_max", fq.quant_max)):
            raise ValueError(f"load_weight_qparams: {name!r}'s weight_fake_quant has range "
                             f"[{fq.quant_min}, {fq.quant_max}] but the qparams were made for "
                             f"[{qp['quant_min']}, {qp['quant_max']}]")
        with torch.no_grad():
            for buf, val in (("scale", scale), ("zero_point", zero)):
                cur = getattr(fq, buf)
                val = val.reshape(shape).to(device=cur.device, dtype=cur.dtype)
                if isinstance(cur, torch.nn.Parameter):
                    cur.data = val.clone()
                else:
                    if cur.shape != val.shape:
                        cur.resize_(val.shape)
                    cur.copy_(val)
        fq.disable_observer()
