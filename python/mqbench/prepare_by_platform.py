"""Backends and their quantization configuration (MQBench's ``mqbench.prepare_by_platform``).

``BackendType`` and ``ParamsTable`` are built from the C++ backend registry
(``include/mqbench/backend.h``, one file per backend under ``src/backends/``), so Python and C++
agree by construction. :func:`register_backend` adds a backend from Python (see
docs/add_a_backend.md).

Example::

    from mqbench.prepare_by_platform import BackendType, get_qconfig_by_platform
    qconfig = get_qconfig_by_platform(BackendType.Tensorrt, {"a_observer": "MSEObserver"})
    act_fq = qconfig.activation()      # LearnableFakeQuantize(MSEObserver, [-127, 127])
"""
import copy
import enum
import inspect
import itertools

import torch

from mqbench import _C
from mqbench._base import QConfig, is_fake_quantizer
from mqbench.fake_quantize import (AdaRoundFakeQuantize, DoReFaFakeQuantize, DSQFakeQuantize,
                                   FixedFakeQuantize, FP8FakeQuantize, GroupFakeQuantize,
                                   LearnableFakeQuantize, LearnableFP8FakeQuantize,
                                   LearnableGroupFakeQuantize, MXFakeQuantize, NNIEFakeQuantize,
                                   NVFP4FakeQuantize,
                                   PACTFakeQuantize, PerTokenFakeQuantize, QDropFakeQuantize,
                                   QuantizeBase,
                                   TqtFakeQuantize)
from mqbench.observer import (ClipStdObserver, EMAMinMaxObserver, EMAMSEObserver,
                              EMAQuantileObserver, LSQObserver, LSQPlusObserver,
                              MinMaxFloorObserver, MinMaxObserver, MSEObserver, ObserverBase,
                              PoTModeObserver, GroupMinMaxObserver, GroupEMAMinMaxObserver,
                              GroupMSEObserver, GroupEMAMSEObserver)
from mqbench.custom_quantizer import class_of_rules, quantizer_for
from mqbench.capture import capture
from mqbench.capture.fx import duplicate_reused_nodes, prepare_constant_dict
from mqbench.custom_quantizer.fused_experts import quantize_fused_experts
from mqbench.custom_quantizer.kv_cache import insert_kv_cache_quantizers, kv_cache_scheme_of
from mqbench.custom_quantizer.tracer import CustomedTracer
from mqbench.nn.modules.functional import swap_float_functionals
from mqbench.scheme import QuantizeScheme
from mqbench.utils.arguments import check_arg
from mqbench.utils.config import UnknownNameError, check_keys, unknown_name
from mqbench.utils.logger import logger
from mqbench.utils.registry import DEFAULT_MODEL_QUANTIZER

__all__ = ["BackendType", "ParamsTable", "ObserverDict", "FakeQuantizeDict",
           "get_qconfig_by_platform", "register_backend", "UnknownNameError",
           "prepare_by_platform", "CustomedTracer", "duplicate_reused_nodes",
           "prepare_constant_dict"]


ObserverDict = {
    "MinMaxObserver": MinMaxObserver,
    "EMAMinMaxObserver": EMAMinMaxObserver,
    "MinMaxFloorObserver": MinMaxFloorObserver,
    "PoTModeObserver": PoTModeObserver,
    "EMAQuantileObserver": EMAQuantileObserver,
    "ClipStdObserver": ClipStdObserver,
    "LSQObserver": LSQObserver,
    "LSQPlusObserver": LSQPlusObserver,
    "MSEObserver": MSEObserver,
    "EMAMSEObserver": EMAMSEObserver,
    "GroupMinMaxObserver": GroupMinMaxObserver,
    "GroupEMAMinMaxObserver": GroupEMAMinMaxObserver,
    "GroupMSEObserver": GroupMSEObserver,
    "GroupEMAMSEObserver": GroupEMAMSEObserver,
}

FakeQuantizeDict = {
    "FixedFakeQuantize": FixedFakeQuantize,
    "LearnableFakeQuantize": LearnableFakeQuantize,
    "NNIEFakeQuantize": NNIEFakeQuantize,
    "DoReFaFakeQuantize": DoReFaFakeQuantize,
    "DSQFakeQuantize": DSQFakeQuantize,
    "PACTFakeQuantize": PACTFakeQuantize,
    "TqtFakeQuantize": TqtFakeQuantize,
    "AdaRoundFakeQuantize": AdaRoundFakeQuantize,
    "QDropFakeQuantize": QDropFakeQuantize,
    # formats (docs/formats.md); get_qconfig_by_platform picks them by the scheme
    "FP8FakeQuantize": FP8FakeQuantize,
    "LearnableFP8FakeQuantize": LearnableFP8FakeQuantize,
    "GroupFakeQuantize": GroupFakeQuantize,
    "LearnableGroupFakeQuantize": LearnableGroupFakeQuantize,
    "MXFakeQuantize": MXFakeQuantize,
    "NVFP4FakeQuantize": NVFP4FakeQuantize,
    "PerTokenFakeQuantize": PerTokenFakeQuantize,
}

# The format twins of the integer fake quantizers: (scheme kind, MQBench's class) -> the class
# that runs that format ("fp8": QuantizeScheme(dtype="fp8_*"); "group": group_size set).
FORMAT_FAKEQUANTIZE = {
    ("fp8", FixedFakeQuantize): FP8FakeQuantize,
    ("fp8", LearnableFakeQuantize): LearnableFP8FakeQuantize,
    ("group", FixedFakeQuantize): GroupFakeQuantize,
    ("group", LearnableFakeQuantize): LearnableGroupFakeQuantize,
    # MX and NVFP4 scales come from each block of the data (NVFP4's per-tensor one from the
    # observed amax): no learnable scale, so both of MQBench's classes map to the one module.
    ("mxfp8_e4m3", FixedFakeQuantize): MXFakeQuantize,
    ("mxfp8_e4m3", LearnableFakeQuantize): MXFakeQuantize,
    ("mxfp6_e3m2", FixedFakeQuantize): MXFakeQuantize,
    ("mxfp6_e3m2", LearnableFakeQuantize): MXFakeQuantize,
    ("mxfp6_e2m3", FixedFakeQuantize): MXFakeQuantize,
    ("mxfp6_e2m3", LearnableFakeQuantize): MXFakeQuantize,
    ("mxfp4", FixedFakeQuantize): MXFakeQuantize,
    ("mxfp4", LearnableFakeQuantize): MXFakeQuantize,
    ("nvfp4", FixedFakeQuantize): NVFP4FakeQuantize,
    ("nvfp4", LearnableFakeQuantize): NVFP4FakeQuantize,
}


def _format_kind(scheme):
    if scheme.dtype in ("fp8_e4m3", "fp8_e5m2"):
        return "fp8"
    if scheme.group_size is not None:
        return "group"
    return scheme.dtype if scheme.is_float else None


def format_fakequantize(fakequantize, scheme, key):
    """The fake quantizer class that runs ``scheme``'s format: ``fakequantize`` itself for
    MQBench's integer schemes (unchanged), or its format twin (FixedFakeQuantize ->
    FP8FakeQuantize / GroupFakeQuantize, LearnableFakeQuantize -> LearnableFP8FakeQuantize /
    LearnableGroupFakeQuantize); a class already of the format is kept. A dynamic scheme
    (``dynamic="per_token"``) takes PerTokenFakeQuantize whatever the backend's class."""
    if getattr(scheme, "dynamic", None) == "per_token":
        if fakequantize is not PerTokenFakeQuantize:
            logger.info(f"{key}: {fakequantize.__name__} -> PerTokenFakeQuantize (the scheme is "
                        "dynamic per token)")
        return PerTokenFakeQuantize
    kind = _format_kind(scheme)
    if kind is None:
        return fakequantize
    twins = {cls: twin for (k, cls), twin in FORMAT_FAKEQUANTIZE.items() if k == kind}
    if fakequantize in twins.values():
        return fakequantize
    for cls, twin in twins.items():
        if fakequantize is cls:
            return twin
    raise ValueError(f"extra_qconfig_dict['{key}']: {fakequantize.__name__} has no {kind} variant "
                     f"for dtype {scheme.dtype!r}" +
                     (f" with group_size {scheme.group_size}" if kind == "group" else "") +
                     f"; use one of {sorted(c.__name__ for c in twins) or 'none yet'}")

EXTRA_QCONFIG_KEYS = ("w_observer", "a_observer", "w_fakequantize", "a_fakequantize",
                      "w_fakeq_params", "a_fakeq_params", "w_qscheme", "a_qscheme",
                      "w_observer_extra_args", "a_observer_extra_args")


class BackendType(enum.Enum):
    """The deploy backends; each value is the member's name, as in MQBench. Members come from
    the C++ registry: MQBench's 14, then any registered with :func:`register_backend`."""


ParamsTable = {}


def _add_member(name):
    """Adds a member to BackendType (enum classes are closed once created; the registry is not)."""
    member = object.__new__(BackendType)
    member._name_ = name
    member._value_ = name
    member.__objclass__ = BackendType
    member.__init__(name)
    type.__setattr__(BackendType, name, member)
    BackendType._member_map_[name] = member
    BackendType._value2member_map_[name] = member
    BackendType._member_names_.append(name)
    return member


def _params_from_spec(spec):
    params = {"qtype": spec["qtype"]}
    if spec["w_qscheme"] is not None:
        params["w_qscheme"] = QuantizeScheme.from_dict(spec["w_qscheme"])
        params["a_qscheme"] = QuantizeScheme.from_dict(spec["a_qscheme"])
    for key, table in (("default_weight_quantize", FakeQuantizeDict),
                       ("default_act_quantize", FakeQuantizeDict),
                       ("default_weight_observer", ObserverDict),
                       ("default_act_observer", ObserverDict)):
        # A name known only to C++ (no Python class) stays out: get_qconfig_by_platform then
        # asks the user to choose one.
        if spec[key] and spec[key] in table:
            params[key] = table[spec[key]]
    return params


def _sync_from_registry():
    """Adds to BackendType / ParamsTable every backend registered in C++ but not yet here."""
    specs = {name: _C.get_backend(name) for name in _C.backend_names()}
    for name, spec in specs.items():
        if name not in BackendType.__members__:
            _add_member(name)
    for name, spec in specs.items():
        backend = BackendType[name]
        if backend in ParamsTable or spec["params_of"]:
            continue
        ParamsTable[backend] = _params_from_spec(spec)
    # Backends that share another's parameters share the very dict object, as in MQBench.
    for name, spec in specs.items():
        if spec["params_of"] and BackendType[name] not in ParamsTable:
            ParamsTable[BackendType[name]] = ParamsTable[BackendType[spec["params_of"]]]
    # Each backend's quantizer class, as MQBench's modules register theirs; a class the user
    # registered first stays.
    for name, spec in specs.items():
        DEFAULT_MODEL_QUANTIZER.setdefault(BackendType[name],
                                           class_of_rules(spec["model_quantizer"]))


def _class_name(cls, base, table, what):
    """Registers a class by name in `table` (and with C++) if new; returns its name."""
    if cls is None:
        return None
    if isinstance(cls, str):
        if cls not in table:
            raise unknown_name(cls, sorted(table), what)
        return cls
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        raise TypeError(f"{what} must be a subclass of {base.__name__} or a registered name, "
                        f"got {cls!r}")
    name = cls.__name__
    if table.get(name) is not cls:
        if name in table:
            raise ValueError(f"a different {what} named {name!r} is already registered")
        table[name] = cls
        (_C.register_fake_quantize_name if base is QuantizeBase else _C.register_observer_name)(name)
    return name


def register_backend(name, qtype="affine", w_qscheme=None, a_qscheme=None,
                     default_weight_quantize=None, default_act_quantize=None,
                     default_weight_observer=None, default_act_observer=None,
                     model_quantizer="ModelQuantizer", deploy_translator="", params_of=None):
    """Registers a new backend and returns its new ``BackendType`` member.

    Fake quantizers and observers may be given as registered names or as classes (a class not
    yet known is registered under its ``__name__``). ``w_qscheme``/``a_qscheme`` are
    :class:`QuantizeScheme` objects (or None for an Academic-style backend whose users supply
    them); ``params_of`` makes the backend share another backend's parameters.

    Example::

        MyChip = register_backend("MyChip", w_qscheme=QuantizeScheme(per_channel=True, bit=4),
                                  a_qscheme=QuantizeScheme(bit=8),
                                  default_weight_quantize=LearnableFakeQuantize,
                                  default_act_quantize=LearnableFakeQuantize,
                                  default_weight_observer=MinMaxObserver,
                                  default_act_observer=EMAMinMaxObserver)
    """
    for key, scheme in (("w_qscheme", w_qscheme), ("a_qscheme", a_qscheme)):
        if getattr(scheme, "dynamic", None) is not None:
            raise ValueError(f"register_backend: {key} dynamic={scheme.dynamic!r} is not a "
                             "registered scheme; give it at prepare time "
                             "(extra_qconfig_dict['a_qscheme'])")
    spec = {
        "name": name, "qtype": qtype,
        "w_qscheme": w_qscheme.to_dict() if w_qscheme is not None else None,
        "a_qscheme": a_qscheme.to_dict() if a_qscheme is not None else None,
        "default_weight_quantize": _class_name(default_weight_quantize, QuantizeBase,
                                               FakeQuantizeDict, "fake quantizer"),
        "default_act_quantize": _class_name(default_act_quantize, QuantizeBase, FakeQuantizeDict,
                                            "fake quantizer"),
        "default_weight_observer": _class_name(default_weight_observer, ObserverBase,
                                               ObserverDict, "observer"),
        "default_act_observer": _class_name(default_act_observer, ObserverBase, ObserverDict,
                                            "observer"),
        "model_quantizer": model_quantizer, "deploy_translator": deploy_translator,
        "params_of": params_of.value if isinstance(params_of, BackendType) else params_of,
    }
    _C.register_backend(spec)
    _sync_from_registry()
    return BackendType[name]


def _backend(deploy_backend):
    if isinstance(deploy_backend, BackendType):
        return deploy_backend
    _sync_from_registry()  # a backend registered from C++ after import
    if isinstance(deploy_backend, str) and deploy_backend in BackendType.__members__:
        return BackendType[deploy_backend]
    raise unknown_name(deploy_backend, list(BackendType.__members__), "backend")


def _lookup(table, name, what):
    if not name:
        return None
    if name not in table:
        raise unknown_name(name, list(table), what)
    return table[name]


def _with_extra_args(scheme, extra_args):
    """The scheme with extra observer arguments merged in, on a copy: MQBench mutated the shared
    ParamsTable scheme, leaking the arguments into later calls (docs/compatibility.md)."""
    if not extra_args:
        return scheme
    scheme = copy.deepcopy(scheme)
    scheme.kwargs.update(extra_args)
    return scheme


def get_qconfig_by_platform(deploy_backend, extra_qparams):
    """The QConfig (activation and weight fake-quantizer factories) of a backend.

    Args:
        deploy_backend: a :class:`BackendType` (or its name).
        extra_qparams: MQBench's ``extra_qconfig_dict``: ``w_observer``, ``a_observer``,
            ``w_fakequantize``, ``a_fakequantize`` (names from ObserverDict / FakeQuantizeDict),
            ``w_fakeq_params``, ``a_fakeq_params`` (extra fake-quantizer kwargs),
            ``w_qscheme``, ``a_qscheme`` (dicts of QuantizeScheme arguments; required for
            Academic), ``w_observer_extra_args``, ``a_observer_extra_args``.

    Returns:
        a ``QConfig(activation=..., weight=...)`` (``mqbench._base.QConfig``, torch's fields)
        whose members are
        ``with_args`` factories; ``qconfig.weight.p.keywords`` holds their arguments.
    """
    backend = _backend(deploy_backend)
    extra_qparams = dict(extra_qparams or {})
    check_keys(extra_qparams, EXTRA_QCONFIG_KEYS, "extra_qconfig_dict")
    w_observer = _lookup(ObserverDict, extra_qparams.get("w_observer"), "observer")
    a_observer = _lookup(ObserverDict, extra_qparams.get("a_observer"), "observer")
    w_fakequantize = _lookup(FakeQuantizeDict, extra_qparams.get("w_fakequantize"), "fakequantize")
    a_fakequantize = _lookup(FakeQuantizeDict, extra_qparams.get("a_fakequantize"), "fakequantize")
    backend_params = ParamsTable[backend]

    # NNIE must use NNIEFakeQuantize; only its observers can change.
    if backend_params["qtype"] == "nnie":
        w_observer = w_observer or backend_params["default_weight_observer"]
        a_observer = a_observer or backend_params["default_act_observer"]
        w_config = backend_params["default_weight_quantize"].with_args(
            observer=w_observer, **backend_params["w_qscheme"].to_observer_params())
        a_config = backend_params["default_act_quantize"].with_args(
            observer=a_observer, **backend_params["a_qscheme"].to_observer_params())
        return QConfig(activation=a_config, weight=w_config)

    if "w_qscheme" not in backend_params:  # Academic-style: the user gives the schemes
        for key in ("w_qscheme", "a_qscheme"):
            if key not in extra_qparams:
                raise KeyError(f"{backend.value} needs extra_qconfig_dict['{key}'], a dict of "
                               "QuantizeScheme arguments (bit, symmetry, per_channel, pot_scale)")
        w_qscheme = QuantizeScheme(**extra_qparams["w_qscheme"])
        a_qscheme = QuantizeScheme(**extra_qparams["a_qscheme"])
    else:
        w_qscheme = backend_params["w_qscheme"]
        a_qscheme = backend_params["a_qscheme"]
        if extra_qparams.get("w_qscheme") is not None:
            w_qscheme = QuantizeScheme(**extra_qparams["w_qscheme"])
            logger.info("Weight Quant Scheme is overrided!")
        if extra_qparams.get("a_qscheme") is not None:
            a_qscheme = QuantizeScheme(**extra_qparams["a_qscheme"])
            logger.info("Activation Quant Scheme is overrided!")
    if w_qscheme.dynamic is not None:
        raise ValueError(f"extra_qconfig_dict['w_qscheme']: dynamic={w_qscheme.dynamic!r} is "
                         "for activations; weights have fixed scales")
    if a_qscheme.group_size is not None:
        raise ValueError(f"extra_qconfig_dict['a_qscheme']: group_size "
                         f"({a_qscheme.group_size}) is for weights (group-wise weight-only "
                         "formats); activations take a scale per tensor")
    w_qscheme = _with_extra_args(w_qscheme, extra_qparams.get("w_observer_extra_args"))
    a_qscheme = _with_extra_args(a_qscheme, extra_qparams.get("a_observer_extra_args"))

    w_fakequantize = w_fakequantize or backend_params.get("default_weight_quantize")
    a_fakequantize = a_fakequantize or backend_params.get("default_act_quantize")
    w_observer = w_observer or backend_params.get("default_weight_observer")
    a_observer = a_observer or backend_params.get("default_act_observer")
    for value, key, table in ((w_fakequantize, "w_fakequantize", FakeQuantizeDict),
                              (a_fakequantize, "a_fakequantize", FakeQuantizeDict),
                              (w_observer, "w_observer", ObserverDict),
                              (a_observer, "a_observer", ObserverDict)):
        if value is None:
            raise UnknownNameError(f"{backend.value} has no default {key}; set "
                                   f"extra_qconfig_dict['{key}'] to one of {list(table)}")
    w_fakequantize = format_fakequantize(w_fakequantize, w_qscheme, "w_fakequantize")
    a_fakequantize = format_fakequantize(a_fakequantize, a_qscheme, "a_fakequantize")
    w_fakeq_params = extra_qparams.get("w_fakeq_params", {})
    a_fakeq_params = extra_qparams.get("a_fakeq_params", {})

    w_qconfig = w_fakequantize.with_args(observer=w_observer, **w_fakeq_params,
                                         **w_qscheme.to_observer_params())
    a_qconfig = a_fakequantize.with_args(observer=a_observer, **a_fakeq_params,
                                         **a_qscheme.to_observer_params())
    logger.info("Weight Qconfig:\n    FakeQuantize: {} Params: {}\n"
                "    Oberver:      {} Params: {}".format(w_fakequantize.__name__, w_fakeq_params,
                                                         w_observer.__name__, str(w_qscheme)))
    logger.info("Activation Qconfig:\n    FakeQuantize: {} Params: {}\n"
                "    Oberver:      {} Params: {}".format(a_fakequantize.__name__, a_fakeq_params,
                                                         a_observer.__name__, str(a_qscheme)))
    if backend_params["qtype"] == "vitis":
        logger.info("Bias Qconfig:\n    TqtFakeQuantize with MinMaxObserver")
    return QConfig(activation=a_qconfig, weight=w_qconfig)


# The names this module adds to MQBench's (the format fake quantizers and observers) are known
# to the C++ registry too, so a backend spec may name them.
for _name in list(FakeQuantizeDict)[9:]:
    if _name not in _C.fake_quantize_names():
        _C.register_fake_quantize_name(_name)
for _name in ObserverDict:
    if _name not in _C.observer_names():
        _C.register_observer_name(_name)

_sync_from_registry()


# ---- prepare_by_platform ---------------------------------------------------------------------

PREPARE_CONFIG_KEYS = ("extra_qconfig_dict", "extra_quantizer_dict", "preserve_attr",
                       "concrete_args", "extra_fuse_dict", "leaf_module", "w_qscheme_by_layer",
                       "example_inputs", "capture", "dynamic_shapes", "kv_cache_qscheme")


def _scheme_fields(scheme):
    """A QuantizeScheme as the dict of arguments that rebuilds it."""
    fields = {"bit": scheme.bit, "symmetry": scheme.symmetry, "per_channel": scheme.per_channel,
              "pot_scale": scheme.pot_scale, "symmetric_range": scheme.symmetric_range}
    if scheme.is_float:  # a float format's bit is its element width, not a field to pass
        fields.update(dtype=scheme.dtype)
        del fields["bit"]
    if scheme.group_size is not None:
        fields.update(group_size=scheme.group_size)
    if scheme.dynamic is not None:
        fields.update(dynamic=scheme.dynamic)
    fields.update(scheme.kwargs)
    return fields


def apply_w_qscheme_by_layer(prepared, backend, extra_qconfig_dict, by_layer):
    """Gives the layers named in ``by_layer`` (``{module name: bits}`` or ``{module name:
    {QuantizeScheme arguments}}``, e.g. mix_precision's bit selection) their own weight fake
    quantizer: the model's weight scheme with those fields replaced, same observer and fake
    quantizer class. Done before calibration, nothing else changes."""
    backend = _backend(backend)
    if not isinstance(by_layer, dict):
        raise TypeError(f"w_qscheme_by_layer must be a dict {{layer name: bits or qscheme "
                        f"dict}}, got {type(by_layer).__name__}")
    if ParamsTable[backend]["qtype"] == "nnie":
        raise ValueError("w_qscheme_by_layer: NNIE's weight format is fixed (8-bit logarithmic)")
    extra = dict(extra_qconfig_dict or {})
    base = extra.get("w_qscheme")
    if base is None:
        base = _scheme_fields(ParamsTable[backend]["w_qscheme"])
    modules = dict(prepared.named_modules())
    layers = sorted(n for n, m in modules.items() if hasattr(m, "weight_fake_quant"))
    for name, override in by_layer.items():
        module = modules.get(name)
        if module is None or not hasattr(module, "weight_fake_quant"):
            raise UnknownNameError(f"w_qscheme_by_layer: {name!r} is not a layer with a weight "
                                   f"quantizer in the prepared model; its layers: {layers}")
        fields = {"bit": override} if isinstance(override, int) and \
            not isinstance(override, bool) else override
        if not isinstance(fields, dict):
            raise TypeError(f"w_qscheme_by_layer[{name!r}]: give the bit width (int) or a dict "
                            f"of QuantizeScheme arguments, got {override!r}")
        layer_extra = dict(extra, w_qscheme=dict(base, **fields))
        old = module.weight_fake_quant
        module.weight_fake_quant = get_qconfig_by_platform(backend, layer_extra).weight().to(
            next((t.device for t in old.buffers()), torch.device("cpu")))
        module.weight_fake_quant.train(old.training)
        logger.info(f"Set {name} weight quantize scheme to {fields}")


def _check_model(model):
    import torch.nn.parallel as par
    if isinstance(model, (torch.nn.DataParallel, par.DistributedDataParallel)):
        raise TypeError(f"prepare_by_platform got a {type(model).__name__}; prepare the wrapped "
                        "model (model.module) and wrap the prepared one for DDP afterwards")
    if any(is_fake_quantizer(m) for m in model.modules()):
        raise ValueError("prepare_by_platform: the model already has fake quantizers (was it "
                         "prepared before?); prepare the float model once")


def prepare_by_platform(model, deploy_backend, prepare_custom_config_dict=None,
                        custom_tracer=None, is_qat=True, freeze_bn=False):
    """Turns a float model into one that simulates ``deploy_backend``'s quantization.

    Captures the model with torch.fx (``CustomedTracer``) or torch.export
    (``mqbench.capture``: ``capture``, ``example_inputs``), fuses conv / linear with BatchNorm and
    ReLU, swaps them to QAT modules whose weights go through the backend's weight fake
    quantizer, and inserts ``<node>_post_act_fake_quantizer`` modules where the backend's rules
    say (the rules run in C++, ``src/quantizer/rules/``). The result is a ``GraphModule`` that
    trains like any module. Submodules and parameters are shared with ``model``.

    Args:
        model: a float ``nn.Module`` (not DataParallel-wrapped, not prepared before).
        deploy_backend: a ``BackendType`` (or its name).
        prepare_custom_config_dict: ``extra_qconfig_dict`` (see get_qconfig_by_platform),
            ``extra_quantizer_dict``, ``extra_fuse_dict``, ``preserve_attr``
            ({submodule: [attr, ...]}, "" = root), ``concrete_args``, ``leaf_module``, and
            ``w_qscheme_by_layer`` ({prepared layer name: bits or QuantizeScheme arguments}:
            per-layer weight schemes, e.g. from mix_precision's bit selection).
            Not in MQBench: ``kv_cache_qscheme`` (QuantizeScheme arguments, e.g.
            ``{"dtype": "fp8_e4m3"}`` or ``{"bit": 4, "symmetry": False, "per_channel": True}``
            for one scale per head): fake quantizers on attention's keys and values
            (``<attention>.k_fake_quant`` / ``.v_fake_quant``, MinMax, calibrated as the
            others; docs/llm-rotation.md).
            Not in MQBench: ``capture`` ("auto" (default): fx, then torch.export when fx
            cannot trace and ``example_inputs`` are given; "fx"; "export"),
            ``example_inputs`` (a tuple of positional arguments or a dict of keyword
            arguments for ``model.forward``) and ``dynamic_shapes`` (torch.export's
            ``Dim`` specs; without them an export-captured model refuses other input sizes).
            docs/transformers.md.
        custom_tracer: a torch.fx Tracer to use instead of CustomedTracer.
        is_qat: True (default): fused conv/linear + BatchNorm become BN-folding QAT modules.
            False (post-training quantization): BatchNorm is folded into the weights now, which
            needs the model in eval mode.
        freeze_bn: freeze the BatchNorm statistics of fused QAT modules (MQBench main's default
            is True; docs/compatibility.md).

    Example::

        model = prepare_by_platform(torchvision.models.resnet18(), BackendType.Tensorrt)
        enable_calibration(model); model(calib_batch)
        enable_quantization(model); train(model)
    """
    import types

    from torch.fx import Tracer

    check_arg(prepare_by_platform, "model", model, lambda v: isinstance(v, torch.nn.Module),
              "the float nn.Module to prepare")
    check_arg(prepare_by_platform, "deploy_backend", deploy_backend,
              lambda v: isinstance(v, (BackendType, str)), "a BackendType (or its name)")
    check_arg(prepare_by_platform, "prepare_custom_config_dict", prepare_custom_config_dict,
              lambda v: v is None or isinstance(v, dict), "a dict (or EasyDict) or None")
    check_arg(prepare_by_platform, "custom_tracer", custom_tracer,
              lambda v: v is None or isinstance(v, Tracer), "a torch.fx.Tracer instance or None")
    for flag, value in (("is_qat", is_qat), ("freeze_bn", freeze_bn)):
        check_arg(prepare_by_platform, flag, value, lambda v: isinstance(v, int) and v in (0, 1),
                  "a bool")
    backend = _backend(deploy_backend)
    config = dict(prepare_custom_config_dict or {})
    check_keys(config, PREPARE_CONFIG_KEYS, "prepare_custom_config_dict")
    _check_model(model)
    logger.info("Quantize model Scheme: {} Mode: {}".format(
        backend, "Training" if model.training else "Eval"))
    qconfig = get_qconfig_by_platform(backend, config.get("extra_qconfig_dict", {}))
    swap_float_functionals(model)
    preserve_attr = config.get("preserve_attr", {})
    preserved = {}
    for sub_name, attrs in preserve_attr.items():
        sub = model.get_submodule(sub_name) if sub_name else model
        for attr in attrs:
            preserved[(sub_name, attr)] = getattr(sub, attr)
    gm = capture(model, config, custom_tracer)
    quantizer = quantizer_for(backend)(config.get("extra_quantizer_dict", {}),
                                       config.get("extra_fuse_dict", {}))
    if hasattr(quantizer, "freeze_bn"):
        quantizer.freeze_bn = freeze_bn
    if hasattr(quantizer, "is_qat"):
        quantizer.is_qat = is_qat
    prepared = _call_prepare(quantizer, gm, qconfig, is_qat, freeze_bn)
    # Note [Fused experts in a prepared model]
    quantize_fused_experts(
        prepared, model, qconfig, getattr(quantizer, "_excluded_module", lambda name: False),
        getattr(quantizer, "_all_weights_range", None),
        getattr(quantizer, "_size_per_channel_params", None))
    if config.get("kv_cache_qscheme") is not None:  # Note [KV cache quantizers]
        kv = kv_cache_scheme_of(config["kv_cache_qscheme"])
        insert_kv_cache_quantizers(prepared, kv, format_fakequantize(
            FixedFakeQuantize, kv, "kv_cache_qscheme"), MinMaxObserver)
    if config.get("w_qscheme_by_layer"):
        apply_w_qscheme_by_layer(prepared, backend, config.get("extra_qconfig_dict"),
                                 config["w_qscheme_by_layer"])
    _place_on_model_device(prepared, model)
    # New modules (the GraphModule, QAT swaps, quantizers) start in training mode; give the
    # prepared model the mode the float model was in (docs/compatibility.md).
    prepared.train(model.training)
    for (sub_name, attr), value in preserved.items():
        sub = prepared.get_submodule(sub_name) if sub_name else prepared
        if inspect.ismethod(value):
            value = types.MethodType(getattr(type(value.__self__), attr), sub)
        setattr(sub, attr, value)
        logger.info(f"Preserve attr: {sub_name}.{attr}")
    return prepared


def _place_on_model_device(prepared, model):
    """The fake quantizers (and any other state prepare creates) are built on the CPU. When the
    float model lives on one other device, e.g. a model moved to CUDA before preparing, they
    are moved there, as torch's prepare_qat_fx places its observers: otherwise the first
    forward would combine CUDA activations with CPU scales. A model spread over several
    devices is left for the user to place."""
    devices = {t.device for t in itertools.chain(model.parameters(), model.buffers())}
    if len(devices) == 1:
        device = devices.pop()
        if device.type != "cpu":
            prepared.to(device)


def _call_prepare(quantizer, model, qconfig, is_qat, freeze_bn):
    """``quantizer.prepare`` as MQBench 1.10 calls it, ``(model, qconfig)``, or as main does,
    ``(model, qconfig, is_qat, backend_config, freeze_bn)``, when a user class requires it."""
    try:
        params = inspect.signature(quantizer.prepare).parameters.values()
    except (TypeError, ValueError):
        return quantizer.prepare(model, qconfig)
    required = [p for p in params if p.default is p.empty and
                p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    # main's arguments, as many as the class requires
    return quantizer.prepare(*(model, qconfig, is_qat, None, freeze_bn)[:max(2, len(required))])
