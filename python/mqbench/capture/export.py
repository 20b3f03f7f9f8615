"""The torch.export frontend: a model captured by ``torch.export`` (aten operators), lifted to a
``GraphModule`` of the model's own submodules that the quantizer's IR and the fx-based apply
step (fusion, QAT swap, activation quantizers) take as they take a traced one.

Note [Lifting an exported graph]
``torch.export.export(model, args, kwargs).module()`` inlines every module: a ``Conv2d`` is an
``aten.conv2d`` node whose weight is a ``get_attr``. The rules, and MQBench's quantizer names,
are about modules (``nn.qat.Linear`` inputs, ``layer1_0_conv1_post_act_fake_quantizer``), so the
aten nodes each leaf module call produced become one ``call_module`` node again. The nodes of
one call are known from export's ``nn_module_stack`` metadata (one key per call: the second
call of ``layer1.0.relu`` is ``...relu@1``). A call is lifted when

* its module is a leaf as ``CustomedTracer`` sees it (torch.nn's and mqbench.nn's modules
  except Sequential, and the ``leaf_module`` classes): the same modules fx calls whole;
* its ``forward`` takes one argument (or is a transposed convolution's
  ``forward(input, output_size=None)`` whose call kept the module's ``output_padding``: no
  ``output_size`` was passed), its nodes read one value from outside besides the
  module's own parameters and buffers, and one of its nodes is used outside the call. A call
  with more inputs (``nn.MultiheadAttention(q, k, v)``) cannot be rebuilt from the graph with
  certainty about its arguments, so its leaf submodules are tried instead and the rest stays
  as aten nodes.

The lifted node is named as fx names it (``layer1_0_conv1``; a second call ``layer1_0_relu_1``
with its own copy of the module, ``layer1.0.relu_dup1``, as ``duplicate_reused_nodes`` does),
so the same model gets the same quantizer names from both captures. Other nodes keep their aten
operator (the graph runs and differentiates them like any other code) and enter the IR under
the names fx gives the same calls (``mqbench.custom_quantizer.aten_names``: export's
``torch_fn`` metadata tells ``x.flatten(1)`` from ``torch.flatten(x, 1)``); they are renamed to
fx's short names (``add``, ``matmul``, ``flatten``). The module keeps export's calling convention
(the forward takes the example inputs' structure and returns the model's output structure).

Note [Values computed from integer inputs]
An exported transformer computes its attention mask inside the graph, from the integer
``attention_mask`` input: ``where(mask, 0, finfo(float32).min)``, added to the attention scores.
A quantizer on that value (Tensorrt_NLP quantizes the inputs of adds) spans [-3.4e38, 0]: its
scale is about 2.7e36, and the first QAT step's LSQ gradient turns it into NaN. (MQBench met the
mask as an input of an fx graph, at -10000 in transformers 4.) Values that depend on no
floating-point input and no parameter (masks, position ids, rotary tables from buffers and
``arange``) are data the model derives from its integer inputs and constants, not activations:
they enter the IR as constants do (``graph_ir``'s Note [Shape values in the IR]), so no rule
puts a quantizer on them, and an add of scores and mask counts as an add with a constant
argument (which the NLP rules skip). A call of a lifted module is always an activation (an
embedding of token ids is one).

Note [Shapes of an exported graph]
Without ``dynamic_shapes`` export bakes every size into the graph (``view(x, [1, 512])``); the
captured model would compute garbage or fail deep inside on other sizes. The prepared model
checks its inputs before each forward (``InputShapeCheck``) and refuses other sizes with a
message naming the input, the dimension and the captured size. ``torch.export.Dim`` specs in
``dynamic_shapes`` are passed to export; those dimensions stay symbolic (``sym_size`` nodes,
values that are not tensors, Note [Shape values in the IR]) and are not checked.
"""
import inspect

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.fx import Graph, GraphModule

from mqbench.custom_quantizer.aten_names import aten_name, fx_name
from mqbench.nn.modules.hadamard import input_rotations, without_input_rotations
from mqbench.capture.fx import duplicate_reused_nodes, is_leaf_type
from mqbench.custom_quantizer.graph_ir import canonical_function

__all__ = ["export_capture", "lift_exported", "lift_graph", "split_example_inputs",
           "InputShapeCheck"]


def split_example_inputs(example_inputs):
    """``(args, kwargs)`` from ``prepare_custom_config_dict['example_inputs']``: a tuple (or
    list) of positional arguments, a dict of keyword arguments, or one tensor."""
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    raise TypeError("prepare_custom_config_dict['example_inputs'] must be a tuple of positional "
                    "arguments or a dict of keyword arguments (e.g. (torch.randn(1, 3, 224, 224),)"
                    f" or {{'input_ids': ids}}), got {type(example_inputs).__name__}")


def export_capture(model, example_inputs, dynamic_shapes=None, leaf_types=()):
    """The model captured with ``torch.export`` (non-strict) on ``example_inputs`` and lifted
    (Note [Lifting an exported graph]) into a GraphModule sharing the model's submodules and
    parameters.

    Example::

        gm = export_capture(model, (torch.randn(1, 3, 64, 64),))
        gm.graph  # call_module conv1, ..., call_function aten.add.Tensor (named 'add'), ...
    """
    args, kwargs = split_example_inputs(example_inputs)
    exported = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes,
                                   strict=False)
    return lift_exported(exported, model, leaf_types)


def _resolve(root, target):
    value = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _submodule(model, path):
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def _flat_nodes(value, out):
    for item in pytree.tree_leaves(value, is_leaf=lambda v: isinstance(v, torch.fx.Node)):
        if isinstance(item, torch.fx.Node):
            out.append(item)
    return out


def _takes_one_argument(module):
    """Whether a call of ``module`` with one tensor can stand for its exported nodes: a forward of
    one parameter, or a transposed convolution's ``forward(input, output_size=None)`` (a call
    with ``output_size`` is told apart by its ``output_padding``: ``_Call.settle``). Other
    optional arguments (a mask, ``is_causal``) may have been passed as constants, which a lifted
    one-argument call would drop."""
    if isinstance(module, nn.modules.conv._ConvTransposeNd):
        return True
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return False
    return len([p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]) == 1


def _output_padding_as_built(module, nodes):
    """A transposed convolution's exported call used its own ``output_padding`` (no
    ``output_size`` was passed, which changes it)."""
    for node in nodes:
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.name.startswith("aten::conv_transpose"):
            if not hasattr(module, "output_padding"):
                return True  # mqbench.pt2e's stand-in: planned on, never run
            padding = node.args[5] if len(node.args) > 5 else node.kwargs.get("output_padding", 0)
            dims = len(module.output_padding)
            padding = tuple(padding) if isinstance(padding, (list, tuple)) else (padding,) * dims
            return padding == tuple(module.output_padding)
    return True


class _Call:
    """One call of a leaf module in the exported graph: its nodes, its input, its output."""

    def __init__(self, key, path, module):
        self.key, self.path, self.module = key, path, module
        self.nodes = []
        self.input = self.output = None

    def settle(self, root):
        """Finds the input and output; returns whether the call can be lifted."""
        if not _takes_one_argument(self.module):
            return False
        if isinstance(self.module, nn.modules.conv._ConvTransposeNd) and \
                not _output_padding_as_built(self.module, self.nodes):
            return False
        members = set(self.nodes)
        own = {id(t) for t in self.module.parameters()} | {id(t) for t in self.module.buffers()}
        inputs = []
        for node in self.nodes:
            for arg in _flat_nodes((node.args, node.kwargs), []):
                if arg in members or arg in inputs:
                    continue
                if arg.op == "get_attr" and id(_resolve(root, arg.target)) in own:
                    continue
                inputs.append(arg)
        outputs = [n for n in self.nodes if any(u not in members for u in n.users)]
        if len(inputs) != 1 or len(outputs) != 1:
            return False
        if not isinstance(inputs[0].meta.get("val"), torch.Tensor):
            return False
        self.input, self.output = inputs[0], outputs[0]
        return True


def _leaf_calls(graph, model, root, leaf_types):
    """{node: _Call} for every node inside a liftable leaf module call (outermost first)."""
    candidates = {}
    modules = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        chain = []
        for key, entry in (node.meta.get("nn_module_stack") or {}).items():
            path = entry[0]
            if path not in modules:
                modules[path] = _submodule(model, path)
            module = modules[path]
            if module is not None and path and is_leaf_type(module, leaf_types):
                chain.append((key, path))
        # a leaf called inside an outer leaf's call that is not a submodule of it (called by
        # a hook of the outer leaf, or handed to its forward: Note [Input rotations in a
        # capture]) starts a call of its own, ending the outer one's
        chain = [(k, p) for i, (k, p) in enumerate(chain)
                 if all(q.startswith(p + ".") for _, q in chain[i + 1:])]
        if chain:
            candidates[node] = chain
    level = dict.fromkeys(candidates, 0)
    while True:
        calls = {}
        for node, chain in candidates.items():
            if level[node] >= len(chain):
                continue
            key, path = chain[level[node]]
            call = calls.get(key)
            if call is None:
                call = calls[key] = _Call(key, path, modules[path])
            call.nodes.append(node)
        refused = [c for c in calls.values() if not c.settle(root)]
        if not refused:
            return {n: c for c in calls.values() for n in c.nodes}
        for call in refused:
            for node in call.nodes:
                level[node] += 1


def _fx_name(node):
    """The canonical IR name of an aten node: fx's name of the Python call export recorded
    (``torch_fn``: ``x.flatten(1)`` is the method ``flatten``, ``torch.flatten(x, 1)`` the
    function), else the aten operator's usual spelling
    (``mqbench.custom_quantizer.aten_names``)."""
    aten = aten_name(node.target)
    if aten is None:  # operator.getitem, ...: fx has the same call
        return None
    # torch_fn names the Python call this node came from; a node of another operator made by
    # the same call (a chunk's getitems, a decomposition) keeps the operator's own name.
    torch_fn = node.meta.get("torch_fn")
    op = node.target._schema.name.partition("::")[2].rstrip("_")
    called = torch_fn[1].rpartition(".")[2].rstrip("_") if isinstance(torch_fn, tuple) and \
        len(torch_fn) == 2 and isinstance(torch_fn[1], str) else None
    if called != op:
        return aten
    return fx_name(torch_fn, canonical_function) or aten


def _short_name(node):
    """fx's node name for a call of this aten operator (``aten.add_.Tensor`` -> ``add``)."""
    name = _fx_name(node) if node.op == "call_function" else None
    if name is None:
        return node.name
    return name.rpartition(".")[2]


def _mark_constant_values(graph, root):
    """Marks ``meta['mqbench_constant']`` on the nodes whose values depend on no floating-point
    input and no parameter (Note [Values computed from integer inputs])."""
    constant = set()
    for node in graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            is_constant = isinstance(val, torch.Tensor) and not val.is_floating_point()
        elif node.op == "get_attr":
            is_constant = not isinstance(root.get(node.target), torch.nn.Parameter)
        elif node.op == "call_function":
            inputs = _flat_nodes((node.args, node.kwargs), [])
            is_constant = all(n in constant for n in inputs)
        else:  # call_module (a layer with parameters), output
            is_constant = False
        if is_constant:
            constant.add(node)
            node.meta["mqbench_constant"] = True


class InputShapeCheck:
    """A forward pre-hook refusing inputs whose sizes differ from the captured ones (Note
    [Shapes of an exported graph]). ``shapes``: per flat input (pytree order of the forward's
    arguments), its label and its captured shape (None for a dynamic dimension), or None for a
    value that is not a tensor."""

    def __init__(self, arg_names, labels, shapes):
        self.arg_names, self.labels, self.shapes = list(arg_names), list(labels), list(shapes)

    def __call__(self, module, args, kwargs):
        try:
            bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments
        except TypeError as e:
            raise TypeError(f"the prepared model was captured by torch.export with the "
                            f"arguments {self.arg_names}: {e}") from None
        flat = []
        for name in self.arg_names:
            flat.extend(pytree.tree_leaves(bound.get(name)))
        for label, shape, value in zip(self.labels, self.shapes, flat):
            if shape is None or not isinstance(value, torch.Tensor):
                continue
            got = tuple(value.shape)
            bad = len(got) != len(shape) or any(
                s is not None and s != g for s, g in zip(shape, got))
            if bad:
                want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
                raise ValueError(
                    f"input {label} has shape {list(got)}, but the model was captured by "
                    f"torch.export for {want} and export fixed those sizes in the graph. "
                    "Feed that shape, or prepare again with "
                    "prepare_custom_config_dict['dynamic_shapes'] (torch.export.Dim specs, as "
                    "torch.export.export takes them) for the dimensions that vary.")
        return None


def _input_check(graph, exported_module):
    info = exported_module.graph._codegen.pytree_info
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    labels, shapes = [], []
    for node in placeholders:
        val = node.meta.get("val")
        labels.append(f"'{node.name}'")
        if isinstance(val, torch.Tensor):
            shapes.append(tuple(d if isinstance(d, int) else None for d in val.shape))
        else:
            shapes.append(None)
    return InputShapeCheck(info.orig_args, labels, shapes)


def lift_exported(exported, model, leaf_types=()):
    """The ``ExportedProgram`` of ``model`` as a GraphModule of the model's own leaf modules
    (Note [Lifting an exported graph]), with the input-size check (Note [Shapes of an exported
    graph])."""
    source = exported.module()
    gm = lift_graph(source, model, leaf_types)
    gm.register_forward_pre_hook(_input_check(gm.graph, source), with_kwargs=True)
    return gm


def lift_graph(source, model, leaf_types=(), origins=None):
    """The lifting of Note [Lifting an exported graph] on ``source``, the GraphModule of an
    ``ExportedProgram`` (``exported.module()``), for ``model``'s leaf modules (the model, or
    modules standing in for it: ``mqbench.pt2e``). ``origins``, when a dict, receives for each
    node of the lifted graph ``(the source node computing its value, [the source nodes it
    stands for])``: a lifted call stands for the nodes of the call."""
    old = source.graph
    calls = _leaf_calls(old, model, source, leaf_types)
    graph = Graph()
    graph._codegen = old._codegen
    env = {}
    root = dict(model.named_modules())
    for node in old.nodes:
        if node.op == "call_module" and node.target == "_guards_fn":
            continue  # export's own input check; InputShapeCheck replaces it
        call = calls.get(node)
        if call is not None:
            if node is call.output:
                rotations = input_rotations(call.module)
                if rotations:  # Note [Input rotations in a capture]
                    source_call = calls.get(call.input)
                    if source_call is None or not any(source_call.module is r for r in rotations):
                        raise ValueError(
                            f"the export capture did not record {call.path!r}'s input rotation "
                            "as a call of its own (its pre-hook's module is missing from the "
                            "graph's module stack): prepare the model with torch.export's "
                            "non-strict mode, as prepare_by_platform does")
                    root[call.path] = without_input_rotations(call.module)
                lifted = graph.create_node("call_module", call.path, (env[call.input],), {},
                                           name=call.path.replace(".", "_"))
                lifted.meta = dict(node.meta)
                env[node] = lifted
                if origins is not None:
                    origins[lifted] = (node, list(call.nodes))
            continue
        if node.op == "get_attr":
            if not any(u not in calls for u in node.users):
                continue  # read only by lifted modules
            try:
                value = _resolve(model, node.target)
            except AttributeError:  # a constant export lifted out of the forward
                value = _resolve(source, node.target)
            root[node.target] = value
        if node.op == "call_function":
            new = graph.create_node("call_function", node.target,
                                    torch.fx.map_arg(node.args, env.__getitem__),
                                    torch.fx.map_arg(node.kwargs, env.__getitem__),
                                    name=_short_name(node))
            new.meta = dict(node.meta)
            name = _fx_name(node)
            if name is not None:
                new.meta["mqbench_fx_name"] = name
        else:
            new = graph.node_copy(node, env.__getitem__)
        env[node] = new
        if origins is not None:
            origins[new] = (node, [node])
    graph.lint()
    _mark_constant_values(graph, root)
    root = duplicate_reused_nodes(graph, root)
    return GraphModule(root, graph, model.__class__.__name__)
