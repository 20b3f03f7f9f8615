"""transformers' ``Conv1D`` in a captured model (docs/transformers.md, "GPT-2's Conv1D").

GPT-2 and its family compute their projections with ``transformers.pytorch_utils.Conv1D``: a
Linear whose weight is stored transposed, [in, out], with ``y = x @ W + b``. Neither capture
knew it: fx would trace into it and export inlines it, so its weight became a ``get_attr`` feeding
an ``addmm`` that no rule quantizes, and a GPT-2 prepared for a W8A8 backend kept every
attention and MLP weight in float while only its embeddings and head were quantized.

Both captures now call a ``Conv1D`` whole (``is_conv1d`` is a leaf for ``CustomedTracer``, and
export lifts leaf calls), and ``linear_from_conv1d`` then puts in its place the ``nn.Linear``
computing the same function: weight ``W.t()`` ([out, in]) and bias, copied. From
there on the QAT swap, the rules, the LLM algorithms and deploy see the Linear they know. The
prepared model's state dict holds that weight as [out, in] under the Conv1D's key
(docs/compatibility.md). The user's model keeps its Conv1D: the capture's own module tree holds
the replacement.
"""
from torch import nn

from mqbench.utils.logger import logger
from mqbench.utils.module_types import is_conv1d, parameter_holders

__all__ = ["is_conv1d", "linear_from_conv1d", "linearize_conv1d"]


def linear_from_conv1d(mod):
    """The ``nn.Linear`` computing ``mod``'s function, with its own parameters: the weight
    transposed to [out, in] and the bias, copied (same device, dtype and requires_grad), so the
    prepared layer and the user's Conv1D never hold half of each other's state."""
    w, b = mod.weight, mod.bias
    n_in, n_out = w.shape
    lin = nn.Linear(n_in, n_out, bias=b is not None, device=w.device, dtype=w.dtype)
    lin.weight = nn.Parameter(w.detach().t().contiguous(), requires_grad=w.requires_grad)
    if b is not None:
        lin.bias = nn.Parameter(b.detach().clone(), requires_grad=b.requires_grad)
    lin.train(mod.training)
    return lin


def linearize_conv1d(gm):
    """Replaces, in the captured ``gm``'s own module tree, every called ``Conv1D`` by
    ``linear_from_conv1d`` of it. A Conv1D whose parameters another module also holds, or that
    the graph also reads directly (a ``get_attr``), is left as it is, with a warning: the copy
    would break the tie. Returns the replaced targets."""
    calls = [n for n in gm.graph.nodes
             if n.op == "call_module" and is_conv1d(gm.get_submodule(n.target))]
    if not calls:
        return []
    holders = parameter_holders(gm)
    read = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    done = []
    for node in calls:
        if node.target in done:
            continue
        mod = gm.get_submodule(node.target)
        params = [(k, p) for k, p in mod._parameters.items() if p is not None]
        if any(holders[id(p)] > 1 or f"{node.target}.{k}" in read for k, p in params):
            logger.warning("prepare_by_platform: Conv1D %s shares its parameters with another "
                           "module or the graph reads them directly; it stays a Conv1D, with a "
                           "float weight (docs/transformers.md)", node.target)
            continue
        parent_name, _, child = node.target.rpartition(".")
        parent = gm.get_submodule(parent_name) if parent_name else gm
        setattr(parent, child, linear_from_conv1d(mod))
        done.append(node.target)
    return done
