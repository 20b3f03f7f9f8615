"""The calibration data of :func:`mqbench.advanced_ptq.ptq_reconstruction`: the values of chosen
fx nodes (a unit's inputs in the quantized model, its output in the float model) over the
calibration batches, each forward stopped once they exist. ``save_inp_oup_data`` (MQBench's
name) is re-exported by ``mqbench.advanced_ptq``.
"""
import torch
from torch import fx

from mqbench.utils.hook import StopForwardException
from mqbench.utils.utils import model_device, to_device


class _Collector(fx.Interpreter):
    """Runs a GraphModule node by node, keeps the values of the wanted nodes and stops the
    forward once it has them all."""

    def __init__(self, gm, wanted):
        super().__init__(gm, garbage_collect_values=True)
        self.wanted = set(wanted)
        self.values = {}

    def run_node(self, n):
        result = super().run_node(n)
        if n in self.wanted:
            self.values[n] = result.detach() if isinstance(result, torch.Tensor) else result
            if len(self.values) == len(self.wanted):
                raise StopForwardException()
        return result


def _forward(model, batch):
    """``model(batch)`` as MQBench calls it; a tuple is spread over the model's inputs and a
    dict passed by keyword, so models with several inputs calibrate too."""
    if isinstance(batch, tuple):
        return model(*batch)
    if isinstance(batch, dict):
        return model(**batch)
    return model(batch)


def save_inp_oup_data(model, gm, nodes, cali_data, keep_gpu=True):
    """Values of the fx ``nodes`` of ``gm`` (the model itself or one of its GraphModule
    children) over the calibration batches: ``{node: [value per batch]}``. Each forward stops as
    soon as the values exist. Values stay on the model's device with ``keep_gpu``, else on the
    CPU."""
    nodes = list(nodes)
    cached = {n: [] for n in nodes}
    device = model_device(model)
    state = {}

    def interpret(module, args, kwargs):
        collector = _Collector(module, nodes)
        state["collector"] = collector
        if kwargs:  # keyword inputs go to the placeholders of the same names
            names = [n.target for n in module.graph.nodes if n.op == "placeholder"]
            args = list(args) + [kwargs[k] for k in names[len(args):] if k in kwargs]
        try:
            collector.run(*args)
        except StopForwardException:
            pass
        raise StopForwardException()

    handle = gm.register_forward_pre_hook(lambda m, a, k: interpret(m, a, k), with_kwargs=True)
    try:
        with torch.no_grad():
            for batch in cali_data:
                state.clear()
                try:
                    _forward(model, to_device(batch, device))
                except StopForwardException:
                    pass
                collector = state.get("collector")
                if collector is None or len(collector.values) != len(nodes):
                    missing = [n.name for n in nodes
                               if collector is None or n not in collector.values]
                    raise RuntimeError("ptq_reconstruction: the forward did not compute "
                                       f"{missing}; is the graph module part of the model?")
                for n in nodes:
                    v = collector.values[n]
                    cached[n].append(v if keep_gpu else to_device(v, "cpu"))
    finally:
        handle.remove()
    return cached
