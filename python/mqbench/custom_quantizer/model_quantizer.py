"""The Python side of the model quantizer: fx tracing output in, prepared GraphModule out.

The decisions (which chains to fuse, where activation quantizers go) come from the C++ rule
sets (``src/quantizer/rules/``, one per MQBench quantizer class) through ``mqbench._C``; this
module applies them with torch.fx: fused containers and QAT modules from ``mqbench.nn`` (our
own; torch's deprecated ``nn.intrinsic`` / ``nn.qat`` are not used, but a user's torch
classes are matched by their canonical names), and ``<node>_post_act_fake_quantizer`` modules
after the chosen nodes, exactly as MQBench names them.

A subclass changes the rules the way it does in MQBench (docs/prepare.md, "Your own
quantizer"): the type-list properties (``module_type_to_quant_input``, ...) reach the C++
rules as data, and the hooks (``_find_act_quants``, ``_qat_swap_modules``, ``_weight_quant``,
``_insert_fake_quantize_for_act_quant``, ``_fuse_fx``, ``prepare``) are called at MQBench's
steps, with MQBench's signatures.
"""
import collections.abc
import functools
import inspect
import operator

import torch
import torch.nn as nn

import mqbench.nn.intrinsic as qnni
from mqbench import _C
from mqbench.custom_quantizer.graph_ir import (canonical_function, canonical_type,
                                               resolve_function, to_ir)
from mqbench.custom_quantizer.type_table import resolve_type
from mqbench.fake_quantize import LearnableFakeQuantize
from mqbench.nn.modules.frozen_batchnorm import FrozenBatchNorm2d
from mqbench.utils import is_symmetric_quant
from mqbench.utils.config import check_keys
from mqbench.utils.logger import logger

__all__ = ["ModelQuantizer", "QUANTIZER_DICT_KEYS", "FUSE_DICT_KEYS"]

QUANTIZER_DICT_KEYS = ("additional_function_type", "additional_module_type",
                       "additional_node_name", "exclude_module_name", "exclude_function_type",
                       "exclude_node_name", "academic_mode")
FUSE_DICT_KEYS = ("additional_fuser_method_mapping", "additional_fusion_pattern",
                  "additional_qat_module_mapping", "additional_qat_module_mappings")

# Fusion kinds of the C++ rules (src/quantizer/model_quantizer.cpp) -> fused float container.
_FUSED = {name: getattr(qnni, name) for name in qnni.__all__}


def _names(items):
    """Types and functions as the IR's canonical names (strings pass through); anything else
    is an error naming it (a silently unmatched name would place no quantizer)."""
    out = []
    for it in items or ():
        if isinstance(it, type):
            out.append(canonical_type(it))
        elif isinstance(it, str) or callable(it):
            out.append(canonical_function(it))
        else:
            raise TypeError(f"expected module classes, functions or method names, got {it!r}")
    return out


def _set_module(root, target, module):
    parent, _, leaf = target.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)


def _fold_now(names, parts):
    """is_qat=False: BatchNorm is folded into the conv / linear at prepare time (torch's
    fuse_*_bn_eval; needs eval mode). Returns the folded module (with its ReLU as a fused
    container), or None when the chain has no BatchNorm."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval, fuse_linear_bn_eval

    from mqbench.utils.fusion import fuse_deconv_bn_eval
    bns = [p for p in parts if isinstance(p, nn.modules.batchnorm._BatchNorm)]
    if not bns or len(parts) < 2 or not isinstance(parts[1], nn.modules.batchnorm._BatchNorm):
        return None
    if any(p.training for p in parts):
        raise ValueError(f"is_qat=False folds BatchNorm into {names[0]} at prepare time, which "
                         "needs eval mode: call model.eval() before prepare_by_platform")
    root, bn = parts[0], parts[1]
    if isinstance(root, nn.Linear):
        folded = fuse_linear_bn_eval(root, bn)
    elif isinstance(root, nn.ConvTranspose2d):
        folded = fuse_deconv_bn_eval(root, bn)  # groups included (torch's assumes 1)
    else:
        folded = fuse_conv_bn_eval(root, bn)
    if len(parts) == 2:
        return folded
    relu = parts[2]
    if isinstance(folded, nn.ConvTranspose2d):
        return qnni.ConvTransposeReLU2d(folded, relu)
    if isinstance(folded, nn.Linear):
        return qnni.LinearReLU(folded, relu)
    return {nn.Conv1d: qnni.ConvReLU1d, nn.Conv2d: qnni.ConvReLU2d,
            nn.Conv3d: qnni.ConvReLU3d}[type(folded)](folded, relu)


def _call_fuser(fuser, *modules):
    """A user fuser: torch >= 1.11 style fuser(is_qat, *modules), or fuser(*modules) (1.10)."""
    try:
        n = len(inspect.signature(fuser).parameters)
    except (TypeError, ValueError):
        n = len(modules)
    return fuser(True, *modules) if n == len(modules) + 1 else fuser(*modules)


def _delete_unused_submodules(gm):
    """GraphModule.delete_all_unused_submodules, but blind to sharing: torch's skips a module
    whose object is also reachable under a used name (bn1 is also conv1.1 after fusion)."""
    used = set()
    for node in gm.graph.nodes:
        if node.op not in ("call_module", "get_attr"):
            continue
        parts = node.target.split(".")
        used.update(".".join(parts[:i + 1]) for i in range(len(parts)))
        if node.op == "call_module":
            sub = gm.get_submodule(node.target)
            used.update(f"{node.target}.{n}" for n, _ in sub.named_modules(remove_duplicate=False)
                        if n)
    for name, _ in list(gm.named_modules(remove_duplicate=False)):
        if name and name not in used:
            gm.delete_submodule(name)


def _replace_arg(arg, old, new):
    if arg is old:
        return new
    if isinstance(arg, tuple):
        return tuple(_replace_arg(a, old, new) for a in arg)
    if isinstance(arg, list):
        return [_replace_arg(a, old, new) for a in arg]
    if isinstance(arg, dict):
        return {k: _replace_arg(v, old, new) for k, v in arg.items()}
    return arg


def _float_format(factory):
    """True when a fake-quantizer factory's scheme is a float format (FP8, MX, NVFP4): the
    rules' integer ranges (Academic's 8-bit first and last layers, 8-bit IO) leave it as is."""
    keywords = getattr(getattr(factory, "p", None), "keywords", {})
    return keywords.get("format", "int") != "int"


class _RuleList(property):
    """A type-list property whose default comes from the C++ rule set. A subclass that defines
    the attribute again (a property, or a plain class attribute) overrides the rule set's list;
    ``ModelQuantizer._rule_overrides`` sends the override to C++."""


def _rule_data(rules):
    return _C.quantizer_rules(rules)


# MQBench hooks our rules do not call back into Python; a subclass defining one is told so.
_NOT_CALLED = ("_passed_func_type", "_passed_module_type", "_relu_module_type",
               "_relu_function_type", "_propagated_pattern", "_linear_module_node",
               "module_type_to_quant_unsigned", "function_type_maybe_unsigned",
               "function_type_to_quant_unsigned", "module_type_maybe_unsigned", "_merge_add_type",
               "function_type_not_to_quant_alone", "_is_implicit_merge", "_on_merge_chain",
               "_flatten_args", "_is_skiped_add", "_find_add_merge_node", "_convert",
               "_get_io_module", "_get_post_act_8bit_node_name")


class ModelQuantizer(object):
    """Prepares a traced model for a backend: fuse, swap to QAT modules, insert activation
    fake quantizers. ``rules`` names the C++ rule set.

    Args:
        extra_quantizer_dict: MQBench's keys (``additional_function_type``,
            ``additional_module_type``, ``additional_node_name``, ``exclude_module_name``,
            ``exclude_function_type``, ``exclude_node_name``, ``academic_mode``).
        extra_fuse_dict: ``additional_qat_module_mapping`` ({float class: QAT class}),
            ``additional_fuser_method_mapping`` ({(types...): fuser}).

    A subclass may override, as in MQBench: the properties ``function_type_to_quant_input``,
    ``module_type_to_quant_input`` and ``implicit_merge_patterns`` (``VitisQuantizer``:
    ``*_to_quant_output``), which replace the rule set's lists (the defaults include the
    ``additional_*`` types); the ``exclude_*`` / ``additional_*`` attributes; and the steps
    ``prepare``, ``_fuse_fx``, ``_weight_quant``, ``_qat_swap_modules``, ``_find_act_quants``
    (returns the fx nodes whose outputs get a quantizer) and
    ``_insert_fake_quantize_for_act_quant``.
    """

    rules = "ModelQuantizer"
    # {property: the rule-set list it overrides}. VitisQuantizer maps its output lists.
    _rule_lists = {"function_type_to_quant_input": "function_types",
                   "module_type_to_quant_input": "module_types",
                   "implicit_merge_patterns": "implicit_merges"}

    def __init__(self, extra_quantizer_dict=None, extra_fuse_dict=None, freeze_bn=False,
                 is_qat=True):
        d = dict(extra_quantizer_dict or {})
        check_keys(d, QUANTIZER_DICT_KEYS, "extra_quantizer_dict")
        self.additional_function_type = list(d.get("additional_function_type", []))
        self.additional_module_type = tuple(d.get("additional_module_type", ()))
        self.additional_node_name = list(d.get("additional_node_name", []))
        self.exclude_module_name = list(d.get("exclude_module_name", []))
        self.exclude_function_type = list(d.get("exclude_function_type", []))
        self.exclude_node_name = list(d.get("exclude_node_name", []))
        self.academic_mode = bool(d.get("academic_mode", False))
        self.extra_fuse_dict = dict(extra_fuse_dict or {})
        check_keys(self.extra_fuse_dict, FUSE_DICT_KEYS, "extra_fuse_dict")
        # MQBench 1.10's fuse_custom_config_dict spells it ..._mappings: both are read.
        self.additional_qat_module_mapping = {
            **self.extra_fuse_dict.get("additional_qat_module_mappings", {}),
            **self.extra_fuse_dict.get("additional_qat_module_mapping", {})}
        # {(type or function, ...) in data-flow order: fuser(is_qat, *modules) or fuser(*modules)}
        self.additional_fuser_method_mapping = list(
            self.extra_fuse_dict.get("additional_fuser_method_mapping", {}).items())
        self.additional_fusion_pattern = dict(
            self.extra_fuse_dict.get("additional_fusion_pattern", {}))
        self.freeze_bn = freeze_bn
        self.is_qat = is_qat
        self._qconfig = None
        self._act_details = {}
        self._warn_not_called()

    # -- MQBench's type lists: the rule set's, as Python objects ------------------------------
    @_RuleList
    def function_type_to_quant_input(self):
        """Functions / methods whose inputs get a quantizer (rule set's list + additional)."""
        data = _rule_data(self.rules)
        out = [resolve_function(n) for n in data["function_types"]]
        if data["append_additional_function_types"]:
            out += list(self.additional_function_type)
        return out

    @_RuleList
    def module_type_to_quant_input(self):
        """Module classes (isinstance) whose inputs get a quantizer (+ additional)."""
        types = tuple(resolve_type(n) for n in _rule_data(self.rules)["module_types"])
        return types + tuple(self.additional_module_type)

    @_RuleList
    def implicit_merge_patterns(self):
        """Patterns, consumer first, whose producer -> consumer edge gets no quantizer."""
        return [tuple(resolve_type(n) if n.startswith(("nn.", "mqbench.")) else
                      resolve_function(n) for n in pattern)
                for pattern in _rule_data(self.rules)["implicit_merges"]]

    @property
    def function_type_to_update_data_struct(self):
        return ["update"]

    def _rule_overrides(self):
        """{rule-set list: canonical names} for every type-list property a subclass redefines."""
        out = {}
        cls = type(self)
        for prop, key in self._rule_lists.items():
            if isinstance(inspect.getattr_static(cls, prop, None), _RuleList):
                continue
            value = getattr(self, prop)
            if isinstance(value, (str, type)) or callable(value) or \
                    not isinstance(value, collections.abc.Iterable):
                value = (value,)  # one type, function or method name
            if key == "implicit_merges":
                out[key] = [_names(pattern) for pattern in value]
            else:
                out[key] = _names(value)
        return out

    def _warn_not_called(self):
        """A subclass defining a hook of MQBench's that the C++ rules decide internally is told
        so, instead of being silently ignored."""
        for cls in type(self).__mro__:
            if cls.__module__.startswith("mqbench."):
                break
            for name in _NOT_CALLED:
                if name in cls.__dict__:
                    logger.warning(
                        f"{cls.__name__}.{name} is not called by mqbench: its rule sets decide "
                        "that step in C++. Override the type-list properties "
                        f"({', '.join(self._rule_lists)}) or _find_act_quants instead.")

    # -- the three steps ---------------------------------------------------------------------
    def prepare(self, model, qconfig, is_qat=None, backend_config=None, freeze_bn=None):
        """Fuse, QAT-swap, insert activation quantizers. Takes MQBench 1.10's ``(model,
        qconfig)`` and main's ``(model, qconfig, is_qat, backend_config, freeze_bn)``;
        ``backend_config`` (torch.ao's) is not used: the rule set is the backend config."""
        # This call's is_qat / freeze_bn go down as arguments: the instance keeps its own.
        is_qat = self.is_qat if is_qat is None else bool(is_qat)
        freeze_bn = self.freeze_bn if freeze_bn is None else bool(freeze_bn)
        self._qconfig = qconfig
        model = self._fuse_fx(model, is_qat, backend_config)
        model = self._weight_quant(model, qconfig, backend_config, freeze_bn)
        model = self._insert_fake_quantize_for_act_quant(model, qconfig)
        return model

    def _options(self, qconfig=None):
        options = {
            "additional_function_type": _names(self.additional_function_type),
            "additional_module_type": _names(self.additional_module_type),
            "additional_node_name": list(self.additional_node_name),
            "exclude_module_name": list(self.exclude_module_name),
            "exclude_function_type": _names(self.exclude_function_type),
            "exclude_node_name": list(self.exclude_node_name),
            "academic_mode": self.academic_mode,
            "extra_fusion_patterns": [_names(p) for p, _ in self.additional_fuser_method_mapping],
        }
        if qconfig is not None:
            w = qconfig.weight.p.keywords
            a = qconfig.activation.p.keywords
            bits = int(a["quant_max"] - a["quant_min"] + 1).bit_length() - 1 \
                if "quant_max" in a else 8
            options.update({
                "weight_symmetric": is_symmetric_quant(
                    w.get("qscheme", torch.per_tensor_symmetric)),
                "activation_symmetric": is_symmetric_quant(
                    a.get("qscheme", torch.per_tensor_symmetric)),
                "activation_bits": bits})
        options.update(self._rule_overrides())
        return options

    def _plan(self, model):
        return _C.plan_activation_quant(to_ir(model), self.rules, self._options(self._qconfig))

    def _fuse_fx(self, graph_module, is_qat=None, *args, **kwargs):
        """Fuses the rule set's chains (conv + bn + relu, ...) and the user's
        ``additional_fuser_method_mapping`` patterns. MQBench's extra arguments (the fuse dict,
        torch.ao's backend_config) are accepted and not needed; 1.10's
        ``_fuse_fx(model, extra_fuse_dict)`` works too."""
        is_qat = is_qat if isinstance(is_qat, bool) else self.is_qat
        model = graph_module
        groups = _C.find_fusions(to_ir(model), self.rules, self._options())
        if not groups:
            return model
        nodes = {n.name: n for n in model.graph.nodes}
        for names, kind in groups:
            if kind.startswith("user:"):
                fuser = self.additional_fuser_method_mapping[int(kind[5:])][1]
                fused_cls = functools.partial(_call_fuser, fuser)
            else:
                fused_cls = _FUSED.get(kind)
            if fused_cls is None:
                logger.warning(f"Fusion {kind} of {names} is not supported yet; left unfused.")
                continue
            chain = [nodes[n] for n in names]
            parts = []
            for node in chain:
                if node.op == "call_module":
                    parts.append(model.get_submodule(node.target))
                else:  # F.relu: a ReLU module in the chain's mode
                    parts.append(nn.ReLU().train(parts[0].training))
            # A FrozenBatchNorm2d is always in eval mode: it does not count.
            if len({p.training for p in parts if not isinstance(p, FrozenBatchNorm2d)}) > 1:
                raise ValueError(f"cannot fuse {names}: its modules are not all in the same "
                                 "train/eval mode; call model.train() or model.eval() first")
            fused = _fold_now(names, parts) if not is_qat else None
            _set_module(model, chain[0].target, fused if fused is not None else fused_cls(*parts))
            chain[-1].replace_all_uses_with(chain[0])
            for node in reversed(chain[1:]):
                model.graph.erase_node(node)
        model.graph.lint()
        # The fused-away modules (bn1, relu, ...) leave the model, so the state dict has
        # MQBench's keys only (conv1.bn.weight, not also bn1.weight).
        _delete_unused_submodules(model)
        model.recompile()
        return model

    def _qat_mapping(self, additional_qat_module_mapping=None):
        """{canonical float type name: QAT class}: our table (MQBench's default QAT mappings
        plus its own modules), then the user's ``additional_qat_module_mapping``. Keys are
        canonical names, so a torch fused container in the user's model maps like ours."""
        from mqbench.nn import qat as qnnqat
        from mqbench.nn.intrinsic import qat as qnniqat
        # As torch's default QAT mappings, which MQBench uses: plain Conv1d and Conv1d + ReLU
        # stay float (their QAT classes exist for a user's additional_qat_module_mapping).
        mapping = {}
        for float_cls, qat_cls in [
                (nn.Conv2d, qnnqat.Conv2d),
                (nn.Conv3d, qnnqat.Conv3d), (nn.Linear, qnnqat.Linear),
                (nn.modules.linear.NonDynamicallyQuantizableLinear, qnnqat.Linear),
                (nn.ConvTranspose2d, qnnqat.ConvTranspose2d), (nn.Embedding, qnnqat.Embedding)]:
            mapping[canonical_type(float_cls)] = qat_cls
        for name in ("ConvBn1d", "ConvBn2d", "ConvBn3d", "ConvBnReLU1d", "ConvBnReLU2d",
                     "ConvBnReLU3d", "ConvReLU2d", "ConvReLU3d", "LinearReLU",
                     "LinearBn1d", "ConvTransposeReLU2d", "ConvTransposeBn2d",
                     "ConvTransposeBnReLU2d", "ConvFreezebn2d", "ConvFreezebnReLU2d",
                     "ConvTransposeFreezebn2d", "ConvTransposeFreezebnReLU2d"):
            mapping[canonical_type(getattr(qnni, name))] = getattr(qnniqat, name)
        if additional_qat_module_mapping is None:
            additional_qat_module_mapping = self.additional_qat_module_mapping
        for float_cls, qat_cls in additional_qat_module_mapping.items():
            mapping[canonical_type(float_cls)] = qat_cls
        excluded = set(_C.quantizer_rules(self.rules)["qat_exclude_types"])
        return {k: v for k, v in mapping.items() if k not in excluded}

    def _excluded_module(self, target):
        # Full dotted names (as MQBench 1.10) and bare child names (as MQBench main, where the
        # scope was lost below the top level) both exclude.
        return target in self.exclude_module_name or \
            target.rpartition(".")[2] in self.exclude_module_name

    def _weight_quant(self, model, qconfig, backend_config=None, freeze_bn=None):
        """Swaps layers to QAT modules (``_qat_swap_modules``), then applies the rule set's
        weight ranges (Academic's 8-bit IO layers, OPENVINO's 7 bits)."""
        logger.info("Replace module to qat module.")
        self._qconfig = qconfig
        freeze_bn = self.freeze_bn if freeze_bn is None else freeze_bn
        model = self._qat_swap_modules(model, self.additional_qat_module_mapping,
                                       backend_config, freeze_bn)
        self._weight_ranges(model, qconfig, self._plan(model))
        return model

    def _qat_swap_modules(self, root, additional_qat_module_mapping, backend_config=None,
                          freeze_bn=None):
        """Replaces every called layer with a QAT class in the mapping by
        ``QATClass.from_float`` (with the qconfig of this prepare call); returns ``root``."""
        if self._qconfig is None:
            raise ValueError("_qat_swap_modules needs the qconfig: call it from "
                             "_weight_quant(model, qconfig) or prepare(model, qconfig)")
        qconfig = self._qconfig
        freeze_bn = self.freeze_bn if freeze_bn is None else freeze_bn
        mapping = self._qat_mapping(additional_qat_module_mapping)
        done = set()
        for node in root.graph.nodes:
            if node.op != "call_module" or node.target in done:
                continue
            done.add(node.target)
            module = root.get_submodule(node.target)
            qat_cls = mapping.get(canonical_type(type(module)))
            if qat_cls is None:
                continue
            if self._excluded_module(node.target):
                logger.info(f"Skip quant layer: {node.target}")
                continue
            qat = self._from_float(qat_cls, module, qconfig)
            self._size_per_channel_params(qat)
            if freeze_bn and hasattr(qat, "freeze_bn_stats"):
                qat.freeze_bn_stats()
            _set_module(root, node.target, qat)
        root.recompile()
        return root

    @staticmethod
    def _from_float(qat_cls, module, qconfig):
        """``qat_cls.from_float(module)`` with ``qconfig`` (a qconfig the user put on a module
        wins). ``module`` and its children (a fused container's conv reads its own qconfig) get
        the attribute only for the swap: the float modules, shared with the user's model, are
        left without it, so preparing the same model again for another backend does not
        inherit this qconfig (docs/compatibility.md)."""
        added = [m for m in module.modules() if getattr(m, "qconfig", None) is None]
        for m in added:
            m.qconfig = qconfig
        try:
            return qat_cls.from_float(module)
        finally:
            for m in added:
                del m.qconfig

    @staticmethod
    def _size_per_channel_params(qat):
        """MQBench sizes per-channel learnable scales at prepare time, so an optimizer built
        before calibration holds the final Parameters."""
        fq = getattr(qat, "weight_fake_quant", None)
        if isinstance(fq, LearnableFakeQuantize) and fq.ch_axis != -1:
            n = qat.weight.shape[fq.ch_axis]
            fq.scale = nn.Parameter(torch.ones(n, dtype=fq.scale.dtype))
            fq.zero_point = nn.Parameter(torch.zeros(n, dtype=fq.zero_point.dtype))

    def _weight_ranges(self, model, qconfig, plan):
        # the range every weight takes (no module list): the fused experts' quantizers too
        self._all_weights_range = plan["weight_range"] if not plan["weight_range_modules"] and \
            not _float_format(qconfig.weight) else None
        if plan["weight_range"] is None:
            return
        if _float_format(qconfig.weight):
            return  # an 8-bit integer range does not apply to a float format (docs/formats.md)
        lo, hi = plan["weight_range"]
        targets = plan["weight_range_modules"]
        factory = qconfig.weight.with_args(quant_min=lo, quant_max=hi)
        per_channel = qconfig.weight.p.keywords.get("ch_axis", -1) != -1
        for name, module in model.named_modules():
            if not hasattr(module, "weight_fake_quant"):
                continue
            if targets and name not in targets:
                continue
            # transposed convs and embeddings keep their channels on weight dimension 1
            dim1 = per_channel and isinstance(module, (nn.ConvTranspose2d, nn.Embedding))
            module.weight_fake_quant = (factory.with_args(ch_axis=1) if dim1 else factory)()
            self._size_per_channel_params(module)
            logger.info(f"Set {name} weight quantize to [{lo}, {hi}].")

    def _find_act_quants(self, model):
        """The fx nodes whose outputs get an activation quantizer, in graph order: the rule
        set's plan (with this instance's type lists and exclusions)."""
        plan = self._plan(model)
        for line in plan["log"]:
            logger.info(line)
        self._act_details = {q["node"]: q for q in plan["act_quants"]}
        nodes = {n.name: n for n in model.graph.nodes}
        found = []
        for q in plan["act_quants"]:
            node = nodes[q["node"]]
            # A torch.export graph records each value: an integer tensor (token ids, OPENVINO
            # quantizes every model input) cannot be fake-quantized.
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and not val.is_floating_point():
                logger.info(f"Skip integer value: {node.name}")
                continue
            found.append(node)
        return found

    def _insert_fake_quantize_for_act_quant(self, model, qconfig):
        """A ``<node>_post_act_fake_quantizer`` after every node ``_find_act_quants`` returns
        (repeats dropped), the node's users rewired to it. The rule set's per-node details
        (Academic's 8-bit IO, OPENVINO's unsigned ranges, Vitis's quant types) apply to the
        nodes it chose."""
        self._qconfig = qconfig
        self._act_details = {}
        found = self._find_act_quants(model)
        graph = model.graph
        for node in dict.fromkeys(found):
            if not isinstance(node, torch.fx.Node) or node.graph is not graph:
                raise TypeError(f"_find_act_quants must return nodes of the model's graph, got "
                                f"{node!r}")
            detail = self._act_details.get(node.name, {})
            factory = qconfig.activation
            if detail.get("quant_min") is not None and not _float_format(factory):
                factory = factory.with_args(quant_min=detail["quant_min"],
                                            quant_max=detail["quant_max"])
            fq = factory()
            if detail.get("quant_type") and hasattr(fq, "set_quant_type"):
                fq.set_quant_type(detail["quant_type"])
            name = node.name + "_post_act_fake_quantizer"
            setattr(model, name, fq)
            logger.info("Insert act quant {}".format(name))
            users = list(node.users)
            with graph.inserting_after(node):
                inserted = graph.create_node("call_module", name, (node,), {})
            for user in users:
                user.args = _replace_arg(user.args, node, inserted)
        model.recompile()
        graph.lint()
        return model
