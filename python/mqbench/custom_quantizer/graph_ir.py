"""Conversion of a torch.fx graph to the C++ quantizer's IR (include/mqbench/graph/graph.h).

Types and functions cross as canonical names, so the C++ rules do not depend on where a class
lives in a given torch version: ``torch.ao.nn.intrinsic.qat.modules.conv_fused.ConvBnReLU2d``
becomes ``nn.intrinsic.qat.ConvBnReLU2d``; ``torch.nn.functional.relu`` becomes ``F.relu``;
``operator.add`` stays ``operator.add``.
"""
import builtins
import operator

import torch
import torch.nn.functional as F

from mqbench.utils.module_types import canonical_type

__all__ = ["canonical_type", "canonical_function", "module_types", "to_ir"]


def module_types(module):
    """Canonical names of the module's class and its bases, most derived first."""
    return [canonical_type(c) for c in type(module).__mro__
            if c not in (object, torch.nn.Module)]


def _function_table():
    table = {getattr(operator, n): f"operator.{n}" for n in (
        "add", "iadd", "mul", "imul", "sub", "truediv", "floordiv", "matmul", "getitem", "neg")}
    for name in dir(F):
        fn = getattr(F, name)
        if callable(fn) and not name.startswith("_") and not isinstance(fn, type):
            table.setdefault(fn, f"F.{name}")
    for name in ("cat", "flatten", "matmul", "add", "mul", "relu", "sigmoid", "stack", "mean",
                 "sum", "reshape", "transpose", "chunk", "split"):
        table.setdefault(getattr(torch, name), f"torch.{name}")
    table[builtins.getattr] = "getattr"
    return table


_FUNCTIONS = None


def canonical_function(fn):
    """The canonical name of a call_function target, or of a method name (a string)."""
    global _FUNCTIONS
    if isinstance(fn, str):
        return fn
    if _FUNCTIONS is None:
        _FUNCTIONS = _function_table()
    try:
        name = _FUNCTIONS.get(fn)
    except TypeError:  # unhashable
        name = None
    if name is not None:
        return name
    module = getattr(fn, "__module__", None) or "builtins"
    return f"{module}.{getattr(fn, '__qualname__', getattr(fn, '__name__', repr(fn)))}"


def _flatten_nodes(args, out):
    """Positional args flattened through lists, tuples and dicts; returns whether all were nodes."""
    all_nodes = True
    for a in args:
        if isinstance(a, torch.fx.Node):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            all_nodes &= _flatten_nodes(a, out)
        elif isinstance(a, dict):
            all_nodes &= _flatten_nodes(list(a.values()), out)
        else:
            all_nodes = False
    return all_nodes


def getitem2node(graph):
    """MQBench's getitem2node: getitem nodes that read a value written by ``dict.update`` mapped
    to the node that produced the value."""
    mapping, writers = {}, {}
    for node in graph.nodes:
        if node.op == "call_method" and node.target == "update" and len(node.args) >= 2:
            target, update = node.args[0], node.args[1]
            if isinstance(update, dict):
                for key, value in update.items():
                    if isinstance(value, torch.fx.Node):
                        writers[(target, key)] = value
        if node.op == "call_function" and node.target is operator.getitem:
            src, key = node.args[0], node.args[1]
            if (src, key) in writers:
                mapping[node] = writers[(src, key)]
    return mapping


def to_ir(gm):
    """The node dicts of a GraphModule's graph, in graph order, for mqbench._C's quantizer."""
    modules = dict(gm.named_modules())
    index = {}
    items = []
    sources = getitem2node(gm.graph)
    for node in gm.graph.nodes:
        args = []
        all_nodes = _flatten_nodes(node.args, args)
        d = {"name": node.name, "op": node.op, "inputs": [index[a] for a in args],
             "all_args_are_nodes": all_nodes}
        if node.op == "call_module":
            d["target"] = node.target
            d["module_types"] = module_types(modules[node.target])
        elif node.op in ("call_function", "call_method"):
            d["target"] = canonical_function(node.target)
        else:
            d["target"] = str(node.target)
        if node in sources and sources[node] in index:
            d["getitem_source"] = index[sources[node]]
        index[node] = len(items)
        items.append(d)
    return items
