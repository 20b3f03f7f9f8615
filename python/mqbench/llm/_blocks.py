"""Captures from cached block inputs (docs/design/llm.md).

The sequential algorithms (GPTQ, AWQ) need each layer's inputs as the layers before it, already
processed, give them. Re-running the model from its input for every capture costs a prefix of
the model per layer group: about twice the model's depth in forwards for a decoder. A decoder's
layers sit in a chain of blocks (``model.layers``, ``encoder.layer``): block j + 1 reads the
hidden states block j returned, with the same other arguments (masks, position embeddings).
Where the counting pass sees exactly that, ``BlockCache`` keeps one block's inputs per
calibration item, runs only that block for a capture, and moves on by running a finished block
once over its inputs. The layers see the same tensors as with a forward from the start, so the
results are equal bit for bit (tests/python/llm/test_llm.py).

What the counting pass checks (``ChainWatch``), on every item it runs (one item of each kind of
input where those items call every layer once: Note [Counting pass on one item of each kind]
in ``_calibration``; the calls per layer are checked again on every item as the cache moves past
each block, the chain is not); any miss and every capture runs the model from its input, as
before:
* each block of the chosen ``nn.ModuleList`` is called once, in order, none nested in another;
* block j + 1's hidden-states input (first positional argument, or ``hidden_states=``) is the
  very tensor block j returned (its first tensor), unchanged in place since;
* its other arguments are the very objects block 0 got (per-layer masks differ: not a chain);
* no block changes its inputs in place (a block is run again on the same cached tensors).

A parameter or buffer outside the blocks still ahead (or of a block already run past) that changes
after the inputs were cached (its ``_version`` moves) makes the cache record them again from the
model's input. A cache object in the arguments (``past_key_values``) is replaced by None in the
block re-runs, so no key/value cache is appended to twice.
"""
import sys

import torch
from torch import nn

# Nesting depth read when listing the tensors of a block's arguments (tuples of tensors, dicts of
# them): bounded, never a recursion over whatever object a model passes.
MAX_DEPTH = 3
# Key/value cache arguments of decoder layers: transformers 4 ("past_key_value(s)", GPT-2's
# "layer_past"), transformers 5.2x ("cache"); any transformers ``Cache`` object under any name.
_CACHE_KEYS = ("past_key_values", "past_key_value", "layer_past", "cache")


class StopForward(Exception):
    """Raised by a capture hook once the layers it watches have seen all their calls of an item:
    the rest of the forward is not needed."""


def first_tensor(out):
    """The first tensor of a module's output (a tensor, or nested tuples / lists of them)."""
    for _ in range(MAX_DEPTH + 1):
        if not isinstance(out, (tuple, list)) or not out:
            break
        out = out[0]
    return out if isinstance(out, torch.Tensor) else None


def _tensors(obj, depth=0):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth >= MAX_DEPTH:
        return []
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in _tensors(v, depth + 1)]
    return []


def _split(args, kwargs):
    """(hidden, where, rest): the hidden-states input of a block call, where it was ("arg" or
    "kw") and the other arguments ((args after it, kwargs without it)); hidden None if the call
    has no tensor there."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0], "arg", (tuple(args[1:]), dict(kwargs))
    h = kwargs.get("hidden_states")
    if isinstance(h, torch.Tensor):
        rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        return h, "kw", (tuple(args), rest)
    return None, None, None


def join_call(hidden, where, rest):
    """(args, kwargs) of a block call from its hidden states and the rest of a cached item."""
    args, kwargs = rest
    if where == "arg":
        return (hidden,) + args, kwargs
    return args, dict(kwargs, hidden_states=hidden)


def _same_objects(a, b):
    (a_args, a_kw), (b_args, b_kw) = a, b
    return (len(a_args) == len(b_args) and all(x is y for x, y in zip(a_args, b_args))
            and a_kw.keys() == b_kw.keys() and all(a_kw[k] is b_kw[k] for k in a_kw))


def _as_list(mod):
    """The children of an ``nn.ModuleList``, or of the bare module a GraphModule keeps in its
    place (children named 0, 1, ...: a prepared model's ``model.layers``), else None."""
    if isinstance(mod, nn.ModuleList):
        return list(mod)
    if type(mod) is nn.Module:
        named = list(mod.named_children())
        if named and [n for n, _ in named] == [str(i) for i in range(len(named))]:
            return [child for _, child in named]
    return None


def find_blocks(model, linear_names):
    """The ``nn.ModuleList`` (``_as_list``) whose children hold the most of ``linear_names`` (at
    least two children holding some): [(qualified name, block)], else []."""
    best, best_n = [], 0
    names = list(linear_names)
    for lname, mod in model.named_modules():
        items = _as_list(mod)
        if items is None or len(items) < 2:
            continue
        prefix = lname + "." if lname else ""
        children = [(prefix + str(i), child) for i, child in enumerate(items)]
        per_child = [sum(1 for n in names if n.startswith(c + ".")) for c, _ in children]
        if sum(1 for k in per_child if k) >= 2 and sum(per_child) > best_n:
            best, best_n = children, sum(per_child)
    return best


def block_index(blocks):
    """Qualified module name -> index of the block (of ``find_blocks``) holding it."""
    return {name: j for j, (bname, block) in enumerate(blocks)
            for name, _ in block.named_modules(prefix=bname)}


def block_of(index, names):
    """The block (of ``index``, a ``block_index``) holding all the named modules, else None."""
    found = {index.get(n) for n in names}
    return found.pop() if len(found) == 1 else None


class QuietWatch(object):
    """A watch of the counting pass that hooks nothing: whether the blocks form a chain is known
    without watching the items (``ok``)."""

    def install(self):
        pass

    def remove(self):
        pass

    def begin_item(self):
        pass

    def end_item(self):
        pass


class ChainWatch(object):
    """Hooks on the blocks during the counting pass (``_calibration.check_calibration``): ``ok``
    says whether the blocks form a chain on every item (module docstring)."""

    def __init__(self, blocks):
        self.blocks = blocks
        self.ok = bool(blocks)
        self._handles = []
        self._reset()

    def _reset(self):
        self._next = 0       # the block expected next
        self._inside = None  # the block running now
        self._prev = None    # (output tensor, its version) of the block before
        self._rest0 = None   # the other arguments of block 0
        self._in = None      # [(tensor, version)] of the running block's inputs

    def install(self):
        for j, (_, block) in enumerate(self.blocks):
            self._handles.append(block.register_forward_pre_hook(
                lambda _m, args, kwargs, j=j: self._pre(j, args, kwargs), with_kwargs=True))
            self._handles.append(block.register_forward_hook(
                lambda _m, _a, _k, out, j=j: self._post(j, out), with_kwargs=True))

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        self._reset()

    def begin_item(self):
        self._reset()

    def end_item(self):
        if self._next != len(self.blocks) or self._inside is not None:
            self.ok = False
        self._reset()

    def _pre(self, j, args, kwargs):
        if not self.ok:
            return
        hidden, where, rest = _split(args, kwargs)
        if j != self._next or self._inside is not None or hidden is None:
            self.ok = False
            return
        if j == 0:
            self._rest0, self._where = rest, where
        else:
            out, version = self._prev
            if hidden is not out or hidden._version != version or \
                    not _same_objects(rest, self._rest0) or self._where != where:
                self.ok = False
                return
        self._inside = j
        self._in = [(t, t._version) for t in [hidden] + _tensors(rest)]

    def _post(self, j, out):
        if not self.ok:
            return
        if self._inside != j or any(t._version != v for t, v in self._in):
            self.ok = False
            return
        out = first_tensor(out)
        if out is None:
            self.ok = False
            return
        self._prev = (out, out._version)
        self._inside, self._in = None, None
        self._next = j + 1


def _is_kv_cache(key, value):
    if key in _CACHE_KEYS:
        return True
    cache_utils = sys.modules.get("transformers.cache_utils")
    cache_cls = getattr(cache_utils, "Cache", None) if cache_utils is not None else None
    return cache_cls is not None and isinstance(value, cache_cls)


def without_kv_cache(kwargs):
    """kwargs of a block call with its key/value cache replaced by None: a block run again must
    not append its keys and values to the cache a second time (and attend to them)."""
    return {k: (None if v is not None and _is_kv_cache(k, v) else v) for k, v in kwargs.items()}


def _no_cache(rest):
    args, kwargs = rest
    return args, without_kv_cache(kwargs)


class BlockCache(object):
    """Inputs of one block per calibration item, moved forward block by block (module
    docstring). ``block_of(names)`` says which block holds all the named layers (None: not one
    block); ``run_in(b)`` returns the function a capture calls per item, running block b."""

    def __init__(self, model, calib, blocks, index, run_model, check=None):
        self.model, self.calib, self.blocks = model, calib, blocks
        self._run_model = run_model
        # a ``_calibration.PathCheck`` where the counting pass ran on one item of each kind: each
        # block run over every item to move on checks the other items' calls against it
        self._check = check
        self._index = index  # block_index(blocks)
        # every parameter and buffer with the index of its block (-1: outside the blocks)
        self._tensors = []
        seen = set()
        for j, (_, block) in enumerate(blocks):
            for t in list(block.parameters()) + list(block.buffers()):
                if id(t) not in seen:
                    seen.add(id(t))
                    self._tensors.append((t, j))
        for t in list(model.parameters()) + list(model.buffers()):
            if id(t) not in seen:
                seen.add(id(t))
                self._tensors.append((t, -1))
        self._k = None       # the block whose inputs are cached
        self._items = None   # per item: (hidden, where, rest) of block k
        self._versions = None

    def block_of(self, names):
        return block_of(self._index, names)

    def _snapshot(self, k):
        return [t._version for t, j in self._tensors if j < k]

    def _record(self, b):
        """Block b's inputs from the model run from its input (a forward stopped there)."""
        items, got = [], []

        def pre(_m, args, kwargs):
            got.append(_split(args, kwargs))
            raise StopForward

        handle = self.blocks[b][1].register_forward_pre_hook(pre, with_kwargs=True)
        try:
            with torch.no_grad():
                for i, sample in enumerate(self.calib):
                    got.clear()
                    try:
                        self._run_model(self.model, sample)
                    except StopForward:
                        pass
                    if len(got) != 1:  # the counting pass said otherwise: a changed model, or
                        # an item off its kind's path (Note [Counting pass on one item of each
                        # kind])
                        raise RuntimeError(
                            f"block {self.blocks[b][0]} was called {len(got)} times on "
                            f"calibration item {i}, where the counting pass saw it called once; "
                            "pass cache_blocks=False to run every capture from the model's "
                            "input")
                    hidden, where, rest = got[0]
                    items.append((hidden.detach(), where, _no_cache(rest)))
        finally:
            handle.remove()
        self._k, self._items, self._versions = b, items, self._snapshot(b)

    def _advance(self):
        """Runs block k over its cached inputs: the inputs of block k + 1."""
        bname, block = self.blocks[self._k]
        items = []

        def run_item(i):
            hidden, where, rest = self._items[i]
            args, kwargs = join_call(hidden, where, rest)
            items.append((first_tensor(block(*args, **kwargs)).detach(), where, rest))

        with torch.no_grad():
            if self._check is None:
                for i in range(len(self._items)):
                    run_item(i)
            else:
                names = {n for n, j in self._index.items() if j == self._k}
                self._check.run(bname, names, len(self._items), run_item)
        self._k, self._items = self._k + 1, items
        self._versions = self._snapshot(self._k)

    def inputs_of(self, b):
        """Block b's cached inputs, per item (hidden, where, rest), after bringing the cache to
        block b as ``run_in`` does; ``join_call`` makes an item a call again."""
        self.run_in(b)
        return list(self._items)

    def run_in(self, b, names=None):
        """Brings the cache to block b (forward from a cached earlier block where nothing before
        it changed, else recorded again) and returns run(i, sample) that runs block b on item i's
        cached inputs. ``names`` (the layers the capture watches) is not read here: inside a
        block, ``ScopeInputs`` replays a sub-module (``_graph_cache`` reads it)."""
        if self._k is None or self._k > b or self._snapshot(self._k) != self._versions:
            self._record(b)
        while self._k < b:
            self._advance()
        block = self.blocks[b][1]

        def run(i, _sample):
            hidden, where, rest = self._items[i]
            args, kwargs = join_call(hidden, where, rest)
            block(*args, **kwargs)
        return run


# Note [Captures from a sub-module's inputs]
# In GPTQ's true-sequential order each group's capture runs its block, from the block's cached
# inputs, up to the group's layers. Where two consecutive steps g and h of one block sit in a
# module S strictly inside the block (a Llama's ``mlp`` for gate/up_proj, then down_proj), h's
# capture needs only S: S's inputs were computed before S was entered, so quantizing g (inside
# S) does not change them. They are recorded during g's capture (S's pre-hook fires before g's
# layers, where that capture stops) and h's capture runs S alone on them: the very tensors, so
# the same results bit for bit. Used only where, on every item g's capture ran, S was entered
# once and before any of g's layers was called, and where the recorded tensors are unchanged in
# place when h's capture runs, and where no weight of g is shared with a module of the block
# outside S; otherwise h runs its block as before. An item whose replay of S does not make all
# its calls of h's layers (a layer also called outside S), or changes one of their inputs in
# place after the call, runs its block again, its replayed inputs dropped
# (``_calibration.capture``'s fallback). Memory: S's inputs for all items (one block's hidden
# states), for at most two steps at once. docs/design/llm.md.
class ScopeInputs(object):
    """Inputs of module ``module`` (named ``name``, inside a block) per calibration item, recorded
    while a capture of ``layers`` ([(name, module)], inside it) runs, for the next capture to
    run ``module`` alone (Note [Captures from a sub-module's inputs])."""

    def __init__(self, name, module, layers):
        self.name, self.module, self.layers = name, module, layers
        self.items = {}  # item -> (args, kwargs, [(tensor, version)])
        self.ok = True
        self._item = None
        self._handles = []

    def begin_item(self, i):
        self._item = i

    def install(self):
        """Before the capture's own hooks, so that a layer's hook here runs before the capture's
        stops the forward."""
        def enter(_m, args, kwargs):
            if self._item in self.items:  # entered twice on one item
                self.ok = False
                return
            kwargs = without_kv_cache(kwargs)
            kept = [t.detach() if isinstance(t, torch.Tensor) else t for t in args]
            seen = [(t, t._version) for t in _tensors(kept) + _tensors(kwargs)]
            self.items[self._item] = (tuple(kept), kwargs, seen)

        def layer_called(_m, _args, _kwargs):
            if self._item not in self.items:  # a layer of the step ran before the module
                self.ok = False

        # first among the module's pre-hooks: its inputs as its caller passed them (a replay
        # calls the module, so its other pre-hooks run again)
        self._handles.append(self.module.register_forward_pre_hook(enter, with_kwargs=True,
                                                                   prepend=True))
        for _, mod in self.layers:
            self._handles.append(mod.register_forward_pre_hook(layer_called, with_kwargs=True))

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def usable(self, items):
        """Whether every one of ``items`` has its recorded inputs, each tensor unchanged."""
        return self.ok and all(i in self.items for i in items) and all(
            t._version == v for i in items for t, v in self.items[i][2])

    def run(self, i, _sample):
        args, kwargs, _ = self.items[i]
        self.module(*args, **kwargs)
