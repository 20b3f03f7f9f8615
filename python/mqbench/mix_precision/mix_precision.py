"""Mixed-precision bit-width selection (MQBench's ``mqbench.mix_precision.mix_precision``).

Three steps, as in MQBench:

1. **Sensitivity** of each Conv2d/Linear layer at each candidate weight bit width,
   ``mixprecision_profiling(model, quantized_model, bitwidth_list, data, criterion, algo)``:

   * ``'naive'``: the loss increase when only that layer's weight is fake-quantized at ``b``
     bits (every other quantizer off), ``prec_degradation_by_layer``;
   * ``'hawq_eigen'`` / ``'hawq_trace'`` (HAWQ, Dong et al. 2019; HAWQ-v2 2020): the largest
     eigenvalue or the trace of the layer's Hessian block divided by its number of weights,
     times the mean squared weight quantization error at ``b`` bits (``get_delta_w``), i.e.
     ``Omega_l(b) = Tr(H_l) / n_l * ||Q_b(W_l) - W_l||^2 / n_l``.

2. **Selection**: ``ILP_bit_selection`` solves the integer program

   ``min sum_l sum_b s_l(b) x_lb   s.t.  sum_b x_lb = 1 (each l),
   sum_l sum_b b * n_l * x_lb <= 8 * 2^20 * (size budget in MB - fixed MB),  x_lb in {0, 1}``

   with PuLP's bundled CBC solver, and returns the bit config ``{layer name: bits}``.

3. **Apply**: ``apply_bit_config(prepared_model, bit_config)`` sets each layer's weight fake
   quantizer to its bit width. ``prepare_by_platform`` has one weight scheme for the whole
   model (no per-layer qconfig), so the bit config is applied to the prepared model.

All weight quantization goes through the model's own fake quantizers (our C++ ops); they are
copied for the trials, so profiling leaves the quantized model's quantizers as they were.
Differences from MQBench: docs/compatibility.md and docs/mix_precision.md.

Example::

    sens = mixprecision_profiling(model, qmodel, [2, 4, 8], (x, y), criterion, algo='naive')
    params = model_size_analysis(model)
    config = mixprecision_bit_selection([2, 4, 8], sens, params, model_size_constraints=0.05,
                                        fixed_size_mb=mp_unquantized_size(qmodel))
    apply_bit_config(qmodel, config)
"""
import copy
import math
import warnings
from typing import Dict, List, Tuple

import numpy as np
import torch
from torch.nn import Module

from mqbench._base import is_fake_quantizer
from mqbench.mix_precision.hessian_per_layer import LAYER_TYPES, hessian_per_layer
from mqbench.utils.logger import logger

__all__ = ["mixprecision_profiling", "get_delta_w", "model_size_analysis", "mp_model_size",
           "mp_unquantized_size", "prec_degradation_by_layer", "hawq",
           "mixprecision_bit_selection", "ILP_bit_selection", "bit_config_size",
           "apply_bit_config", "PROFILING_ALGOS", "HAWQ_TYPES"]

#: The sensitivity algorithms of ``mixprecision_profiling``.
PROFILING_ALGOS = ("naive", "hawq_eigen", "hawq_trace")
#: The Hessian measures of ``hawq``.
HAWQ_TYPES = ("trace", "eigenvalues")

_MB_BITS = 8 * 1024 * 1024  # bits in one MB (MiB, as MQBench counts)
_MIN_BITS, _MAX_BITS = 2, 16


# ---- bit widths and quantization ranges --------------------------------------------------------

def _check_bitwidth_list(bitwidth_list):
    if isinstance(bitwidth_list, (str, bytes)) or not hasattr(bitwidth_list, "__iter__"):
        raise TypeError(f"bitwidth_list must be a list of ints, e.g. [2, 4, 8], got "
                        f"{bitwidth_list!r}")
    bits = list(bitwidth_list)
    if not bits:
        raise ValueError("bitwidth_list is empty; give the candidate weight bit widths, e.g. "
                         "[2, 4, 8]")
    for b in bits:
        _check_bits(b, "bitwidth_list")
    if len(set(bits)) != len(bits):
        raise ValueError(f"bitwidth_list has repeated bit widths: {bits}")
    return [int(b) for b in bits]


def _check_bits(b, what):
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or \
            not _MIN_BITS <= b <= _MAX_BITS:
        raise ValueError(f"{what}: a bit width must be an int in [{_MIN_BITS}, {_MAX_BITS}], "
                         f"got {b!r}")


def _new_qrange(fq, bits):
    """The ``bits``-wide integer range of the same kind as ``fq``'s: unsigned ``[0, 2^b - 1]``,
    signed ``[-2^(b-1), 2^(b-1) - 1]``, or signed narrow ``[-(2^(b-1) - 1), 2^(b-1) - 1]`` when
    the quantizer's range is narrow (quant_min == -quant_max; MQBench always uses the full
    signed range)."""
    qmin, qmax = int(fq.quant_min), int(fq.quant_max)
    if qmin == 0:
        return 0, 2 ** bits - 1
    if qmin < 0 and qmin == -qmax:
        return -(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1
    if qmin < 0:
        return -2 ** (bits - 1), 2 ** (bits - 1) - 1
    raise ValueError(f"cannot change the bit width of a quantizer with range [{qmin}, {qmax}] "
                     "(neither [0, n] nor signed)")


def _set_bits(fq, bits):
    """Sets ``fq``'s range (and its observer's) and ``bitwidth`` to ``bits`` bits."""
    qmin, qmax = _new_qrange(fq, bits)
    fq.quant_min, fq.quant_max = qmin, qmax
    fq.bitwidth = bits
    obs = getattr(fq, "activation_post_process", None)
    if obs is not None:
        obs.quant_min, obs.quant_max = qmin, qmax
        if hasattr(obs, "has_customized_qrange"):
            obs.has_customized_qrange = True


def _reset_observer(fq):
    """Forgets what ``fq``'s observer saw (its constructor state), so that the next forward
    observes only the tensor it gets."""
    obs = getattr(fq, "activation_post_process", None)
    if obs is None:
        return
    for name, value in (("min_val", float("inf")), ("max_val", float("-inf"))):
        buf = getattr(obs, name, None)
        if isinstance(buf, torch.Tensor):
            setattr(obs, name, torch.tensor(value, dtype=buf.dtype, device=buf.device))
    for name in ("tensor_norm", "mean", "std"):
        if getattr(obs, name, None) is not None:
            setattr(obs, name, None)


def _trial_quantizer(fq, bits):
    """A copy of ``fq`` at ``bits`` bits that observes and fake-quantizes the next input."""
    trial = copy.deepcopy(fq)
    _set_bits(trial, bits)
    _reset_observer(trial)
    trial.enable_observer()
    trial.enable_fake_quant()
    return trial


def _weight_layers(quantized_model):
    return [(name, mod) for name, mod in quantized_model.named_modules()
            if is_fake_quantizer(getattr(mod, "weight_fake_quant", None))]


# ---- sizes --------------------------------------------------------------------------------------

def model_size_analysis(model: Module) -> Dict[str, int]:
    """``{layer name: number of weights}`` of every Conv2d / Linear layer of ``model``."""
    return {name: mod.weight.numel() for name, mod in model.named_modules()
            if isinstance(mod, LAYER_TYPES)}


def _weight_numel(mod):
    w = getattr(mod, "weight", None)
    return w.numel() if isinstance(w, torch.Tensor) else 0


def mp_model_size(model: Module) -> float:
    """Model size in MB (2^20 bytes): each module with a ``weight_fake_quant`` counts its weight
    at that quantizer's ``bitwidth``, every other module with a ``weight`` at 32 bits (biases
    are not counted, as in MQBench)."""
    bits = 0
    for mod in model.modules():
        fq = getattr(mod, "weight_fake_quant", None)
        if fq is not None and hasattr(fq, "bitwidth"):
            bits += _weight_numel(mod) * int(fq.bitwidth)
        else:
            bits += _weight_numel(mod) * 32
    return bits / _MB_BITS


def mp_unquantized_size(model: Module) -> float:
    """The part of ``mp_model_size(model)`` no bit config changes: the weights of modules
    without a weight fake quantizer (BatchNorm, LayerNorm ...) at 32 bits, in MB. Pass it as
    ``fixed_size_mb`` so that the budget bounds ``mp_model_size``."""
    bits = sum(_weight_numel(mod) * 32 for mod in model.modules()
               if getattr(mod, "weight_fake_quant", None) is None)
    return bits / _MB_BITS


def bit_config_size(bit_config: Dict[str, int], layer_parameters_dict: Dict[str, int]) -> float:
    """Size in MB of the weights of the layers of ``bit_config`` at their bit widths."""
    missing = [n for n in bit_config if n not in layer_parameters_dict]
    if missing:
        raise KeyError(f"layers {missing} of the bit config are not in layer_parameters_dict")
    return sum(int(b) * layer_parameters_dict[n] for n, b in bit_config.items()) / _MB_BITS


# ---- sensitivities --------------------------------------------------------------------------

def get_delta_w(quantized_model: Module, bitwidth_list: List[int]) -> Dict[str, np.ndarray]:
    """``{layer name: array of mean((W - Q_b(W))^2) for b in bitwidth_list}`` for every module
    with a ``weight_fake_quant``.

    ``Q_b`` is a copy of the layer's own weight fake quantizer (same class, observer, qscheme,
    granularity) set to ``b`` bits, observing the layer's ``weight`` afresh. The model is not
    changed (MQBench leaves every weight quantizer at the last bit width, all disabled).
    """
    bits_list = _check_bitwidth_list(bitwidth_list)
    delta_w = {}
    for name, mod in _weight_layers(quantized_model):
        w = mod.weight.detach()
        errors = []
        for bits in bits_list:
            trial = _trial_quantizer(mod.weight_fake_quant, bits)
            with torch.no_grad():
                wq = trial(w)
            errors.append(float(torch.mean((w.double() - wq.double()) ** 2)))
        delta_w[name] = np.array(errors)
    return delta_w


def _loss_value(loss):
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise ValueError(f"criterion must return a scalar loss, got shape {tuple(loss.shape)}")
        return float(loss.detach())
    return float(loss)


def _check_data(data):
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ValueError("data must be a pair (inputs, targets)")
    return data


def prec_degradation_by_layer(model: Module, quantized_model: Module, bitwidth_list: List[int],
                              data: Tuple, creterion) -> Dict[str, np.ndarray]:
    """``{layer name: array of (loss with only this layer's weight at b bits) - (float loss)}``.

    For each layer with a ``weight_fake_quant`` and each ``b``, every fake quantizer of
    ``quantized_model`` is off except a ``b``-bit copy of that layer's weight quantizer, which
    observes and quantizes the weight in the forward pass. ``model`` (the float model) gives
    the reference loss. Afterwards the quantizers (and their on/off switches) are as before.
    Both models run in the mode they are in; use eval mode (a train-mode BatchNorm would
    update its statistics). The argument name ``creterion`` is MQBench's.
    """
    bits_list = _check_bitwidth_list(bitwidth_list)
    input_data, label_data = _check_data(data)
    with torch.no_grad():
        fp_loss = _loss_value(creterion(model(input_data), label_data))
    quantizers = [m for m in quantized_model.modules() if is_fake_quantizer(m)]
    switches = [(fq, int(fq.observer_enabled[0]), int(fq.fake_quant_enabled[0]))
                for fq in quantizers]
    sensetive_dict = {}
    try:
        for fq in quantizers:
            fq.disable_observer()
            fq.disable_fake_quant()
        for name, mod in _weight_layers(quantized_model):
            original = mod.weight_fake_quant
            values = []
            try:
                for bits in bits_list:
                    mod.weight_fake_quant = _trial_quantizer(original, bits)
                    with torch.no_grad():
                        loss = _loss_value(creterion(quantized_model(input_data), label_data))
                    values.append(loss - fp_loss)
                    logger.info("Layer {} under bit {} with sensetive {}".format(
                        name, bits, loss - fp_loss))
            finally:
                mod.weight_fake_quant = original
            sensetive_dict[name] = np.array(values)
    finally:
        for fq, obs_on, fq_on in switches:
            fq.enable_observer(bool(obs_on))
            fq.enable_fake_quant(bool(fq_on))
    return sensetive_dict


def hawq(model: Module, data: Tuple, criterion, type="trace", maxIter=100, tol=1e-3,  # noqa: A002
         generator=None) -> Dict[str, float]:
    """HAWQ's per-layer Hessian measure of the float ``model`` on one batch ``data``:
    ``{layer name: trace}`` (``type='trace'``, Hutchinson) or ``{layer name: largest
    eigenvalue}`` (``type='eigenvalues'``, power iteration), see ``hessian_per_layer``."""
    if type not in HAWQ_TYPES:
        raise ValueError(f"hawq: unknown type {type!r}; choose one of {list(HAWQ_TYPES)}")
    inputs, targets = _check_data(data)
    comp = hessian_per_layer(model, criterion, data=(inputs, targets), generator=generator)
    if type == "eigenvalues":
        return comp.layer_eigenvalues(maxIter=maxIter, tol=tol)
    return comp.layer_trace(maxIter=maxIter, tol=tol)


def mixprecision_profiling(model: Module, quantized_model: Module, bitwidth_list: List[int],
                           data: Tuple, criterion, algo="naive", *, maxIter=100, tol=1e-3,
                           generator=None) -> Dict[str, np.ndarray]:
    """Sensitivity of each layer at each bit width: ``{layer name: array, one value per entry
    of bitwidth_list}`` (lower = safer to quantize).

    Args:
        model: the float model.
        quantized_model: ``model`` prepared by ``prepare_by_platform`` (its weight fake
            quantizers set the quantization kind; their bit widths are overridden).
        bitwidth_list: candidate weight bit widths, e.g. ``[2, 4, 8]``.
        data: one batch ``(inputs, targets)``.
        criterion: ``criterion(output, targets)`` -> scalar loss.
        algo: ``'naive'`` (loss increase, ``prec_degradation_by_layer``), ``'hawq_eigen'`` or
            ``'hawq_trace'`` (Hessian measure / #weights * ``get_delta_w``).
        maxIter, tol, generator: the Hessian estimators' settings (hawq only).

    Layers of the float model without a weight quantizer in ``quantized_model`` are left out
    (logged). Example::

        sens = mixprecision_profiling(model, qmodel, [2, 4, 8], (x, y),
                                      torch.nn.CrossEntropyLoss(), algo='hawq_trace')
    """
    if algo not in PROFILING_ALGOS:
        raise ValueError(f"mixprecision_profiling: unknown algo {algo!r}; choose one of "
                         f"{list(PROFILING_ALGOS)}")
    bits_list = _check_bitwidth_list(bitwidth_list)
    if algo == "naive":
        return prec_degradation_by_layer(model, quantized_model, bits_list, data, criterion)
    layer_parameters_dict = model_size_analysis(model)
    measure = hawq(model, data, criterion, type="eigenvalues" if algo == "hawq_eigen" else "trace",
                   maxIter=maxIter, tol=tol, generator=generator)
    delta_w = get_delta_w(quantized_model, bits_list)
    sensetive_dict = {}
    for layer, value in measure.items():
        if layer not in delta_w:
            logger.info("Layer {} has no weight fake quantizer in the quantized model; "
                        "left out".format(layer))
            continue
        normalized = value / layer_parameters_dict[layer]
        logger.info("Layer {} with {} / #params {}".format(
            layer, "max eigenvalue" if algo == "hawq_eigen" else "trace", normalized))
        sensetive_dict[layer] = normalized * delta_w[layer]
    return sensetive_dict


# ---- selection ------------------------------------------------------------------------------

def mixprecision_bit_selection(bitwidth_list, sensetive_dict, layer_parameters_dict,
                               model_size_constraints, latency_constraints=None, *,
                               fixed_size_mb=0.0) -> Dict[str, int]:
    """Chooses one bit width per layer (see ``ILP_bit_selection``) and returns the bit config
    ``{layer name: bits}`` (MQBench returns None)."""
    return ILP_bit_selection(bitwidth_list, sensetive_dict, layer_parameters_dict,
                             model_size_constraints, latency_constraints,
                             fixed_size_mb=fixed_size_mb)


def ILP_bit_selection(bitwidth_list, sensetive_dict, layer_parameters_dict,  # noqa: N802
                      model_size_constraints, latency_constraints=None, *,
                      fixed_size_mb=0.0) -> Dict[str, int]:
    """The bit config of least total sensitivity whose size fits the budget, by integer
    linear programming (PuLP, CBC solver).

    Args:
        bitwidth_list: candidate bit widths, ``[b_0, b_1, ...]``.
        sensetive_dict: ``{layer: sequence of sensitivities, one per b_j}`` (as returned by
            ``mixprecision_profiling``).
        layer_parameters_dict: ``{layer: number of weights}`` (``model_size_analysis``); the
            same layers as ``sensetive_dict``.
        model_size_constraints: the size budget in MB (2^20 bytes).
        latency_constraints: must be None (MQBench accepts it and ignores it; there is no
            latency model).
        fixed_size_mb: size counted against the budget that no choice changes, e.g.
            ``mp_unquantized_size(quantized_model)``; then ``mp_model_size`` of the applied
            model is <= the budget.

    Returns ``{layer: bits}``. Raises ValueError when even the smallest bit width for every
    layer does not fit, RuntimeError when the solver finds no optimum.
    """
    bits_list = _check_bitwidth_list(bitwidth_list)
    if latency_constraints is not None:
        raise NotImplementedError("ILP_bit_selection: latency_constraints is not supported (no "
                                  "latency model); pass None and a model_size_constraints")
    if model_size_constraints is None or isinstance(model_size_constraints, bool) or \
            not isinstance(model_size_constraints, (int, float)) or model_size_constraints <= 0:
        raise ValueError(f"model_size_constraints must be a size budget in MB (> 0), got "
                         f"{model_size_constraints!r}")
    if set(sensetive_dict) != set(layer_parameters_dict):
        raise ValueError(
            "sensetive_dict and layer_parameters_dict must name the same layers; only in "
            f"sensetive_dict: {sorted(set(sensetive_dict) - set(layer_parameters_dict))}, only "
            f"in layer_parameters_dict: {sorted(set(layer_parameters_dict) - set(sensetive_dict))}")
    layers = list(sensetive_dict)
    if not layers:
        raise ValueError("sensetive_dict is empty: no layer to choose bit widths for")
    sens = {}
    for layer in layers:
        try:
            values = [float(v) for v in sensetive_dict[layer]]
        except TypeError as e:
            raise TypeError(f"sensetive_dict[{layer!r}] must be a sequence of numbers, one per "
                            f"bit width in {bits_list}") from e
        if len(values) != len(bits_list):
            raise ValueError(f"sensetive_dict[{layer!r}] has {len(values)} values for "
                             f"{len(bits_list)} bit widths {bits_list}")
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"sensetive_dict[{layer!r}] has a non-finite value: {values}")
        sens[layer] = values
    budget_bits = (float(model_size_constraints) - float(fixed_size_mb)) * _MB_BITS
    smallest_bits = sum(min(bits_list) * layer_parameters_dict[n] for n in layers)
    if smallest_bits > budget_bits:
        raise ValueError(
            f"model_size_constraints={model_size_constraints} MB is infeasible: every layer at "
            f"{min(bits_list)} bits already takes {smallest_bits / _MB_BITS:.6f} MB (plus "
            f"fixed_size_mb={fixed_size_mb}); raise the budget to at least "
            f"{smallest_bits / _MB_BITS + fixed_size_mb:.6f} MB or add smaller bit widths")
    try:
        import pulp
    except ImportError as e:  # pragma: no cover - pulp is in requirements-dev.txt
        raise ImportError("ILP_bit_selection needs PuLP: pip install pulp") from e

    prob = pulp.LpProblem("mixed_precision_bit_selection", pulp.LpMinimize)
    # Index-based variable names: layer names may hold characters PuLP rewrites.
    new_var = getattr(prob, "add_variable", None)  # PuLP >= 3.3; LpVariable before
    x = {(i, j): (new_var(f"x_{i}_{j}", 0, 1, cat=pulp.LpBinary) if new_var else
                  pulp.LpVariable(f"x_{i}_{j}", 0, 1, cat=pulp.LpBinary))
         for i in range(len(layers)) for j in range(len(bits_list))}
    prob += pulp.lpSum(sens[layers[i]][j] * x[i, j] for (i, j) in x)
    for i in range(len(layers)):
        prob += pulp.lpSum(x[i, j] for j in range(len(bits_list))) == 1, f"one_bit_width_{i}"
    prob += pulp.lpSum(bits_list[j] * layer_parameters_dict[layers[i]] * x[i, j]
                       for (i, j) in x) <= budget_bits, "model_size"
    status = prob.solve(_cbc_solver(pulp))
    if pulp.LpStatus[status] != "Optimal":
        raise RuntimeError(f"ILP_bit_selection: the solver ended with status "
                           f"{pulp.LpStatus[status]!r}, no bit config chosen")
    bit_config = {}
    for i, layer in enumerate(layers):
        chosen = [j for j in range(len(bits_list)) if pulp.value(x[i, j]) > 0.5]
        bit_config[layer] = bits_list[chosen[0]]
        logger.info("Layer {} with {} bits".format(layer, bit_config[layer]))
    logger.info("Result model size {} MB.".format(
        bit_config_size(bit_config, layer_parameters_dict) + fixed_size_mb))
    logger.info("Result model sensetive is {}".format(
        sum(sens[n][bits_list.index(b)] for n, b in bit_config.items())))
    return bit_config


def _cbc_solver(pulp):
    """CBC, quiet: the one on PATH (``COIN_CMD``, PuLP 4's way) or else the copy PuLP 3 ships
    (``PULP_CBC_CMD``, deprecated in PuLP 3.3, hence the silenced warning)."""
    coin = pulp.COIN_CMD(msg=False)
    if coin.available():
        return coin
    bundled = getattr(pulp, "PULP_CBC_CMD", None)
    if bundled is None:
        raise RuntimeError("ILP_bit_selection needs the CBC solver: pip install 'pulp[cbc]'")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        solver = bundled(msg=False)
    if not solver.available():
        raise RuntimeError("ILP_bit_selection: PuLP's bundled CBC is not available on this "
                           "platform; install CBC (pip install 'pulp[cbc]' or apt-get install "
                           "coinor-cbc)")
    return solver


# ---- applying a bit config --------------------------------------------------------------------

def apply_bit_config(prepared_model: Module, bit_config: Dict[str, int]) -> Module:
    """Sets the weight fake quantizer of each layer of ``bit_config`` (``{layer name: bits}``)
    to its bit width, in place; returns ``prepared_model``.

    ``prepare_by_platform`` takes one weight scheme for all layers, so per-layer bit widths
    are set on the prepared model: ``quant_min``/``quant_max`` of the quantizer and of its
    observer, and ``bitwidth`` (read by ``mp_model_size``). The range keeps its kind (unsigned,
    signed, or signed narrow). A quantizer that has observed data gets its scale and zero point
    recomputed from the observer's statistics at the new width, which is exact for min/max
    observers; recalibrate (``enable_calibration(model)``, a few batches) for observers whose
    statistics depend on the range (MSE) or after QAT with learned scales. Layers not named
    keep their bit width.

    Example::

        apply_bit_config(qmodel, {'conv1': 8, 'conv2': 4, 'fc': 2})
    """
    if not isinstance(bit_config, dict):
        raise TypeError(f"bit_config must be a dict {{layer name: bits}}, got "
                        f"{type(bit_config).__name__}")
    layers = dict(_weight_layers(prepared_model))
    unknown = [n for n in bit_config if n not in layers]
    if unknown:
        raise KeyError(f"apply_bit_config: {unknown} are not layers with a weight_fake_quant; "
                       f"the model's are {sorted(layers)}")
    for name, bits in bit_config.items():
        _check_bits(bits, f"bit_config[{name!r}]")
    for name, bits in bit_config.items():
        fq = layers[name].weight_fake_quant
        _set_bits(fq, int(bits))
        _refresh_qparams(fq)
        logger.info("Set {} weight quantize to {} bits [{}, {}].".format(
            name, bits, fq.quant_min, fq.quant_max))
    return prepared_model


def _refresh_qparams(fq):
    obs = getattr(fq, "activation_post_process", None)
    min_val = getattr(obs, "min_val", None)
    scale, zero_point = getattr(fq, "scale", None), getattr(fq, "zero_point", None)
    if not isinstance(min_val, torch.Tensor) or min_val.numel() == 0 or \
            not bool(torch.isfinite(min_val).all()) or not isinstance(scale, torch.Tensor) or \
            not isinstance(zero_point, torch.Tensor):
        return  # never calibrated: the next calibration sets the qparams
    new_scale, new_zp = fq.calculate_qparams()
    with torch.no_grad():
        for dst, src in ((scale, new_scale), (zero_point, new_zp)):
            src = src.to(device=dst.device, dtype=dst.dtype)
            if dst.shape != src.shape:
                dst.data = src.clone()
            else:
                dst.data.copy_(src)
