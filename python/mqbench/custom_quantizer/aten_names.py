"""The canonical IR names of aten operators (a leaf module: ``graph_ir`` and the export
frontend read it).

A graph captured by ``torch.export`` calls aten operators (``aten.add.Tensor``,
``aten.conv2d.default``) where an fx graph calls Python functions (``operator.add``,
``F.conv2d``) or methods (``x.mean()``). The rules (``src/quantizer/rules/``) name the fx
spellings, so each aten operator enters the IR under the name fx would give the same call.
Where fx has two spellings of one aten operator, the rules' spelling wins: ``aten.sigmoid`` is
``F.sigmoid`` (Tengine's list), ``aten.mean`` / ``aten.sum`` are the methods ``mean`` / ``sum``
(OPENVINO's list), ``aten.matmul`` is ``torch.matmul`` (``x @ y`` is ``operator.matmul`` in
fx, which no rule lists). In-place variants (``add_``, ``relu_``) share their name: fx records
``out += y`` as ``operator.add`` and ``F.relu(x, inplace=True)`` as ``F.relu``.
An operator not listed is ``aten.<name>``, which no rule names.
"""

__all__ = ["ATEN_NAMES", "aten_name", "fx_name"]

# Tensor methods that Python operators call (``x + y`` records ``Tensor.add``): fx records the
# operator. ``out += y`` records ``add_``; fx, whose Proxy has no ``__iadd__``, ``operator.add``.
_OPERATOR_METHODS = {"add": "operator.add", "mul": "operator.mul", "sub": "operator.sub",
                     "div": "operator.truediv", "truediv": "operator.truediv",
                     "floor_divide": "operator.floordiv", "matmul": "operator.matmul",
                     "neg": "operator.neg"}

# aten overload packet name (in-place trailing underscore dropped) -> canonical IR name.
ATEN_NAMES = {
    "add": "operator.add", "mul": "operator.mul", "sub": "operator.sub",
    "div": "operator.truediv", "floor_divide": "operator.floordiv", "neg": "operator.neg",
    "matmul": "torch.matmul", "bmm": "torch.bmm", "cat": "torch.cat", "concat": "torch.cat",
    "stack": "torch.stack", "flatten": "torch.flatten", "split": "torch.split",
    "chunk": "chunk", "mean": "mean", "sum": "sum", "view": "view", "reshape": "reshape",
    "permute": "permute", "transpose": "transpose", "contiguous": "contiguous",
    "unsqueeze": "unsqueeze", "squeeze": "squeeze", "expand": "expand", "size": "size",
    "relu": "F.relu", "relu6": "F.relu6", "hardtanh": "F.hardtanh", "sigmoid": "F.sigmoid",
    "hardsigmoid": "F.hardsigmoid", "hardswish": "F.hardswish", "silu": "F.silu",
    "gelu": "F.gelu", "tanh": "torch.tanh", "softmax": "F.softmax", "_softmax": "F.softmax",
    "log_softmax": "F.log_softmax", "adaptive_avg_pool2d": "F.adaptive_avg_pool2d",
    "max_pool2d": "F.max_pool2d", "avg_pool2d": "F.avg_pool2d",
    "upsample_nearest2d": "F.interpolate", "upsample_bilinear2d": "F.interpolate",
    "upsample_bicubic2d": "F.interpolate", "conv1d": "F.conv1d", "conv2d": "F.conv2d",
    "conv3d": "F.conv3d", "linear": "F.linear", "layer_norm": "F.layer_norm",
    "batch_norm": "F.batch_norm", "embedding": "F.embedding", "dropout": "F.dropout",
    "scaled_dot_product_attention": "F.scaled_dot_product_attention",
}


def aten_name(op):
    """The canonical IR name of an aten ``OpOverload`` (``aten.add_.Tensor`` ->
    ``operator.add``), or None when ``op`` is not an aten operator."""
    schema = getattr(op, "_schema", None)
    if schema is None or not schema.name.startswith("aten::"):
        return None
    name = schema.name[len("aten::"):]
    base = name[:-1] if name.endswith("_") and not name.endswith("__") and \
        name[:-1] in ATEN_NAMES else name
    return ATEN_NAMES.get(base, f"aten.{name}")


def fx_name(torch_fn, canonical_function):
    """The canonical name fx gives the Python call export recorded in a node's ``torch_fn``
    metadata (``('flatten_1', 'method_descriptor.flatten')``: ``x.flatten(1)``, the method
    ``flatten``; ``'builtin_function_or_method.flatten'``: ``torch.flatten``;
    ``'function.relu'``: ``F.relu``), or None when it cannot tell (then ``aten_name``).
    ``canonical_function`` is graph_ir's, passed in to keep this module a leaf."""
    import torch
    import torch.nn.functional as F
    if not (isinstance(torch_fn, tuple) and len(torch_fn) == 2 and isinstance(torch_fn[1], str)):
        return None
    kind, _, name = torch_fn[1].rpartition(".")
    if kind == "method_descriptor":
        base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
        return _OPERATOR_METHODS.get(base, name)
    if kind == "builtin_function_or_method":
        fn = getattr(F, name, None) or getattr(torch, name, None)
    elif kind == "function":
        fn = getattr(F, name, None)
    else:
        fn = None
    return canonical_function(fn) if fn is not None else None
