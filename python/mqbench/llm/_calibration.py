"""Running the calibration data through a model for the LLM algorithms: the counting pass
(which layers each item reaches, how often, which layers read the same input), the
``Calibration`` that the algorithms drive, and the captures of one layer's inputs or one block's
inputs and outputs (from cached block inputs where the model's blocks form a chain:
``_blocks``, ``_graph_cache``)."""
import collections.abc
import warnings

import torch
from torch import nn

from mqbench.llm import _blocks, _experts, _graph_cache
from mqbench.llm._layers import common_module, find_linears, weight_2d
from mqbench.utils.logger import logger
from mqbench.utils.utils import model_device, to_device

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
# a decoder whose captures run from cached block inputs (docs/design/llm.md). Where the blocks
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


def _off_device(item, device, depth=0):
    """Whether a tensor of ``item`` (in mappings, tuples and lists, to ``to_device``'s 32
    levels) is not on ``device``."""
    if isinstance(item, torch.Tensor):
        return item.device != device
    if depth >= 32:
        return False
    if isinstance(item, collections.abc.Mapping):
        item = list(item.values())
    if isinstance(item, (tuple, list)):
        return any(_off_device(v, device, depth + 1) for v in item)
    return False


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
        # items already there are kept as they are (a mapping that reads its tensors when
        # asked, quantize_checkpoint's rows, is not made a dict of all of them)
        calib = [to_device(item, device) if _off_device(item, device) else item
                 for item in calib]
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


class WholeBlock(_blocks.QuietWatch):
    """The counting pass's watch for a model that is one block of a chain (``quantize_checkpoint``
    runs a decoder block alone): trivially a chain, so one item of each kind decides the others'
    counts where it calls every layer once (a dense block; an MoE block's items are all
    counted)."""
    ok = True


def select_and_calibrate(model, layers, ignore, calib_data, skip_unreached, algorithm, wq=None,
                         cache_blocks=True, one_block=False):
    """The first steps every algorithm takes: the Linear layers to process (``find_linears``), each
    checked against the weight scheme ``wq`` when given, and one counting pass of the calibration
    data (``check_calibration``), whose unreached layers raise or are skipped (``handle_dead``);
    the same pass checks whether the model's blocks form a chain (``_blocks.ChainWatch``), for
    captures from cached block inputs (``cache_blocks``). With the cache, the pass runs one item
    of each kind where those decide the others' paths (Note [Counting pass on one item of each
    kind]), as it does for ``one_block`` (the model is one block: ``WholeBlock``). Returns a
    ``Calibration``."""
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
    if one_block and not blocks:
        watch = WholeBlock()
    # experts: which ones an item reaches depends on its values, not on its kind
    routed = any(isinstance(m, _experts.SplitExperts) for m in model.modules())
    calib, counts, dead, same_input, predicted = counting_pass(
        model, linears, calib_data, watch, by_kind=watch is not None and not routed)
    handle_dead(dead, skip_unreached, algorithm)
    index = _blocks.block_index(blocks)
    cache = None
    if graph:
        cache = _graph_cache.GraphBlockCache.build(model, calib, blocks, index, run_model)
    elif watch is not None and watch.ok and blocks:
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
