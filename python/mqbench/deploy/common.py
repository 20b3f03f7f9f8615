"""MQBench's ONNX graph helpers (``mqbench.deploy.common``), over the ``onnx`` package.

::

    from mqbench.deploy.common import ONNXGraph, update_inp2node_out2node
    g = ONNXGraph("out/resnet18.onnx")
    conv = g.get_tensor_producer("/conv1/Conv_output_0")        # a NodeProto, or 'INPUT_TOKEN'
    g.set_initializer("conv1.weight", g.get_initializer("conv1.weight") * 0.5)
    g.optimize_model()                      # unused Constants and initializers out, nodes sorted
    g.save_onnx_model("out/resnet18_edited.onnx")

These are the helpers a user script edits a graph with. The deploy steps themselves
(``remove_fakequantize_and_collect_params``, ``ONNXQNNPass``, ...) run the C++ translators;
``OnnxPreprocess``'s two passes are the translators' own (``mqbench/deploy/fake_quant.h``), run on
a copy and written back into the graph given. Differences from MQBench are listed in
docs/compatibility.md (rows from 100).
"""
import heapq
import os

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from mqbench import _C
from mqbench.deploy._io import read_onnx  # the checked reader of every step

__all__ = ["ONNXGraph", "OnnxPreprocess", "update_inp2node_out2node", "prepare_data",
           "prepare_initializer", "parse_attrs", "parse_qparams", "get_constant_inputs"]


def _load(onnx_model):
    """A ModelProto from a path (str or os.PathLike), serialized bytes or a ModelProto."""
    if isinstance(onnx_model, onnx.ModelProto):
        return onnx_model
    data = onnx_model if isinstance(onnx_model, (bytes, bytearray)) else read_onnx(onnx_model)
    try:
        return onnx.load_from_string(bytes(data))
    except Exception as e:  # protobuf's DecodeError
        raise ValueError(f"cannot parse the ONNX model: {e}") from e


def _atomic_save(model, path):
    """Writes ``model`` to ``path`` atomically (a temporary in the same folder, then a rename);
    the file name must be one name (the folder is the path's own)."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    _C.deploy_write(directory or ".", {name: model.SerializeToString()})


class ONNXGraph(object):
    """An ONNX model with MQBench's lookup tables.

    Attributes:
        model: the ``onnx.ModelProto``; ``graph`` is ``model.graph``.
        initializer: ``{name: (TensorProto, index in graph.initializer)}``.
        input_map: ``{tensor: [nodes reading it]}``; ``output_map``: ``{tensor: node writing it}``.

    Args:
        onnx_model_path: a path (as MQBench), or serialized bytes, or an ``onnx.ModelProto``
            (used as is, not copied).
    """

    def __init__(self, onnx_model_path):
        self.model = _load(onnx_model_path)
        self.graph = self.model.graph
        self.initializer = {}
        self.input_map = {}
        self.output_map = {}
        self.topologize_graph()
        self.prepare_initializer()

    def prepare_initializer(self):
        """Rebuilds ``initializer`` from the graph."""
        self.initializer.clear()
        for idx, init in enumerate(self.graph.initializer):
            self.initializer[init.name] = (init, idx)

    def get_constant(self, name):
        """The value of the Constant node writing ``name``, as ``.tolist()``; None if none does."""
        for node in self.graph.node:
            if node.op_type == "Constant" and node.output and node.output[0] == name:
                for attr in node.attribute:
                    if attr.name == "value":
                        return numpy_helper.to_array(attr.t).tolist()
        return None

    def get_initializer(self, initializer_name):
        """The initializer ``initializer_name`` as a numpy array (KeyError naming it if absent)."""
        if initializer_name not in self.initializer:
            raise KeyError(f"no initializer named '{initializer_name}'")
        return numpy_helper.to_array(self.initializer[initializer_name][0])

    def set_initializer(self, initializer_name, value_tensor, raw=True):
        """Replaces (in place) or appends the initializer ``initializer_name``.

        ``raw=True`` stores ``value_tensor`` (a numpy array) with its shape and dtype as raw data;
        ``raw=False`` stores float32 / uint8 / int8 values in the typed field, with dims ``[]``
        for a single value (MQBench's layout for QDQ scales and zero points).
        """
        value_tensor = np.asarray(value_tensor)
        if raw:
            initializer = numpy_helper.from_array(value_tensor, initializer_name)
        else:
            types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.uint8): TensorProto.UINT8,
                     np.dtype(np.int8): TensorProto.INT8}
            if value_tensor.dtype not in types:
                raise TypeError(f"set_initializer(raw=False) stores float32, uint8 or int8 "
                                f"values; got {value_tensor.dtype} (pass raw=True, or convert "
                                f"with .astype)")
            dims = [] if value_tensor.size == 1 else list(value_tensor.shape)
            initializer = onnx.helper.make_tensor(initializer_name, types[value_tensor.dtype], dims,
                                                  value_tensor.flatten().tolist(), raw=False)
        if initializer_name in self.initializer:
            self.graph.initializer[self.initializer[initializer_name][1]].CopyFrom(initializer)
        else:
            self.graph.initializer.append(initializer)
        self.prepare_initializer()

    def topologize_graph(self):
        """Rebuilds ``input_map`` and ``output_map`` from the nodes."""
        self.input_map.clear()
        self.output_map.clear()
        for node in self.graph.node:
            for output_name in node.output:
                self.output_map[output_name] = node
            for input_name in node.input:
                self.input_map.setdefault(input_name, []).append(node)

    def get_tensor_producer(self, output_name):
        """The node writing ``output_name``, or ``'INPUT_TOKEN'`` (graph input, initializer)."""
        return self.output_map.get(output_name, "INPUT_TOKEN")

    def get_tensor_consumer(self, input_name):
        """The nodes reading ``input_name``, or ``['OUTPUT_TOKEN']`` when none does."""
        return self.input_map.get(input_name, ["OUTPUT_TOKEN"])

    def save_onnx_model(self, model_path):
        """Writes the model to ``model_path`` atomically (no half-written file on failure)."""
        _atomic_save(self.model, model_path)

    def remove_node_purely(self, node):
        """Removes ``node`` from the graph (the maps are not updated: call topologize_graph)."""
        self.graph.node.remove(node)

    def insert_node_purely(self, node, idx=0):
        """Inserts ``node`` at position ``idx`` (the maps are not updated)."""
        self.graph.node.insert(idx, node)

    def del_initializer(self, initializer_name):
        """Removes the initializer ``initializer_name`` from the graph and from ``initializer``."""
        if initializer_name in self.initializer:
            del self.graph.initializer[self.initializer[initializer_name][1]]
            self.prepare_initializer()

    def optimize_model(self):
        """Removes nodes without inputs whose outputs nothing reads (dead Constants), then
        initializers nothing reads, then sorts the nodes topologically (stable: a sorted graph
        keeps its order). A cycle, or a node reading a tensor nothing provides, is a
        ValueError naming the node."""
        outputs = {o.name for o in self.graph.output}
        dead = [n for n in self.graph.node if len(n.input) == 0
                and not any(o in self.input_map or o in outputs for o in n.output)]
        for node in dead:
            self.remove_node_purely(node)
        self.topologize_graph()
        for name in [n for n in self.initializer if n not in self.input_map and n not in outputs]:
            self.del_initializer(name)
        self._sort_nodes()
        self.topologize_graph()
        self.prepare_initializer()

    def _sort_nodes(self):
        nodes = list(self.graph.node)
        available = {i.name for i in self.graph.input} | set(self.initializer) | {""}
        producer = {}
        for i, node in enumerate(nodes):
            for out in node.output:
                producer[out] = i
        waiting = [0] * len(nodes)
        readers = {}
        for i, node in enumerate(nodes):
            for inp in set(node.input):
                if inp in available:
                    continue
                if inp not in producer:
                    raise ValueError(f"node '{node.name}' ({node.op_type}) reads '{inp}', which no "
                                     f"node, graph input or initializer provides")
                waiting[i] += 1
                readers.setdefault(producer[inp], []).append(i)
        ready = [i for i in range(len(nodes)) if waiting[i] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for j in readers.get(i, ()):
                waiting[j] -= 1
                if waiting[j] == 0:
                    heapq.heappush(ready, j)
        if len(order) != len(nodes):
            stuck = next(nodes[i] for i in range(len(nodes)) if waiting[i] > 0)
            raise ValueError(f"the graph has a cycle through node '{stuck.name}' ({stuck.op_type})")
        sorted_nodes = [onnx.NodeProto() for _ in order]
        for dst, i in zip(sorted_nodes, order):
            dst.CopyFrom(nodes[i])
        del self.graph.node[:]
        self.graph.node.extend(sorted_nodes)

    def set_opset_version(self, domain, version):
        """Sets the opset of ``domain`` (updating its import, or inserting one first)."""
        for opset in self.model.opset_import:
            if opset.domain == domain:
                opset.version = version
                return
        opset = onnx.helper.make_opsetid(domain, version)
        self.model.opset_import.insert(0, opset)


def _run_preprocess(graph, pass_name):
    """Runs a translator preprocess pass on a copy of ``graph`` and writes the result back."""
    model = onnx.ModelProto()
    model.ir_version = onnx.IR_VERSION
    model.graph.CopyFrom(graph)
    out = onnx.load_from_string(_C.deploy_preprocess(model.SerializeToString(), pass_name))
    graph.CopyFrom(out.graph)


class OnnxPreprocess(object):
    """MQBench's two graph preprocess passes, run by the C++ translators' own code. Each edits
    ``graph`` in place (a GraphProto); the map arguments are taken for MQBench's signatures and
    not used (rebuild yours with update_inp2node_out2node afterwards). Unnamed nodes come back
    named ``<op_type>_<index>``."""

    def replace_resize_op_with_upsample(self, graph, out2node=None):
        """Each Resize becomes Upsample(X, scales) with its mode (NNIE); a Resize without constant
        scales is a ValueError naming it."""
        _run_preprocess(graph, "resize_to_upsample")

    def remove_fake_pad_op(self, graph, name2data=None, inp2node=None, out2node=None):
        """Removes the Pad nodes whose pads are all zero, rewiring their readers."""
        _run_preprocess(graph, "remove_zero_pads")


def update_inp2node_out2node(graph):
    """``(out2node, inp2node)``: ``out2node[tensor] = node`` writing it, ``inp2node[tensor] =
    [[node, input index], ...]`` reading it."""
    out2node = {}
    inp2node = {}
    for node in graph.node:
        for out in node.output:
            out2node[out] = node
        for idx, inp in enumerate(node.input):
            inp2node.setdefault(inp, []).append([node, idx])
    return out2node, inp2node


def prepare_data(graph):
    """``{name: numpy array}`` of the initializers and of the Constant nodes' outputs."""
    params = {}
    for init in graph.initializer:
        params[init.name] = numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    params[node.output[0]] = numpy_helper.to_array(attr.t)
    return params


def prepare_initializer(graph):
    """``{name: TensorProto}`` of the initializers."""
    return {init.name: init for init in graph.initializer}


def parse_attrs(node_attrs):
    """A node's attributes as a dict: INTS / FLOATS / STRINGS as tuples, INT / FLOAT as numbers,
    TENSOR as a numpy array, STRING as ``str(bytes)`` (MQBench's form, ``"b'nearest'"``)."""
    A = onnx.AttributeProto
    attrs = {}
    for attr in node_attrs:
        if attr.type == A.INTS:
            attrs[attr.name] = tuple(attr.ints)
        elif attr.type == A.INT:
            attrs[attr.name] = attr.i
        elif attr.type == A.FLOATS:
            attrs[attr.name] = tuple(attr.floats)
        elif attr.type == A.FLOAT:
            attrs[attr.name] = attr.f
        elif attr.type == A.TENSOR:
            attrs[attr.name] = numpy_helper.to_array(attr.t)
        elif attr.type == A.STRING:
            attrs[attr.name] = str(attr.s)
        elif attr.type == A.STRINGS:
            attrs[attr.name] = tuple(str(x) for x in attr.strings)
        else:
            raise ValueError(f"attribute '{attr.name}' has type "
                             f"{A.AttributeType.Name(attr.type)}, which parse_attrs does not read "
                             f"(it reads INT(S), FLOAT(S), STRING(S) and TENSOR)")
    return attrs


def get_constant_inputs(node, out2node):
    """The Constant nodes among the producers of ``node``'s inputs."""
    return [out2node[inp] for inp in node.input
            if inp in out2node and out2node[inp].op_type == "Constant"]


def parse_qparams(node, name2data, required=True):
    """MQBench's parse_qparams: (tensor name, scale, zero point, qmin, qmax) of a fake-quantize
    node, from ``name2data`` (prepare_data) and its trailing inputs or attributes."""
    def data(name):
        if name not in name2data:
            raise KeyError(f"'{name}' (an input of node '{node.name}') is not an initializer or a "
                           f"Constant output (torch may leave Identity / Cast nodes in front of "
                           f"quantization parameters; the deploy translators fold them)")
        return name2data[name]

    if len(node.input) < 3:
        raise ValueError(f"node '{node.name}' ({node.op_type}) has {len(node.input)} inputs; a "
                         f"fake-quantize node has x, scale, zero_point")
    tensor_name = node.input[0]
    scale, zero_point = data(node.input[1]), data(node.input[2])
    attrs = parse_attrs(node.attribute)
    if len(node.input) > 3:
        qmin, qmax = (data(n) for n in node.input[-2:])
    elif "quant_min" in attrs and "quant_max" in attrs:
        qmin, qmax = attrs["quant_min"], attrs["quant_max"]
    elif required:
        raise ValueError(f"quant_min and quant_max are not found for <{node.name}>: neither "
                         f"inputs 3-4 nor attributes")
    else:
        qmin = qmax = None
    return tensor_name, scale, zero_point, qmin, qmax
