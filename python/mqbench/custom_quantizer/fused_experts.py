"""Weight fake quantizers on the fused experts of a mixture of experts (Note [Fused experts in a
prepared model])."""
import types

import torch

from mqbench.utils.logger import logger

# Note [Fused experts in a prepared model]
# transformers 5 keeps a mixture of experts' weights as 3-D parameters of one experts module
# (Qwen3-MoE, Mixtral: ``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``; GPT-OSS stores
# them ``[E, in, out]``), which its forward indexes per expert or multiplies grouped. A capture
# keeps that module as a holder of the parameters and its graph reads them (``get_attr``):
# there is no Linear to swap for a QAT module, so the QAT swap leaves most of the model's
# weights float. This pass puts one weight fake quantizer on each such parameter, named
# ``<experts>.<parameter>_weight_fake_quant`` (a weight quantizer by name for ``enable_*`` and
# the state dict), between the read and its users: the parameter seen as [E x out, in] (the
# transposed layout turned first), so that a row is one output channel of one expert and a
# per-channel or per-group grid is exactly the grid of that expert's Linear; a per-tensor grid is
# one scale for every expert. Gradients reach the fused parameters through the quantizer's
# straight-through backward, as a Linear's weight does. ``save_quantized`` reads each expert
# Linear's rows of the grid back (``llm._experts``), so the checkpoint holds the trained grid.
# The router stays float: it is not one of these parameters.

SUFFIX = "_weight_fake_quant"
_LEAVES = ("gate_up_proj", "up_proj", "down_proj")
# the experts module's layout flags, which llm._experts reads to split it one Linear per expert
_LAYOUT = ("has_gate", "is_transposed", "is_concatenated", "has_post_expert_norm")


def _insert(graph, node, holder_name, fq_name, shape, transposed):
    """read -> [E x out, in] -> fake quantizer -> the parameter's shape, for every user of
    ``node``."""
    aten = torch.ops.aten
    users = list(node.users)
    e, a, b = shape
    out_f, in_f = (b, a) if transposed else (a, b)
    with graph.inserting_after(node):
        x = graph.call_function(aten.transpose.int, (node, 1, 2)) if transposed else node
    with graph.inserting_after(x):
        flat = graph.call_function(aten.reshape.default, (x, [e * out_f, in_f]))
    with graph.inserting_after(flat):
        q = graph.call_module(f"{holder_name}.{fq_name}", (flat,))
    with graph.inserting_after(q):
        back = graph.call_function(aten.reshape.default, (q, [e, out_f, in_f]))
    last = back
    if transposed:
        with graph.inserting_after(back):
            last = graph.call_function(aten.transpose.int, (back, 1, 2))
    for user in users:
        user.replace_input_with(node, last)


def quantize_fused_experts(gm, model, qconfig, excluded, weight_range=None, size_params=None):
    """Puts a weight fake quantizer (``qconfig.weight``, on ``weight_range`` where the backend
    narrows every weight's range) on each fused experts parameter ``gm``'s graph reads (Note
    [Fused experts in a prepared model]). ``model``: the float model ``gm`` was captured from
    (its experts modules' layout); ``excluded(name)``: the quantizer's exclusion of a module
    name (the experts module or its parameter); ``size_params(namespace with weight and
    weight_fake_quant)``: sizes a learnable quantizer's per-channel parameters. Returns the
    names of the quantizers added."""
    graph = getattr(gm, "graph", None)
    if graph is None or not any(n.rpartition(".")[2] in _LEAVES and p.dim() == 3
                                for n, p in model.named_parameters()):
        return []  # no fused experts: mqbench.llm is not imported for a CNN
    from mqbench.llm import _experts  # the detection the LLM algorithms use
    fused = dict(_experts.fused_experts(model))
    if not fused:
        return []
    factory = qconfig.weight
    if weight_range is not None:
        factory = factory.with_args(quant_min=weight_range[0], quant_max=weight_range[1])
    for owner, mod in fused.items():  # the capture's holder keeps the parameters, not these
        try:
            holder = gm.get_submodule(owner)
        except AttributeError:
            continue
        for attr in _LAYOUT:
            if hasattr(mod, attr) and not hasattr(holder, attr):
                setattr(holder, attr, getattr(mod, attr))
    added = []
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        owner, _, leaf = node.target.rpartition(".")
        if owner not in fused or leaf not in _LEAVES:
            continue
        if excluded(owner) or excluded(node.target):
            logger.info(f"Skip quant layer: {node.target}")
            continue
        holder = gm.get_submodule(owner)
        param = getattr(holder, leaf)
        transposed = bool(getattr(fused[owner], "is_transposed", False))
        fq_name = leaf + SUFFIX
        if not hasattr(holder, fq_name):
            fq = factory()
            e, a, b = param.shape
            rows, cols = (e * b, a) if transposed else (e * a, b)
            if size_params is not None:
                size_params(types.SimpleNamespace(
                    weight_fake_quant=fq, weight=torch.empty(rows, cols, device="meta")))
            holder.add_module(fq_name, fq.to(param.device))
            added.append(f"{owner}.{fq_name}")
        _insert(graph, node, owner, fq_name, tuple(param.shape), transposed)
    if added:
        gm.recompile()
        logger.info(f"Fused experts weight quantizers: {len(added)}")
    return added
