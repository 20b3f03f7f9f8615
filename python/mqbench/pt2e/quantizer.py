"""``MQBenchQuantizer``: the torchao pt2e ``Quantizer`` that annotates the plan of ``planning``.

The specs' ``observer_or_fake_quant_ctr`` builds OUR fake quantizer from the backend's qconfig
(``get_qconfig_by_platform``), with the rule set's per-node ranges (Academic's 8-bit IO,
OPENVINO's unsigned ones, Vitis's quant types); the spec's own fields (dtype, range, qscheme) are
filled in for readers of the annotation but torchao's keyword arguments are not passed to our
constructors (they take the scheme from the qconfig).
"""
import torch
import torch.nn as nn

from mqbench.custom_quantizer import quantizer_for
from mqbench.custom_quantizer.model_quantizer import _float_format
from mqbench.fake_quantize.mx import MXFakeQuantize, NVFP4FakeQuantize
from mqbench.prepare_by_platform import _backend, get_qconfig_by_platform

try:
    from torchao.quantization.pt2e.quantizer import (QuantizationAnnotation, QuantizationSpec,
                                                     Quantizer)
except ImportError as _error:  # torchao is optional: pip install .[pt2e]
    _IMPORT_ERROR = _error
    Quantizer = object
else:
    _IMPORT_ERROR = None

from mqbench.pt2e.planning import _op_name, plan_pt2e


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
