"""The fx frontend: a model traced with ``torch.fx`` (``CustomedTracer``, as MQBench traces),
as a ``GraphModule`` of the model's own submodules, ready for the quantizer's IR
(``mqbench.custom_quantizer.graph_ir.to_ir``)."""
import copy

from torch.fx import GraphModule

from mqbench.custom_quantizer.tracer import CustomedTracer

__all__ = ["trace", "duplicate_reused_nodes", "prepare_constant_dict"]


def duplicate_reused_nodes(graph, modules):
    """Gives the 2nd, 3rd, ... call of the same module its own deep copy, ``<target>_dup<k>``
    (ResNet's BasicBlock calls ``relu`` twice), so each call can be fused and quantized on its
    own. Returns the updated modules dict."""
    seen = {}
    for node in graph.nodes:
        if node.op != "call_module":
            continue
        k = seen.get(node.target, 0)
        seen[node.target] = k + 1
        if k == 0:
            continue
        new_target = f"{node.target}_dup{k}"
        modules[new_target] = copy.deepcopy(modules[node.target])
        node.target = new_target
    return modules


def prepare_constant_dict(graph, model):
    """The values of every ``get_attr`` target, resolved on the model (dotted paths)."""
    constants = {}
    for node in graph.nodes:
        if node.op == "get_attr":
            value = model
            for part in node.target.split("."):
                value = getattr(value, part)
            constants[node.target] = value
    return constants


def trace(model, config, custom_tracer=None):
    """The model as a GraphModule traced by ``custom_tracer`` (default ``CustomedTracer`` with
    ``config['leaf_module']``), with ``config['concrete_args']``; a module called twice gets
    its own copy for the second call (``duplicate_reused_nodes``)."""
    tracer = custom_tracer or CustomedTracer(
        customed_leaf_module=tuple(config.get("leaf_module", ())))
    graph = tracer.trace(model, config.get("concrete_args"))
    modules = dict(model.named_modules())
    modules = duplicate_reused_nodes(graph, modules)
    modules.update(prepare_constant_dict(graph, model))
    return GraphModule(modules, graph, model.__class__.__name__)


def is_leaf_type(module, leaf_types=()):
    """Whether ``CustomedTracer`` calls ``module`` as a whole (torch.nn's and mqbench.nn's
    modules except Sequential, and instances of ``leaf_types``)."""
    return CustomedTracer(customed_leaf_module=tuple(leaf_types) or None).is_leaf_module(
        module, "")
