"""The fake-quantize nodes no runtime runs, written as the standard ONNX ops of their formulas
(private; :mod:`mqbench.deploy.check` runs files through it).

* mqbench's own nodes (``FixedPerTensorAffine``, ``LearnablePerTensorAffine``,
  ``FixedPerChannelAffine``, ``FakeQuantizeLearnablePerchannelAffine``; domain ``mqbench`` or,
  as MQBench 1.10 wrote them, the default domain): the fake-quant export ``convert_deploy``
  writes as ``<name>.onnx``, and the Academic files that keep a node where a range has no Q/DQ
  form (16 bits).
* OpenVINO's ``FakeQuantize`` (domain ``org.openvinotoolkit``), by OpenVINO's operation spec.

Note [The emulated formulas]
The affine nodes are emulated with the arithmetic of mqbench's kernels
(``src/ops/common/affine_formula.h``): ``inv = Reciprocal(s)`` in float32, ``q = Round(x * inv) +
z`` (Round is half to even, as nearbyint), ``y = (Clip(q, qmin, qmax) - z) * s``; a learnable
node's zero point is ``Clip(Round(z), qmin, qmax)`` first. onnxruntime computes each op in
float32 as the kernels do, so the emulation gives the fake-quant model's values bit for bit on
the same input. The nodes of the other algorithms (DSQ, TQT, NNIE, the block formats) have
formulas of their own; a file with one is refused by name rather than emulated approximately.

Nothing here imports torch: the check of two files (``mqbench-deploy check``) runs without it.
"""
import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["AFFINE_OPS", "emulate", "fake_quant_nodes", "is_fake_quant_node"]

#: mqbench's affine nodes: op_type -> (per-channel, learnable zero point).
AFFINE_OPS = {
    "FixedPerTensorAffine": (False, False),
    "LearnablePerTensorAffine": (False, True),
    "FixedPerChannelAffine": (True, False),
    "FakeQuantizeLearnablePerchannelAffine": (True, True),
}
#: mqbench's other fake-quantize nodes: recognised (a quantizer of the model), not emulated.
OTHER_OPS = ("FakeQuantizeDSQPertensor", "FakeQuantizeDSQPerchannel", "FakeQuantizeTqtAffine",
             "NNIEQuantize", "FakeQuantizeMXFP8", "FakeQuantizeMXFP4", "FakeQuantizeNVFP4")
_MQBENCH_DOMAINS = ("mqbench", "")
OPENVINO_DOMAIN = "org.openvinotoolkit"


def is_fake_quant_node(node):
    """Whether ``node`` is one of mqbench's fake-quantize nodes (either domain)."""
    return node.domain in _MQBENCH_DOMAINS and \
        (node.op_type in AFFINE_OPS or node.op_type in OTHER_OPS)


def fake_quant_nodes(model):
    """mqbench's fake-quantize nodes of ``model`` (a ModelProto), in graph order."""
    return [n for n in model.graph.node if is_fake_quant_node(n)]


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class _Builder(object):
    """New nodes and initializers under one unique prefix per emulated node."""

    def __init__(self, model):
        self.model = model
        self.nodes = []
        taken = {t.name for t in model.graph.initializer}
        for n in model.graph.node:
            taken.update(n.output)
        self._taken = taken

    def name(self, hint):
        base = f"mqbench_emulated/{hint}"
        name, k = base, 1
        while name in self._taken:
            name, k = f"{base}_{k}", k + 1
        self._taken.add(name)
        return name

    def const(self, hint, value):
        name = self.name(hint)
        self.model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type, inputs, hint, output=None, **attrs):
        out = output or self.name(hint)
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out


def constant_values(model):
    """{tensor: numpy value} of the initializers and Constant nodes (the axis and range inputs
    of mqbench's nodes are one or the other)."""
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output:
            for a in n.attribute:
                if a.name == "value":
                    values[n.output[0]] = numpy_helper.to_array(a.t)
    return values


def _rank_of(model, tensor, constants):
    if tensor in constants:
        return constants[tensor].ndim
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if vi.name == tensor and vi.type.tensor_type.HasField("shape"):
            return len(vi.type.tensor_type.shape.dim)
    return None


def _int_input(node, index, attrs, attr, constants, default=None):
    """An integer operand given as input ``index`` (a constant) or as attribute ``attr``."""
    if len(node.input) > index and node.input[index]:
        name = node.input[index]
        if name not in constants:
            raise ValueError(f"node '{node.name}' ({node.op_type}): input {index} ('{name}') is "
                             f"not a constant; the check emulates constant ranges and axes only")
        value = np.asarray(constants[name]).reshape(-1)
        if value.size != 1:
            raise ValueError(f"node '{node.name}' ({node.op_type}): input {index} ('{name}') "
                             f"holds {value.size} values; it takes one")
        return int(value[0])
    if attr in attrs:
        return int(attrs[attr])
    if default is not None:
        return default
    raise ValueError(f"node '{node.name}' ({node.op_type}) has no {attr}")


def _emulate_affine(b, model, node, constants):
    per_channel, learnable = AFFINE_OPS[node.op_type]
    attrs = _attrs(node)
    if len(node.input) < 3 or len(node.output) != 1:
        raise ValueError(f"node '{node.name}' ({node.op_type}) has {len(node.input)} inputs and "
                         f"{len(node.output)} outputs; it takes x, scale, zero_point and gives "
                         f"one output")
    x, s, z = node.input[:3]
    if node.op_type == "FixedPerChannelAffine":
        axis = _int_input(node, 3, attrs, "ch_axis", constants)
        qmin = _int_input(node, 4, attrs, "quant_min", constants)
        qmax = _int_input(node, 5, attrs, "quant_max", constants)
    elif node.op_type == "FakeQuantizeLearnablePerchannelAffine":
        axis = int(attrs.get("ch_axis", 0))
        qmin = _int_input(node, 99, attrs, "quant_min", constants)
        qmax = _int_input(node, 99, attrs, "quant_max", constants)
    else:
        axis = None
        qmin = _int_input(node, 3, attrs, "quant_min", constants)
        qmax = _int_input(node, 4, attrs, "quant_max", constants)
    if qmin > qmax:
        raise ValueError(f"node '{node.name}' ({node.op_type}): quant_min {qmin} > quant_max "
                         f"{qmax}")
    f32 = onnx.TensorProto.FLOAT
    s = b.op("Cast", [s], "scale", to=f32)
    z = b.op("Cast", [z], "zero_point", to=f32)
    if per_channel:
        rank = _rank_of(model, x, constants)
        if rank is None:
            raise ValueError(f"node '{node.name}' ({node.op_type}): the rank of its input '{x}' "
                             f"is not recorded in the file, so its per-channel scale cannot be "
                             f"broadcast")
        if not 0 <= axis < rank:
            raise ValueError(f"node '{node.name}' ({node.op_type}): ch_axis {axis} is outside "
                             f"its input's rank {rank}")
        shape = [1] * rank
        shape[axis] = -1
        shape = b.const("channel_shape", np.array(shape, dtype=np.int64))
        s = b.op("Reshape", [s, shape], "scale_c")
        z = b.op("Reshape", [z, shape], "zero_point_c")
    lo = b.const("quant_min", np.array(qmin, dtype=np.float32))
    hi = b.const("quant_max", np.array(qmax, dtype=np.float32))
    if learnable:
        z = b.op("Clip", [b.op("Round", [z], "zero_point_r"), lo, hi], "zero_point_q")
    inv = b.op("Reciprocal", [s], "inv_scale")
    q = b.op("Add", [b.op("Round", [b.op("Mul", [x, inv], "x_inv")], "rounded"), z], "level")
    q = b.op("Clip", [q, lo, hi], "clipped")
    b.op("Mul", [b.op("Sub", [q, z], "centred"), s], "y", output=node.output[0])


def _emulate_openvino(b, node):
    """OpenVINO's FakeQuantize by its operation spec: q = round((clip(x, il, ih) - il) /
    (ih - il) * (levels - 1)), y = q / (levels - 1) * (oh - ol) + ol."""
    levels = int(_attrs(node).get("levels", 0))
    if levels < 2:
        raise ValueError(f"FakeQuantize node '{node.name}' has levels {levels}; it needs 2 or more")
    if len(node.input) != 5 or len(node.output) != 1:
        raise ValueError(f"FakeQuantize node '{node.name}' has {len(node.input)} inputs and "
                         f"{len(node.output)} outputs; it takes 5 inputs and gives 1 output")
    x, il, ih, ol, oh = node.input
    steps = b.const("steps", np.array(levels - 1, dtype=np.float32))
    c = b.op("Sub", [b.op("Min", [b.op("Max", [x, il], "lo"), ih], "hi"), il], "shifted")
    d = b.op("Div", [c, b.op("Sub", [ih, il], "in_range")], "unit")
    r = b.op("Round", [b.op("Mul", [d, steps], "level")], "rounded")
    g = b.op("Div", [r, steps], "fraction")
    b.op("Add", [b.op("Mul", [g, b.op("Sub", [oh, ol], "out_range")], "scaled"), ol], "y",
         output=node.output[0])


def emulate(model):
    """A copy of ``model`` (a ModelProto) with every mqbench affine node and OpenVINO
    FakeQuantize node written as standard ops (Note [The emulated formulas]), and the count of
    nodes rewritten. mqbench's other nodes are a ValueError naming them."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    constants = constant_values(out)
    b = _Builder(out)
    rewritten = 0
    refused = []
    for node in out.graph.node:
        if node.domain in _MQBENCH_DOMAINS and node.op_type in AFFINE_OPS:
            _emulate_affine(b, out, node, constants)
            rewritten += 1
        elif node.domain == OPENVINO_DOMAIN and node.op_type == "FakeQuantize":
            _emulate_openvino(b, node)
            rewritten += 1
        elif is_fake_quant_node(node):
            refused.append(f"'{node.name or ','.join(node.output)}' ({node.op_type})")
            b.nodes.append(node)
        else:
            b.nodes.append(node)
    if refused:
        raise ValueError(f"the file has fake-quantize nodes whose formulas the check does not "
                         f"emulate: {', '.join(refused[:5])}"
                         f"{' ...' if len(refused) > 5 else ''}. Check a deploy of the model "
                         f"whose file a runtime runs (QDQ, OPENVINO, ONNX_QNN) instead")
    # the range and axis constants the rewritten nodes took are read by nothing now: dropped, so
    # the runtime has no unused initializer to warn about
    read = {i for n in b.nodes for i in n.input} | {o.name for o in out.graph.output}
    nodes = [n for n in b.nodes if not (n.op_type == "Constant" and n.domain in ("", "ai.onnx")
                                       and not any(o in read for o in n.output))]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    inits = [t for t in out.graph.initializer if t.name in read]
    del out.graph.initializer[:]
    out.graph.initializer.extend(inits)
    keep = [o for o in out.opset_import if o.domain not in ("mqbench", OPENVINO_DOMAIN)]
    del out.opset_import[:]
    out.opset_import.extend(keep)
    return out, rewritten
