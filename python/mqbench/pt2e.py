"""Every backend as a torchao pt2e ``Quantizer`` (``MQBenchQuantizer``), and the road from a
pt2e-prepared model to ``convert_deploy`` (``convert_pt2e_for_deploy``). docs/pt2e.md.

::

    from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e
    from mqbench.pt2e import MQBenchQuantizer
    gm = torch.export.export(model, (x,)).module()
    prepared = prepare_qat_pt2e(gm, MQBenchQuantizer(BackendType.Tensorrt))
    # prepared has MQBench's fake quantizers (LearnableFakeQuantize, ...) where
    # prepare_by_platform(model, BackendType.Tensorrt) puts them

Note [Placement by lifting, annotation on aten nodes]
pt2e hands the quantizer the exported graph (aten operators, every module inlined) and asks it
to annotate nodes: an output spec puts an observer after a node for all its users, an input
spec one on one edge. The placement is decided the way ``prepare_by_platform(capture="export")``
decides it, on the same IR, by the same rules (0014): the graph is lifted
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
(``_rebuild``), the fuser runs on them, and its result's type is planned (design 0019).

The specs' ``observer_or_fake_quant_ctr`` builds OUR fake quantizer from the backend's qconfig
(``get_qconfig_by_platform``), with the rule set's per-node ranges (Academic's 8-bit IO,
OPENVINO's unsigned ones, Vitis's quant types); the spec's own fields (dtype, range, qscheme) are
filled in for readers of the annotation but torchao's keyword arguments are not passed to our
constructors (they take the scheme from the qconfig).
"""
import copy
import importlib
import operator

import torch
import torch.nn as nn

from mqbench.capture.export import lift_graph
from mqbench.custom_quantizer import quantizer_for
from mqbench.custom_quantizer.graph_ir import to_ir
from mqbench.custom_quantizer.model_quantizer import _FUSED, _float_format
from mqbench.fake_quantize.mx import MXFakeQuantize, NVFP4FakeQuantize
from mqbench.prepare_by_platform import _backend, get_qconfig_by_platform, ParamsTable
from mqbench.utils.module_types import canonical_type, is_conv1d_class

try:
    from torchao.quantization.pt2e.quantizer import (QuantizationAnnotation, QuantizationSpec,
                                                     Quantizer)
except ImportError as _error:  # torchao is optional: pip install .[pt2e]
    _IMPORT_ERROR = _error
    Quantizer = object
else:
    _IMPORT_ERROR = None

__all__ = ["MQBenchQuantizer", "convert_pt2e_for_deploy", "is_pt2e_fake_quantizer"]

# aten operators of a layer whose weight (argument index) the QAT module fake-quantizes;
# ``addmm(bias, x, W)`` is transformers' Conv1D (Note [Conv1D on the aten graph])
_WEIGHT_ARG = {"conv1d": 1, "conv2d": 1, "conv3d": 1, "conv_transpose1d": 1,
               "conv_transpose2d": 1, "conv_transpose3d": 1, "linear": 1, "embedding": 0,
               "convolution": 1, "addmm": 2}

# Note [Conv1D on the aten graph]
# transformers' Conv1D (GPT-2's projections) is a Linear with its weight stored [in, out]:
# ``addmm(b, x, W)``. prepare_by_platform replaces it by the nn.Linear of the same function
# (capture/conv1d.py, design note 0025). pt2e keeps the aten graph as it is, so here the
# Conv1D is planned as a Linear (its stand-in is an nn.Linear: the activation rules and the
# QAT swap see a Linear), its weight edge is addmm's argument 2, and the weight quantizer's
# channel axis is swapped: per output channel is axis 1 of [in, out], per group of input
# channels (and MX / NVFP4 blocks) axis 0.


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


# ---- the quantizer ----------------------------------------------------------------------------

def _unwrap(factory):
    """(the class a factory builds, its bound keywords): ``with_args`` of a ``with_args``
    nests the factories; the outer keywords win."""
    keywords = {}
    while hasattr(factory, "p"):
        keywords = {**factory.p.keywords, **keywords}
        factory = factory.p.func
    return factory, keywords


class _Constructor:
    """A spec's ``observer_or_fake_quant_ctr``: our fake quantizer from the qconfig's factory.
    torchao calls ``ctr.with_args(**spec fields)()``; the fields restate the scheme the factory
    already has, so they are not passed on."""

    def __init__(self, factory, quant_type=None):
        self.factory, self.quant_type = factory, quant_type
        cls = _unwrap(factory)[0]
        self.__name__ = getattr(cls, "__name__", type(cls).__name__)

    def with_args(self, **kwargs):
        return self

    def __call__(self):
        fq = self.factory()
        if self.quant_type and hasattr(fq, "set_quant_type"):
            fq.set_quant_type(self.quant_type)
        return fq

    def __deepcopy__(self, memo):  # torchao deep-copies specs (dataclasses.asdict)
        return self

    def __repr__(self):
        return f"MQBench({self.__name__})"


def _spec(factory, quant_type=None):
    keywords = _unwrap(factory)[1]
    lo, hi = keywords.get("quant_min"), keywords.get("quant_max")
    if _float_format(factory) or lo is None:
        dtype, lo, hi = torch.float32, None, None
    else:
        dtype = next((d for d in (torch.uint8, torch.int8, torch.int16, torch.int32)
                      if torch.iinfo(d).min <= lo and hi <= torch.iinfo(d).max), torch.int32)
    ch_axis = keywords.get("ch_axis", -1)
    symmetric = keywords.get("qscheme", torch.per_tensor_affine) in (
        torch.per_tensor_symmetric, torch.per_channel_symmetric)
    if ch_axis is not None and ch_axis >= 0:
        qscheme = torch.per_channel_symmetric if symmetric else torch.per_channel_affine
    else:
        qscheme, ch_axis = (torch.per_tensor_symmetric if symmetric else
                            torch.per_tensor_affine), None
    return QuantizationSpec(dtype=dtype,
                            observer_or_fake_quant_ctr=_Constructor(factory, quant_type),
                            quant_min=lo, quant_max=hi, qscheme=qscheme, ch_axis=ch_axis)


class MQBenchQuantizer(Quantizer):
    """A torchao pt2e ``Quantizer`` placing ``backend``'s fake quantizers where
    ``prepare_by_platform`` places them (Note [Placement by lifting, annotation on aten nodes]).

    Args:
        backend: a ``BackendType`` (or its name): any of the 14, or a registered one.
        extra_qconfig_dict: as ``prepare_by_platform``'s (observers, fake quantizers, schemes;
            Academic's schemes are required).
        extra_quantizer_dict: as ``prepare_by_platform``'s (``exclude_node_name`` names the
            lifted graph's nodes, which are fx's names: ``layer1_0_conv1``).
        is_qat: None (default) reads the mode from the model, as pt2e's prepare functions run:
            a model with ``aten.batch_norm`` in training mode is QAT. Only the type of a fused
            conv + BN differs (it does not move a quantizer).
        leaf_module: classes lifted whole besides torch.nn's and mqbench.nn's.
        extra_fuse_dict: as ``prepare_by_platform``'s ``prepare_custom_config_dict
            ['extra_fuse_dict']`` (``additional_fuser_method_mapping``: the patterns fuse and the
            fuser's result type is planned, ``additional_qat_module_mapping``: which fused types
            get a weight quantizer). The fuser runs on the exported graph's layers: torch.nn's
            conv, transposed conv, linear and BatchNorm rebuilt from their parameters and calls
            (Note [Placement by lifting, annotation on aten nodes]); one that needs more raises a
            ValueError naming it.

    After ``annotate``, ``placement`` lists the planned quantizers by the names
    ``prepare_by_platform`` gives them (``layer1_0_conv1_post_act_fake_quantizer``, and
    ``<layer>.weight_fake_quant``).
    """

    def __init__(self, backend, extra_qconfig_dict=None, extra_quantizer_dict=None,
                 is_qat=None, leaf_module=(), extra_fuse_dict=None):
        if _IMPORT_ERROR is not None:
            raise ImportError("mqbench.pt2e needs torchao (>= 0.18): pip install mqbench[pt2e]"
                              f" ({_IMPORT_ERROR})")
        super().__init__()
        self.backend = _backend(backend)
        self.extra_qconfig_dict = dict(extra_qconfig_dict or {})
        self.extra_quantizer_dict = dict(extra_quantizer_dict or {})
        self.extra_fuse_dict = dict(extra_fuse_dict or {})
        # the keys are checked now, as prepare_by_platform checks them
        quantizer_for(self.backend)(self.extra_quantizer_dict, self.extra_fuse_dict)
        self.qconfig = get_qconfig_by_platform(self.backend, self.extra_qconfig_dict)
        self.is_qat = is_qat
        self.leaf_module = tuple(leaf_module)
        self.placement = []
        self._annotated = {}

    def _weight_factory(self, weight_range, qat_cls, in_out=False):
        factory = self.qconfig.weight
        if weight_range is not None and not _float_format(factory):
            factory = factory.with_args(quant_min=weight_range[0], quant_max=weight_range[1])
        axis = _unwrap(factory)[1].get("ch_axis", -1)
        if axis not in (-1, None) and issubclass(qat_cls, (nn.ConvTranspose2d, nn.Embedding)):
            # channels on weight dimension 1, as their QAT modules' quantizers
            # (deconv_weight_quantizer) and ModelQuantizer._weight_ranges have them
            factory = factory.with_args(ch_axis=1)
        elif in_out and axis in (0, 1):  # a Conv1D's [in, out] weight: the other axis
            factory = factory.with_args(ch_axis=1 - axis)
        if in_out and issubclass(_unwrap(factory)[0], (MXFakeQuantize, NVFP4FakeQuantize)):
            # MX / NVFP4 blocks run along the input channels: axis 0 of [in, out] (their default,
            # the last axis, is a Linear's [out, in] input channels)
            factory = factory.with_args(axis=0)
        return factory

    def annotate(self, model):
        is_qat = self.is_qat
        if is_qat is None:
            is_qat = any(_op_name(n) in ("batch_norm", "_native_batch_norm_legit",
                                         "cudnn_batch_norm") and
                         len(n.args) > 5 and n.args[5] is True for n in model.graph.nodes)
        plan = plan_pt2e(model, self.backend, self.qconfig, self.extra_quantizer_dict,
                         is_qat, self.leaf_module, self.extra_fuse_dict)
        annotations = {}

        def annotation(node):
            if node not in annotations:
                annotations[node] = QuantizationAnnotation(_annotated=True)
            return annotations[node]

        for node, (name, detail) in plan.acts.items():
            factory = self.qconfig.activation
            if detail.get("quant_min") is not None and not _float_format(factory):
                factory = factory.with_args(quant_min=detail["quant_min"],
                                            quant_max=detail["quant_max"])
            quant_type = detail.get("quant_type")
            if self.backend.value == "Vitis" and node.op == "placeholder":
                quant_type = "input"  # VitisQuantizer._set_quant_type: a model input's
            annotation(node).output_qspec = _spec(factory, quant_type)
        vitis = self.backend.value == "Vitis"
        for (weight, layer), (name, weight_range, qat_cls, in_out) in plan.weights.items():
            factory = self._weight_factory(weight_range, qat_cls, in_out)
            specs = annotation(layer).input_qspec_map
            if weight is not layer.args[0] and isinstance(layer.args[0], torch.fx.Node):
                # torchao's QAT conv + BN rewrite reads a conv's map in order (input, weight,
                # bias): the input edge comes first, without a quantizer (None)
                specs.setdefault(layer.args[0], None)
            specs[weight] = _spec(factory, "param" if vitis else None)
        from mqbench.quantization.default_bias_fake_quant import bias_fake_quantizer
        for (bias, layer), name in plan.biases.items():
            annotation(layer).input_qspec_map[bias] = _spec(bias_fake_quantizer, "param")
        for node, value in annotations.items():
            node.meta["quantization_annotation"] = value
        self.placement = [f"{n}_post_act_fake_quantizer" for n in plan.act_names] + \
            [f"{n}.weight_fake_quant" for n in plan.weight_layers] + \
            [f"{n}.bias_fake_quant" for n in plan.biases.values()]
        self._annotated = annotations
        return model

    def validate(self, model):
        for node in model.graph.nodes:
            ann = node.meta.get("quantization_annotation")
            if ann is None or node not in self._annotated:
                continue
            for arg in ann.input_qspec_map:
                if arg not in node.all_input_nodes:
                    raise ValueError(f"MQBenchQuantizer: the annotation of {node.name} names "
                                     f"{arg.name}, which is not one of its inputs")


# ---- deploy -----------------------------------------------------------------------------------

def is_pt2e_fake_quantizer(module):
    from mqbench.fake_quantize.quantize_base import QuantizeBase
    return isinstance(module, QuantizeBase)


# Note [Folding torchao's QAT conv + BN at deploy]
# prepare_qat_pt2e rewrites each conv + BN (torchao's _fuse_conv_bn_qat, before our annotation
# is turned into modules) to
#     sf = bn_weight / sqrt(running_var + eps)
#     y  = conv(x, wfq(w * sf.reshape(w_shape)), zeros_like(b) or None) / sf.reshape(c_shape)
#     y  = y + b.reshape(c_shape)                        (only with a conv bias)
#     y  = batch_norm(y, running_mean, running_var, bn_weight, bn_bias, training, momentum, eps)
# where wfq is our weight fake quantizer. torchao's own fold (_fold_conv_bn_qat, in convert_pt2e)
# matches its quantize / dequantize ops in place of wfq, so it never fires on our modules. In
# eval mode (running statistics) the chain equals a conv with
#     w' = w * sf.reshape(w_shape)          (the tensor wfq was calibrated and trained on)
#     b' = (b - running_mean) * bn_weight / sqrt(running_var + eps) + bn_bias
# which is MQBench's deploy merge (convert_merge_bn, fusion_method.fold_bn): the weight fake
# quantizer keeps its qparams and now reads the folded weight parameter. w' is computed by the
# graph's own operators (bit-identical to what wfq saw), so the fake-quantized weight is the
# same; the output differs from the unfolded graph by float rounding only.

_CONV_OPS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
             "conv_transpose3d")


def _op(node, *names):
    return isinstance(node, torch.fx.Node) and (_op_name(node) or "").partition(".")[0] in names


def _single_user(node):
    return len(node.users) == 1


_MAX_EVAL_DEPTH = 64


def _evaluate(model, node, depth=0):
    """The value of a node computed from get_attr nodes and constants only (a short chain: the
    walk stops with a ValueError past _MAX_EVAL_DEPTH nodes rather than recursing on)."""
    if depth > _MAX_EVAL_DEPTH:
        raise ValueError(f"convert_pt2e_for_deploy: the folded weight's chain at {node.name} is "
                         f"deeper than {_MAX_EVAL_DEPTH} nodes")
    if node.op == "get_attr":
        return _attr(model, node.target)
    args = torch.fx.node.map_arg(node.args, lambda n: _evaluate(model, n, depth + 1))
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: _evaluate(model, n, depth + 1))
    return node.target(*args, **kwargs)


def _attr(model, target):
    owner, _, name = target.rpartition(".")
    return getattr(model.get_submodule(owner) if owner else model, name)


def _match_qat_conv_bn(model, bn):
    """The nodes of torchao's QAT conv + BN chain ending at ``bn`` (Note [Folding torchao's QAT
    conv + BN at deploy]), or None where ``bn`` is not the end of one."""
    from mqbench.fake_quantize.quantize_base import QuantizeBase
    eps_index = 7 if _op(bn, "batch_norm") else 6
    if len(bn.args) <= eps_index or (eps_index == 7 and bn.args[5] is not False):
        return None
    gamma, beta, mean, var = bn.args[1:5]
    if not all(isinstance(n, torch.fx.Node) and n.op == "get_attr"
               for n in (gamma, beta, mean, var)):
        return None
    x, conv_bias = bn.args[0], None
    if _op(x, "add") and _single_user(x) and _op(x.args[1], "reshape") and \
            getattr(x.args[1].args[0], "op", None) == "get_attr":
        x, conv_bias = x.args[0], x.args[1].args[0]
    if not (_op(x, "div") and _single_user(x) and _op(x.args[1], "reshape")):
        return None
    sf, conv = x.args[1].args[0], x.args[0]
    # sf = gamma / sqrt(var + eps): the same BN's parameters
    if not (_op(sf, "div") and sf.args[0] is gamma and _op(sf.args[1], "sqrt") and
            _op(sf.args[1].args[0], "add") and sf.args[1].args[0].args[0] is var):
        return None
    if not (_op(conv, *_CONV_OPS) and _single_user(conv) and len(conv.args) >= 2):
        return None
    scaled = conv.args[1]  # the weight fake quantizer's input (or, unquantized, the weight)
    if isinstance(scaled, torch.fx.Node) and scaled.op == "call_module" and \
            isinstance(model.get_submodule(scaled.target), QuantizeBase):
        scaled = scaled.args[0]
    if not (_op(scaled, "mul") and _single_user(scaled) and
            getattr(scaled.args[0], "op", None) == "get_attr" and _op(scaled.args[1], "reshape")
            and scaled.args[1].args[0] is sf):
        return None
    bias_arg = conv.args[2] if len(conv.args) > 2 else None
    if bias_arg is not None and not _op(bias_arg, "zeros_like"):
        return None
    eps = sf.args[1].args[0].args[1]
    if not isinstance(eps, (int, float)) or float(eps) != float(bn.args[eps_index]):
        return None  # torchao writes one eps in both places; another graph is not folded
    return dict(bn=bn, conv=conv, scaled=scaled, weight=scaled.args[0], conv_bias=conv_bias,
                gamma=gamma, beta=beta, mean=mean, var=var, eps=float(bn.args[eps_index]))


def _fold_qat_conv_bn(model):
    """Folds each of torchao's QAT conv + BN chains into its conv, in place (Note [Folding
    torchao's QAT conv + BN at deploy]). Returns the number folded."""
    graph, folded = model.graph, 0
    for bn in list(graph.nodes):
        if not _op(bn, "batch_norm", "_native_batch_norm_legit_no_training"):
            continue
        m = _match_qat_conv_bn(model, bn)
        if m is None:
            continue
        if not _op(bn, "batch_norm") and any(  # the tuple form: only its output 0 is read
                u.target is not operator.getitem or u.args[1] != 0 for u in bn.users):
            continue
        with torch.no_grad():
            w_folded = _evaluate(model, m["scaled"])  # the graph's own w * sf
            gamma, beta, mean, var = (_attr(model, m[k].target)
                                      for k in ("gamma", "beta", "mean", "var"))
            b = _attr(model, m["conv_bias"].target) if m["conv_bias"] is not None else \
                torch.zeros_like(mean)
            b_folded = (b - mean) * (gamma / torch.sqrt(var + m["eps"])) + beta
        weight_target = m["weight"].target
        owner_path, _, _ = weight_target.rpartition(".")
        owner = model.get_submodule(owner_path) if owner_path else model
        if m["conv_bias"] is not None:
            bias_target = m["conv_bias"].target
        elif not hasattr(owner, "bias"):
            bias_target = f"{owner_path}.bias" if owner_path else "bias"
        else:
            bias_target = weight_target + "_bias"
        _set_parameter(model, weight_target, w_folded)
        _set_parameter(model, bias_target, b_folded)
        conv = m["conv"]
        with graph.inserting_before(conv):
            bias_node = graph.get_attr(bias_target)
        args = list(conv.args) + [None] * (3 - len(conv.args))
        args[2] = bias_node
        conv.args = tuple(args)
        m["scaled"].replace_all_uses_with(m["weight"])
        if _op(bn, "batch_norm"):
            bn.replace_all_uses_with(conv)
        else:
            for user in list(bn.users):
                user.replace_all_uses_with(conv)
                graph.erase_node(user)
        # the BN's num_batches_tracked update (an in-place op nothing reads) goes with it
        tracked = m["gamma"].target.rpartition(".")[0] + ".num_batches_tracked"
        tracked = tracked.lstrip(".")
        for node in list(graph.nodes):
            if _op(node, "add_") and not node.users and \
                    getattr(node.args[0], "target", None) == tracked:
                graph.erase_node(node)
        folded += 1
    if folded:
        graph.eliminate_dead_code()
        graph.lint()
        model.delete_all_unused_submodules()
        model.recompile()
    return folded


def _set_parameter(model, target, value):
    owner, _, name = target.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    if name in module._buffers:
        del module._buffers[name]
    module._parameters[name] = nn.Parameter(value.detach().clone())


def convert_pt2e_for_deploy(model):
    """The model ``convert_deploy`` takes, from a pt2e-prepared (and calibrated or trained)
    one: a copy in eval mode (torchao's ``move_exported_model_to_eval`` for the graph's
    BatchNorm and dropout, ``nn.Module.eval`` for the modules, and ``train`` / ``eval`` callable
    again, as ``convert_deploy`` calls them), without export's input guard (``_guards_fn``),
    and with the BatchNorm of each of ``prepare_qat_pt2e``'s conv + BN chains folded into the
    conv's weight and bias (MQBench's deploy merge; Note [Folding torchao's QAT conv + BN at
    deploy]): the weight fake quantizer keeps its qparams and reads the folded weight.
    Our fake quantizers stay as they are: ``convert_deploy`` exports them as for a
    ``prepare_by_platform`` model. torchao's ``convert_pt2e`` is not for these models (it turns
    torchao's observers into its own quantize / dequantize ops)."""
    from torchao.quantization.pt2e import move_exported_model_to_eval
    model = copy.deepcopy(model)
    move_exported_model_to_eval(model)  # BatchNorm and dropout ops of the graph
    _fold_qat_conv_bn(model)
    # torchao forbids train() / eval() on exported models (their graph does not switch);
    # convert_deploy calls eval() for the modules (our fake quantizers): give nn.Module's back
    for name in ("train", "eval"):
        model.__dict__.pop(name, None)
    model.eval()
    graph = model.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            graph.erase_node(node)
    if hasattr(model, "_guards_fn"):
        delattr(model, "_guards_fn")
    graph.lint()
    model.recompile()
    return model
