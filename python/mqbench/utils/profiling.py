"""Per-layer quantization error of a prepared model (MQBench's ``mqbench.utils.profiling``).

:func:`profiling` quantizes one op at a time (its weight fake quantizer and the activation fake
quantizer right after it) and measures how far that op's output moves from the float output:
cosine similarity (MQBench's metric), SQNR in dB and MSE. It logs a table at CRITICAL level,
returns the per-layer records, and can write an HTML report with plots (``report_dir``,
written by :mod:`mqbench.utils.profiling_report`).

Example::

    model = prepare_by_platform(net.eval(), BackendType.Tensorrt)
    enable_calibration(model); [model(b) for b in calib]; enable_quantization(model)
    result = profiling(model, calib, 'standalone', report_dir='out/profile')
    result.worst(3)            # the three layers with the lowest SQNR
    # open out/profile/index.html

Note [Profiling compares local outputs]: as in MQBench, each op is compared where it is
quantized: the output of its activation fake quantizer (or of the op itself when none
follows), in a float copy and in a quantized copy of the model, on the same batch. In
``'standalone'`` mode only that op is quantized, so the number is the error this op alone
adds; in ``'interaction'`` mode the ops before it stay quantized, so the number is the error
accumulated up to this op. Neither is the error of the final model output.

Differences from MQBench (all on purpose; docs/profiling.md lists them too):

* the model passed in is left exactly as it was: MQBench calls ``disable_all`` on it and
  inserts ``<node>_dummy`` Identity nodes in its graph; here both happen on deep copies;
* returns a :class:`ProfilingResult` (a list of :class:`LayerProfile`) instead of None;
* SQNR and MSE next to the cosine; the table is formatted here (no ``prettytable``);
* a function op (``add``, ``cat``, ``F.relu``...) followed by a fake quantizer is profiled (MQBench
  raises KeyError looking up a module for the function node); ``module_list`` works (MQBench's
  branch raises AttributeError);
* the logger level is restored afterwards (MQBench leaves it at INFO); a one-shot iterator as
  ``cali_data`` is read once into a list (MQBench would see no batch after the first layer).
"""
import contextlib
import dataclasses
import math
import operator
import os
import warnings
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mqbench._base import is_fake_quantizer
from mqbench.utils.arguments import check_arg
from mqbench.utils.hook import StopForwardException
from mqbench.utils.logger import logger
# The printed table and the HTML report: how the records are shown.
from mqbench.utils.profiling_report import (_format_table, _fmt_sqnr, _nodes_text,
                                            check_report_dir, write_report)
from mqbench.utils.state import disable_all, enable_quantization
from mqbench.utils.utils import (deepcopy_graphmodule, deepcopy_mixedmodule, model_device,
                                 to_device)

__all__ = ["profiling", "ProfilingResult", "LayerProfile", "QUANT_MODULE_TYPE",
           "QUANT_FUNCTION_TYPE", "cosine", "profile_summary", "to_device"]

PROFILING_TYPES = ("standalone", "interaction")

# The ops MQBench profiles (module types and traced functions, as in MQBench).
QUANT_MODULE_TYPE = (nn.Conv2d, nn.Linear, nn.ReLU, nn.ReLU6, nn.AdaptiveAvgPool2d, nn.AvgPool2d,
                     nn.ConvTranspose2d)
QUANT_FUNCTION_TYPE = [F.conv2d, F.linear, F.relu, F.relu6, F.adaptive_avg_pool2d, F.avg_pool2d,
                       F.conv_transpose2d, F.interpolate, torch.cat, operator.add, operator.sub]

# -- records --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LayerProfile:
    """The error one profiled op adds (or, in 'interaction' mode, has accumulated).

    Attributes:
        op: the module class name (``'Conv2d'``, ``'ConvBnReLU2d'``) or the function name
            (``'add'``), as MQBench's table.
        name: the module path (call_module) or the node name (functions), prefixed with the
            child's name when ``module_list`` is used.
        nodes: the fx nodes whose quantizers were switched on: the op and the fake quantizer
            right after it, or ``<node>_dummy`` for a function op without one (MQBench's).
        cosine: ``|sum(x*y)| / (||x|| ||y||)`` per batch, averaged over the batches.
        sqnr_db: ``10*log10(sum(x^2) / sum((x-y)^2))`` over all batches (``inf``: no error).
        mse: ``sum((x-y)^2) / numel`` over all batches.
    """

    op: str
    name: str
    nodes: Tuple[str, ...]
    cosine: float
    sqnr_db: float
    mse: float

    def as_dict(self):
        """The record as a plain dict (``nodes`` as a list)."""
        d = dataclasses.asdict(self)
        d["nodes"] = list(self.nodes)
        return d


class ProfilingResult(list):
    """The :class:`LayerProfile` records in graph order, plus ``profiling_type``, the printed
    ``table`` and ``summary``, and ``report_path`` (the HTML report, or None)."""

    def __init__(self, records=(), profiling_type="standalone", table="", summary="",
                 report_path=None):
        super().__init__(records)
        self.profiling_type = profiling_type
        self.table = table
        self.summary = summary
        self.report_path = report_path

    def worst(self, k=3):
        """The ``k`` records with the lowest SQNR (then the lowest cosine), worst first."""
        return sorted(self, key=lambda r: (r.sqnr_db, r.cosine))[:k]


# -- metrics --------------------------------------------------------------------------------
def cosine(x, y):
    """MQBench's cosine: ``|sum(x*y)| / (||x|| ||y||)`` of the flattened tensors, in float64.
    Two all-zero tensors give 1 and one all-zero tensor gives 0 (MQBench: nan)."""
    x, y = x.detach().flatten().double(), y.detach().flatten().double()
    nx, ny = x.norm(2), y.norm(2)
    if float(nx) == 0.0 or float(ny) == 0.0:
        return 1.0 if float(nx) == float(ny) else 0.0
    return float((x * y).sum().abs() / nx / ny)


def _sqnr_db(signal, noise):
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


class _ErrorMeter:
    """Accumulates cosine (mean over batches), SQNR and MSE (sums over all batches)."""

    def __init__(self):
        self.cosines = []
        self.signal = 0.0
        self.noise = 0.0
        self.numel = 0

    def add(self, fp_out, q_out):
        x, y = _flat(fp_out), _flat(q_out)
        if x.shape != y.shape:
            raise RuntimeError(f"float and quantized outputs differ in shape: {tuple(x.shape)} "
                               f"vs {tuple(y.shape)}")
        self.cosines.append(cosine(x, y))
        x, y = x.double(), y.double()
        self.signal += float((x * x).sum())
        self.noise += float(((x - y) ** 2).sum())
        self.numel += x.numel()

    def record(self, op, name, nodes):
        cos = sum(self.cosines) / len(self.cosines)
        mse = self.noise / self.numel if self.numel else 0.0
        return LayerProfile(op, name, tuple(nodes), cos, _sqnr_db(self.signal, self.noise), mse)


def _flat(out):
    """A captured output as one flat float tensor (tuples and lists of tensors concatenated)."""
    if isinstance(out, torch.Tensor):
        return out.detach().flatten()
    if isinstance(out, (list, tuple)):
        parts = [_flat(o) for o in out if isinstance(o, (torch.Tensor, list, tuple))]
        if parts:
            return torch.cat([p.float() for p in parts])
    raise TypeError(f"profiling can only compare tensor outputs, got {type(out).__name__}")


def profile_summary(result):
    """MQBench's summary (average cosine, the layer with the lowest cosine) plus the layer with
    the lowest SQNR. ``result``: LayerProfile records or MQBench-style dicts with ``'cos'``."""
    def get(r, key):
        if isinstance(r, dict):
            return r.get(key, r.get("cos") if key == "cosine" else None)
        return getattr(r, key)

    if not result:
        return "no layer was profiled"
    cos = [get(r, "cosine") for r in result]
    worst = min(result, key=lambda r: get(r, "cosine"))
    lines = [f"avg cos: {sum(cos) / len(cos)}",
             f"worst layer: {get(worst, 'name')}({get(worst, 'op')}) with nodes "
             f"{_nodes_text(get(worst, 'nodes'))} cos {get(worst, 'cosine')}"]
    if all(get(r, "sqnr_db") is not None for r in result):
        low = min(result, key=lambda r: get(r, "sqnr_db"))
        lines.append(f"lowest SQNR: {get(low, 'name')}({get(low, 'op')}) "
                     f"{_fmt_sqnr(get(low, 'sqnr_db'))} dB")
    return "\n".join(lines)


# -- helpers --------------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet_logger():
    """MQBench raises the logger to CRITICAL around the state switches; the level is restored."""
    level = logger.level
    logger.setLevel("CRITICAL")
    try:
        yield
    finally:
        logger.setLevel(level)


def _op_name(module_or_fn):
    if isinstance(module_or_fn, nn.Module):
        return type(module_or_fn).__name__
    return getattr(module_or_fn, "__name__", str(module_or_fn))


def _unique_attr(gm, base):
    name, i = base, 1
    while hasattr(gm, name):
        name, i = f"{base}_{i}", i + 1
    return name


def _insert_dummy(gm, node, attr):
    """An Identity module ``attr`` called right after ``node``, taking over its users."""
    gm.add_submodule(attr, nn.Identity())
    with gm.graph.inserting_after(node):
        dummy = gm.graph.create_node("call_module", attr, args=(node,), kwargs={},
                                     name=node.name + "_dummy")
    node.replace_all_uses_with(dummy, delete_user_cb=lambda user: user is not dummy)
    return dummy


class _Plan:
    """One profiled op: its name and op label, the node names, and in each copy the modules to
    switch on and the module (plus which of its calls) whose output is compared."""

    def __init__(self, name, op, nodes, q_modules, q_tap, f_tap, call_index, quantizers):
        self.name, self.op, self.nodes = name, op, nodes
        self.q_modules, self.call_index = q_modules, call_index
        self.q_tap, self.f_tap = q_tap, f_tap
        # {'weight' / 'act': (quantized copy's fake quantizer, the float copy's twin)}
        self.quantizers = quantizers


_SHAPE_METHODS = ("size", "dim", "numel")
_SHAPE_ATTRS = ("shape", "ndim")


def _shape_values(graph):
    """Nodes that compute shape values, not tensors: ``x.size()``, ``x.shape``, ``len(x)`` and
    anything computed only from those (``h * w``, ``x.shape[1] - 2``)."""
    out = set()
    for n in graph.nodes:
        if n.op == "call_method" and n.target in _SHAPE_METHODS:
            out.add(n)
        elif n.op == "call_function" and n.target is getattr and len(n.args) > 1 and \
                n.args[1] in _SHAPE_ATTRS:
            out.add(n)
        elif n.op == "call_function" and n.target is len:
            out.add(n)
        elif n.op in ("call_function", "call_method") and n.all_input_nodes and \
                all(a in out for a in n.all_input_nodes):
            out.add(n)
    return out


def _plan_graph(prefix, q_gm, f_gm, used_names):
    """Finds the profiled ops of one GraphModule pair (deep copies with the same graph), inserts
    the ``<node>_dummy`` Identity nodes in both, and returns the plans in graph order."""
    q_mods, f_mods = dict(q_gm.named_modules()), dict(f_gm.named_modules())
    f_nodes = {n.name: n for n in f_gm.graph.nodes}

    def module_of(node, mods):
        if node.op == "call_module" and isinstance(node.target, str):
            return mods.get(node.target)
        return None

    def quantizer_after(node):
        if len(node.users) != 1:
            return None
        user = next(iter(node.users))
        return user if is_fake_quantizer(module_of(user, q_mods)) else None

    plans, dirty = [], False
    shape_values = _shape_values(q_gm.graph)
    for node in list(q_gm.graph.nodes):
        if node.op == "call_module":
            mod = module_of(node, q_mods)
            if not isinstance(mod, QUANT_MODULE_TYPE):
                continue
            op = _op_name(mod)
            base = node.target
        elif node.op == "call_function" and node.target in QUANT_FUNCTION_TYPE and \
                node not in shape_values:  # shape arithmetic (h * w) is not profiled
            op = _op_name(node.target)
            base = node.name
        else:
            continue
        name = prefix + base
        if name in used_names:  # a module called from several nodes: one record per call
            name = prefix + node.name
        used_names.add(name)
        follower = quantizer_after(node)
        if follower is not None:
            prof_nodes = [node, follower]
        elif node.op == "call_module":
            prof_nodes = [node]
        else:  # MQBench's dummy: a module to hook after the function's output
            attr = _unique_attr(q_gm, node.name + "_dummy")
            q_dummy = _insert_dummy(q_gm, node, attr)
            f_dummy = _insert_dummy(f_gm, f_nodes[node.name], attr)
            f_nodes[f_dummy.name] = f_dummy
            q_mods[attr], f_mods[attr] = q_gm.get_submodule(attr), f_gm.get_submodule(attr)
            prof_nodes = [q_dummy]
            dirty = True
        tap = prof_nodes[-1]
        same_target = [n for n in q_gm.graph.nodes
                       if n.op == "call_module" and n.target == tap.target]
        quantizers = {}
        if node.op == "call_module" and is_fake_quantizer(
                getattr(q_mods[node.target], "weight_fake_quant", None)):
            path = node.target + ".weight_fake_quant"
            quantizers["weight"] = (q_mods[path], f_mods[path])
        if follower is not None:
            quantizers["act"] = (q_mods[follower.target], f_mods[follower.target])
        plans.append(_Plan(
            name=name, op=op, nodes=[n.name for n in prof_nodes],
            q_modules=[m for m in (module_of(n, q_mods) for n in prof_nodes) if m is not None],
            q_tap=q_mods[tap.target], f_tap=f_mods[tap.target],
            call_index=same_target.index(tap), quantizers=quantizers))
    if dirty:
        for gm in (q_gm, f_gm):
            gm.graph.lint()
            gm.recompile()
    return plans


class _Tap:
    """Forward hook: keeps the output of the ``call_index``-th call of a module in one forward,
    then stops the forward (nothing after it is compared)."""

    def __init__(self, call_index):
        self.call_index = call_index
        self.calls = 0
        self.output = None

    def __call__(self, module, inputs, output):
        hit = self.calls == self.call_index
        self.calls += 1
        if hit:
            self.output = output
            raise StopForwardException


def _run_to_tap(model, batch, module, call_index):
    tap = _Tap(call_index)
    handle = module.register_forward_hook(tap)
    try:
        try:
            model(batch)
        except StopForwardException:
            pass
    finally:
        handle.remove()
    if tap.output is None:
        raise RuntimeError("the profiled module was not called in the forward pass; is "
                           "cali_data a list of model inputs?")
    return tap.output


def _batches(cali_data):
    if cali_data is None:
        raise ValueError("cali_data is None: pass a list of input batches")
    try:
        it = iter(cali_data)
    except TypeError:
        raise TypeError(f"cali_data must be an iterable of input batches (a list or a "
                        f"DataLoader), got {type(cali_data).__name__}") from None
    if it is cali_data:  # a one-shot iterator: read once, it is walked once per layer
        cali_data = list(cali_data)
    for _ in cali_data:
        return cali_data
    raise ValueError("cali_data holds no batch: pass at least one input batch")


# -- the profiler ---------------------------------------------------------------------------
def profiling(model, cali_data, profiling_type="standalone", module_list=None, report_dir=None,
              num_worst=3):
    r"""Per-layer quantization error of a calibrated, prepared model.

    For every op of ``QUANT_MODULE_TYPE`` / ``QUANT_FUNCTION_TYPE`` in graph order, the op's
    weight fake quantizer and the fake quantizer right after it are switched on in a quantized
    copy; every batch of ``cali_data`` runs through it and through a float copy (all quantizers
    off), and the two outputs at that place are compared (Note [Profiling compares local
    outputs] in this module). ``model`` itself is not changed.

    Args:
        model: the ``GraphModule`` from ``prepare_by_platform``, calibrated (its qparams are
            used; observers are off during profiling). With ``module_list``, any module whose
            children named there are GraphModules.
        cali_data: an iterable of model inputs (``model(batch)`` per batch), walked once per
            layer: a list of tensors or a DataLoader yielding them.
        profiling_type: ``'standalone'`` (only this op quantized: its own error) or
            ``'interaction'`` (this op and every op before it quantized).
        module_list: names of GraphModule children to profile (the model was prepared per
            child); None profiles ``model``'s own graph.
        report_dir: a directory for an HTML report (``index.html`` plus PNGs, referenced by
            relative path), created when missing; None writes nothing.
        num_worst: how many of the lowest-SQNR layers get weight and activation histograms in
            the report.

    Returns:
        ProfilingResult: a list of :class:`LayerProfile` (op, name, nodes, cosine, sqnr_db,
        mse) in graph order. The table and the summary are also logged at CRITICAL level.

    Raises:
        ValueError: unknown ``profiling_type``, empty ``cali_data``, ``report_dir`` naming a
            file, negative ``num_worst``.
        TypeError: ``model`` is not a GraphModule (and no ``module_list``), or a name in
            ``module_list`` is not a GraphModule child.
    """
    check_arg(profiling, "model", model, lambda v: isinstance(v, nn.Module),
              "the prepared, calibrated GraphModule")
    check_arg(profiling, "cali_data", cali_data,
              lambda v: not isinstance(v, (str, bytes, dict)) and hasattr(v, "__iter__"),
              "an iterable of batches (a list or a DataLoader)")
    check_arg(profiling, "profiling_type", profiling_type, lambda v: isinstance(v, str),
              f"one of {', '.join(map(repr, PROFILING_TYPES))}")
    check_arg(profiling, "module_list", module_list,
              lambda v: v is None or (isinstance(v, (list, tuple))
                                      and all(isinstance(n, str) for n in v)),
              "a list of GraphModule child names or None")
    check_arg(profiling, "report_dir", report_dir,
              lambda v: v is None or isinstance(v, (str, os.PathLike)), "a directory path or None")
    if profiling_type not in PROFILING_TYPES:
        raise ValueError(f"profiling_type must be one of {', '.join(map(repr, PROFILING_TYPES))}, "
                         f"got {profiling_type!r}")
    if isinstance(num_worst, bool) or not isinstance(num_worst, int) or num_worst < 0:
        raise ValueError(f"num_worst must be an int >= 0, got {num_worst!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module (the GraphModule from prepare_by_platform), "
                        f"got {type(model).__name__}")
    if module_list is None and not isinstance(model, torch.fx.GraphModule):
        raise TypeError(f"model must be the torch.fx.GraphModule returned by prepare_by_platform, "
                        f"got {type(model).__name__}; for a model whose prepared parts are "
                        f"GraphModule children, pass their names as module_list")
    if module_list is not None:
        if isinstance(module_list, str) or not all(isinstance(m, str) for m in module_list):
            raise TypeError("module_list must be a list of child module names (str)")
        for mname in module_list:
            child = model.get_submodule(mname)
            if not isinstance(child, torch.fx.GraphModule):
                raise TypeError(f"module_list entry {mname!r} is a {type(child).__name__}, not a "
                                f"torch.fx.GraphModule: list the children prepare_by_platform "
                                f"returned")
    report_path = check_report_dir(report_dir)
    cali_data = _batches(cali_data)
    if any(m.training for m in model.modules()
           if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd))):
        warnings.warn("profiling a model in training mode: BatchNorm uses batch statistics and "
                      "dropout is random, so float and quantized runs differ by more than "
                      "quantization; call model.eval() first", UserWarning, stacklevel=2)

    # Two deep copies: fp_model (every quantizer off) and quant_model (switched per op).
    if module_list is None:
        fp_model, quant_model = deepcopy_graphmodule(model), deepcopy_graphmodule(model)
        pairs = [("", quant_model, fp_model)]
    else:
        fp_model = deepcopy_mixedmodule(model, module_list)
        quant_model = deepcopy_mixedmodule(model, module_list)
        pairs = [(f"{m}.", quant_model.get_submodule(m), fp_model.get_submodule(m))
                 for m in module_list]
    with _quiet_logger():
        disable_all(fp_model)
        disable_all(quant_model)
    used, plans = set(), []
    for prefix, q_gm, f_gm in pairs:
        plans += _plan_graph(prefix, q_gm, f_gm, used)

    device = model_device(quant_model)
    records = []
    try:
        from tqdm import tqdm
        bar = tqdm(plans, desc=f"profiling ({profiling_type})", leave=False, disable=None)
    except ImportError:  # pragma: no cover - tqdm is a dependency
        bar = plans
    with torch.no_grad():
        for plan in bar:
            with _quiet_logger():
                for m in plan.q_modules:
                    enable_quantization(m)
            meter = _ErrorMeter()
            for batch in cali_data:
                batch = to_device(batch, device)
                fp_out = _run_to_tap(fp_model, batch, plan.f_tap, plan.call_index)
                q_out = _run_to_tap(quant_model, batch, plan.q_tap, plan.call_index)
                meter.add(fp_out, q_out)
            records.append(meter.record(plan.op, plan.name, plan.nodes))
            if profiling_type == "standalone":
                with _quiet_logger():
                    for m in plan.q_modules:
                        disable_all(m)

    table = _format_table(records)
    summary = profile_summary(records)
    result = ProfilingResult(records, profiling_type, table, summary)
    if report_path is not None:
        result.report_path = write_report(report_path, result, plans, fp_model, cali_data,
                                          device, num_worst)
    logger.critical(f"Profile Type {profiling_type}\n{table}")
    logger.critical(summary + (f"\nreport: {result.report_path}" if result.report_path else ""))
    return result
