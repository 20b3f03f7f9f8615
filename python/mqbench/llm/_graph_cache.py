"""The block cache on a prepared graph (docs/design/llm.md).

A model ``prepare_by_platform`` captured with torch.export calls no block module: its
``model.layers.3`` is a bare module holding what the graph reads, and that decoder layer's
operations are a stretch of the graph's nodes. Without a cache every capture ran the model from
its input (the captures grew with the square of the depth). ``GraphBlockCache`` is
``_blocks.BlockCache`` for such a graph:

* **Stretches.** Block b's stretch starts at the first node whose ``nn_module_stack`` (the
  module path torch.export records on each node) lies in block b. The stretches must come in
  the blocks' order without interleaving, and each of a block's Linear calls must lie in its own
  stretch; else there is no cache.
* **Cached values.** Per calibration item, the values live where block k's stretch starts: each
  node before it that a node from there on reads (the residual stream, the attention mask, the
  rotary tables). A graph attribute (a norm's weight) is read again from the model whenever a
  run starts, never cached.
* **Runs.** A capture runs the graph's nodes from block b's start, one by one, each freed after
  its last reader (``torch.fx.Interpreter``'s rules: a Linear is called as the module, so the
  capture's hooks stop the run as in a forward). The cache moves on by running block k's stretch
  over its items. The nodes are the graph's own, in its order, so every layer sees the tensors a
  forward from the input gives, bit for bit; before the cache is used, the first item run this
  way through every cut must give the forward's outputs exactly.
* **Marks inside a block** (GPTQ's and AWQ's later steps in a block): Note [Marks inside a
  block].
* **Counting.** A graph has no control flow: where it calls every layer itself, one item of
  each kind is counted (``StaticWatch``).
* **Staleness.** Every tensor a node before the cut reads (the parameters and buffers of the
  modules it calls, the attributes it reads) has its version counter kept; if one moved, the
  values are recorded again from the model's input, as ``BlockCache`` does. Fake quantizers
  are left out: the algorithms run with all of them off (``_prepared``). The cached tensors'
  own version counters are kept too, and a graph with an op that changes a tensor in place
  (``aten.add_``, an ``inplace`` module) gets no cache: it could write into a cached value.
"""
import inspect

import torch
from torch import nn

from mqbench._base import is_fake_quantizer
from mqbench.llm import _blocks
from mqbench.utils.logger import logger

__all__ = ["GraphBlockCache", "StaticWatch", "uncalled_blocks"]


def _called(gm):
    """The names of the modules ``gm``'s graph calls."""
    return {n.target for n in gm.graph.nodes if n.op == "call_module"}


def uncalled_blocks(model, blocks):
    """True when ``model`` is a GraphModule that calls none of ``blocks`` (bare modules holding
    what its graph reads): the blocks' stretches of its graph can be cached instead."""
    if not isinstance(model, torch.fx.GraphModule) or not blocks:
        return False
    called = _called(model)
    return all(type(block) is nn.Module and name not in called for name, block in blocks)


_INPLACE_OPERATORS = {"iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand",
                      "ior", "ixor", "ilshift", "irshift", "imatmul"}


def _mutates(node, mods):
    """Whether ``node`` may change one of its inputs in place (an aten op whose schema says so,
    a method or function named like ``add_``, an ``inplace`` module, ``x += y``)."""
    if node.kwargs.get("inplace") is True:  # F.relu(x, inplace=True)
        return True
    if node.op == "call_function":
        schema = getattr(node.target, "_schema", None)
        if schema is not None:
            return bool(schema.is_mutable)
        name = getattr(node.target, "__name__", "")
        return name in _INPLACE_OPERATORS or (name.endswith("_") and not name.startswith("_"))
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.startswith("_")
    if node.op == "call_module":
        return bool(getattr(mods.get(node.target), "inplace", False))
    return False


def _unchanged(kept):
    """Whether no cached tensor of ``kept`` (``GraphBlockCache._keep``) changed in place."""
    return all(t._version == v for t, v in kept[1])


class StaticWatch(_blocks.QuietWatch):
    """The counting pass's watch (``_blocks.ChainWatch``'s place) on a GraphModule whose graph
    calls each of the layers itself: a graph has no control flow, so every item makes the calls
    of its first item, and one item of each kind is counted (Note [Counting pass on one item of
    each kind] in ``_calibration``). ``ok`` is False where a layer runs inside a module the graph
    calls (that module may call it differently per item)."""

    def __init__(self, gm, names):
        called = _called(gm)
        self.ok = all(name in called for name in names)



def _stack_paths(node):
    stack = node.meta.get("nn_module_stack") or {}
    for value in stack.values():
        if isinstance(value, tuple) and value and isinstance(value[0], str):
            yield value[0]


def _block_of_path(path, prefixes):
    """The block whose name is ``path`` or a prefix of it (``prefixes``: name -> index)."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        b = prefixes.get(".".join(parts[:n]))
        if b is not None:
            return b
    return None


def _cuts(gm, blocks, index):
    """[node position where block b's stretch starts] (module docstring), or None."""
    prefixes = {name: b for b, (name, _) in enumerate(blocks)}
    first, last = {}, {}
    for i, node in enumerate(gm.graph.nodes):
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        found = {_block_of_path(p, prefixes) for p in _stack_paths(node)} - {None}
        if node.op == "call_module" and node.target in index:
            found.add(index[node.target])
        if len(found) > 1:
            return None
        for b in found:
            first.setdefault(b, i)
            last[b] = i
    if len(first) != len(blocks):
        return None
    cuts = [first[b] for b in range(len(blocks))]
    for b in range(len(blocks) - 1):
        if last[b] >= cuts[b + 1]:
            return None  # stretches out of order or interleaved
    return cuts


def _marks(nodes, blocks, cuts):
    """Per block: the positions inside its stretch where one of its direct children (a Llama
    layer's self_attn, post_attention_layernorm, mlp) first runs, after the block's start."""
    marks = []
    for b, (bname, _) in enumerate(blocks):
        depth = len(bname.split("."))
        stop = cuts[b + 1] if b + 1 < len(cuts) else len(nodes)
        seen, found = set(), []
        for i in range(cuts[b], stop):
            for path in _stack_paths(nodes[i]):
                parts = path.split(".")
                if len(parts) > depth and ".".join(parts[:depth]) == bname:
                    child = parts[depth]
                    if child not in seen:
                        seen.add(child)
                        if i > cuts[b]:  # the block's start is its own cut
                            found.append(i)
        marks.append(sorted(set(found)))
    return marks


def _bind(gm, sample):
    """The values of the graph's placeholders for one calibration item."""
    sig = inspect.signature(gm.forward)
    if isinstance(sample, dict) or hasattr(sample, "keys"):
        bound = sig.bind(**dict(sample))
    elif isinstance(sample, (tuple, list)):
        bound = sig.bind(*sample)
    else:
        bound = sig.bind(sample)
    if bound.kwargs:
        raise TypeError("keyword-only inputs")
    flat = gm.graph._codegen.process_inputs(*bound.args)
    holders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(flat) != len(holders):
        raise TypeError(f"{len(flat)} inputs for {len(holders)} placeholders")
    return dict(zip(holders, flat))


# Note [Marks inside a block]
# The block cache's counterpart of ``_blocks.ScopeInputs``. A block's later steps (GPTQ's
# o_proj, gate/up_proj, down_proj; AWQ's groups and clips) would each run the block from its
# start. Any node position is a valid place to start a run from, given the values live there
# and a check that nothing before it changed: so while a capture runs item i through the block,
# the values live at the block's marks (where each of its direct children first runs: a Llama
# layer's self_attn, post_attention_layernorm and mlp) are kept for item i, with the version
# counters of what the nodes before the mark read. A later capture starts each item from the
# latest mark at or before its first watched layer whose versions are unchanged (down_proj from
# the MLP's start, once gate/up_proj are quantized: the attention is not run again), else from
# the block's start. The marks of one block are kept, one set of live values per mark and item
# (a Llama layer: three sets of hidden states); they go when the cache moves to another block.
class GraphBlockCache(object):
    """``_blocks.BlockCache`` for a GraphModule that calls none of its blocks (module docstring):
    ``block_of(names)``, ``run_in(b)``, ``blocks``. ``build`` returns None where the graph does
    not allow it."""

    def __init__(self, gm, calib, blocks, index, cuts):
        self.model, self.calib, self.blocks = gm, calib, blocks
        self._index = index
        self._nodes = list(gm.graph.nodes)
        self._cuts = cuts
        self._pos = {node: i for i, node in enumerate(self._nodes)}
        self._calls = {}  # module name -> position of its first call
        self._last_use = {}
        for i, node in enumerate(self._nodes):
            if node.op == "call_module":
                self._calls.setdefault(node.target, i)
            for inp in node.all_input_nodes:
                self._last_use[inp] = max(self._last_use.get(inp, -1), i)
        # Nodes computed from graph attributes alone (a weight, a fake quantizer on it, a
        # constant): computed again when a run starts, never cached (module docstring).
        self._derived = {}  # node -> the derived nodes it is computed from (itself included)
        for node in self._nodes:
            inputs = node.all_input_nodes
            if node.op == "get_attr" or (node.op.startswith("call_") and
                                         all(i in self._derived for i in inputs)):
                self._derived[node] = {node}.union(*(self._derived[i] for i in inputs))
        self._marks_at = _marks(self._nodes, blocks, cuts)
        self._at = {}  # position -> (live nodes not derived, derived to compute, reads)
        self._interp = torch.fx.Interpreter(gm, garbage_collect_values=False)
        self._mods = dict(gm.named_modules())
        self._k = None       # the block whose start values are cached
        self._items = None   # per item: {node: value} of the live nodes not derived
        self._versions = None
        self._marks = {}     # position -> (versions, {item: values}) inside block k
        self._mark_set = set()
        self._mark_versions = {}

    def _cut_info(self, pos):
        """(live nodes not derived, derived nodes to compute again, (modules, attributes) the
        nodes before ``pos`` computed from) of a cut at node position ``pos``."""
        if pos not in self._at:
            derived = self._derived
            live = [n for n in self._nodes[:pos] if self._last_use.get(n, -1) >= pos]
            again = set().union(*(derived[n] for n in live if n in derived))
            modules, attrs = set(), set()
            for node in self._nodes[:pos]:
                if node in derived:
                    continue
                sources = [node] + [d for i in node.all_input_nodes if i in derived
                                    for d in derived[i]]
                for src in sources:
                    if src.op == "get_attr":
                        attrs.add(src.target)
                    # a fake quantizer is off while the algorithms run: what it holds does not
                    # change what it computes
                    elif src.op == "call_module" and not is_fake_quantizer(self._mods[src.target]):
                        modules.add(src.target)
            self._at[pos] = ([n for n in live if n not in derived],
                             sorted(again, key=self._pos.get), (sorted(modules), sorted(attrs)))
        return self._at[pos]

    @classmethod
    def build(cls, gm, calib, blocks, index, run_model):
        cuts = _cuts(gm, blocks, index)
        if cuts is None:
            logger.info("llm: the prepared graph's blocks are not contiguous stretches in order; "
                        "each capture runs it from its input")
            return None
        cache = cls(gm, calib, blocks, index, cuts)
        mutating = [n.name for n in cache._nodes if _mutates(n, cache._mods)]
        if mutating:  # it could write into a cached value
            logger.info("llm: the prepared graph changes tensors in place (%s); each capture runs "
                        "it from its input", mutating[:3])
            return None
        try:  # item 0 run node by node through every cut must give the forward's outputs
            with torch.no_grad():
                env = _bind(gm, calib[0])
                cache._run(env, 0, cuts[0])
                for k in range(len(cuts)):
                    env = cache._start_env(cuts[k], cache._keep(cuts[k], env))
                    out = cache._run(env, cuts[k], cuts[k + 1] if k + 1 < len(cuts)
                                     else len(cache._nodes))
                ref = run_model(gm, calib[0])
            got, want = _blocks._tensors(out), _blocks._tensors(ref)
            same = len(got) == len(want) and all(
                a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, want))
        except Exception as e:  # noqa: BLE001  (any failure: no cache, captures as before)
            logger.info("llm: no block cache on the prepared graph (%s: %s)", type(e).__name__, e)
            return None
        if not same:
            logger.info("llm: running the prepared graph node by node does not give its forward's "
                        "outputs; each capture runs it from its input")
            return None
        return cache

    def block_of(self, names):
        return _blocks.block_of(self._index, names)

    def _snapshot(self, pos):
        modules, attrs = self._cut_info(pos)[2]
        versions = []
        for target in modules:
            mod = self._mods[target]
            versions += [(id(t), t._version) for t in list(mod.parameters()) +
                         list(mod.buffers())]
        for target in attrs:
            t = self._interp.fetch_attr(target)
            if isinstance(t, torch.Tensor):
                versions.append((id(t), t._version))
        return versions

    def _value(self, node, env):
        """Runs one node on ``env`` (torch.fx.Interpreter's rules, without its per-node
        bookkeeping: this runs for every node of every capture)."""
        load = env.__getitem__
        args = torch.fx.node.map_arg(node.args, load)
        kwargs = torch.fx.node.map_arg(node.kwargs, load)
        if node.op == "call_function":
            return node.target(*args, **kwargs)
        if node.op == "call_module":
            return self._mods[node.target](*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        if node.op == "get_attr":
            return self._interp.fetch_attr(node.target)
        raise RuntimeError(f"node {node.name}: op {node.op!r} cannot run alone")

    def _run(self, env, start, stop, item=None):
        """Runs nodes [start, stop) on ``env`` (node -> value), freeing each value after its
        last reader; returns the output node's value if reached. With ``item``, the values at
        the marks of the current block it passes are kept (Note [Marks inside a block])."""
        for i in range(start, stop):
            node = self._nodes[i]
            if item is not None and i in self._mark_set and i > start:
                self._mark(i, item, env)
            if node.op == "output":
                args = torch.fx.node.map_arg(node.args[0], env.__getitem__)
                return self.model.graph._codegen.process_outputs(args)
            if node.op != "placeholder":
                env[node] = self._value(node, env)
            for inp in node.all_input_nodes:
                if self._last_use.get(inp) == i and inp in env:
                    del env[inp]
            if node not in self._last_use:
                env.pop(node, None)
        return None

    def _mark(self, pos, item, env):
        versions = self._mark_versions.get(pos)
        if versions is None:
            versions = self._mark_versions[pos] = self._snapshot(pos)
        kept = self._marks.get(pos)
        if kept is None or kept[0] != versions:
            kept = self._marks[pos] = (versions, {})
        kept[1][item] = self._keep(pos, env)

    def _start_env(self, pos, kept):
        """The values to run from node position ``pos``: ``kept`` (cached, ``_keep``) and the
        derived nodes, computed again from the model's attributes."""
        env = dict(kept[0])
        for node in self._cut_info(pos)[1]:
            env[node] = self._value(node, env)
        return env

    def _keep(self, pos, env):
        """(values live at ``pos`` and not derived, their tensors' version counters)."""
        values = {n: env[n] for n in self._cut_info(pos)[0]}
        return values, [(t, t._version) for t in _blocks._tensors(list(values.values()))]

    def _moved_to(self, k, items):
        self._k, self._items = k, items
        self._versions = self._snapshot(self._cuts[k])
        self._marks, self._mark_set = {}, set(self._marks_at[k])

    def _record(self, b):
        items = []
        cut = self._cuts[b]
        with torch.no_grad():
            for sample in self.calib:
                env = _bind(self.model, sample)
                self._run(env, 0, cut)
                items.append(self._keep(cut, env))
        self._moved_to(b, items)

    def _advance(self):
        k = self._k
        start, stop = self._cuts[k], self._cuts[k + 1]
        items = []
        with torch.no_grad():
            for kept in self._items:
                env = self._start_env(start, kept)
                self._run(env, start, stop)
                items.append(self._keep(stop, env))
        self._moved_to(k + 1, items)

    def run_in(self, b, names=None):
        """Brings the cache to block b (moved on from an earlier block whose values are fresh,
        else recorded again) and returns run(i, sample) that runs the graph on item i from block
        b's start, or from the latest fresh mark before the first call of the modules ``names``
        (a capture's hook stops it)."""
        if self._k is None or self._k > b or \
                self._snapshot(self._cuts[self._k]) != self._versions or \
                not all(_unchanged(kept) for kept in self._items):
            self._record(b)
        while self._k < b:
            self._advance()
        self._mark_versions = {}  # what the marks passed in this capture are computed from
        cut, end = self._cuts[b], len(self._nodes)
        first = min((self._calls.get(n, cut) for n in names), default=cut) if names else cut
        mark = None
        for pos in reversed(self._marks_at[b]):
            if pos <= first and pos in self._marks and \
                    self._marks[pos][0] == self._snapshot(pos) and \
                    all(_unchanged(kept) for kept in self._marks[pos][1].values()):
                mark = pos
                break
        held = self._marks[mark][1] if mark is not None else {}

        def run(i, _sample):
            if i in held:
                self._run(self._start_env(mark, held[i]), mark, end, item=i)
            else:
                self._run(self._start_env(cut, self._items[i]), cut, end, item=i)
        return run
