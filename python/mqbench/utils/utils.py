"""Helpers shared by observers, fake quantizers and graph passes (MQBench's
``mqbench.utils.utils``, re-exported by ``mqbench.utils``)."""
import collections.abc
import contextlib
import copy
import operator

import torch
import torch.distributed as dist
import torch.fx

__all__ = ["USE_DDP", "USE_LINK", "sync_tensor", "pot_quantization", "is_symmetric_quant",
           "is_per_channel", "no_jit_trace", "is_tracing_state", "deepcopy_graphmodule",
           "deepcopy_mixedmodule", "getitem2node", "topology_order", "get_flattened_qconfig_dict",
           "to_device", "model_device"]

# MQBench fixes these when the module is first imported. SenseTime's linklink is not available
# outside SenseTime, so USE_LINK is always False here.
USE_LINK = False
USE_DDP = dist.is_available() and dist.is_initialized()


def _ddp_active():
    # Checked at call time (not only at import, as MQBench does), so a process group created
    # after `import mqbench` still synchronises qparams (docs/compatibility.md).
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def sync_tensor(tensor):
    """Averages ``tensor`` in place across DDP ranks (a no-op outside DDP); returns it."""
    if _ddp_active():
        if tensor.is_floating_point():
            tensor.data /= dist.get_world_size()
            dist.all_reduce(tensor.data)
        else:  # integer zero points: average in float, round back (MQBench divides ints in place)
            mean = tensor.data.double() / dist.get_world_size()
            dist.all_reduce(mean)
            tensor.data.copy_(mean.round().to(tensor.dtype))
    return tensor


def pot_quantization(tensor, mode="round"):
    """Rounds a scale to a power of two, ``2^round(log2 t)`` (or ``floor``, or ``ceil`` as
    MQBench 1.10 allows), with a straight-through gradient on the rounding."""
    if mode == "round":
        return torch.ops.mqbench.pot_quantization(tensor)
    if mode in ("floor", "ceil"):
        log2t = torch.log2(tensor)
        rounded = torch.floor(log2t) if mode == "floor" else torch.ceil(log2t)
        return 2 ** ((rounded - log2t).detach() + log2t)
    raise ValueError(f"pot_quantization: mode must be 'round', 'floor' or 'ceil', got {mode!r}")


def is_symmetric_quant(qscheme):
    """True for ``torch.per_tensor_symmetric`` and ``torch.per_channel_symmetric``."""
    return qscheme in (torch.per_tensor_symmetric, torch.per_channel_symmetric)


def is_per_channel(qscheme):
    """True for the per-channel qschemes."""
    return qscheme in (torch.per_channel_symmetric, torch.per_channel_affine,
                       torch.per_channel_affine_float_qparams)


def is_tracing_state():
    """True while ``torch.jit.trace`` (and so ``torch.onnx.export``) is tracing."""
    return torch._C._get_tracing_state() is not None


@contextlib.contextmanager
def no_jit_trace():
    """Suspends JIT tracing inside the block (state updates that must not enter the graph)."""
    state = torch._C._get_tracing_state()
    torch._C._set_tracing_state(None)
    try:
        yield
    finally:
        torch._C._set_tracing_state(state)


# -- fx graph helpers (MQBench's, used by PTQ and deploy code) ----------------------------------
# to_device's nesting bound: far beyond any model input, and no recursion without end on a
# container that holds itself.
_MAX_NESTING = 32


def to_device(data, device="cpu", _depth=0):
    """``data`` with every tensor (inside dicts and other mappings such as a tokenizer's
    ``BatchEncoding``, lists, tuples and named tuples too) moved to ``device``; the containers
    are new, a mapping becomes a dict (MQBench's edits dicts and lists in place, and leaves other
    mappings unmoved). Nesting deeper than 32 levels raises ``ValueError``."""
    if isinstance(data, torch.Tensor):
        return data.to(device)
    if _depth >= _MAX_NESTING and isinstance(data, (collections.abc.Mapping, list, tuple)):
        raise ValueError(f"to_device: the data nests containers deeper than {_MAX_NESTING} "
                         "levels (or holds itself)")
    if isinstance(data, collections.abc.Mapping):
        return {k: to_device(v, device, _depth + 1) for k, v in data.items()}
    if isinstance(data, list):
        return [to_device(v, device, _depth + 1) for v in data]
    if isinstance(data, tuple):
        moved = [to_device(v, device, _depth + 1) for v in data]
        return type(data)(*moved) if hasattr(data, "_fields") else tuple(moved)
    return data


def model_device(model):
    """The device of ``model``'s first parameter (or buffer); the CPU for a stateless model."""
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def deepcopy_graphmodule(gm):
    """A deep copy of the GraphModule ``gm`` whose ``graph`` is a deep copy too (so editing the
    copy's graph leaves ``gm`` alone), as MQBench's."""
    copied = copy.deepcopy(gm)
    copied.graph = copy.deepcopy(gm.graph)
    return copied


def deepcopy_mixedmodule(mm, module_list):
    """A deep copy of the module ``mm`` whose children named in ``module_list`` (GraphModules)
    get deep copies of their graphs, as :func:`deepcopy_graphmodule` does for one."""
    copied = copy.deepcopy(mm)
    for name in module_list:
        setattr(getattr(copied, name), "graph", copy.deepcopy(getattr(mm, name).graph))
    return copied


def topology_order(model):
    """``{node: index}`` of ``model.graph``'s nodes in graph order (0-based)."""
    return {node: idx for idx, node in enumerate(model.graph.nodes)}


def getitem2node(model):
    """``{getitem node: node}`` for every ``operator.getitem`` that reads, through any depth of
    nested dicts and getitems, a value a model wrote with ``dict.update`` (MQBench's, both
    branches): ``d.update({'a': conv_out}); d['a']`` maps the getitem to ``conv_out``;
    ``d.update({'a': {'b': x}}); d['a']['b']`` maps the second getitem to ``x``; ``d.update(e)``
    merges what was recorded for the dict ``e`` (MQBench main).

    Args:
        model: a GraphModule (or a ``torch.fx.Graph``).

    Raises:
        ValueError: ``update`` called with something other than a dict literal or a node
            (MQBench main's ``'Wrong type for update'``).
    """
    graph = model if isinstance(model, torch.fx.Graph) else model.graph
    paths = {}    # getitem node -> [root, key, key, ...]
    written = {}  # dict node -> what its update calls wrote
    mapping = {}
    for node in graph.nodes:
        if node.op == "call_function" and node.target is operator.getitem:
            src, key = node.args[0], node.args[1]
            parent = paths.get(src) if isinstance(src, torch.fx.Node) else None
            paths[node] = parent + [key] if parent is not None else [src, key]
            for getitem, path in paths.items():
                if getitem not in mapping:
                    value = _lookup(written, path)
                    if isinstance(value, torch.fx.Node):
                        mapping[getitem] = value
        elif node.op == "call_method" and node.target == "update":
            # d.update(x) or d.update(key=value, ...)
            target = node.args[0]
            update = node.args[1] if len(node.args) > 1 else dict(node.kwargs)
            recorded = written.setdefault(target, {})
            if isinstance(update, dict):
                recorded.update(update)
            elif isinstance(update, torch.fx.Node):
                recorded.update(written.get(update, {}))
            else:
                raise ValueError(f"Wrong type for update: {type(update).__name__} in node "
                                 f"{node.name}")
    return mapping


def _lookup(written, path):
    value = written
    for key in path:
        try:
            value = value[key]
        except (IndexError, KeyError, TypeError):  # not recorded, or not a container
            return None
    return value


def _fix_succ_recursivly(args, target_node, inserted_node):
    """``args`` with ``target_node`` replaced by ``inserted_node`` inside nested tuples, lists
    and dicts (MQBench's name and results: a list or tuple comes back as a tuple, nested lists
    as lists, dicts as dicts; other values are kept).

    Raises:
        NotImplementedError: ``args`` itself is not a tuple, list or dict.
    """
    if isinstance(args, (list, tuple)):
        out = list(args)
        for i, arg in enumerate(args):
            if arg is target_node:
                out[i] = inserted_node
            elif isinstance(arg, list):
                out[i] = list(_fix_succ_recursivly(arg, target_node, inserted_node))
            elif isinstance(arg, (tuple, dict)):
                out[i] = _fix_succ_recursivly(arg, target_node, inserted_node)
        return tuple(out)
    if isinstance(args, dict):
        out = {}
        for k, v in args.items():
            if v is target_node:
                out[k] = inserted_node
            elif isinstance(v, (list, tuple, dict)):
                out[k] = _fix_succ_recursivly(v, target_node, inserted_node)
            else:  # MQBench recursed into any non-node value and raised on an int
                out[k] = v
        return out
    raise NotImplementedError(f"{type(args)} can not be handled now.")


def get_flattened_qconfig_dict(qconfig_dict):
    """One flat ``{key: qconfig}`` from a qconfig dict: the global ``''`` entry, then every
    ``(type or function, qconfig)`` of ``'object_type'`` and ``(module name, qconfig)`` of
    ``'module_name'`` (each a dict, as MQBench main iterates them, or torch 1.10's list of
    pairs). ``'module_name_regex'`` is ignored, as in MQBench.

    Example::

        >>> get_flattened_qconfig_dict({'': qc, 'object_type': {torch.add: qc2},
        ...                             'module_name': {'conv': qc3}})
        {'': qc, torch.add: qc2, 'conv': qc3}
    """
    flattened = {}
    if "" in qconfig_dict:
        flattened[""] = qconfig_dict[""]
    for key in ("object_type", "module_name"):
        entries = qconfig_dict.get(key, {})
        for obj, qconfig in (entries.items() if isinstance(entries, dict) else entries):
            flattened[obj] = qconfig
    return flattened
