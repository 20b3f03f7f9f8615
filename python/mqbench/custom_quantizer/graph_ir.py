"""Conversion of a torch.fx graph to the C++ quantizer's IR (include/mqbench/graph/graph.h).

Types and functions cross as canonical names, so the C++ rules do not depend on where a class
lives in a given torch version: ``torch.ao.nn.intrinsic.qat.modules.conv_fused.ConvBnReLU2d``
becomes ``nn.intrinsic.qat.ConvBnReLU2d``; ``torch.nn.functional.relu`` becomes ``F.relu``;
``operator.add`` stays ``operator.add``; a torch.export graph's aten operator is named as fx
names the same call (``aten.add_.Tensor`` -> ``operator.add``,
``mqbench.custom_quantizer.aten_names``).

Note [Shape values in the IR]
A traced ``n, c, h, w = x.shape`` (torchvision's VisionTransformer does it) records ``getattr``
and ``getitem`` nodes whose values are Python ints, and ``h * w`` an ``operator.mul`` of two
of them. The quantizer's rules see an ``operator.mul`` of two nodes and would put activation
fake quantizers on the ints (on its inputs for TensorRT, on its output for Vitis), which fail
at the first forward; MQBench does the same. The IR describes tensor data flow, so values the
graph shows are not tensors (tensor metadata, see ``non_tensor_nodes``):

* enter their users as constants do: left out of ``inputs`` (so out of the producers'
  ``users``), and ``all_args_are_nodes`` is false;
* are named ``non_tensor.<canonical name>`` (``non_tensor.operator.mul``,
  ``non_tensor.getattr``, ``non_tensor.size``), which no rule lists, so no rule matches them.

The nodes stay in the IR, and the ``x.shape`` node keeps ``x`` as its input, so ``x``'s users
(which fusion looks at) are what fx shows. (The IR has no is-tensor field; when it gets one,
the renaming can go.)
"""
import builtins
import operator

import torch
import torch.nn.functional as F

from mqbench.custom_quantizer.aten_names import aten_name
from mqbench.utils.module_types import canonical_type

# Note [Shape values in the IR]: the IR target of a node whose value is not a tensor.
NON_TENSOR_PREFIX = "non_tensor."

__all__ = ["canonical_type", "canonical_function", "module_types", "non_tensor_nodes",
           "resolve_function", "to_ir"]


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
    if isinstance(fn, torch._ops.OpOverload):  # a torch.export graph's aten operator
        name = aten_name(fn)
        if name is not None:
            return name
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


def _flatten_nodes(args, out, constants=frozenset()):
    """Positional args flattened through lists, tuples and dicts; returns whether all were nodes.
    Nodes in ``constants`` count as constants: not appended, and not nodes."""
    all_nodes = True
    for a in args:
        if isinstance(a, torch.fx.Node) and a not in constants:
            out.append(a)
        elif isinstance(a, (list, tuple)):
            all_nodes &= _flatten_nodes(a, out, constants)
        elif isinstance(a, dict):
            all_nodes &= _flatten_nodes(list(a.values()), out, constants)
        else:
            all_nodes = False
    return all_nodes


# Tensor attributes and methods whose value is metadata (ints, torch.Size, dtype, device, bool),
# never a tensor. Note [Shape values in the IR].
_METADATA_ATTRS = frozenset((
    "shape", "ndim", "dtype", "device", "layout", "is_cuda", "is_sparse", "is_quantized",
    "is_meta", "requires_grad"))
_METADATA_METHODS = frozenset((
    "size", "dim", "ndimension", "numel", "nelement", "element_size", "stride",
    "storage_offset", "get_device", "is_contiguous", "is_floating_point", "is_complex"))
# Functions that give a non-tensor when every node among their args is one.
_SCALAR_FUNCTIONS = frozenset((
    operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv,
    operator.truediv, operator.mod, operator.pow, operator.neg, operator.eq, operator.ne,
    operator.lt, operator.le, operator.gt, operator.ge, operator.not_, builtins.int,
    builtins.float, builtins.min, builtins.max, builtins.abs))


def _holds_tensor(value):
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    return isinstance(value, torch.Tensor)


def non_tensor_nodes(graph):
    """The nodes of an fx graph whose values the graph shows are not tensors: tensor metadata
    (``x.shape``, ``x.size()``, ``x.dim()``, ``len(x)``, ...), items of it (``x.shape[2]``,
    ``x.size()[2:]``) and arithmetic or comparisons on those alone (``h * w``, ``h == 224``).

    Example::

        # forward: n, c, h, w = x.shape; return y.reshape(n, -1, h * w)
        non_tensor_nodes(gm.graph)  # {getattr_1, getitem, ..., getitem_3, mul}
    """
    out = set()
    for node in graph.nodes:
        if node.meta.get("mqbench_constant"):
            # mqbench.capture.export's Note [Values computed from integer inputs]
            is_meta = node.op in ("call_function", "call_method", "get_attr")
        elif node.op in ("call_function", "call_method") and "val" in node.meta:
            # A torch.export graph records each value (sym_size is an int, Note [Shape
            # values in the IR]).
            is_meta = not _holds_tensor(node.meta["val"])
        elif node.op == "call_function":
            if node.target is builtins.getattr:
                is_meta = len(node.args) >= 2 and node.args[1] in _METADATA_ATTRS
            elif node.target is builtins.len:
                is_meta = True
            elif node.target in _SCALAR_FUNCTIONS:
                args = []
                _flatten_nodes(node.args, args)
                is_meta = bool(args) and all(a in out for a in args)
            else:
                is_meta = False
        elif node.op == "call_method":
            is_meta = node.target in _METADATA_METHODS
        else:
            is_meta = False
        if is_meta:
            out.add(node)
    return out


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
            try:
                written = writers.get((src, key))
            except TypeError:  # a slice key (x[:, 0]) is unhashable before Python 3.12
                written = None
            if written is not None:
                mapping[node] = written
    return mapping


def to_ir(gm):
    """The node dicts of a GraphModule's graph, in graph order, for mqbench._C's quantizer."""
    modules = dict(gm.named_modules())
    index = {}
    items = []
    sources = getitem2node(gm.graph)
    constants = non_tensor_nodes(gm.graph)  # Note [Shape values in the IR]
    for node in gm.graph.nodes:
        args = []
        all_nodes = _flatten_nodes(node.args, args, constants)
        d = {"name": node.name, "op": node.op, "inputs": [index[a] for a in args],
             "all_args_are_nodes": all_nodes}
        if node.op == "call_module":
            d["target"] = node.target
            d["module_types"] = module_types(modules[node.target])
        elif node.op in ("call_function", "call_method"):
            # a torch.export graph's node carries fx's name (mqbench.capture.export)
            d["target"] = node.meta.get("mqbench_fx_name") or canonical_function(node.target)
            if node in constants:
                d["target"] = NON_TENSOR_PREFIX + d["target"]
        else:
            d["target"] = str(node.target)
        if node in sources and sources[node] in index:
            d["getitem_source"] = index[sources[node]]
        index[node] = len(items)
        items.append(d)
    return items


def resolve_function(name):
    """The function a canonical name stands for (``F.relu`` -> ``torch.nn.functional.relu``);
    a method name (``'mean'``) or an unknown name comes back as it is."""
    global _FUNCTIONS
    if _FUNCTIONS is None:
        _FUNCTIONS = _function_table()
    for fn, known in _FUNCTIONS.items():
        if known == name:
            return fn
    return name
