"""The units of :func:`mqbench.advanced_ptq.ptq_reconstruction`, carved out of an fx graph: a
layer (a weighted layer and the single-user chain after it), a block (BRECQ's single-entry,
single-exit region), and the standalone ``GraphModule`` of a unit's nodes. MQBench's public
names (``extract_layer``, ``extract_block``, ``extract_subgraph``) are re-exported by
``mqbench.advanced_ptq``, where its users import them.
"""
from typing import Dict, List

import torch
from torch import fx, nn

_MAX_BLOCK_NODES = 256


def _tensor_args(node):
    """The fx nodes among ``node``'s arguments (nested lists, tuples and dicts included)."""
    out = []
    for arg in node.all_input_nodes:
        if arg not in out:
            out.append(arg)
    return out


def _is_quant_layer(module):
    """A layer whose weight AdaRound reconstructs: it has a weight and a weight quantizer."""
    return (isinstance(getattr(module, "weight", None), torch.Tensor)
            and isinstance(getattr(module, "weight_fake_quant", None), nn.Module))


def _is_layer_node(node, modules):
    return node.op == "call_module" and _is_quant_layer(modules.get(node.target))


def _is_merge(node):
    return len(_tensor_args(node)) > 1


def _real_users(node):
    """Users of ``node`` except in-place dict updates whose result is unused (MQBench drops them)."""
    return [u for u in node.users if not (u.target == "update" and not u.users)]


def extract_layer(node, fp32_modules):
    """The layer unit that starts at the weighted layer ``node``: ``node`` and the single-user
    chain after it (activation, its quantizer, ...), up to and excluding the next weighted layer,
    a merge (add, cat, ...) or the output. Returns ``(nodes, is_next_block)``; ``is_next_block``
    says the chain ended at a fan-out or the output, as MQBench's."""
    nodes = [node]
    cur = node
    is_next_block = False
    while True:
        users = _real_users(cur)
        if len(users) != 1:  # a fan-out (or nothing) follows: the next unit starts there
            is_next_block = True
            break
        user = users[0]
        if user.op == "output":
            is_next_block = True
            break
        if _is_layer_node(user, fp32_modules) or _is_merge(user) or user.op == "placeholder":
            break
        nodes.append(user)
        cur = user
    return nodes, is_next_block


def extract_block(input_nodes, fp32_modules, max_layers=3, max_nodes=_MAX_BLOCK_NODES):
    """The block unit fed by ``input_nodes`` (the inputs of a weighted layer), BRECQ's
    definition: the single-entry, single-exit region from the input to the point where every
    branch has joined again (a residual or inception block), followed by the activation chain
    after the join; without a branch, up to ``max_layers`` layers stacked as a chain. The search
    walks forward in graph order over at most ``max_nodes`` nodes (no recursion) and returns an
    empty list when the region does not close within them (the caller falls back to a layer)."""
    if not input_nodes:
        return []
    sources = set(input_nodes)
    region: List[fx.Node] = []
    members = set()
    graph_nodes = list(next(iter(sources)).graph.nodes)
    order = {n: i for i, n in enumerate(graph_nodes)}
    start = max(order[n] for n in sources)
    branched = False
    layers = 0

    def open_nodes():
        # nodes of the region (or its sources) with a user outside the region
        return [n for n in list(sources) + region if any(u not in members for u in _real_users(n))]

    for node in graph_nodes[start + 1:start + 1 + max_nodes]:
        args = _tensor_args(node)
        if node.op in ("output", "placeholder") or not any(a in members or a in sources
                                                             for a in args):
            continue
        if any(a not in members and a not in sources for a in args) and _is_layer_node(
                node, fp32_modules):
            continue  # a weighted layer fed from outside starts another unit
        if len([u for s in sources for u in _real_users(s)]) > 1 or any(
                len(_real_users(n)) > 1 for n in region):
            branched = True
        region.append(node)
        members.add(node)
        if _is_layer_node(node, fp32_modules):
            layers += 1
        still_open = open_nodes()
        if still_open != [node] or layers == 0:
            continue
        # closed at ``node``: every branch has joined
        if branched:
            tail, _ = extract_layer(node, fp32_modules)
            return region + [n for n in tail[1:] if n not in members]
        users = _real_users(node)
        next_user = users[0] if len(users) == 1 else None
        if next_user is None or next_user.op == "output" or _is_merge(next_user):
            return region
        if _is_layer_node(next_user, fp32_modules) and layers >= max_layers:
            return region
    return []


def _unit_output(value):
    if isinstance(value, torch.Tensor):
        return value
    raise TypeError("ptq_reconstruction: a unit's output must be a tensor, got "
                    f"{type(value).__name__}; exclude the node or use pattern='layer'")


def extract_subgraph(orig_module, nodes, output, g2node=None):
    """A ``GraphModule`` that computes ``output`` from the ``nodes`` of a graph, with one
    placeholder per value the nodes read from outside (in order of first use). It shares
    ``orig_module``'s submodules and parameters, so training it trains them.
    Returns the module; its ``unit_inputs`` attribute lists the outside nodes."""
    del g2node  # MQBench's getitem map: our units keep getitem nodes as nodes
    members = set(nodes)
    graph = fx.Graph()
    env: Dict[fx.Node, fx.Node] = {}
    inputs: List[fx.Node] = []
    for node in nodes:
        for arg in _tensor_args(node):
            if arg not in members and arg not in env:
                env[arg] = graph.placeholder(arg.name)
                inputs.append(arg)
    for node in nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(env[output])
    graph.lint()
    # fx.GraphModule takes the root module, or MQBench's {qualified name: module} dict
    sub = fx.GraphModule(orig_module, graph)
    sub.unit_inputs = inputs
    return sub
