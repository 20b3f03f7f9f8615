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

``smoothquant`` and ``awq`` run on it with ``FoldingRun``: the same switches off while they run
(their passes see the float model, as on a float model), and the scales folded into the
parameters the prepared graph reads (a norm it inlined keeps its weight at the norm's name:
``_mappings``, whose every fold is checked on the output first). Their scales move what some
quantizers observe: the consumers' weights (and a producing Linear's), and the activations
between producer and consumer. A quantizer that had not observed anything yet (prepared, not
yet calibrated: the usual order) observes the new values when calibrated, as on a model
prepared after the algorithm. One that had observed holds a stale range; it is observed
again (Note [Quantizers observed again after a fold]).
"""
import torch

from mqbench._base import is_fake_quantizer
from mqbench.llm import _calibration, _layers
from mqbench.llm.qparams import load_weight_qparams
from mqbench.utils.logger import logger

__all__ = ["FoldingRun", "PreparedRun", "fake_quantizers"]


def fake_quantizers(model):
    """[(name, module)] of the fake quantizers in ``model`` (weights' and activations'; ours and
    torch's)."""
    return [(n, m) for n, m in model.named_modules() if is_fake_quantizer(m)]


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


class _QuantizersOff(object):
    """On ``__enter__`` every fake quantizer of the model off, observer and fake quantization
    (their switches saved); ``_restore`` puts the switches back. Nothing on a model with no fake
    quantizer."""

    def __init__(self, model):
        self.model = model
        self._fqs = fake_quantizers(model)
        self._saved = None

    def __enter__(self):
        if not self._fqs:
            return self
        self._saved = [(fq, _switches(fq)) for _, fq in self._fqs]
        for _, fq in self._fqs:
            fq.enable_observer(False)
            fq.enable_fake_quant(False)
        return self

    def _restore(self):
        for fq, (fake_quant, observer) in self._saved:
            fq.enable_fake_quant(fake_quant)
            fq.enable_observer(observer)
        self._saved = None


class PreparedRun(_QuantizersOff):
    """``with PreparedRun(model, layers, ignore, wq, algorithm) as run:`` the algorithm's passes
    and edits; ``run.done(name, qparams)`` after each layer (module docstring). On a model with
    no fake quantizer it does nothing."""

    def __init__(self, model, layers, ignore, wq, algorithm):
        super().__init__(model)
        self._weight_fq = {}
        self._done = {}
        if not self._fqs:
            return
        for name, mod in _layers.find_linears(model, layers, ignore):
            check_weight_quantizer(name, mod, wq, algorithm)
            self._weight_fq[name] = mod.weight_fake_quant

    def done(self, name, qparams):
        if name in self._weight_fq:
            self._done[name] = qparams

    def __exit__(self, *exc):
        if self._saved is None:
            return False
        self._restore()
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


def _observed(fq):
    """True when the fake quantizer's observer holds a range (it has observed something)."""
    obs = getattr(fq, "activation_post_process", None)
    lo = getattr(obs, "min_val", None)
    return isinstance(lo, torch.Tensor) and bool(torch.isfinite(lo).any())


def _reset_observer(fq):
    """Back to the observer's state before any data: the next batch sets its range."""
    obs = fq.activation_post_process
    if hasattr(obs, "reset_min_max_vals"):  # torch's observers
        obs.reset_min_max_vals()
        return
    for key, value in (("min_val", float("inf")), ("max_val", float("-inf"))):
        old = getattr(obs, key)
        setattr(obs, key, torch.full((), value, dtype=old.dtype, device=old.device))


# Note [Quantizers observed again after a fold]
# SmoothQuant and AWQ divide activation channels by s and multiply weight columns by s. On a
# prepared model whose quantizers had already observed (calibrated, then smoothed), a range they
# hold no longer fits what they quantize. At the end of the run (also after an error, for the
# folds done), with the switches still off:
#   * each weight quantizer whose weight changed (its version counter moved) and whose observer
#     held a range: reset, then observes the new weight once (what calibrating again gives);
#   * each activation quantizer that held a range and whose input moved (its per-channel maxima
#     on the first calibration item, before against after, by more than 1e-3 of the largest):
#     reset, then observes all of ``calib_data`` with fake quantization off (as
#     ``enable_calibration`` calibrates). Its range then comes from ``calib_data``, which a
#     warning names with the quantizers.
# Quantizers whose inputs did not move keep their state, and every switch is restored.


def _moved(before, after):
    """Whether an activation quantizer's input moved (its per-call, per-channel maxima)."""
    if before is None or after is None or len(before) != len(after):
        return True
    for a, b in zip(after, before):
        if a.shape != b.shape:
            return True
        if not torch.allclose(a, b, rtol=1e-3, atol=1e-3 * float(b.max()) if b.numel() else 0):
            return True
    return False


class FoldingRun(_QuantizersOff):
    """``with FoldingRun(model, layers, ignore, wq, algorithm) as run:`` SmoothQuant's or AWQ's
    passes and folds on a prepared model (module docstring); ``run.begin(calib)`` once the
    calibration items are a list, ``run.run_one`` for ``_mappings.mappings_of_live`` and then
    ``run.settle()``. On a model with no fake quantizer only ``run_one`` does something."""

    def __init__(self, model, layers, ignore, wq, algorithm):
        super().__init__(model)
        self.algorithm = algorithm
        self._calib = None
        self._weights = []  # (name, module, its weight's version counter) for each weight quantizer
        self._acts = []     # (name, fq): the activation quantizers that have observed
        self._before = None
        if not self._fqs:
            return
        for name, mod in _layers.find_linears(model, layers, ignore):
            if wq is not None:
                check_weight_quantizer(name, mod, wq, algorithm)
            elif getattr(mod, "bn", None) is not None:  # its weight quantizer sees W * bn scale
                raise ValueError(f"{algorithm}: {name!r} is a Linear fused with a BatchNorm "
                                 f"({type(mod).__name__}), whose forward rescales its weight; "
                                 f"run {algorithm} before prepare_by_platform")
        weight_fqs = set()
        for name, mod in model.named_modules():
            fq, w = getattr(mod, "weight_fake_quant", None), getattr(mod, "weight", None)
            if fq is not None and is_fake_quantizer(fq) and isinstance(w, torch.Tensor):
                self._weights.append((name, mod, w._version))
                weight_fqs.add(id(fq))
        self._acts = [(n, fq) for n, fq in self._fqs if id(fq) not in weight_fqs and _observed(fq)]

    @property
    def prepared(self):
        return bool(self._fqs)

    def begin(self, calib):
        """``calib``: the calibration items (a list). Fingerprints the inputs of the activation
        quantizers that have observed, on the first item."""
        self._calib = calib
        if self._acts and calib:
            self._before = self._fingerprints()

    @property
    def run_one(self):
        """A function running the model on the first calibration item (fake quantizers off:
        inside the ``with``), for ``_mappings.checked_folds``."""
        if not self._calib:
            return None
        return lambda: _calibration.run_model(self.model, self._calib[0])

    def settle(self):
        """After ``checked_folds``: its trial folds, undone exactly, moved the weights' version
        counters; what changes from here on is what the algorithm does."""
        self._weights = [(name, mod, mod.weight._version) for name, mod, _ in self._weights]

    def _fingerprints(self):
        """name -> [per-channel max |input| (last dimension) of each call] of the activation
        quantizers that have observed, on the first calibration item."""
        fps = {}

        def make(name):
            def hook(_m, args):
                x = args[0] if args else None
                if isinstance(x, torch.Tensor) and x.numel():
                    x = x.detach().abs()
                    m = x.reshape(-1, x.shape[-1]).amax(0) if x.dim() else x.reshape(1)
                    fps.setdefault(name, []).append(m.double().cpu())
            return hook

        handles = [fq.register_forward_pre_hook(make(n)) for n, fq in self._acts]
        try:
            with torch.no_grad():
                _calibration.run_model(self.model, self._calib[0])
        finally:
            for h in handles:
                h.remove()
        return fps

    def _observe_again(self):
        """Note [Quantizers observed again after a fold]."""
        weights = [(n, m) for n, m, version in self._weights
                   if m.weight._version != version and _observed(m.weight_fake_quant)]
        with torch.no_grad():
            for _, mod in weights:
                fq = mod.weight_fake_quant
                _reset_observer(fq)
                fq.enable_observer(True)
                fq(mod.weight)
                fq.enable_observer(False)
        acts = []
        if self._before is not None:
            after = self._fingerprints()
            acts = [(n, fq) for n, fq in self._acts
                    if _moved(self._before.get(n), after.get(n))]
        if acts:
            for _, fq in acts:
                _reset_observer(fq)
                fq.enable_observer(True)
            with torch.no_grad():
                for sample in self._calib:
                    _calibration.run_model(self.model, sample)
            for _, fq in acts:
                fq.enable_observer(False)
        if weights or acts:
            logger.warning(
                "%s: the scales changed what %d weight and %d activation quantizers had already "
                "observed; observed again (weights: the new weights; activations: calib_data, "
                "fake quantization off): %s", self.algorithm, len(weights), len(acts),
                [n + ".weight_fake_quant" for n, _ in weights] + [n for n, _ in acts])

    def __exit__(self, *exc):
        if self._saved is None:
            return False
        try:
            if exc[0] is None or issubclass(exc[0], Exception):
                self._observe_again()
            else:  # interrupted: no calibration pass now
                logger.warning("%s: interrupted; quantizers that had observed what the scales "
                               "folded so far changed were not observed again", self.algorithm)
        except Exception as e:  # noqa: BLE001  (an error here must not hide the algorithm's)
            if exc[0] is None:
                raise
            logger.error("%s: could not observe the changed quantizers again: %s",
                         self.algorithm, e)
        finally:
            self._restore()
        return False
