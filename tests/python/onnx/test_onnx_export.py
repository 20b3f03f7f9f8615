"""ONNX export of every op: node types, inputs and attributes as MQBench emits them,
onnx.checker, and the QDQ format's structure and saturation."""
import io

import onnx
import pytest
import torch
from onnx import numpy_helper

from mqbench.custom_symbolic_opset import export_format, export_onnx, get_export_format, set_export_format

ops = torch.ops.mqbench


class Quant(torch.nn.Module):
    """A conv whose weight and output are fake-quantized by the op under test."""

    def __init__(self, fn):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fn = fn

    def forward(self, x):
        return self.fn(self, self.conv(x))


def export(fn, opset, fmt="mqbench"):
    model = Quant(fn).eval()
    buf = io.BytesIO()
    with export_format(fmt):
        export_onnx(model, (torch.randn(1, 3, 8, 8),), buf, opset_version=opset,
                    input_names=["x"], output_names=["y"])
    m = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(m)
    return m


def nodes(m, op_type):
    return [n for n in m.graph.node if n.op_type == op_type]


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def constant_value(m, name):
    for n in m.graph.node:
        if n.op_type == "Constant" and n.output[0] == name:
            return numpy_helper.to_array(n.attribute[0].t)
    for init in m.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    raise KeyError(name)


S1, Z1 = torch.tensor([0.05]), torch.tensor([0], dtype=torch.int32)
DATA_MAX, ALPHA, N_ALPHA = torch.tensor(4.0), torch.tensor([2.0]), torch.tensor([-1.0])
SC, ZC = torch.full((4,), 0.05), torch.zeros(4, dtype=torch.int32)

CASES = {
    "FixedPerTensorAffine": lambda m, y: ops.fake_quantize_per_tensor_affine(y, S1, Z1, -128, 127),
    "LearnablePerTensorAffine": lambda m, y: ops.fake_quantize_learnable_per_tensor_affine(y, S1, Z1.float(), 0, 15, 1.0),
    "FixedPerChannelAffine": lambda m, y: ops.fake_quantize_per_channel_affine(y, SC, ZC, 1, -128, 127),
    "FakeQuantizeLearnablePerchannelAffine": lambda m, y: m.conv._conv_forward(
        y[:, :3, :3, :3] * 0 + 1,
        ops.fake_quantize_learnable_per_channel_affine(m.conv.weight, SC, ZC.float(), 0, -127, 127, 1.0), None),
    "FakeQuantizeDSQPertensor": lambda m, y: ops.fake_quantize_dsq_per_tensor(y, S1, Z1, -8, 7, 0.4),
    "FakeQuantizeDSQPerchannel": lambda m, y: ops.fake_quantize_dsq_per_channel(y, SC, ZC, 1, -8, 7, 0.4),
    "FakeQuantizeTqtAffine": lambda m, y: ops.fake_quantize_tqt(y, S1, Z1.float(), -128, 127, 2),
    "NNIEQuantize": lambda m, y: ops.fake_quantize_nnie(y, DATA_MAX),
}


def test_default_format_is_mqbench():
    assert get_export_format() == "mqbench"
    with pytest.raises(ValueError, match=r"unknown ONNX export format 'tflite'; choose one of \['mqbench', 'qdq'\]"):
        set_export_format("tflite")


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("op_type", list(CASES))
def test_mqbench_nodes(opset, op_type):
    m = export(CASES[op_type], opset)
    found = nodes(m, op_type)
    assert len(found) == 1, [n.op_type for n in m.graph.node]
    node = found[0]
    assert node.domain == "mqbench"
    assert {o.domain: o.version for o in m.opset_import}["mqbench"] == 1
    a = attrs(node)
    if op_type in ("FixedPerTensorAffine", "LearnablePerTensorAffine"):
        assert len(node.input) == 5 and not a
        expected = (-128, 127) if op_type.startswith("Fixed") else (0, 15)
        assert (int(constant_value(m, node.input[3])), int(constant_value(m, node.input[4]))) == expected
    elif op_type == "FixedPerChannelAffine":
        assert len(node.input) == 6 and not a
        assert [int(constant_value(m, i)) for i in node.input[3:]] == [1, -128, 127]
    elif op_type == "FakeQuantizeLearnablePerchannelAffine":
        assert len(node.input) == 3 and a == {"quant_min": -127, "quant_max": 127}
    elif op_type.startswith("FakeQuantizeDSQ"):
        expected = {"quant_min": -8, "quant_max": 7, "alpha": pytest.approx(0.4)}
        if op_type.endswith("Perchannel"):
            expected["ch_axis"] = 1
        assert len(node.input) == 3 and a == expected
    elif op_type == "FakeQuantizeTqtAffine":
        assert len(node.input) == 3 and a == {"quant_min": -128, "quant_max": 127}
    elif op_type == "NNIEQuantize":
        assert len(node.input) == 2 and not a


def test_pact_exports_clip_then_fixed_node():
    m = export(lambda mod, y: ops.fake_quantize_pact(y, ALPHA, N_ALPHA, S1, Z1, -128, 127), 13)
    clip = nodes(m, "Clip")
    assert len(clip) == 1 and len(nodes(m, "FixedPerTensorAffine")) == 1
    assert nodes(m, "FixedPerTensorAffine")[0].input[0] == clip[0].output[0]


@pytest.mark.parametrize("opset", [11, 13])
def test_helper_ops_export(opset):
    m = export(lambda mod, y: ops.fake_quantize_qdrop_per_tensor(ops.dorefa_normalize(y), ops.pot_quantization(S1), Z1, -128, 127, 0.5), opset)
    assert len(nodes(m, "LearnablePerTensorAffine")) == 1
    assert len(nodes(m, "Tanh")) == 1 and len(nodes(m, "ReduceMax")) == 1


def test_adaround_exports_hard_rounding():
    alpha = torch.randn(1, 4, 6, 6)
    m = export(lambda mod, y: ops.fake_quantize_adaround_per_channel(y, SC, ZC, alpha, 1, -8, 7, False), 13)
    assert len(nodes(m, "FixedPerChannelAffine")) == 1
    assert len(nodes(m, "Floor")) == 1


# ---- QDQ ----------------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [11, 13])
def test_qdq_per_tensor(opset):
    m = export(CASES["FixedPerTensorAffine"], opset, "qdq")
    q, dq = nodes(m, "QuantizeLinear"), nodes(m, "DequantizeLinear")
    assert len(q) == len(dq) == 1 and not nodes(m, "Clip")
    assert dq[0].input[0] == q[0].output[0]
    assert not any(n.domain == "mqbench" for n in m.graph.node)


def test_qdq_per_channel_has_axis():
    m = export(CASES["FixedPerChannelAffine"], 13, "qdq")
    q = nodes(m, "QuantizeLinear")
    assert len(q) == 1 and attrs(q[0]) == {"axis": 1}


def test_qdq_narrow_range_clips_in_the_integer_domain():
    m = export(CASES["LearnablePerTensorAffine"], 13, "qdq")  # [0, 15] in uint8
    q_out = nodes(m, "QuantizeLinear")[0].output[0]
    clip = [n for n in nodes(m, "Clip") if n.input[0] == q_out]
    assert len(clip) == 1
    assert nodes(m, "DequantizeLinear")[0].input[0] == clip[0].output[0]
    lo, hi = constant_value(m, clip[0].input[1]), constant_value(m, clip[0].input[2])
    assert (lo.dtype.name, int(lo), int(hi)) == ("uint8", 0, 15)


def test_qdq_refusals_are_clear():
    with pytest.raises(ValueError, match=r"the range \[0, 65535\] fits neither int8 nor uint8"):
        export(lambda m, y: ops.fake_quantize_per_tensor_affine(y, S1, Z1, 0, 65535), 13, "qdq")
    with pytest.raises(ValueError, match="per-channel QuantizeLinear needs opset 13"):
        export(CASES["FixedPerChannelAffine"], 11, "qdq")
    with pytest.raises(ValueError, match="NNIE's logarithmic quantization has no QuantizeLinear form"):
        export(CASES["NNIEQuantize"], 13, "qdq")


def test_export_format_context_restores_previous():
    with export_format("qdq"):
        assert get_export_format() == "qdq"
    assert get_export_format() == "mqbench"


class _PooledHead(torch.nn.Module):
    """alexnet / vgg's tail: a non-global adaptive average pool and a flatten after a
    fake-quantized tensor (torch's adaptive_avg_pool2d export needs the input's sizes)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.pool = torch.nn.AdaptiveAvgPool2d((3, 3))
        self.fc = torch.nn.Linear(36, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


@pytest.mark.parametrize("fmt", ["mqbench", "qdq"])
@pytest.mark.parametrize("dynamo", [False, True])
def test_fake_quant_outputs_keep_the_input_type_and_shape(fmt, dynamo, tmp_path):
    if dynamo:
        pytest.importorskip("onnxscript")
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    from mqbench.utils.state import enable_calibration, enable_quantization
    q = prepare_by_platform(_PooledHead().eval(), BackendType.Tensorrt).eval()
    x = torch.randn(2, 3, 11, 11)
    enable_calibration(q)
    q(x)
    enable_quantization(q)
    path = str(tmp_path / "m.onnx")
    with export_format(fmt):
        export_onnx(q, (x,), path, dynamo=dynamo)
    m = onnx.shape_inference.infer_shapes(onnx.load(path), strict_mode=True)
    typed = {v.name: v.type.tensor_type for v in
             list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output)}
    for init in m.graph.initializer:  # weights: their own type and dims
        typed[init.name] = onnx.helper.make_tensor_type_proto(init.data_type,
                                                              init.dims).tensor_type
    quant_types = {"QuantizeLinear", "DequantizeLinear"} if fmt == "qdq" else None
    checked = 0
    for n in m.graph.node:
        if (quant_types and n.op_type not in quant_types) or (not quant_types and not n.domain):
            continue
        source = n.input[0]
        if n.op_type == "DequantizeLinear":  # its input is the integer tensor: same shape
            assert typed[n.output[0]].elem_type == onnx.TensorProto.FLOAT
        elif n.op_type != "QuantizeLinear":
            assert typed[n.output[0]].elem_type == typed[source].elem_type, n.name
        out_dims = [d.dim_value for d in typed[n.output[0]].shape.dim]
        in_dims = [d.dim_value for d in typed[source].shape.dim]
        assert out_dims == in_dims and all(out_dims), (n.name, out_dims, in_dims)
        checked += 1
    assert checked >= 3
