"""Advanced post-training quantization by reconstruction: AdaRound (layer by layer), BRECQ
(block by block) and QDrop (blocks with randomly dropped activation quantization), MQBench's
``mqbench.advanced_ptq.ptq_reconstruction``.

For each unit (one layer, or one block) of a prepared and calibrated model, in graph order:

1. the unit's inputs are cached from the *quantized* model (whose earlier units are already
   reconstructed) and its target output from the *float* model, over the calibration batches;
2. the unit is cut out as a standalone ``GraphModule`` sharing the quantized model's modules;
3. the rounding of its weights (AdaRound's ``alpha``, through ``AdaRoundFakeQuantize``) and, with
   ``scale_lr``, the scales of its activation quantizers are learned to minimise
   ``|unit(x_q) - y_fp|^2 + weight * sum(1 - |2 h(alpha) - 1|^beta)``, beta annealed;
4. the learned hard rounding is written into the weights (through any BatchNorm folding), so
   the model deploys with ordinary fixed fake quantization.

The maths of the inner loop are our ops: the soft and hard AdaRound fake quantization and the
rectified sigmoid (``torch.ops.mqbench.fake_quantize_adaround_*``,
``adaround_rectified_sigmoid``), the rounding regularizer (``adaround_regularizer``), the alpha
initialisation (``adaround_alpha_init``) and QDrop's random drop inside the unit
(``fake_quantize_qdrop_*``); the drop of the unit's cached inputs is one ``torch.where`` as in
MQBench. docs/ptq.md has a walkthrough and measured figures; the deliberate
differences from MQBench are rows 112- of docs/compatibility.md.
"""
import math
import operator
import warnings

import torch
from torch import fx, nn

# The graph carving (units) and the data caching have their own modules; their public names
# are MQBench's here.
from mqbench._ptq_cache import save_inp_oup_data
from mqbench._ptq_units import (_MAX_BLOCK_NODES, _is_layer_node, _is_quant_layer, _tensor_args,
                                _unit_output, extract_block, extract_layer, extract_subgraph)
from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.utils.arguments import check_arg
from mqbench.utils.config import check_keys
from mqbench.utils.hook import StopForwardException
from mqbench.utils.logger import logger
from mqbench.utils.utils import (deepcopy_graphmodule, deepcopy_mixedmodule, model_device,
                                 to_device)

__all__ = ["ptq_reconstruction", "subgraph_reconstruction", "LinearTempDecay", "CosineTempDecay",
           "LossFunction", "lp_loss", "save_inp_oup_data", "extract_layer", "extract_block",
           "extract_subgraph", "StopForwardException", "RECONSTRUCTION_DEFAULTS"]

# MQBench's keys, with the values of its example configs where a key may be left out.
RECONSTRUCTION_DEFAULTS = {
    "pattern": "block",
    "warm_up": 0.2,
    "weight": 0.01,
    "max_count": 20000,
    "b_range": (20, 2),
    "keep_gpu": True,
    "round_mode": "learned_hard_sigmoid",
    "prob": 1.0,
}
# Keys beyond the defaults: scale_lr (learn activation scales), exclude_node /
# exclude_node_prefix (skip units), batch_size (rows drawn per step from all cached batches;
# MQBench draws one cached batch), drop_prob (QDrop's name for 1 - prob), progress (tqdm bar),
# max_block_nodes (when a block search gives up and falls back to a layer).
_OPTIONAL_KEYS = ("scale_lr", "exclude_node", "exclude_node_prefix", "batch_size", "drop_prob",
                  "progress", "max_block_nodes")
_PATTERNS = ("layer", "block")
_MIN_SCALE = 1e-8  # learned activation scales are kept at least this large


# -- losses and schedules ------------------------------------------------------------------

def lp_loss(pred, tgt, p=2.0):
    """``mean(sum_dim1 |pred - tgt|^p)``: summed over channels (dim 1), averaged over the rest."""
    return (pred - tgt).abs().pow(p).sum(1).mean()


class LinearTempDecay:
    """beta = ``start_b`` for the first ``warm_up * t_max`` steps, then linear down to ``end_b``."""

    def __init__(self, t_max=10000, warm_up=0.2, start_b=20, end_b=2):
        self.t_max = t_max
        self.start_decay = warm_up * t_max
        self.start_b = start_b
        self.end_b = end_b

    def _relative(self, t):
        return (t - self.start_decay) / max(self.t_max - self.start_decay, 1e-12)

    def __call__(self, t):
        if t < self.start_decay:
            return self.start_b
        if t > self.t_max:
            return self.end_b
        return self.end_b + (self.start_b - self.end_b) * max(0.0, 1.0 - self._relative(t))


class CosineTempDecay(LinearTempDecay):
    """As :class:`LinearTempDecay`, with a half-cosine from ``start_b`` to ``end_b``."""

    def __call__(self, t):
        if t < self.start_decay:
            return self.start_b
        if t > self.t_max:
            return self.end_b
        return self.end_b + 0.5 * (self.start_b - self.end_b) * (
            1.0 + math.cos(self._relative(t) * math.pi))


class LossFunction:
    """Reconstruction loss ``lp_loss(pred, tgt, p)`` plus, after ``warm_up * max_count`` calls,
    AdaRound's rounding regularizer ``weight * sum(1 - |2 h(alpha) - 1|^beta)`` over the
    AdaRound weight quantizers of ``subgraph`` (beta from :class:`LinearTempDecay`).
    The last terms are kept in ``rec_loss``, ``round_loss`` (detached tensors) and ``beta``."""

    def __init__(self, subgraph, weight=1.0, max_count=10000, b_range=(20, 2), warm_up=0.0,
                 p=2.0):
        self.subgraph = subgraph
        self.weight = weight
        self.loss_start = max_count * warm_up
        self.p = p
        self.temp_decay = LinearTempDecay(max_count, warm_up=warm_up, start_b=b_range[0],
                                          end_b=b_range[1])
        self.count = 0
        self.rec_loss = self.round_loss = torch.zeros(())
        self.beta = float(b_range[0])
        self._alphas = [m.alpha for m in subgraph.modules()
                        if getattr(m, "adaround", False) and hasattr(m, "alpha")]

    def __call__(self, pred, tgt):
        self.count += 1
        rec_loss = lp_loss(pred, tgt, p=self.p)
        self.beta = b = self.temp_decay(self.count)
        if self.count < self.loss_start or not self._alphas:
            round_loss = torch.zeros((), device=rec_loss.device)
        else:
            round_loss = self.weight * sum(torch.ops.mqbench.adaround_regularizer(a, float(b))
                                           for a in self._alphas)
        total = rec_loss + round_loss
        # kept as device tensors: read them (a host sync) only when logging
        self.rec_loss, self.round_loss = rec_loss.detach(), round_loss.detach()
        if self.count % 500 == 0:
            logger.info("Total loss:\t%.3f (rec:%.3f, round:%.3f)\tb=%.2f\tcount=%d",
                        total.item(), self.rec_loss.item(), self.round_loss.item(), b,
                        self.count)
        return total


# -- config ----------------------------------------------------------------------------------

class _Config:
    """The reconstruction config with MQBench's defaults filled in; unknown keys refused."""

    def __init__(self, config):
        if config is None:
            config = {}
        if isinstance(config, dict):
            items = dict(config)
        else:  # EasyDict is a dict; other objects: their public attributes
            items = {k: getattr(config, k) for k in dir(config) if not k.startswith("_")
                     and not callable(getattr(config, k))}
        known = set(RECONSTRUCTION_DEFAULTS) | set(_OPTIONAL_KEYS)
        check_keys(items, known, "ptq_reconstruction config")
        values = dict(RECONSTRUCTION_DEFAULTS)
        values.update(items)
        if "drop_prob" in items:
            if "prob" in items and abs(items["prob"] - (1.0 - items["drop_prob"])) > 1e-12:
                raise ValueError("ptq_reconstruction config: give either prob (probability to "
                                 "quantize) or drop_prob (= 1 - prob), not two that disagree")
            values["prob"] = 1.0 - float(items["drop_prob"])
        self.__dict__.update(values)
        self._check()

    def _check(self):
        if self.pattern not in _PATTERNS:
            raise NotImplementedError(f"ptq_reconstruction: pattern {self.pattern!r} is not "
                                      f"supported; use one of {list(_PATTERNS)}")
        if self.round_mode != "learned_hard_sigmoid":
            raise NotImplementedError(f"ptq_reconstruction: round_mode {self.round_mode!r} is "
                                      "not supported; use 'learned_hard_sigmoid'")
        if not (0.0 < float(self.prob) <= 1.0):
            raise ValueError(f"ptq_reconstruction config: prob must be in (0, 1], got {self.prob}")
        if int(self.max_count) < 1:
            raise ValueError(f"ptq_reconstruction config: max_count must be >= 1, got "
                             f"{self.max_count}")
        if not (0.0 <= float(self.warm_up) <= 1.0):
            raise ValueError(f"ptq_reconstruction config: warm_up is a fraction of max_count in "
                             f"[0, 1], got {self.warm_up}")
        if len(tuple(self.b_range)) != 2:
            raise ValueError(f"ptq_reconstruction config: b_range is (start_beta, end_beta), got "
                             f"{self.b_range}")
        for key in ("exclude_node", "exclude_node_prefix"):
            value = getattr(self, key, None)
            if isinstance(value, str):
                setattr(self, key, [value])

    def __contains__(self, key):
        return key in self.__dict__

    def get(self, key, default=None):
        return self.__dict__.get(key, default)


# -- reconstruction ----------------------------------------------------------------------------

def _weight_seen_by_quantizer(layer, run_unit):
    """The tensor ``layer.weight_fake_quant`` receives (the weight, times a BatchNorm folding
    factor for fused conv-bn layers), and the factor itself, found by running the unit once
    with the real weight and once with a weight of ones (the folding is linear in the
    weight)."""
    seen = []

    def capture(module, args):
        seen.append(args[0].detach().clone())
        raise StopForwardException()  # nothing after the quantizer's input is needed

    def run():
        try:
            run_unit()
        except StopForwardException:
            pass

    handle = layer.weight_fake_quant.register_forward_pre_hook(capture)
    saved = layer.weight.data
    try:
        with torch.no_grad():
            run()
            layer.weight.data = torch.ones_like(saved)
            run()
    finally:
        layer.weight.data = saved
        handle.remove()
    if len(seen) < 2 or seen[0].shape != saved.shape:
        raise RuntimeError(f"ptq_reconstruction: could not observe the weight quantizer of "
                           f"{type(layer).__name__} (its forward did not call weight_fake_quant "
                           "on a tensor of the weight's shape)")
    return seen[0], seen[1]


def _act_quantizers(subgraph, layer_quantizers):
    """The activation fake quantizers of a unit: its call_module nodes that are quantizers."""
    out = []
    for node in subgraph.graph.nodes:
        if node.op != "call_module":
            continue
        module = subgraph.get_submodule(node.target)
        if isinstance(module, QuantizeBase) and module not in layer_quantizers:
            out.append((node.target, module))
    return out


def _rows(batch, pick, device):
    """A cached batch (or the rows ``pick`` of it) on ``device``."""
    if pick is not None:
        batch = batch[pick.to(batch.device)]
    return batch.to(device)


def _fixed_scale_quantizers(module, layer_quantizers=()):
    """Names of the activation quantizers under ``module`` whose scale is a buffer (a
    ``FixedFakeQuantize``, say): ``scale_lr`` cannot learn them."""
    return [f"{n} ({type(q).__name__})" for n, q in module.named_modules()
            if isinstance(q, QuantizeBase) and q not in layer_quantizers
            and not n.endswith("weight_fake_quant")
            and not isinstance(getattr(q, "scale", None), nn.Parameter)]


def _warn_fixed_scales(where, names):
    warnings.warn(f"ptq_reconstruction ({where}): scale_lr learns the activation scales that are "
                  f"parameters; {len(names)} activation quantizer(s) have a buffer scale and keep "
                  f"their calibrated scale: {', '.join(names)}. To learn them too, prepare with "
                  "a_fakequantize: QDropFakeQuantize or LearnableFakeQuantize.", UserWarning,
                  stacklevel=3)


def subgraph_reconstruction(subgraph, cached_inps, cached_oups, config, name="unit", *,
                            _report_fixed_scales=True):
    """Learns the rounding of the unit's weights (and, with ``config.scale_lr``, its activation
    scales) on the cached data, then writes the hard rounding into the weights.

    ``cached_inps``: per unit input, the quantized model's values per batch, or with
    ``config.prob < 1`` a pair ``(quant_inputs, fp_inputs)``; ``cached_oups``: the float
    model's output of the unit per batch."""
    config = config if isinstance(config, _Config) else _Config(config)
    device = model_device(subgraph)
    layers = [(n, m) for n, m in subgraph.named_modules() if _is_quant_layer(m)]
    if not layers:
        return
    prob = float(config.prob)
    if prob < 1.0:
        quant_inps, fp_inps = cached_inps
    else:
        quant_inps, fp_inps = cached_inps, None
    n_batches = len(cached_oups)
    first = tuple(to_device(c[0], device) for c in quant_inps)

    def run_first():
        subgraph(*first)

    w_params = []
    for lname, layer in layers:
        quantizer = layer.weight_fake_quant
        if not hasattr(quantizer, "init") or not hasattr(quantizer, "get_hard_value"):
            raise TypeError(f"ptq_reconstruction: {name}: the weight quantizer of {lname} is "
                            f"{type(quantizer).__name__}; reconstruction learns the rounding "
                            "with AdaRoundFakeQuantize (w_fakequantize: AdaRoundFakeQuantize)")
        seen, _ = _weight_seen_by_quantizer(layer, run_first)
        quantizer.init(seen, config.round_mode)
        w_params.append(quantizer.alpha)
    layer_quantizers = {m.weight_fake_quant for _, m in layers}
    a_params, fixed_scales = [], []
    for aname, quantizer in _act_quantizers(subgraph, layer_quantizers):
        if hasattr(quantizer, "prob"):
            quantizer.prob = prob
        if "scale_lr" in config and config.scale_lr is not None:
            if isinstance(quantizer.scale, nn.Parameter):
                a_params.append(quantizer.scale)
            else:
                fixed_scales.append(f"{aname} ({type(quantizer).__name__})")
    if fixed_scales and _report_fixed_scales:
        # MQBench hands these buffers to Adam, where they never get a gradient: the calibrated
        # scales stay as they are. Keep that outcome without the pretence, and say so once.
        _warn_fixed_scales(name, fixed_scales)
    w_opt = torch.optim.Adam(w_params)
    a_opt = a_sched = None
    if a_params:
        a_opt = torch.optim.Adam(a_params, lr=float(config.scale_lr))
        a_sched = torch.optim.lr_scheduler.CosineAnnealingLR(a_opt, T_max=int(config.max_count),
                                                             eta_min=0.0)
    loss_func = LossFunction(subgraph, weight=float(config.weight),
                             max_count=int(config.max_count), b_range=tuple(config.b_range),
                             warm_up=float(config.warm_up))
    world_size = 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world_size = torch.distributed.get_world_size()
    batch_size = config.get("batch_size")
    if batch_size:
        # rows drawn from all cached batches: concatenate once
        quant_inps = [[torch.cat(c)] for c in quant_inps]
        fp_inps = [[torch.cat(c)] for c in fp_inps] if fp_inps is not None else None
        cached_oups = [torch.cat(cached_oups)]
    progress = _progress(range(int(config.max_count)), name, config.get("progress", True))
    for step in progress:
        if batch_size:
            b, pick = 0, torch.randint(0, cached_oups[0].shape[0], (int(batch_size),))
        else:
            b, pick = int(torch.randint(0, n_batches, ())), None
        args = []
        for a, cached in enumerate(quant_inps):
            x = _rows(cached[b], pick, device)
            if prob < 1.0:
                x_fp = _rows(fp_inps[a][b], pick, device)
                x = torch.where(torch.rand_like(x) < prob, x, x_fp)
            args.append(x)
        target = _rows(cached_oups[b], pick, device)
        w_opt.zero_grad()
        if a_opt:
            a_opt.zero_grad()
        out = subgraph(*args)
        loss = loss_func(_unit_output(out), target) / world_size
        loss.backward()
        if world_size > 1:
            for p in w_params:
                torch.distributed.all_reduce(p.grad)
        w_opt.step()
        if a_opt:
            a_opt.step()
            a_sched.step()
            with torch.no_grad():  # a step past zero would leave an invalid scale
                for p in a_params:
                    p.clamp_(min=_MIN_SCALE)
        if hasattr(progress, "set_postfix") and (step % 50 == 0 or step + 1 == config.max_count):
            progress.set_postfix(loss=f"{loss.item():.4g}", rec=f"{loss_func.rec_loss.item():.4g}",
                                 round=f"{loss_func.round_loss.item():.4g}",
                                 b=f"{loss_func.beta:.1f}", refresh=False)
    # write the hard rounding into the weights, through the folding factor
    for lname, layer in layers:
        quantizer = layer.weight_fake_quant
        with torch.no_grad():
            seen, factor = _weight_seen_by_quantizer(layer, run_first)
            hard = quantizer.get_hard_value(seen)
            safe = torch.where(factor != 0, factor, torch.ones_like(factor))
            layer.weight.data = torch.where(factor != 0, hard / safe, layer.weight.data)
        quantizer.adaround = False
    for _, quantizer in _act_quantizers(subgraph, layer_quantizers):
        if hasattr(quantizer, "prob"):
            quantizer.prob = 1.0


def _progress(iterable, name, enabled):
    if not enabled:
        return iterable
    from tqdm import tqdm
    return tqdm(iterable, desc=f"reconstruct {name}", leave=False, dynamic_ncols=True,
                mininterval=1.0)


def _excluded(node, config):
    names = set(config.get("exclude_node") or [])
    prefixes = tuple(config.get("exclude_node_prefix") or [])
    return (node.name in names or str(node.target) in names
            or (prefixes and (node.name.startswith(prefixes)
                              or str(node.target).startswith(prefixes))))


def _returns_a_sequence(node):
    """True when every user of ``node`` indexes it (``chunk``, ``split``, ``unbind``, ...)."""
    users = list(node.users)
    return bool(users) and all(u.op == "call_function" and u.target is operator.getitem
                               for u in users)


def _all_tensors(values):
    return all(isinstance(v, torch.Tensor) for v in values)


def _units(gm, modules, config):
    """The reconstruction units of ``gm`` in graph order: lists of nodes, each with at least
    one weighted layer; a node belongs to one unit at most."""
    visited = set()
    units = []
    limit = int(config.get("max_block_nodes") or _MAX_BLOCK_NODES)
    for node in gm.graph.nodes:
        if node in visited or not _is_layer_node(node, modules):
            continue
        if _excluded(node, config):
            logger.info("ptq_reconstruction: %s excluded by the config", node.name)
            visited.add(node)
            continue
        if config.pattern == "layer":
            unit, _ = extract_layer(node, modules)
        else:
            unit = extract_block(_tensor_args(node)[:1], modules, max_nodes=limit)
            if not unit or node not in unit:
                logger.info("ptq_reconstruction: no block closes after %s within %d nodes; "
                            "reconstructing it as a layer", node.name, limit)
                unit, _ = extract_layer(node, modules)
        unit = [n for n in unit if n not in visited]
        while unit and _returns_a_sequence(unit[-1]):
            unit.pop()  # a unit ends on a tensor: a chunk / split stays for the next unit
        unit = [n for n in unit if not (_is_layer_node(n, modules) and _excluded(n, config))
                or n is node]
        if not any(_is_layer_node(n, modules) for n in unit):
            continue
        visited.update(unit)
        units.append(unit)
    return units


def _quantizer_states(model):
    return {m: (int(m.fake_quant_enabled[0]), int(m.observer_enabled[0]))
            for m in model.modules() if isinstance(m, QuantizeBase)}


def _restore_states(states):
    for m, (fq, ob) in states.items():
        m.fake_quant_enabled[0] = fq
        m.observer_enabled[0] = ob


def _set_all(model, fake_quant, observer):
    for m in model.modules():
        if isinstance(m, QuantizeBase):
            m.fake_quant_enabled[0] = int(fake_quant)
            m.observer_enabled[0] = int(observer)


def ptq_reconstruction(model, cali_data, config, graph_module_list=None):
    """Reconstructs a prepared, calibrated model unit by unit (AdaRound with
    ``pattern='layer'``, BRECQ with ``pattern='block'``, QDrop with ``pattern='block'`` and
    ``prob < 1``) and returns the quantized copy; ``model`` itself is left as it was.

    Args:
        model: a GraphModule from ``prepare_by_platform`` with ``AdaRoundFakeQuantize`` weight
            quantizers (and, for QDrop or ``scale_lr``, ``QDropFakeQuantize`` activation
            quantizers), calibrated.
        cali_data: a list of batches, each passed as ``model(batch)`` (a tuple as
            ``model(*batch)``, a dict as ``model(**batch)``).
        config: a dict or EasyDict with MQBench's keys (``RECONSTRUCTION_DEFAULTS`` and
            ``scale_lr``, ``exclude_node``, ``exclude_node_prefix``, ``batch_size``, ...).
        graph_module_list: for a model that is not itself a GraphModule, the names of its
            GraphModule children to reconstruct.

    Returns the reconstructed model, with fake quantization on and observers off.
    """
    check_arg(ptq_reconstruction, "model", model, lambda v: isinstance(v, nn.Module),
              "the prepared, calibrated GraphModule")
    check_arg(ptq_reconstruction, "cali_data", cali_data, lambda v: isinstance(v, (list, tuple)),
              "a non-empty list of batches")
    check_arg(ptq_reconstruction, "config", config,
              lambda v: v is None or not isinstance(v, (str, bytes, int, float, list, tuple)),
              "a dict or EasyDict of reconstruction settings")
    check_arg(ptq_reconstruction, "graph_module_list", graph_module_list,
              lambda v: v is None or (isinstance(v, (list, tuple))
                                      and all(isinstance(n, str) for n in v)),
              "a list of GraphModule child names or None")
    config = _Config(config)
    if not isinstance(cali_data, (list, tuple)) or len(cali_data) == 0:
        raise ValueError("ptq_reconstruction: cali_data must be a non-empty list of batches")
    if graph_module_list is None:
        if not isinstance(model, fx.GraphModule):
            raise TypeError("ptq_reconstruction: model must be a GraphModule from "
                            "prepare_by_platform, or pass graph_module_list naming its "
                            "GraphModule children")
        quant_model = deepcopy_graphmodule(model)
        targets = [("", model, quant_model)]
    else:
        quant_model = deepcopy_mixedmodule(model, graph_module_list)
        targets = []
        for name in graph_module_list:
            sub = model.get_submodule(name)
            if not isinstance(sub, fx.GraphModule):
                raise TypeError(f"ptq_reconstruction: graph_module_list names {name!r}, a "
                                f"{type(sub).__name__}, not a GraphModule")
            targets.append((name, sub, quant_model.get_submodule(name)))
    if not config.keep_gpu:
        cali_data = [to_device(b, "cpu") for b in cali_data]
    if config.get("scale_lr") is not None:
        fixed = [n for _, _, q_gm in targets for n in _fixed_scale_quantizers(q_gm)]
        if fixed:  # once per call, not once per unit
            _warn_fixed_scales("whole model", fixed)
    user_states = _quantizer_states(model)
    modes = {m: m.training for m in model.modules()}
    fp32_model = model
    try:
        fp32_model.eval()
        quant_model.eval()
        _set_all(fp32_model, fake_quant=False, observer=False)
        _set_all(quant_model, fake_quant=True, observer=False)
        for name, fp_gm, q_gm in targets:
            _reconstruct_graph(fp32_model, quant_model, fp_gm, q_gm, cali_data, config, name)
    finally:
        _restore_states(user_states)
        for m, training in modes.items():
            m.training = training
    _set_all(quant_model, fake_quant=True, observer=False)
    return quant_model


def _reconstruct_graph(fp32_model, quant_model, fp_gm, q_gm, cali_data, config, prefix):
    modules = dict(q_gm.named_modules())
    fp_nodes = {n.name: n for n in fp_gm.graph.nodes}
    units = _units(q_gm, modules, config)
    keep_gpu = bool(config.keep_gpu)
    for i, unit in enumerate(units):
        output = unit[-1]
        label = f"{prefix + '.' if prefix else ''}{output.name}"
        logger.info("ptq_reconstruction: %s unit %d/%d: %s", config.pattern, i + 1, len(units),
                    [n.name for n in unit])
        subgraph = extract_subgraph(q_gm, unit, output)
        inputs = subgraph.unit_inputs
        fp_out = fp_nodes[output.name]
        fp_wanted = [fp_out] + ([fp_nodes[n.name] for n in inputs] if config.prob < 1.0 else [])
        fp_cache = save_inp_oup_data(fp32_model, fp_gm, fp_wanted, cali_data, keep_gpu)
        q_cache = save_inp_oup_data(quant_model, q_gm, inputs, cali_data, keep_gpu)
        quant_inps = [q_cache[n] for n in inputs]
        if not _all_tensors(fp_cache[fp_out]) or not all(_all_tensors(c) for c in quant_inps):
            logger.warning("ptq_reconstruction: skipping unit %s: its inputs or output are not "
                           "single tensors (its layers keep nearest rounding)", label)
            continue
        if config.prob < 1.0:
            cached_inps = (quant_inps, [fp_cache[fp_nodes[n.name]] for n in inputs])
        else:
            cached_inps = quant_inps
        subgraph_reconstruction(subgraph, cached_inps, fp_cache[fp_out], config, name=label,
                                _report_fixed_scales=False)
