"""Graph capture: the two frontends that turn a model into the GraphModule the quantizer's IR
is built from (``fx.py``: torch.fx symbolic tracing, as MQBench; ``export.py``: torch.export),
and the choice between them (``prepare_custom_config_dict['capture']``, docs/transformers.md).

* ``"fx"``: trace with ``CustomedTracer`` (``leaf_module``, ``concrete_args``).
* ``"export"``: ``torch.export`` on ``example_inputs`` (with ``dynamic_shapes``, if given).
* ``"auto"`` (the default): fx first; when fx cannot trace the model and ``example_inputs``
  are given, torch.export. Without them the fx error says to pass them; when both fail, one
  ``CaptureError`` names both failures and what to try.
"""
from torch.fx.proxy import TraceError

from mqbench.capture import conv1d as _conv1d
from mqbench.capture import export as _export
from mqbench.capture import fx as _fx
from mqbench.nn.modules.hadamard import input_rotations
from mqbench.utils.config import unknown_name

__all__ = ["CAPTURES", "CaptureError", "capture"]

CAPTURES = ("auto", "fx", "export")


class CaptureError(TraceError):
    """No capture could take the model (a ``ValueError``, as torch.fx's ``TraceError``)."""


def _what_to_try(model):
    return (f"What to try: make the submodule that fails a leaf "
            f"(prepare_custom_config_dict['leaf_module'] = [ItsClass]) so both captures call it "
            f"whole; fix Python-level branches with 'concrete_args' (fx); or give "
            f"'example_inputs' that run {type(model).__name__}.forward as deployed "
            f"(and 'dynamic_shapes' for sizes that vary).")


def capture(model, config, custom_tracer=None):
    """The GraphModule ``prepare_by_platform`` quantizes, by ``config['capture']``, with every
    transformers ``Conv1D`` call replaced by the equivalent ``nn.Linear`` (``conv1d.py``).

    Args:
        model: the float model.
        config: ``prepare_custom_config_dict`` (``capture``, ``example_inputs``,
            ``dynamic_shapes``, ``leaf_module``, ``concrete_args``).
        custom_tracer: a torch.fx Tracer for the fx capture.
    """
    gm = _capture(model, config, custom_tracer)
    _conv1d.linearize_conv1d(gm)
    return gm


def _capture(model, config, custom_tracer):
    mode = config.get("capture", "auto")
    if mode not in CAPTURES:
        raise unknown_name(mode, list(CAPTURES), "capture")
    example = config.get("example_inputs")
    dynamic = config.get("dynamic_shapes")
    leaf_types = tuple(config.get("leaf_module", ()))
    if dynamic is not None and example is None:
        raise ValueError("prepare_custom_config_dict['dynamic_shapes'] is for the torch.export "
                         "capture: give 'example_inputs' too")
    rotated = [n for n, m in model.named_modules() if input_rotations(m)]
    if rotated and mode != "export":
        # Note [Input rotations in a capture]: fx would leave the rotation inside the Linear
        if mode == "fx" or example is None:
            raise ValueError(f"{rotated[0]!r} rotates its input in a forward pre-hook "
                             "(mqbench.llm.rotate's online rotation), which torch.fx does not "
                             "trace: give prepare_custom_config_dict['example_inputs'] (and "
                             "capture 'auto' or 'export') for the torch.export capture")
        mode = "export"
    if mode == "fx":
        return _fx.trace(model, config, custom_tracer)
    if mode == "export":
        if example is None:
            raise ValueError("capture='export' needs prepare_custom_config_dict['example_inputs']"
                             ": a tuple of positional arguments or a dict of keyword arguments "
                             "that model.forward takes")
        return _export.export_capture(model, example, dynamic, leaf_types)
    try:
        return _fx.trace(model, config, custom_tracer)
    except Exception as fx_error:  # noqa: BLE001 (any fx failure falls back to export)
        fx_failure = f"{type(fx_error).__name__}: {fx_error}"
        if example is None:
            raise CaptureError(
                f"torch.fx cannot trace {type(model).__name__}: {fx_failure}\n"
                "Pass prepare_custom_config_dict['example_inputs'] (a tuple of positional "
                "arguments or a dict of keyword arguments for model.forward) and prepare_by_"
                "platform captures the model with torch.export instead (capture='auto').") \
                from fx_error
        try:
            return _export.export_capture(model, example, dynamic, leaf_types)
        except Exception as export_error:  # noqa: BLE001
            raise CaptureError(
                f"neither capture could take {type(model).__name__}.\n"
                f"torch.fx: {fx_failure}\n"
                f"torch.export: {type(export_error).__name__}: {export_error}\n"
                + _what_to_try(model)) from export_error
