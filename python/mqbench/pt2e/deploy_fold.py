"""From a pt2e-prepared model to ``convert_deploy``: torchao's QAT conv + BN folded into the conv
(Note [Folding torchao's QAT conv + BN at deploy])."""
import copy
import operator

import torch
import torch.nn as nn

from mqbench.pt2e.planning import _op_name


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
