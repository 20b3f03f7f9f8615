"""Where a pt2e-exported graph gets its fake quantizers: the plan ``MQBenchQuantizer`` annotates.

Note [Placement by lifting, annotation on aten nodes]
pt2e hands the quantizer the exported graph (aten operators, every module inlined) and asks it
to annotate nodes: an output spec puts an observer after a node for all its users, an input
spec one on one edge. The placement is decided the way ``prepare_by_platform(capture="export")``
decides it, on the same IR, by the same rules: the graph is lifted
(``mqbench.capture.export.lift_graph``) to module calls, fused and QAT-typed, and the backend's
rule set plans the activation quantizers on it. Each planned node is annotated back on the aten
node that computes its value (a lifted call's output node; a fused chain's last node); each
layer the QAT swap would give a weight quantizer gets an input spec on its weight edge.

pt2e's ``exported.module()`` does not keep the model's module objects: its submodules are
plain containers of parameters. The rules need module types only (the IR carries a module's
MRO), and the lifting needs the parameters and the ``forward`` signature, so the lifted graph is
built over stand-ins: objects of the recorded class (``nn_module_stack`` names it) made without
running ``__init__``, holding the container's parameters and buffers. Fusion and the QAT swap
are applied to the stand-ins' types only (``ModelQuantizer._fuse_fx`` / ``_qat_swap_modules``
build real modules, which need the real attributes); nothing of the stand-in graph is kept.
A user fuser (``extra_fuse_dict``) reads attributes (``out_channels``, ``num_features``): when
there is one, torch.nn's conv / transposed conv / linear / BatchNorm stand-ins are real modules
rebuilt on the meta device from the parameters' shapes and the aten call's arguments
(``_rebuild``), the fuser runs on them, and its result's type is planned
(docs/design/capture-and-quantizer.md).
"""
import importlib

import torch
import torch.nn as nn

from mqbench.capture.export import lift_graph
from mqbench.custom_quantizer import quantizer_for
from mqbench.custom_quantizer.graph_ir import to_ir
from mqbench.custom_quantizer.model_quantizer import _FUSED
from mqbench.utils.module_types import canonical_type, is_conv1d_class



# aten operators of a layer whose weight (argument index) the QAT module fake-quantizes;
# ``addmm(bias, x, W)`` is transformers' Conv1D (Note [Conv1D on the aten graph])
_WEIGHT_ARG = {"conv1d": 1, "conv2d": 1, "conv3d": 1, "conv_transpose1d": 1,
               "conv_transpose2d": 1, "conv_transpose3d": 1, "linear": 1, "embedding": 0,
               "convolution": 1, "addmm": 2}

# Note [Conv1D on the aten graph]
# transformers' Conv1D (GPT-2's projections) is a Linear with its weight stored [in, out]:
# ``addmm(b, x, W)``. prepare_by_platform replaces it by the nn.Linear of the same function
# (capture/conv1d.py, docs/design/capture-and-quantizer.md). pt2e keeps the aten graph as it is,
# so here the Conv1D is planned as a Linear (its stand-in is an nn.Linear: the activation rules
# and the QAT swap see a Linear), its weight edge is addmm's argument 2, and the weight
# quantizer's channel axis is swapped: per output channel is axis 1 of [in, out], per group of
# input channels (and MX / NVFP4 blocks) axis 0.


def _op_name(node):
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None:
        return None
    return schema.name.partition("::")[2]


# ---- stand-ins --------------------------------------------------------------------------------

def _class_of(type_name):
    """The class an ``nn_module_stack`` entry names (``torch.nn.modules.conv.Conv2d``), or
    None for one that cannot be imported (a class defined in a function)."""
    if isinstance(type_name, type):
        return type_name
    module_name, _, cls_name = str(type_name).rpartition(".")
    if not module_name or "<" in type_name:
        return None
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError):
        return None
    return cls if isinstance(cls, type) and issubclass(cls, nn.Module) else None


class _Opaque(nn.Module):
    """Stands in for a module whose class cannot be imported, and for the containers no call
    records (``ModuleList``): not a leaf, so its children are tried."""


def _blank(cls):
    """An instance of ``cls`` made without its ``__init__`` (Note [Placement by lifting,
    annotation on aten nodes]): the type is what the rules read."""
    obj = cls.__new__(cls)
    nn.Module.__init__(obj)
    return obj


_LAYER_CALLS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                "conv_transpose3d", "linear", "batch_norm", "_native_batch_norm_legit",
                "_native_batch_norm_legit_no_training")


def _literal(call, index, default):
    args = call.args if call is not None else ()
    value = args[index] if len(args) > index else default
    return default if isinstance(value, torch.fx.Node) or value is None else value


def _rebuild(cls, container, call, conv1d=False):
    """A real torch.nn layer of exactly ``cls`` (conv, transposed conv, linear, BatchNorm; on the
    meta device) with the constructor arguments its parameters' shapes and its aten call's
    literal arguments give, or None for another class. A user fuser (``extra_fuse_dict``) reads
    a layer's attributes (``out_channels``, ``num_features``, ...), which a blank lacks."""
    params, buffers = container._parameters, container._buffers
    weight, bias = params.get("weight"), params.get("bias")
    name = (_op_name(call) or "").partition(".")[0] if call is not None else ""
    try:
        if cls in (nn.Conv1d, nn.Conv2d, nn.Conv3d) and weight is not None:
            groups = _literal(call, 6, 1)
            return cls(weight.shape[1] * groups, weight.shape[0], tuple(weight.shape[2:]),
                       stride=_literal(call, 3, 1), padding=_literal(call, 4, 0),
                       dilation=_literal(call, 5, 1), groups=groups, bias=bias is not None,
                       device="meta")
        if cls in (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d) and \
                weight is not None:
            groups = _literal(call, 6, 1)
            return cls(weight.shape[0], weight.shape[1] * groups, tuple(weight.shape[2:]),
                       stride=_literal(call, 3, 1), padding=_literal(call, 4, 0),
                       output_padding=_literal(call, 5, 0), groups=groups,
                       bias=bias is not None, dilation=_literal(call, 7, 1), device="meta")
        if cls is nn.Linear and weight is not None:
            out_f, in_f = reversed(weight.shape) if conv1d else weight.shape  # [in, out]
            return cls(in_f, out_f, bias=bias is not None, device="meta")
        if cls in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d):
            stat = weight if weight is not None else buffers.get("running_mean")
            momentum, eps = (6, 7) if name == "batch_norm" else (5, 6)
            return cls(stat.shape[0], eps=_literal(call, eps, 1e-5),
                       momentum=_literal(call, momentum, 0.1), affine=weight is not None,
                       track_running_stats="running_mean" in buffers, device="meta")
    except (TypeError, ValueError, AttributeError, IndexError, RuntimeError):
        return None
    return None


def _standins(gm, rebuild=False):
    """A module tree standing in for the exported model: at each path ``nn_module_stack``
    records, a blank of the recorded class with the parameters and buffers of ``gm``'s
    container at that path (``rebuild``: torch.nn layers rebuilt with their attributes,
    ``_rebuild``)."""
    types, calls = {}, {}
    for node in gm.graph.nodes:
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        for path, type_name in stack:
            types.setdefault(path, type_name)
        if stack and (_op_name(node) or "").partition(".")[0] in _LAYER_CALLS:
            calls.setdefault(stack[-1][0], node)
    root = nn.Module()
    for path in sorted((p for p in types if p), key=lambda p: p.count(".")):
        cls = _class_of(types[path]) or _Opaque
        conv1d = is_conv1d_class(cls)
        if conv1d:  # planned as the Linear of the same function (Note [Conv1D on the aten graph])
            cls = nn.Linear
        obj = _blank(cls)
        try:
            container = gm.get_submodule(path)
        except AttributeError:
            container = None
        if container is not None:
            rebuilt = _rebuild(cls, container, calls.get(path), conv1d) if rebuild else None
            if rebuilt is not None:
                obj = rebuilt
            obj._parameters = dict(container._parameters)
            obj._buffers = dict(container._buffers)
        owner = root
        *parents, leaf = path.split(".")
        for part in parents:  # containers no call records (ModuleList) are opaque
            if part not in owner._modules:
                owner._modules[part] = _Opaque()
            owner = owner._modules[part]
        owner._modules[leaf] = obj
    return root


# ---- the plan ---------------------------------------------------------------------------------

class _Plan:
    """Where the backend's quantizers go on an exported graph: ``acts`` ({aten node: (lifted
    name, rule details)}), ``weights`` ({(weight node, layer node): (lifted layer name, weight
    range or None)}), ``biases`` (Vitis's bias edges)."""

    def __init__(self):
        self.acts, self.weights, self.biases = {}, {}, {}
        self.act_names, self.weight_layers = [], []


def _fuse_types(lifted, origins, quantizer, is_qat):
    """``ModelQuantizer._fuse_fx`` on the stand-ins: the rule set's chains (and the user's
    ``extra_fuse_dict`` patterns) become one node of the fused type; its origin is the chain's
    last node."""
    from mqbench import _C
    from mqbench.custom_quantizer.model_quantizer import _call_fuser
    groups = _C.find_fusions(to_ir(lifted), quantizer.rules, quantizer._options())
    nodes = {n.name: n for n in lifted.graph.nodes}
    for names, kind in groups:
        fuser = None
        if kind.startswith("user:"):  # extra_fuse_dict's additional_fuser_method_mapping
            fuser = quantizer.additional_fuser_method_mapping[int(kind[5:])][1]
            fused_cls = fuser
        else:
            fused_cls = _FUSED.get(kind)
        if fused_cls is None:  # prepare_by_platform leaves it unfused too (with a warning)
            continue
        chain = [nodes[n] for n in names]
        parts = [lifted.get_submodule(n.target) if n.op == "call_module" else nn.ReLU()
                 for n in chain]
        if not is_qat and len(parts) > 1 and isinstance(parts[1], nn.modules.batchnorm._BatchNorm):
            # prepare_by_platform(is_qat=False) folds BN now (_fold_now): conv (+ ReLU)
            base = type(parts[0])
            if len(parts) == 3:
                fused_cls = {nn.Conv1d: _FUSED["ConvReLU1d"], nn.Conv2d: _FUSED["ConvReLU2d"],
                             nn.Conv3d: _FUSED["ConvReLU3d"], nn.Linear: _FUSED["LinearReLU"],
                             nn.ConvTranspose2d: _FUSED["ConvTransposeReLU2d"]}.get(base, base)
            else:
                fused_cls = base
            fuser = None
        if fuser is not None:
            # the fuser's own result (on the rebuilt layers): its type is what the rules read
            try:
                fused = _call_fuser(fuser, *parts)
            except Exception as error:
                raise ValueError(
                    f"MQBenchQuantizer: extra_fuse_dict's fuser {getattr(fuser, '__name__', fuser)}"
                    f" for {[type(p).__name__ for p in parts]} ({', '.join(names)}) failed on "
                    f"the exported graph's layers ({type(error).__name__}: {error}). pt2e keeps no "
                    "module objects: MQBenchQuantizer rebuilds torch.nn's Conv / ConvTranspose / "
                    "Linear / BatchNorm layers from their parameters and passes the others "
                    "without their attributes. Make the fuser read only types and parameters, "
                    "or prepare with prepare_by_platform(capture='export')") from error
            if not isinstance(fused, nn.Module):
                raise ValueError(f"MQBenchQuantizer: extra_fuse_dict's fuser for {names} "
                                 f"returned {type(fused).__name__}, not a module")
            _set(lifted, chain[0].target, fused)
        else:
            _set(lifted, chain[0].target, _blank(fused_cls))
        members = [m for n in chain for m in origins[n][1]]
        origins[chain[0]] = (origins[chain[-1]][0], members)
        chain[-1].replace_all_uses_with(chain[0])
        for node in reversed(chain[1:]):
            lifted.graph.erase_node(node)
    lifted.graph.lint()


def _set(root, target, module):
    parent, _, leaf = target.rpartition(".")
    (root.get_submodule(parent) if parent else root)._modules[leaf] = module


def _swap_types(lifted, quantizer):
    """``_qat_swap_modules`` on the stand-ins: {lifted layer node: its QAT class}."""
    mapping = quantizer._qat_mapping()
    layers = {}
    for node in lifted.graph.nodes:
        if node.op != "call_module":
            continue
        qat_cls = mapping.get(canonical_type(type(lifted.get_submodule(node.target))))
        if qat_cls is None or quantizer._excluded_module(node.target):
            continue
        _set(lifted, node.target, _blank(qat_cls))
        layers[node] = qat_cls
    return layers


def plan_pt2e(gm, backend, qconfig, extra_quantizer_dict=None, is_qat=True, leaf_types=(),
              extra_fuse_dict=None):
    """The backend's placement on ``gm`` (an ``ExportedProgram.module()``), as a ``_Plan``
    (Note [Placement by lifting, annotation on aten nodes])."""
    quantizer = quantizer_for(backend)(extra_quantizer_dict or {}, extra_fuse_dict or {})
    quantizer._qconfig = qconfig
    origins = {}
    standins = _standins(gm, rebuild=bool(quantizer.additional_fuser_method_mapping))
    lifted = lift_graph(gm, standins, leaf_types, origins)
    _fuse_types(lifted, origins, quantizer, is_qat)
    layers = _swap_types(lifted, quantizer)
    weight_plan = quantizer._plan(lifted)
    found = quantizer._find_act_quants(lifted)
    plan = _Plan()
    order = {n: i for i, n in enumerate(lifted.graph.nodes)}
    for node in sorted(dict.fromkeys(found), key=order.__getitem__):  # graph order
        source = origins[node][0]
        plan.acts[source] = (node.name, quantizer._act_details.get(node.name, {}))
        plan.act_names.append(node.name)
    bias_types = set()
    if quantizer.rules == "VitisQuantizer":
        from mqbench.custom_quantizer.vitis_quantizer import _BIAS_QUANTIZED
        bias_types = set(_BIAS_QUANTIZED)
    targets = weight_plan.get("weight_range_modules") or []
    for layer, qat_cls in layers.items():
        weight_range = None
        if weight_plan.get("weight_range") is not None and (not targets or
                                                            layer.target in targets):
            weight_range = tuple(weight_plan["weight_range"])
        for member in origins[layer][1]:
            op = (_op_name(member) or "").partition(".")[0]
            index = _WEIGHT_ARG.get(op)
            if index is None or len(member.args) <= index:
                continue
            weight = member.args[index]
            if not isinstance(weight, torch.fx.Node) or weight.op != "get_attr":
                continue
            # addmm: a Conv1D's [in, out] weight (Note [Conv1D on the aten graph])
            plan.weights[(weight, member)] = (layer.target, weight_range, qat_cls,
                                              op == "addmm")
            plan.weight_layers.append(layer.target)
            # Vitis's bias: with QAT, torchao's conv + BN rewrite owns the folded bias (row 144)
            if canonical_type(qat_cls) in bias_types and not is_qat and len(member.args) > 2 and \
                    isinstance(member.args[2], torch.fx.Node) and member.args[2].op == "get_attr":
                plan.biases[(member.args[2], member)] = layer.target
            break
    return plan
