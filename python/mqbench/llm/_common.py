"""Shared parts of the LLM post-training algorithms (docs/llm.md): the weight scheme, the
round-to-nearest quantizer they all score with, finding the Linear layers, and running the
calibration data while hooks capture one layer's inputs (from cached block inputs where the model's
blocks form a chain: ``_blocks``)."""
import numbers
import warnings

import torch
from torch import nn

from mqbench.llm import _blocks, _graph_cache
from mqbench.scheme import QuantizeScheme
from mqbench.utils.logger import logger
from mqbench.utils.module_types import is_conv1d  # noqa: F401  (the algorithms' name)
from mqbench.utils.utils import model_device, to_device

try:
    from tqdm.auto import tqdm as _tqdm
except ImportError:  # tqdm is a dependency (design.md section 4); plain log lines without it
    _tqdm = None

# Weight-only integer widths the algorithms accept: below 2 bits there is no rounding choice left
# to optimize, above 8 the rounding error is below float noise of a calibration Hessian.
MIN_WBIT, MAX_WBIT = 2, 8
_EPS = torch.finfo(torch.float32).eps


class WeightQuant(object):
    """The integer weight grid the algorithms target: ``[quant_min, quant_max]``, symmetric or
    affine, per tensor / per output channel / per ``group_size`` input channels, with the qparams
    of a min/max observer (Note [Observer qparams] in src/ops/common/qparams.h), so that the
    weights they produce are the ones ``prepare_by_platform``'s MinMax weight observer then sees.
    """

    def __init__(self, scheme):
        self.quant_min = scheme["quant_min"]
        self.quant_max = scheme["quant_max"]
        self.symmetric = scheme["symmetric"]
        self.per_channel = scheme["per_channel"]
        self.group_size = scheme["group_size"]
        self.bit = scheme["bit"]

    def as_args(self):
        """The op arguments (quant_min, quant_max, symmetric, per_channel, group_size: 0 none)."""
        return (self.quant_min, self.quant_max, self.symmetric, self.per_channel,
                self.group_size or 0)

    def check_layer(self, name, weight):
        in_features = weight.shape[1]
        if self.group_size and in_features % self.group_size:
            raise ValueError(f"w_qscheme group_size ({self.group_size}) does not divide layer "
                             f"{name!r}'s {in_features} input channels")


def resolve_w_qscheme(w_qscheme, algorithm):
    """A ``QuantizeScheme`` or the dict form of ``extra_qconfig_dict['w_qscheme']`` -> the fields
    the algorithms use. Refuses up front what they cannot target."""
    if w_qscheme is None:
        raise ValueError(f"{algorithm}: w_qscheme is required, e.g. QuantizeScheme(bit=4, "
                         "per_channel=True, group_size=128) or {'bit': 4, 'per_channel': True, "
                         "'group_size': 128}")
    if isinstance(w_qscheme, dict):
        w_qscheme = QuantizeScheme(**w_qscheme)
    if not isinstance(w_qscheme, QuantizeScheme):
        raise TypeError(f"{algorithm}: w_qscheme must be a QuantizeScheme or a dict of its "
                        f"arguments, got {type(w_qscheme).__name__}")
    if w_qscheme.is_float:
        raise ValueError(f"{algorithm}: w_qscheme dtype {w_qscheme.dtype!r} is not supported yet "
                         "(integer weights only; FP8 / MX / NVFP4 targets are owed, docs/llm.md)")
    if not MIN_WBIT <= w_qscheme.bit <= MAX_WBIT:
        raise ValueError(f"{algorithm}: w_qscheme bit must be in [{MIN_WBIT}, {MAX_WBIT}] for "
                         f"weight-only integer quantization, got {w_qscheme.bit}")
    if w_qscheme.pot_scale:
        raise ValueError(f"{algorithm}: w_qscheme pot_scale=True is not supported (power-of-two "
                         "scales are not searched by this algorithm)")
    p = w_qscheme.to_observer_params()
    return WeightQuant({"quant_min": int(p["quant_min"]), "quant_max": int(p["quant_max"]),
                        "symmetric": w_qscheme.symmetry, "per_channel": w_qscheme.per_channel,
                        "group_size": w_qscheme.group_size, "bit": w_qscheme.bit})


def minmax_qparams(w_min, w_max, quant_min, quant_max, symmetric):
    """Observer qparams from per-row min / max (float32 tensors of one shape)."""
    mn = torch.clamp(w_min, max=0.0)
    mx = torch.clamp(w_max, min=0.0)
    if symmetric:
        scale = torch.clamp(torch.maximum(-mn, mx) / ((quant_max - quant_min) / 2.0), min=_EPS)
        zero_point = torch.zeros_like(scale)
    else:
        scale = torch.clamp((mx - mn) / float(quant_max - quant_min), min=_EPS)
        zero_point = torch.clamp(quant_min - torch.round(mn / scale), quant_min, quant_max)
    return scale, zero_point


def fake_quant(x, scale, zero_point, quant_min, quant_max):
    """torch's fake_quantize formula: (clamp(round(x * (1/s)) + z, qmin, qmax) - z) * s."""
    q = torch.clamp(torch.round(x * (1.0 / scale)) + zero_point, quant_min, quant_max)
    return (q - zero_point) * scale


def rtn_weight(weight, wq):
    """Round-to-nearest fake quantization of a [out, in] weight with its own min/max qparams.
    Returns (dequantized weight, scale, zero_point); scale is [out, in/group] for groups, [out, 1]
    per channel, [1, 1] per tensor."""
    w = weight.float()
    out_f, in_f = w.shape
    if wq.group_size:
        g = w.reshape(out_f, in_f // wq.group_size, wq.group_size)
    elif wq.per_channel:
        g = w.reshape(out_f, 1, in_f)
    else:
        g = w.reshape(1, 1, -1)
    scale, zp = minmax_qparams(g.amin(-1), g.amax(-1), wq.quant_min, wq.quant_max, wq.symmetric)
    q = fake_quant(g, scale.unsqueeze(-1), zp.unsqueeze(-1), wq.quant_min, wq.quant_max)
    return q.reshape(out_f, in_f).to(weight.dtype), scale, zp


def is_linear(mod):
    """An ``nn.Linear`` or a transformers ``Conv1D``: the layers the algorithms process."""
    return isinstance(mod, nn.Linear) or is_conv1d(mod)


def weight_2d(mod):
    """The layer's weight as [out, in] (Note [Conv1D weights]): the parameter itself for
    ``nn.Linear``, its transposed view for ``Conv1D``. A view: in-place edits (``copy_``,
    ``mul_``) under ``no_grad`` write the parameter in its own layout."""
    # Note [Conv1D weights]: every algorithm reads and writes weights as [out, in] through this
    # view, so a Conv1D is quantized per output channel / per group of input channels exactly as
    # the Linear computing the same function would be, and the result lands in Conv1D's layout.
    return mod.weight.t() if is_conv1d(mod) else mod.weight


def in_features(mod):
    return weight_2d(mod).shape[1]


def find_linears(model, layers=None, ignore=("lm_head",)):
    """[(qualified name, layer)] of ``model``'s ``nn.Linear`` and transformers ``Conv1D`` layers
    in module order. ``layers``: names to keep (all by default); ``ignore``: names (or their last
    component) left out, by default the output head ``lm_head`` as in every LLM toolkit (its
    rounding dominates the logits' error)."""
    found = []
    for name, mod in model.named_modules():
        if not is_linear(mod):
            continue
        if layers is not None and name not in layers:
            continue
        if name in ignore or name.rsplit(".", 1)[-1] in ignore:
            continue
        found.append((name, mod))
    if layers is not None:
        missing = sorted(set(layers) - {n for n, _ in found})
        if missing:
            raise ValueError("layers names modules that are not nn.Linear (or transformers "
                             f"Conv1D) of the model: {missing}")
    if not found:
        raise ValueError("the model has no nn.Linear (or transformers Conv1D) layer to process")
    offloaded = [name for name, mod in found if mod.weight.device.type == "meta"]
    if offloaded:
        raise ValueError(
            f"{len(offloaded)} of the layers to process have their weights on the meta device "
            f"(offloaded, e.g. by accelerate's device_map with 'cpu' or 'disk'), first "
            f"{offloaded[0]!r}: the algorithms read and write every weight in memory; load the "
            "model onto one device (model.to(device)) first")
    return found


def input_device(model):
    """The device the model's inputs belong on: its input embedding's (``get_input_embeddings``)
    or ``model_device``'s. None where accelerate's hooks move the inputs (a model dispatched by
    ``device_map``: ``_hf_hook``) or that device is meta (offloaded)."""
    if hasattr(model, "_hf_hook"):
        return None
    weight = None
    embeddings = getattr(model, "get_input_embeddings", None)
    if callable(embeddings):
        try:
            weight = getattr(embeddings(), "weight", None)
        except (NotImplementedError, AttributeError):
            weight = None
    device = weight.device if isinstance(weight, torch.Tensor) else model_device(model)
    return None if device.type == "meta" else device


def run_model(model, sample):
    """Calls the model on one calibration item: a tensor, a tuple/list of positional inputs or a
    dict of keyword inputs (what a tokenizer returns)."""
    if isinstance(sample, dict) or hasattr(sample, "keys"):
        return model(**sample)
    if isinstance(sample, (tuple, list)):
        return model(*sample)
    return model(sample)


_StopForward = _blocks.StopForward


class CallRecorder(object):
    """Pre-hooks on ``linears`` that record, per calibration item, each layer's number of calls and
    the name of the layer called just before it on the very same input tensor, unchanged in place
    since (else None): ``counts`` and ``same_input`` of ``check_calibration``."""

    def __init__(self, linears, n_items):
        self.linears = linears
        self.counts = {name: [0] * n_items for name, _ in linears}
        self.same_input = {name: [None] * n_items for name, _ in linears}
        self._item = 0
        self._handles = []
        self._last = (None, None, 0)  # the previous call's layer, input (one reference: no id
        # reuse) and the input's version counter (an in-place change makes it another input)

    def _hook(self, name, inp):
        i = self._item
        self.counts[name][i] += 1
        x = inp[0] if inp and isinstance(inp[0], torch.Tensor) else None
        same = x is not None and x is self._last[1] and x._version == self._last[2]
        self.same_input[name][i] = self._last[0] if same else None
        self._last = (name, x, x._version if x is not None else 0)

    def install(self):
        for name, mod in self.linears:
            self._handles.append(mod.register_forward_pre_hook(
                lambda _m, inp, name=name: self._hook(name, inp)))

    def begin_item(self, i):
        self._item = i
        self._last = (None, None, 0)

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        self._last = (None, None, 0)


def _decides(counts, i, watch):
    """Whether counted item i can stand for the items of its kind (Note [Counting pass on one
    item of each kind]): the blocks form a chain on it and it calls every layer exactly once."""
    return watch is not None and watch.ok and all(c[i] == 1 for c in counts.values())


def input_kind(obj, depth=0):
    """What an item's model inputs look like, without their values: the structure, each tensor's
    shape and dtype, whether an integer tensor is all ones (an attention mask without padding),
    and plain values (``use_cache=True``). Items of one kind get the same masks and block
    arguments from a transformers model (Note [Counting pass on one item of each kind])."""
    if isinstance(obj, torch.Tensor):
        ones = not obj.is_floating_point() and not obj.is_complex() and obj.numel() > 0 and \
            bool((obj == 1).all())
        return ("tensor", tuple(obj.shape), obj.dtype, ones)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return ("value", obj)
    if depth < _blocks.MAX_DEPTH:
        if isinstance(obj, dict) or hasattr(obj, "keys"):
            return ("dict", tuple((k, input_kind(obj[k], depth + 1)) for k in obj.keys()))
        if isinstance(obj, (tuple, list)):
            return ("list", tuple(input_kind(v, depth + 1) for v in obj))
    return ("object", type(obj).__name__)


# Note [Counting pass on one item of each kind]
# The counting pass runs the whole model on every item: about a third of GPTQ's forward work on
# a decoder whose captures run from cached block inputs (docs/design/0027). Where the blocks
# form a chain, the pass first runs one item of each kind (``input_kind``: the same input
# shapes and dtypes, the same padding-free masks and plain arguments): for a dense model the
# calls per layer, the shared inputs and the block arguments are what the code makes of inputs
# of that kind. If each of those items keeps the chain and calls every layer exactly once, no
# layer is unreached, and the other items are given their kind's counts and shared inputs.
# Otherwise (a dead branch, a mixture of experts, a layer called twice, sliding-window layers
# whose masks differ from the full ones only for longer items) every item is counted, as
# before. The block cache checks the prediction on every item each time it moves past a block
# (``PathCheck``) and warns, naming the layers, where an item took another path that can have
# made a statistic wrong; the last block and the layers outside the blocks are not checked.


def counting_pass(model, linears, calib_data, watch=None, by_kind=False):
    """``check_calibration``'s pass; with ``by_kind``, on one item of each kind where those
    items decide the others' (Note [Counting pass on one item of each kind]). Returns (calib,
    counts, dead, same_input, predicted): predicted says whether some items' counts and shared
    inputs are their kind's rather than counted."""
    calib = list(calib_data)
    if not calib:
        raise ValueError("calib_data is empty: give at least one model input")
    device = input_device(model)
    if device is not None:  # a tokenizer's CPU tensors for a model on a GPU
        calib = [to_device(item, device) for item in calib]
    rec = CallRecorder(linears, len(calib))
    kinds = [input_kind(item) for item in calib] if by_kind and len(calib) > 1 else None
    first = {}  # kind -> the index of its first item
    if kinds is not None:
        for i, kind in enumerate(kinds):
            first.setdefault(kind, i)
    rec.install()
    if watch is not None:
        watch.install()

    def count(i):
        rec.begin_item(i)
        if watch is not None:
            watch.begin_item()
        run_model(model, calib[i])
        if watch is not None:
            watch.end_item()

    predicted = False
    try:
        with torch.no_grad():
            counted = sorted(first.values()) if kinds is not None else []
            for i in counted:
                count(i)
            if counted and len(counted) < len(calib) and \
                    all(_decides(rec.counts, i, watch) for i in counted):
                predicted = True
                for i, kind in enumerate(kinds):
                    j = first[kind]
                    for name in rec.counts:
                        rec.counts[name][i] = rec.counts[name][j]
                        rec.same_input[name][i] = rec.same_input[name][j]
            else:  # every item counted (those already counted are not run again)
                done = set(counted)
                for i in range(len(calib)):
                    if i not in done:
                        count(i)
    finally:
        rec.remove()
        if watch is not None:
            watch.remove()
    dead = [name for name, c in rec.counts.items() if sum(c) == 0]
    return calib, rec.counts, dead, rec.same_input, predicted


def check_calibration(model, linears, calib_data, watch=None):
    """One forward of every calibration item with counting hooks: names the layers the data never
    reaches (a dead branch) and returns, per layer, its number of calls per item (a shared layer
    is called more than once), so that later passes can stop after that layer; and, per layer,
    per item, the name of the layer called just before it on the very same input tensor (q, k
    and v of an attention block; gate and up of an MLP), else None (``shared_input_groups``).
    ``watch`` (a ``_blocks.ChainWatch``) sees the same pass with its own hooks."""
    return counting_pass(model, linears, calib_data, watch)[:4]


class PathCheck(object):
    """Checks, while the block cache runs a block over every item, that each item calls the
    block's layers as predicted (Note [Counting pass on one item of each kind]); warns once per
    block, naming the layers whose statistics the difference may have made wrong."""

    def __init__(self, linears, counts, same_input, algorithm):
        self._linears, self._algorithm = linears, algorithm
        self._counts, self._same = counts, same_input

    def _missed(self, name, rec, names):
        """Whether the prediction can have cost the layer data: a call a capture stopped before
        (more than one), or a shared input (a group's one statistic) that an item did not give
        it, or gave it where its group's leader got none. An item that skips a layer, or a whole
        group, costs nothing: the capture runs on and sees what it gets."""
        counts, same = rec.counts[name], rec.same_input[name]
        if any(c > 1 for c in counts):
            return True
        for i, c in enumerate(counts):
            pred = self._same[name][i]
            if pred is None or pred not in names:
                continue
            if c != rec.counts[pred][i] or (c == 1 and same[i] != pred):
                return True
        return False

    def run(self, block_name, names, n_items, run_item):
        """Runs ``run_item(i)`` for every item with the named layers recorded."""
        linears = [(n, m) for n, m in self._linears if n in names]
        rec = CallRecorder(linears, n_items)
        rec.install()
        try:
            for i in range(n_items):
                rec.begin_item(i)
                run_item(i)
        finally:
            rec.remove()
        names = {n for n, _ in linears}
        off = sorted(n for n in names if self._missed(n, rec, names))
        if off:
            warnings.warn(
                f"{self._algorithm}: in block {block_name}, calibration items called layer(s) "
                f"{off} otherwise than the first item of their kind did (calls per item, or the "
                "input shared with the layer before). The counting pass ran on one item of each "
                "kind, so their statistics may have missed calls or taken another layer's "
                "inputs: pass cache_blocks=False to count every item (docs/llm.md)")


def shared_input_groups(linears, counts, same_input):
    """Splits ``linears`` (in processing order) into runs of consecutive layers that are called
    once per item, in the same items, each on the very input tensor of the layer before it. A
    run's layers see one input, which quantizing any of them does not change: one capture and
    one input statistic (GPTQ's Hessian) serve them all, with the result of processing them one
    by one."""
    groups = []
    for name, mod in linears:
        if groups:
            prev = groups[-1][-1][0]
            c, p = counts[name], counts[prev]
            if all(a == b and a <= 1 for a, b in zip(c, p)) and all(
                    same_input[name][i] == prev for i in range(len(c)) if c[i]):
                groups[-1].append((name, mod))
                continue
        groups.append([(name, mod)])
    return groups


def handle_dead(dead, skip_unreached, algorithm):
    if not dead:
        return
    if skip_unreached:
        warnings.warn(f"{algorithm}: calibration data never reached {dead}; these layers keep "
                      "their float weights (skip_unreached=True)")
    else:
        raise ValueError(f"{algorithm}: calibration data never reached layer(s) {dead} (a dead "
                         "branch for these inputs); give data that reaches them, leave them out "
                         "with layers=/ignore=, or pass skip_unreached=True to keep them float")


class Calibration(object):
    """What ``select_and_calibrate`` found: ``linears`` (the layers to process), ``calib`` (the
    items, as a list), ``counts`` / ``dead`` / ``same_input`` (``check_calibration``), the
    model's blocks (``_blocks.find_blocks``; ``block_index``: module name -> block) and the block
    cache when they form a chain (``_blocks``; None otherwise or with ``cache_blocks=False``)."""

    def __init__(self, model, linears, calib, counts, dead, same_input, blocks, index, cache):
        self.model, self.linears, self.calib = model, linears, calib
        self.counts, self.dead, self.same_input = counts, dead, same_input
        self.blocks, self.block_index = blocks, index
        self.cache = cache

    @property
    def live(self):
        return [(n, m) for n, m in self.linears if n not in self.dead]

    def groups(self, linears):
        return shared_input_groups(linears, self.counts, self.same_input)

    def block_of(self, names):
        """The index of the block holding all the named modules, else None."""
        return _blocks.block_of(self.block_index, names)

    def capture(self, modules, fn, record=None, replay=None):
        """``capture`` of ``modules``: when they are all in one block of the chain, only that
        block runs, on its cached inputs; else the model runs from its input. ``record``: a
        ``scope_between`` recorder, filled during this capture; ``replay``: the previous
        capture's, whose module runs alone where its inputs cover this capture's items (Note
        [Captures from a sub-module's inputs] in ``_blocks``)."""
        b = self.cache.block_of([n for n, _ in modules]) if self.cache is not None else None
        run = self.cache.run_in(b, [n for n, _ in modules]) if b is not None else None
        fallback = None
        if run is not None and replay is not None:
            items = [i for i in range(len(self.calib))
                     if any(self.counts[n][i] for n, _ in modules)]
            if replay.usable(items):
                run, fallback = replay.run, run
        capture(self.model, self.calib, self.counts, modules, fn, run, record, fallback)

    def record_block_io(self, name, module, n_calls):
        """``record_block_io`` of module ``name``: where it lies in one block of the chain (the
        block itself or a module inside it), only that block runs, on its cached inputs (the
        same tensors as a forward from the model's input); else the model runs from its
        input. [] for a graph's bare module (never called)."""
        if type(module) is nn.Module:
            return []
        b = self.cache.block_of([name]) if self.cache is not None else None
        run = self.cache.run_in(b) if b is not None else None
        return record_block_io(self.model, self.calib, n_calls, module, run)

    def scope_between(self, step, following):
        """A ``_blocks.ScopeInputs`` recorder of the deepest module holding the layers of both
        steps (lists of [(name, module)]) where it lies strictly inside one block of the cache,
        else None."""
        if self.cache is None or not step or not following:
            return None
        names = [n for n, _ in step] + [n for n, _ in following]
        b = self.cache.block_of(names)
        if b is None:
            return None
        scope = common_module(names)
        bname, block = self.cache.blocks[b]
        if not scope.startswith(bname + "."):
            return None
        module = self.model.get_submodule(scope)
        if type(module) is nn.Module:  # a prepared graph's bare module: never called
            return None
        # a weight of the step shared with a module of the block outside the scope could change
        # the scope's inputs once quantized
        mine = {id(p) for _, m in step for p in m.parameters()}
        inside = {id(m) for m in module.modules()}
        if any(id(p) in mine for m in block.modules() if id(m) not in inside
               for p in m.parameters(recurse=False)):
            return None
        return _blocks.ScopeInputs(scope, module, list(step))


def common_module(names):
    """The qualified name of the deepest module holding all the named modules ("" the model)."""
    common = []
    for level in zip(*(n.split(".")[:-1] for n in names)):
        if any(p != level[0] for p in level):
            break
        common.append(level[0])
    return ".".join(common)


def select_and_calibrate(model, layers, ignore, calib_data, skip_unreached, algorithm, wq=None,
                         cache_blocks=True):
    """The first steps every algorithm takes: the Linear layers to process (``find_linears``), each
    checked against the weight scheme ``wq`` when given, and one counting pass of the calibration
    data (``check_calibration``), whose unreached layers raise or are skipped (``handle_dead``);
    the same pass checks whether the model's blocks form a chain (``_blocks.ChainWatch``), for
    captures from cached block inputs (``cache_blocks``). With the cache, the pass runs one item
    of each kind where those decide the others' paths (Note [Counting pass on one item of each
    kind]). Returns a ``Calibration``."""
    linears = find_linears(model, layers, ignore)
    if wq is not None:
        for name, mod in linears:
            wq.check_layer(name, weight_2d(mod))
    blocks = _blocks.find_blocks(model, [n for n, _ in linears])
    # a prepared graph calls no block: its blocks' stretches of nodes are cached instead
    graph = cache_blocks and _graph_cache.uncalled_blocks(model, blocks)
    watch = _blocks.ChainWatch(blocks) if cache_blocks and blocks and not graph else None
    if graph:
        watch = _graph_cache.StaticWatch(model, [n for n, _ in linears])
    calib, counts, dead, same_input, predicted = counting_pass(model, linears, calib_data, watch,
                                                               by_kind=watch is not None)
    handle_dead(dead, skip_unreached, algorithm)
    index = _blocks.block_index(blocks)
    cache = None
    if graph:
        cache = _graph_cache.GraphBlockCache.build(model, calib, blocks, index, run_model)
    elif watch is not None and watch.ok:
        check = PathCheck(linears, counts, same_input, algorithm) if predicted else None
        cache = _blocks.BlockCache(model, calib, blocks, index, run_model, check)
    return Calibration(model, linears, calib, counts, dead, same_input, blocks, index, cache)


def run_stopped(model, run, i, sample):
    """Runs calibration item i (``run(i, sample)``, or the model on it when ``run`` is None);
    True when a hook stopped the forward (``_StopForward``)."""
    try:
        if run is None:
            run_model(model, sample)
        else:
            run(i, sample)
    except _StopForward:
        return True
    return False


def capture(model, calib, counts, modules, fn, run=None, record=None, fallback=None):
    """Runs the calibration items; for each call of each module in ``modules`` (a list of
    (name, module)) calls ``fn(name, input_2d)`` with the layer input flattened to
    [tokens, in_features]. Stops each forward after the last call of the last watched layer.
    ``run(i, item)`` runs item i (default: the model on it; ``BlockCache.run_in``: one block).
    ``record``: a ``_blocks.ScopeInputs`` filled on the way (its hooks go first).
    ``fallback(i, item)``: where ``run`` replays a sub-module (Note [Captures from a
    sub-module's inputs] in ``_blocks``), an item whose replay did not make all the item's calls
    of ``modules`` runs again with it; the replay's inputs reach ``fn`` only once the item is
    complete, each unchanged in place since its call (else the item runs again too)."""
    seen = {}
    handles = []
    item = [0]
    held = []  # the current item's inputs while a replay runs, else None

    def make(name):
        def hook(_m, args, kwargs):
            x = args[0] if args else next(iter(kwargs.values()))
            x = x.detach().reshape(-1, x.shape[-1])
            if held[0] is None:
                fn(name, x)
            else:
                held[0].append((name, x, x._version))
            seen[name] += 1
            if all(seen[n] >= counts[n][item[0]] for n, _ in modules):
                raise _StopForward
        return hook

    def run_item(i, sample, how, hold):
        for n, _ in modules:
            seen[n] = 0
        held[:] = [[] if hold else None]
        return run_stopped(model, how, i, sample)

    try:
        if record is not None:
            record.install()
        for name, mod in modules:
            handles.append(mod.register_forward_pre_hook(make(name), with_kwargs=True))
        with torch.no_grad():
            for i, sample in enumerate(calib):
                item[0] = i
                if all(counts[n][i] == 0 for n, _ in modules):
                    continue
                if record is not None:
                    record.begin_item(i)
                if fallback is None:
                    run_item(i, sample, run, False)
                elif run_item(i, sample, run, True) and \
                        all(x._version == v for _, x, v in held[0]):
                    for name, x, _ in held[0]:
                        fn(name, x)
                else:  # the replay missed calls (or changed an input it gave): the block runs
                    logger.info("llm: on calibration item %d the sub-module run alone missed "
                                "calls of %s; the item runs its block", i, [n for n, _ in modules])
                    run_item(i, sample, fallback, False)
    finally:
        for h in handles:
            h.remove()
        if record is not None:
            record.remove()


def _detached(v):
    if isinstance(v, torch.Tensor):
        return v.detach()
    if isinstance(v, tuple):
        return tuple(_detached(a) for a in v)
    return v


def record_block_io(model, calib, n_calls, block, run=None):
    """[((args, kwargs), float output: its first tensor, None if none)] of every call of module
    ``block`` as the model runs the calibration items (``calib``, a list), each forward stopped
    after the block's ``n_calls[i]``-th call on item i (the calls of a Linear it holds:
    ``Calibration.counts``). ``run(i, item)`` runs item i (default: the model on it;
    ``Calibration.record_block_io``: one block of the chain on its cached inputs).
    The searches that score candidates on a block's output (AWQ's and SmoothQuant's
    ``objective="block"``) run the block again on these inputs. A KV cache among the keyword
    arguments is dropped (never updated twice)."""
    recs, cur, item, calls = [], {}, [0], [0]

    def pre(_m, args, kwargs):
        kw = _blocks.without_kv_cache(kwargs)
        cur["in"] = (_detached(tuple(args)), {k: _detached(v) for k, v in kw.items()})

    def post(_m, _args, _kwargs, output):
        out = _blocks.first_tensor(output)  # None when the output holds no tensor
        recs.append((cur["in"], None if out is None else out.detach().float()))
        calls[0] += 1
        if calls[0] >= n_calls[item[0]]:
            raise _StopForward

    h1 = block.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = block.register_forward_hook(post, with_kwargs=True)
    try:
        with torch.no_grad():
            for i, sample in enumerate(calib):
                item[0], calls[0] = i, 0
                if n_calls[i] == 0:
                    continue
                run_stopped(model, run, i, sample)
    finally:
        h1.remove()
        h2.remove()
    return recs


def progress(items, desc):
    """tqdm over ``items`` (one step per layer), or one log line per step without tqdm."""
    if _tqdm is not None:
        return _tqdm(items, desc=desc, unit="layer", leave=False)

    def gen():
        for i, it in enumerate(items):
            logger.info("%s: %d/%d", desc, i + 1, len(items))
            yield it
    return gen()


def want_cpp(impl, op="gptq_quantize_weight"):
    """impl 'auto' -> the C++ ops when the extension has them (``op``: the one looked for);
    'cpp' requires them; 'python' runs the reference implementation (the test oracle)."""
    if impl not in ("auto", "cpp", "python"):
        raise ValueError(f"impl must be 'auto', 'cpp' or 'python', got {impl!r}")
    if impl == "python":
        return False
    has = hasattr(torch.ops, "mqbench") and hasattr(torch.ops.mqbench, op)
    if impl == "cpp" and not has:
        raise RuntimeError(f"impl='cpp' but this build of mqbench has no LLM ops "
                           f"(torch.ops.mqbench.{op}); rebuild it")
    return has


def check_positive_int(value, name, algorithm):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{algorithm}: {name} must be a positive integer, got {value!r}")
    return int(value)
