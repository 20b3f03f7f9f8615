"""Cross-layer equalization and empirical bias correction (``mqbench.weight_equalization``).

Cross-layer equalization (Nagel et al., "Data-Free Quantization", 2019) rescales the output
channel ``i`` of a layer by ``1/s_i`` and the matching input channel of the next layer by
``s_i``. Between the two, only operations that commute with a positive per-channel scale may
stand (ReLU, LeakyReLU, PReLU, max/average pooling, dropout, identity, fake quantizers, and a
channel-major ``flatten`` before a Linear), so the float function is unchanged while the
per-channel weight ranges ``r1 = max|W1[i]|`` and ``r2 = max|W2[:, i]|`` both become
``sqrt(r1 * r2)``: a layer with a few outlier channels no longer wastes a per-tensor quantizer's
grid on them. The scale is ``torch.ops.mqbench.dfq_equalization_scale`` (MQBench's formula:
``s = clip(sqrt(r1*r2 + eps) / (r2 + eps), s_min, s_max)``, ``s = 1`` where ``r1 + r2 < 0.5``).

MQBench's names work as in MQBench:

* :func:`dfq_weight_equalization` ``(w1, b1, w2, s_min, s_max, eps) -> (w1, b1, w2, scale)``,
  in place; grouped and depthwise ``w2`` are handled.
* :func:`get_weight_equalization_groups` ``(model, input_shape_dict=...)`` finds the chains of
  layers of an fx ``GraphModule`` (a prepared model or a traced float model), prints them and
  equalizes every consecutive pair once; it returns the chains (MQBench returns None).
* :func:`weight_equalize_conv_pair` ``(modules, weq_pair)`` equalizes one pair of nodes;
  :data:`WEIGHT_EQUALIZATION_FUNCTION` / :func:`register_weight_equalization_function` is the
  ``{type1: {type2: fn}}`` registry (looked up along each class's MRO, so a subclass of
  ``nn.Conv2d`` uses the Conv2d entry).

Beyond MQBench: float ``nn.Conv1d/2d/3d`` and ``nn.Linear`` pairs, conv -> Linear through a
flatten, and BatchNorm-folding QAT modules (``ConvBn2d``, ``ConvBnReLU2d``, ``LinearBn1d``, ...),
equalized on the weight their ``weight_fake_quant`` sees (``W * gamma / running_std``): the
BatchNorm's ``gamma`` and ``beta`` carry the output scale, so training- and eval-mode outputs
are both unchanged. :func:`cross_layer_equalization` iterates all pairs until the scales
converge. :func:`bias_correction` is the empirical bias correction of a calibrated model
(:mod:`mqbench.bias_correction`, re-exported here).

Run equalization *before* calibrating the weight and activation quantizers: it changes the
ranges they observe. A prepared model shares its parameters with the float model it was prepared
from (as torch's and MQBench's QAT swap), so equalizing one changes the other; ``deepcopy`` the
float model first when it must stay as it was.
"""
import math
from collections import OrderedDict

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

import mqbench.nn.qat as qnnqat
from mqbench._base import is_fake_quantizer
from mqbench._bn_fold import _bn_of, _fold_factor
# Empirical bias correction has its own module; MQBench's users import it from here.
from mqbench.bias_correction import bias_correction  # noqa: F401
from mqbench.utils.logger import logger
from mqbench.utils.registry import (WEIGHT_EQUALIZATION_FUNCTION,  # noqa: F401
                                    register_weight_equalization_function)

__all__ = ["WEIGHT_EQUALIZATION_FUNCTION", "register_weight_equalization_function",
           "dfq_weight_equalization", "equalize_pair", "weight_equalize_conv_pair",
           "get_weight_equalization_groups", "convert_equalization_groups",
           "cross_layer_equalization", "bias_correction", "ACT_TYPES", "POOL_TYPES"]

# The registry {type of layer 1: {type of layer 2: fn(modules, weq_pair)}} lives in
# mqbench.utils.registry, where MQBench keeps it.


def _lookup(type1, type2):
    """The registered function for (type1, type2), the most derived registered classes first;
    None when there is none."""
    for a in type1.__mro__:
        inner = WEIGHT_EQUALIZATION_FUNCTION.get(a)
        if inner:
            for b in type2.__mro__:
                if b in inner:
                    return inner[b]
    return None


def _is_layer(module):
    """True for a module of a class (or subclass) the registry knows, as layer 1 or 2."""
    known = set(WEIGHT_EQUALIZATION_FUNCTION)
    for inner in WEIGHT_EQUALIZATION_FUNCTION.values():
        known.update(inner)
    return any(c in known for c in type(module).__mro__)


# ---------------------------------------------------------------------------------------------
# The scale and the in-place rescaling
# ---------------------------------------------------------------------------------------------
def _check_pair_shapes(weight_1, bias_1, weight_2):
    """(c1, in2, groups) of a pair of weights, or a ValueError saying what does not match."""
    if weight_1.dim() < 2 or weight_2.dim() < 2:
        raise ValueError("dfq_weight_equalization: weights must be (out, in, ...) tensors, got "
                         f"weight_1 {tuple(weight_1.shape)} and weight_2 {tuple(weight_2.shape)}")
    c1, c2, in2 = weight_1.shape[0], weight_2.shape[0], weight_2.shape[1]
    if in2 == 0 or c1 % in2 or c2 % (c1 // in2):
        raise ValueError(
            f"dfq_weight_equalization: weight_1 {tuple(weight_1.shape)} has {c1} output channels "
            f"but weight_2 {tuple(weight_2.shape)} takes {in2} input channels per group: layer 2 "
            "must consume layer 1's output (groups * weight_2.shape[1] == weight_1.shape[0], "
            "weight_2.shape[0] divisible by groups)")
    if bias_1 is not None and tuple(bias_1.shape) != (c1,):
        raise ValueError(f"dfq_weight_equalization: bias_1 has shape {tuple(bias_1.shape)}, "
                         f"expected ({c1},) (one per output channel of weight_1)")
    return c1, in2, c1 // in2


def _equalization_scale(weight_1, weight_2, s_min, s_max, eps):
    """``dfq_equalization_scale`` with a dead channel (``r2 == 0`` with ``eps == 0`` gives 0/0)
    left unscaled instead of NaN."""
    s = torch.ops.mqbench.dfq_equalization_scale(weight_1.detach(), weight_2.detach(),
                                                 float(s_min), float(s_max), float(eps))
    return torch.where(torch.isfinite(s), s, torch.ones_like(s))


def _input_channel_factor(s, weight_2, groups):
    """``s`` laid out to multiply ``weight_2`` (c2, in2, ...): input channel ``j`` of group
    ``g`` is channel ``g * in2 + j`` of layer 1."""
    c2, in2 = weight_2.shape[0], weight_2.shape[1]
    factor = s.reshape(groups, 1, in2).expand(groups, c2 // groups, in2).reshape(c2, in2)
    return factor.reshape([c2, in2] + [1] * (weight_2.dim() - 2)).to(weight_2.dtype)


def dfq_weight_equalization(weight_1, bias_1, weight_2, s_min=1e-6, s_max=1e6, eps=0):
    """Equalizes a pair of weights in place: ``weight_1[i] /= s[i]``, ``bias_1[i] /= s[i]``,
    ``weight_2[:, i] *= s[i]`` (grouped / depthwise ``weight_2``: ``groups = weight_1.shape[0]
    // weight_2.shape[1]``). Returns ``(weight_1, bias_1, weight_2, scale)``; ``bias_1`` may be
    None."""
    _, _, groups = _check_pair_shapes(weight_1, bias_1, weight_2)
    s = _equalization_scale(weight_1, weight_2, s_min, s_max, eps)
    with torch.no_grad():
        weight_1.div_(s.reshape([-1] + [1] * (weight_1.dim() - 1)).to(weight_1.dtype))
        if bias_1 is not None:
            bias_1.div_(s.to(bias_1.dtype))
        weight_2.mul_(_input_channel_factor(s, weight_2, groups))
    return weight_1, bias_1, weight_2, s


# ---------------------------------------------------------------------------------------------
# Modules: BatchNorm folding, the pair function
# ---------------------------------------------------------------------------------------------
def _effective_weight(module):
    """The weight ``weight_fake_quant`` sees: BatchNorm folded in for fused modules."""
    w = module.weight.detach()
    bn = _bn_of(module)
    return w if bn is None else w * _fold_factor(bn, w.dim()).detach()


def _out_channels(module):
    return module.weight.shape[0]


def _layer2_weight_view(module1, module2, weight_2):
    """``weight_2`` as (c2, c1, ...) against layer 1's c1 outputs: a Linear after a conv and a
    flatten takes ``c1 * k`` features, channel-major, and is seen as (c2, c1, k)."""
    c1 = _out_channels(module1)
    if isinstance(module2, nn.Linear):
        if module2.in_features == c1:
            return weight_2
        if isinstance(module1, nn.modules.conv._ConvNd) and module2.in_features % c1 == 0:
            return weight_2.reshape(weight_2.shape[0], c1, module2.in_features // c1)
        raise ValueError(
            f"weight equalization: {type(module1).__name__} has {c1} output channels but "
            f"{type(module2).__name__} takes {module2.in_features} features; layer 2 must "
            "consume layer 1's output (a conv's flattened output: a multiple of its channels)")
    if module2.in_channels != c1:
        raise ValueError(
            f"weight equalization: {type(module1).__name__} has {c1} output channels but "
            f"{type(module2).__name__} takes {module2.in_channels} input channels; layer 2 must "
            "consume layer 1's output")
    return weight_2


@torch.no_grad()
def equalize_pair(module1, module2, s_min=1e-6, s_max=1e6, eps=0):
    """Equalizes ``module1``'s output channels against ``module2``'s input channels in place
    and returns the scale ``s`` (``module1``'s channel ``i`` divided by ``s[i]``).

    Both are conv (``nn.Conv1d/2d/3d``, QAT and fused forms included) or ``nn.Linear`` modules;
    a Linear after a conv may take the conv's flattened output. A fused module with a BatchNorm
    is equalized on its folded weight: as layer 1, its BatchNorm ``weight`` and ``bias`` are
    divided by ``s`` (the conv weight and bias stay); as layer 2, its conv weight's input
    channels are multiplied by ``s``."""
    for what, m in (("module1", module1), ("module2", module2)):
        if not isinstance(m, (nn.modules.conv._ConvNd, nn.Linear)) or \
                isinstance(m, nn.modules.conv._ConvTransposeNd):
            raise TypeError(f"equalize_pair: {what} must be a Conv1d/2d/3d or Linear module "
                            f"(QAT and fused forms included), got {type(m).__name__}")
    w1 = _effective_weight(module1)
    w2 = _layer2_weight_view(module1, module2, _effective_weight(module2))
    _, _, groups = _check_pair_shapes(w1, None, w2)
    s = _equalization_scale(w1, w2, s_min, s_max, eps)
    bn1 = _bn_of(module1)
    if bn1 is None:
        module1.weight.div_(s.reshape([-1] + [1] * (module1.weight.dim() - 1)))
        if module1.bias is not None:
            module1.bias.div_(s)
    else:  # W_eff = W * gamma / std, b_eff = beta + (b - mean) * gamma / std: both scale by 1/s
        bn1.weight.div_(s)
        bn1.bias.div_(s)
    raw2 = _layer2_weight_view(module1, module2, module2.weight)
    factor = _input_channel_factor(s, raw2, groups)
    if raw2.data_ptr() == module2.weight.data_ptr() and raw2.is_contiguous():
        raw2.mul_(factor)
    else:
        module2.weight.copy_((raw2 * factor).reshape(module2.weight.shape))
    return s


def _module_key(item):
    """A pair element: an fx Node (its module's name is the target) or a module name."""
    if isinstance(item, torch.fx.Node):
        if item.op != "call_module":
            raise ValueError(f"weight equalization: node {item.name} is a {item.op}, not a "
                             "module call")
        return item.target, item.name
    if isinstance(item, str):
        return item, item
    raise TypeError(f"weight equalization: a pair holds fx Nodes or module names, got "
                    f"{type(item).__name__}")


def _pair_modules(modules, weq_pair):
    pair = list(weq_pair)
    if len(pair) != 2:
        names = [_module_key(p)[1] for p in pair]
        raise ValueError(f"weight equalization works on pairs of layers, got a group of "
                         f"{len(pair)}: {names}; split a chain into consecutive pairs "
                         "(convert_equalization_groups does)")
    out = []
    for item in pair:
        target, name = _module_key(item)
        if target not in modules:
            raise KeyError(f"weight equalization: no module named {target!r} in the model")
        out.append((modules[target], name))
    return out


@register_weight_equalization_function(nn.Linear, nn.Linear)
@register_weight_equalization_function(nn.Conv1d, nn.Linear)
@register_weight_equalization_function(nn.Conv2d, nn.Linear)
@register_weight_equalization_function(nn.Conv3d, nn.Linear)
@register_weight_equalization_function(nn.Conv1d, nn.Conv1d)
@register_weight_equalization_function(nn.Conv3d, nn.Conv3d)
@register_weight_equalization_function(nn.Conv2d, nn.Conv2d)
@register_weight_equalization_function(qnnqat.Conv2d, qnnqat.Conv2d)  # MQBench's key
def weight_equalize_conv_pair(modules, weq_pair):
    """MQBench's pair function: ``modules`` is ``dict(model.named_modules())``, ``weq_pair`` two
    fx nodes (or module names). Equalizes them in place (:func:`equalize_pair`), logs
    ``Weight equalizing a and b.`` and returns the scale."""
    (m1, name1), (m2, name2) = _pair_modules(modules, weq_pair)
    s = equalize_pair(m1, m2)
    logger.info(f"Weight equalizing {name1} and {name2}.")
    return s


def _equalize(modules, pair, quiet=False):
    """Dispatches one pair through the registry; returns the scale (None from a function that
    returns none)."""
    (m1, name1), (m2, name2) = _pair_modules(modules, pair)
    func = _lookup(type(m1), type(m2))
    if func is None:
        t1, t2 = type(m1).__name__, type(m2).__name__
        raise TypeError(f"weight equalization: no function is registered for the pair "
                        f"({t1} {name1}, {t2} {name2}); register one with "
                        f"@register_weight_equalization_function({t1}, {t2})")
    for m, name in ((m1, name1), (m2, name2)):
        if _calibrated(getattr(m, "weight_fake_quant", None)):
            logger.warning("weight equalization: the weight quantizer of %s has already observed "
                           "its weight; equalize before calibrating (or recalibrate after): its "
                           "scale no longer fits the equalized weight", name)
    if quiet and func is weight_equalize_conv_pair:
        return equalize_pair(m1, m2)
    return func(modules, pair)


def _calibrated(quantizer):
    """True when ``quantizer``'s observer has seen data (finite running min/max)."""
    observer = getattr(quantizer, "activation_post_process", None)
    min_val = getattr(observer, "min_val", None)
    return isinstance(min_val, torch.Tensor) and min_val.numel() > 0 and \
        bool(torch.isfinite(min_val).all())


def convert_equalization_groups(modules, layer_groups, name2type=None):
    """Equalizes each group (a chain of 2 or more layers) pair by consecutive pair, once.
    ``name2type`` is accepted for MQBench's signature and not needed."""
    for group in layer_groups:
        group = list(group)
        if len(group) < 2:
            raise ValueError(f"weight equalization: a group needs 2 or more layers, got "
                             f"{[_module_key(g)[1] for g in group]}")
        for pair in zip(group, group[1:]):
            _equalize(modules, pair)


# ---------------------------------------------------------------------------------------------
# Finding the chains in an fx graph
# ---------------------------------------------------------------------------------------------
ACT_TYPES = (nn.ReLU, nn.LeakyReLU, nn.PReLU)  # positively homogeneous: f(x / s) = f(x) / s
POOL_TYPES = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d,
              nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
              nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)
_SAME_TYPES = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
_PASS_FUNCTIONS = {F.relu, torch.relu, torch.relu_, F.relu_, F.leaky_relu, F.prelu,
                   F.max_pool1d, F.max_pool2d, F.max_pool3d, F.avg_pool1d, F.avg_pool2d,
                   F.avg_pool3d, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d,
                   F.adaptive_avg_pool3d, F.adaptive_max_pool1d, F.adaptive_max_pool2d,
                   F.adaptive_max_pool3d, F.dropout, torch.nn.functional.dropout2d}
_PASS_METHODS = {"relu", "relu_"}
# ReLU6 / Hardtanh / clamp are left out on purpose: min(x / s, 6) != min(x, 6) / s.


def _is_flatten(node, modules):
    """A channel-major flatten (``start_dim == 1`` to the last dim): conv output -> Linear."""
    if node.op == "call_module":
        m = modules[node.target]
        return isinstance(m, nn.Flatten) and m.start_dim == 1 and m.end_dim == -1
    if (node.op == "call_function" and node.target is torch.flatten) or \
            (node.op == "call_method" and node.target == "flatten"):
        args = list(node.args[1:]) + [None, None]
        start = node.kwargs.get("start_dim", args[0] if args[0] is not None else 0)
        end = node.kwargs.get("end_dim", args[1] if args[1] is not None else -1)
        return start == 1 and end == -1
    return False


def _passes_through(node, modules):
    """True for a node that commutes with a positive per-channel scale of its first input."""
    if node.op == "call_module":
        m = modules[node.target]
        if isinstance(m, (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)) and m.return_indices:
            return False
        return isinstance(m, ACT_TYPES + POOL_TYPES + _SAME_TYPES) or is_fake_quantizer(m)
    if node.op == "call_function":
        return node.target in _PASS_FUNCTIONS and not node.kwargs.get("return_indices", False)
    if node.op == "call_method":
        return node.target in _PASS_METHODS
    return False


def _reachable(starts):
    seen, todo = set(), list(starts)
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(node.users)
    return seen


def _find_chains(gm, input_names=None):
    """Chains [layer, layer, ...] of ``gm``: each layer's output reaches the next layer only,
    through pass-through nodes each used once. A module called more than once is left out."""
    modules = dict(gm.named_modules())
    nodes = list(gm.graph.nodes)
    placeholders = {n.name: n for n in nodes if n.op == "placeholder"}
    if input_names is None:
        starts = list(placeholders.values())
    else:
        missing = [name for name in input_names if name not in placeholders]
        if missing:
            raise ValueError(f"get_weight_equalization_groups: input_shape_dict names {missing}, "
                             f"which are not inputs of the model (its inputs: "
                             f"{list(placeholders)})")
        starts = [placeholders[name] for name in input_names]
    reachable = _reachable(starts)
    calls = {}
    for n in nodes:
        if n.op == "call_module":
            calls[n.target] = calls.get(n.target, 0) + 1

    def is_layer(n):
        return n.op == "call_module" and calls[n.target] == 1 and _is_layer(modules[n.target])

    following = OrderedDict()
    for node in nodes:
        if node not in reachable or not is_layer(node):
            continue
        cur, flattened = node, False
        while len(cur.users) == 1:
            (user,) = cur.users
            if user.all_input_nodes != [cur] or not user.args or user.args[0] is not cur:
                break
            if is_layer(user):
                # a conv's channels reach a Linear's inputs only through flatten(x, 1): a
                # Linear right after a conv acts on the last axis, not on the channels
                conv_to_linear = isinstance(modules[node.target], nn.modules.conv._ConvNd) and \
                    isinstance(modules[user.target], nn.Linear)
                if flattened == conv_to_linear:
                    following[node] = user
                break
            if _is_flatten(user, modules) and \
                    isinstance(modules[node.target], nn.modules.conv._ConvNd):
                flattened = True
            elif not _passes_through(user, modules):
                break
            cur = user
    chains, followers = [], set(following.values())
    for start in following:
        if start in followers:
            continue
        chain = [start]
        while chain[-1] in following:
            chain.append(following[chain[-1]])
        chains.append(chain)
    return chains


class _LayerTracer(torch.fx.Tracer):
    """Keeps layers, pass-through modules and fake quantizers as leaves (QAT modules included)."""

    def is_leaf_module(self, m, qualname):
        return _is_layer(m) or isinstance(m, ACT_TYPES + POOL_TYPES + _SAME_TYPES) or \
            is_fake_quantizer(m) or super().is_leaf_module(m, qualname)


def _as_graph_module(model, who):
    if isinstance(model, torch.fx.GraphModule):
        return model
    if not isinstance(model, nn.Module):
        raise TypeError(f"{who}: model must be an nn.Module or an fx GraphModule, got "
                        f"{type(model).__name__}")
    try:
        graph = _LayerTracer().trace(model)
    except Exception as exc:  # noqa: BLE001 - re-raised with what to do
        raise TypeError(f"{who}: {type(model).__name__} could not be traced by torch.fx "
                        f"({exc}); pass a traced or prepared model (a GraphModule)") from exc
    # The GraphModule holds the model's own submodules: equalizing them changes the model.
    return torch.fx.GraphModule(model, graph)


def get_weight_equalization_groups(model, **kwargs):
    """MQBench's entry point: finds the chains of layers of ``model`` reachable from the inputs
    named by ``input_shape_dict`` (all inputs when it is not given), prints them as lists of
    node names and equalizes each consecutive pair once, in place. Returns the chains (lists
    of fx nodes)."""
    unknown = set(kwargs) - {"input_shape_dict"}
    if unknown:
        raise TypeError(f"get_weight_equalization_groups: unknown keyword(s) {sorted(unknown)}; "
                        "it takes input_shape_dict")
    gm = _as_graph_module(model, "get_weight_equalization_groups")
    input_shape_dict = kwargs.get("input_shape_dict")
    groups = _find_chains(gm, None if input_shape_dict is None else list(input_shape_dict))
    print([[n.name for n in group] for group in groups])
    convert_equalization_groups(dict(gm.named_modules()), groups)
    return groups


def cross_layer_equalization(model, input_shape_dict=None, iterations=20, tol=1e-4):
    """Equalizes every chain of ``model`` (a float model, traced or not, or a prepared one) in
    place, sweeping all consecutive pairs until no scale differs from 1 by more than ``tol``
    (chains of 3 or more layers converge over sweeps) or ``iterations`` sweeps ran. Returns
    ``model``. Call it before calibration."""
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"cross_layer_equalization: iterations must be a positive int, got "
                         f"{iterations!r}")
    gm = _as_graph_module(model, "cross_layer_equalization")
    chains = _find_chains(gm, None if input_shape_dict is None else list(input_shape_dict))
    modules = dict(gm.named_modules())
    pairs = [pair for chain in chains for pair in zip(chain, chain[1:])]
    change = math.inf
    for sweep in range(iterations):
        change = 0.0
        for pair in pairs:
            s = _equalize(modules, pair, quiet=True)
            if isinstance(s, torch.Tensor):
                change = max(change, float((s - 1).abs().max()))
        if change <= tol:
            break
    logger.info(f"Cross-layer equalization: {len(pairs)} pair(s) in {len(chains)} chain(s), "
                f"{sweep + 1 if pairs else 0} sweep(s), last max |s - 1| = {change:.3g}: "
                f"{[[n.name for n in c] for c in chains]}")
    return model
