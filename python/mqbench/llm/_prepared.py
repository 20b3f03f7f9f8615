"""The algorithms on a model ``prepare_by_platform`` already prepared (docs/llm.md, "On a prepared
model").

A prepared model holds fake quantizers: one ``weight_fake_quant`` per quantized Linear and
activation quantizers between the layers. ``gptq`` and ``rtn`` run on it with the result of
running them on the float model and then ``load_weight_qparams`` (what ``PreparedRun`` keeps):

* while they run, every fake quantizer is off: neither its observer nor its fake quantization
  runs. Their passes see the float model inside the prepared one, as llm-compressor calibrates
  GPTQ with quantization disabled. So no observer moves (the calibration the user did, or will
  do, is not changed by the algorithm's many partial passes), a layer not yet processed is not
  rounded by an observer's grid before its turn, and a quantizer switched on before it ever
  observed anything (``enable_calibration_quantization``) does not quantize with an empty range;
* afterwards every switch is back as it was, except that each quantized layer's
  ``weight_fake_quant`` holds the algorithm's grid with its observer off
  (``load_weight_qparams``): observing the new weights again would choose another grid and
  round them a second time. This also happens when the algorithm stops with an error, for the
  layers it had finished.

Whether each layer has a weight fake quantizer that can hold the algorithm's grid (the same per
tensor / channel / group layout, integer range and symmetry, no power-of-two scales) is checked
before any weight or switch changes.

SmoothQuant and AWQ refuse a prepared model (``refuse_prepared``): they fold scales into the
norm or Linear that produces a Linear's input. The prepared graph has inlined those norms and
put an activation quantizer between producer and consumer, whose range the scales would move.
"""
from mqbench._base import is_fake_quantizer
from mqbench.llm import _common
from mqbench.llm.qparams import load_weight_qparams
from mqbench.utils.logger import logger

__all__ = ["PreparedRun", "fake_quantizers", "refuse_prepared"]


def fake_quantizers(model):
    """[(name, module)] of the fake quantizers in ``model`` (weights' and activations'; ours and
    torch's)."""
    return [(n, m) for n, m in model.named_modules() if is_fake_quantizer(m)]


def refuse_prepared(model, algorithm):
    """Raises ValueError when ``model`` holds fake quantizers (module docstring)."""
    found = fake_quantizers(model)
    if found:
        raise ValueError(
            f"{algorithm}: the model holds fake quantizers ({found[0][0]!r} and "
            f"{len(found) - 1} more): run {algorithm} on the float model, before "
            "prepare_by_platform. Its scales fold into the norm or Linear producing each "
            "input, which the prepared graph has inlined, and would move the ranges its "
            "activation quantizers observe (docs/llm.md)")


def _layout(fq):
    """('group', size, grouped axis) / ('channel', axis) / ('tensor',) of a weight fake
    quantizer."""
    group = getattr(fq, "group_size", None)
    if group:
        return ("group", int(group), int(getattr(fq, "ch_axis", 1)))
    if getattr(fq, "is_per_channel", False):
        return ("channel", int(getattr(fq, "ch_axis", 0)))
    return ("tensor",)


def _wanted(wq):
    if wq.group_size:
        return ("group", int(wq.group_size), 1)
    if wq.per_channel:
        return ("channel", 0)
    return ("tensor",)


def _describe(layout):
    if layout[0] == "group":
        return f"groups of {layout[1]} along axis {layout[2]}"
    if layout[0] == "channel":
        return f"per channel along axis {layout[1]}"
    return "per tensor"


def check_weight_quantizer(name, mod, wq, algorithm):
    """Refuses, naming the layer, a prepared layer whose weight fake quantizer cannot hold the
    grid of ``wq``, and a Linear fused with a BatchNorm (its forward scales the weight)."""
    if getattr(mod, "bn", None) is not None:
        raise ValueError(f"{algorithm}: {name!r} is a Linear fused with a BatchNorm "
                         f"({type(mod).__name__}), whose forward rescales its weight; run "
                         f"{algorithm} before prepare_by_platform")
    fq = getattr(mod, "weight_fake_quant", None)
    if fq is None:
        raise ValueError(f"{algorithm}: {name!r} has no weight_fake_quant in this prepared model "
                         "(prepare_by_platform left it float, e.g. exclude_module_name): leave it "
                         f"out with ignore= or layers=, or run {algorithm} on the float model "
                         "before prepare_by_platform")
    if getattr(fq, "pot_scale", False):
        raise ValueError(f"{algorithm}: {name!r}'s weight_fake_quant has power-of-two scales, "
                         f"which {algorithm}'s min/max grid does not give")
    qmin, qmax = getattr(fq, "quant_min", None), getattr(fq, "quant_max", None)
    if (qmin, qmax) != (wq.quant_min, wq.quant_max):
        raise ValueError(f"{algorithm}: {name!r}'s weight_fake_quant has range [{qmin}, {qmax}] "
                         f"but w_qscheme gives [{wq.quant_min}, {wq.quant_max}]: pass the "
                         "w_qscheme the model was prepared with")
    symmetric = getattr(fq, "is_symmetric_quant", None)
    if symmetric is not None and bool(symmetric) != bool(wq.symmetric):
        raise ValueError(f"{algorithm}: {name!r}'s weight_fake_quant is "
                         f"{'symmetric' if symmetric else 'affine'} but w_qscheme is "
                         f"{'symmetric' if wq.symmetric else 'affine'}: pass the w_qscheme the "
                         "model was prepared with")
    have, want = _layout(fq), _wanted(wq)
    if have != want:
        raise ValueError(f"{algorithm}: {name!r}'s weight_fake_quant quantizes "
                         f"{_describe(have)} but w_qscheme asks for {_describe(want)}: pass the "
                         "w_qscheme the model was prepared with")


def _switches(fq):
    return bool(fq.fake_quant_enabled[0] == 1), bool(fq.observer_enabled[0] == 1)


class PreparedRun(object):
    """``with PreparedRun(model, layers, ignore, wq, algorithm) as run:`` the algorithm's passes
    and edits; ``run.done(name, qparams)`` after each layer (module docstring). On a model with
    no fake quantizer it does nothing."""

    def __init__(self, model, layers, ignore, wq, algorithm):
        self.model = model
        self._fqs = fake_quantizers(model)
        self._weight_fq = {}
        self._done = {}
        self._saved = None
        if not self._fqs:
            return
        for name, mod in _common.find_linears(model, layers, ignore):
            check_weight_quantizer(name, mod, wq, algorithm)
            self._weight_fq[name] = mod.weight_fake_quant

    def __enter__(self):
        if not self._fqs:
            return self
        self._saved = [(fq, _switches(fq)) for _, fq in self._fqs]
        for _, fq in self._fqs:
            fq.enable_observer(False)
            fq.enable_fake_quant(False)
        return self

    def done(self, name, qparams):
        if name in self._weight_fq:
            self._done[name] = qparams

    def __exit__(self, *exc):
        if self._saved is None:
            return False
        for fq, (fake_quant, observer) in self._saved:
            fq.enable_fake_quant(fake_quant)
            fq.enable_observer(observer)
        self._saved = None
        if not self._done:
            return False
        # the grids of the layers finished, also when the algorithm failed; then an error here
        # must not hide the algorithm's
        try:
            load_weight_qparams(self.model, self._done)
        except Exception as e:  # noqa: BLE001
            if exc[0] is None:
                raise
            logger.error("could not load the grids of the finished layers %s: %s",
                         sorted(self._done), e)
        return False
