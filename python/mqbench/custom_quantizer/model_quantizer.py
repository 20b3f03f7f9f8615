"""The Python side of the model quantizer: fx tracing output in, prepared GraphModule out.

The decisions (which chains to fuse, where activation quantizers go) come from the C++ rule
sets (``src/quantizer/rules/``, one per MQBench quantizer class) through ``mqbench._C``; this
module applies them with torch.fx: fused containers and QAT modules from ``mqbench.nn`` (our
own; torch's deprecated ``nn.intrinsic`` / ``nn.qat`` are not used, but a user's torch
classes are matched by their canonical names), and ``<node>_post_act_fake_quantizer`` modules after the chosen
nodes, exactly as MQBench names them.
"""
import copy
import functools
import inspect
import operator

import torch
import torch.nn as nn

import mqbench.nn.intrinsic as qnni
from mqbench import _C
from mqbench.custom_quantizer.graph_ir import canonical_type, to_ir
from mqbench.fake_quantize import LearnableFakeQuantize
from mqbench.utils import is_symmetric_quant
from mqbench.utils.logger import logger

__all__ = ["ModelQuantizer", "QUANTIZER_DICT_KEYS"]

QUANTIZER_DICT_KEYS = ("additional_function_type", "additional_module_type",
                       "additional_node_name", "exclude_module_name", "exclude_function_type",
                       "exclude_node_name", "academic_mode")

# Fusion kinds of the C++ rules (src/quantizer/model_quantizer.cpp) -> fused float container.
_FUSED = {name: getattr(qnni, name) for name in qnni.__all__}


def _names(items):
    """Types and functions as the IR's canonical names (strings pass through)."""
    from mqbench.custom_quantizer.graph_ir import canonical_function
    out = []
    for it in items or ():
        out.append(canonical_type(it) if isinstance(it, type) else canonical_function(it))
    return out


def _set_module(root, target, module):
    parent, _, leaf = target.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)


def _fold_now(names, parts):
    """is_qat=False: BatchNorm is folded into the conv / linear at prepare time (torch's
    fuse_*_bn_eval; needs eval mode). Returns the folded module (with its ReLU as a fused
    container), or None when the chain has no BatchNorm."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval, fuse_linear_bn_eval
    bns = [p for p in parts if isinstance(p, nn.modules.batchnorm._BatchNorm)]
    if not bns or len(parts) < 2 or not isinstance(parts[1], nn.modules.batchnorm._BatchNorm):
        return None
    if any(p.training for p in parts):
        raise ValueError(f"is_qat=False folds BatchNorm into {names[0]} at prepare time, which "
                         "needs eval mode: call model.eval() before prepare_by_platform")
    root, bn = parts[0], parts[1]
    if isinstance(root, nn.Linear):
        folded = fuse_linear_bn_eval(root, bn)
    elif isinstance(root, nn.ConvTranspose2d) and root.groups > 1:
        folded = _fold_grouped_deconv_bn(root, bn)  # torch's fuser assumes groups == 1
    else:
        folded = fuse_conv_bn_eval(root, bn, transpose=isinstance(root, nn.ConvTranspose2d))
    if len(parts) == 2:
        return folded
    relu = parts[2]
    if isinstance(folded, nn.ConvTranspose2d):
        return qnni.ConvTransposeReLU2d(folded, relu)
    if isinstance(folded, nn.Linear):
        return qnni.LinearReLU(folded, relu)
    return {nn.Conv1d: qnni.ConvReLU1d, nn.Conv2d: qnni.ConvReLU2d,
            nn.Conv3d: qnni.ConvReLU3d}[type(folded)](folded, relu)


def _fold_grouped_deconv_bn(deconv, bn):
    """BatchNorm folded into a grouped transposed convolution: the weight [in, out / g, kh, kw]
    is scaled per output channel, group by group."""
    folded = copy.deepcopy(deconv)
    with torch.no_grad():
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        w = folded.weight
        g = folded.groups
        w.copy_((w.reshape(g, w.shape[0] // g, *w.shape[1:])
                  * scale.reshape(g, 1, -1, 1, 1)).reshape(w.shape))
        bias = folded.bias if folded.bias is not None else torch.zeros_like(bn.running_mean)
        folded.bias = nn.Parameter((bias - bn.running_mean) * scale + bn.bias)
    return folded


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


class ModelQuantizer(object):
    """Prepares a traced model for a backend: fuse, swap to QAT modules, insert activation
    fake quantizers. ``rules`` names the C++ rule set; subclasses only change it.

    Args:
        extra_quantizer_dict: MQBench's keys (``additional_function_type``,
            ``additional_module_type``, ``additional_node_name``, ``exclude_module_name``,
            ``exclude_function_type``, ``exclude_node_name``, ``academic_mode``).
        extra_fuse_dict: ``additional_qat_module_mapping`` ({float class: QAT class}).
    """

    rules = "ModelQuantizer"

    def __init__(self, extra_quantizer_dict=None, extra_fuse_dict=None, freeze_bn=False,
                 is_qat=True):
        d = dict(extra_quantizer_dict or {})
        from mqbench.prepare_by_platform import check_keys
        check_keys(d, QUANTIZER_DICT_KEYS, "extra_quantizer_dict")
        self.additional_function_type = list(d.get("additional_function_type", []))
        self.additional_module_type = tuple(d.get("additional_module_type", ()))
        self.additional_node_name = list(d.get("additional_node_name", []))
        self.exclude_module_name = list(d.get("exclude_module_name", []))
        self.exclude_function_type = list(d.get("exclude_function_type", []))
        self.exclude_node_name = list(d.get("exclude_node_name", []))
        self.academic_mode = bool(d.get("academic_mode", False))
        self.extra_fuse_dict = dict(extra_fuse_dict or {})
        self.additional_qat_module_mapping = dict(
            self.extra_fuse_dict.get("additional_qat_module_mapping", {}))
        # {(type or function, ...) in data-flow order: fuser(is_qat, *modules) or fuser(*modules)}
        self.additional_fuser_method_mapping = list(
            self.extra_fuse_dict.get("additional_fuser_method_mapping", {}).items())
        self.freeze_bn = freeze_bn
        self.is_qat = is_qat

    # -- the three steps ---------------------------------------------------------------------
    def prepare(self, model, qconfig):
        options = self._options(qconfig)
        model = self._fuse(model, options)
        model = self._weight_quant(model, qconfig)
        plan = _C.plan_activation_quant(to_ir(model), self.rules, options)
        for line in plan["log"]:
            logger.info(line)
        self._weight_ranges(model, qconfig, plan)
        model = self._insert_fake_quantize_for_act_quant(model, qconfig, plan)
        return model

    def _options(self, qconfig):
        w = qconfig.weight.p.keywords
        a = qconfig.activation.p.keywords
        bits = int(a["quant_max"] - a["quant_min"] + 1).bit_length() - 1 if "quant_max" in a else 8
        return {
            "additional_function_type": _names(self.additional_function_type),
            "additional_module_type": _names(self.additional_module_type),
            "additional_node_name": self.additional_node_name,
            "exclude_module_name": self.exclude_module_name,
            "exclude_function_type": _names(self.exclude_function_type),
            "exclude_node_name": self.exclude_node_name,
            "academic_mode": self.academic_mode,
            "weight_symmetric": is_symmetric_quant(w.get("qscheme", torch.per_tensor_symmetric)),
            "activation_symmetric": is_symmetric_quant(a.get("qscheme", torch.per_tensor_symmetric)),
            "activation_bits": bits,
            "extra_fusion_patterns": [_names(p) for p, _ in self.additional_fuser_method_mapping],
        }

    def _fuse(self, model, options):
        groups = _C.find_fusions(to_ir(model), self.rules, options)
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
                else:  # F.relu
                    parts.append(nn.ReLU())
            if len({p.training for p in parts}) > 1:
                raise ValueError(f"cannot fuse {names}: its modules are not all in the same "
                                 "train/eval mode; call model.train() or model.eval() first")
            fused = _fold_now(names, parts) if not self.is_qat else None
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

    def _qat_mapping(self):
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
                     "ConvTransposeBnReLU2d", "ConvFreezebn2d", "ConvFreezebnReLU2d"):
            mapping[canonical_type(getattr(qnni, name))] = getattr(qnniqat, name)
        for float_cls, qat_cls in self.additional_qat_module_mapping.items():
            mapping[canonical_type(float_cls)] = qat_cls
        excluded = set(_C.quantizer_rules(self.rules)["qat_exclude_types"])
        return {k: v for k, v in mapping.items() if k not in excluded}

    def _excluded_module(self, target):
        # Full dotted names (as MQBench 1.10) and bare child names (as MQBench main, where the
        # scope was lost below the top level) both exclude.
        return target in self.exclude_module_name or \
            target.rpartition(".")[2] in self.exclude_module_name

    def _weight_quant(self, model, qconfig):
        logger.info("Replace module to qat module.")
        mapping = self._qat_mapping()
        done = set()
        for node in model.graph.nodes:
            if node.op != "call_module" or node.target in done:
                continue
            done.add(node.target)
            module = model.get_submodule(node.target)
            qat_cls = mapping.get(canonical_type(type(module)))
            if qat_cls is None:
                continue
            if self._excluded_module(node.target):
                logger.info(f"Skip quant layer: {node.target}")
                continue
            qat = self._from_float(qat_cls, module, qconfig)
            self._size_per_channel_params(qat)
            if self.freeze_bn and hasattr(qat, "freeze_bn_stats"):
                qat.freeze_bn_stats()
            _set_module(model, node.target, qat)
        model.recompile()
        return model

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
        if plan["weight_range"] is None:
            return
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

    def _insert_fake_quantize_for_act_quant(self, model, qconfig, plan):
        graph = model.graph
        nodes = {n.name: n for n in graph.nodes}
        for q in plan["act_quants"]:
            node = nodes[q["node"]]
            factory = qconfig.activation
            if q["quant_min"] is not None:
                factory = factory.with_args(quant_min=q["quant_min"], quant_max=q["quant_max"])
            fq = factory()
            if q["quant_type"] and hasattr(fq, "set_quant_type"):
                fq.set_quant_type(q["quant_type"])
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
