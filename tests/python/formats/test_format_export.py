"""ONNX export of the format ops (python/mqbench/onnx/formats.py, TorchScript exporter):
standard QuantizeLinear/DequantizeLinear with float8 types (opset 19) and blocked Q/DQ
(block_size, opset 21) in both export formats; onnx's full checker passes and onnxruntime runs
each model to the fake-quant model's outputs bit for bit; a prepared model with FP8 activations
and INT4 group-wise weights exports and runs the same way."""
import io
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn

import mqbench  # noqa: F401
from mqbench.custom_symbolic_opset import export_format, export_onnx
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.state import enable_calibration, enable_quantization

ops = torch.ops.mqbench


class OpModel(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        g = torch.Generator().manual_seed(0)
        self.register_buffer("s", torch.tensor([0.01]))
        self.register_buffer("sc", torch.rand(6, generator=g) * 0.01 + 1e-3)
        self.register_buffer("gs", torch.rand(6, 4, generator=g) * 0.1 + 0.01)
        self.register_buffer("gz", torch.randint(0, 16, (6, 4), generator=g, dtype=torch.int32))
        self.ls = nn.Parameter(torch.rand(6, generator=g) * 0.01 + 1e-3)

    def forward(self, x):
        k = self.kind
        if k == "fp8_e4m3_tensor":
            return ops.fake_quantize_fp8(x, self.s, None, "fp8_e4m3")
        if k == "fp8_e4m3_channel":
            return ops.fake_quantize_fp8(x, self.sc, 0, "fp8_e4m3")
        if k == "fp8_e5m2_channel":
            return ops.fake_quantize_fp8(x, self.sc, 0, "fp8_e5m2")
        if k == "fp8_learnable":
            return ops.fake_quantize_learnable_fp8(x, self.ls, 0, "fp8_e4m3", 1.0)
        if k == "int4_group_sym":
            return ops.fake_quantize_per_group_affine(x, self.gs, torch.zeros_like(self.gz), 1,
                                                      16, -8, 7)
        if k == "uint4_group_asym":
            return ops.fake_quantize_per_group_affine(x, self.gs, self.gz, 1, 16, 0, 15)
        if k == "int8_group":
            return ops.fake_quantize_learnable_per_group_affine(
                x, self.gs, torch.zeros(6, 4), 1, 16, -128, 127, 1.0)
        raise ValueError(k)


KINDS = {"fp8_e4m3_tensor": 19, "fp8_e4m3_channel": 19, "fp8_e5m2_channel": 19,
         "fp8_learnable": 19, "int4_group_sym": 21, "uint4_group_asym": 21, "int8_group": 21}


def run_ort(data, x, level=None):
    so = ort.SessionOptions()
    if level is not None:
        so.graph_optimization_level = level
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]


def export_bytes(model, x, opset, fmt):
    f = io.BytesIO()
    with export_format(fmt):
        export_onnx(model, (x,), f, opset_version=opset, dynamo=False)
    return f.getvalue()


@pytest.mark.parametrize("fmt", ["qdq", "mqbench"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_export_checks_and_runs_bit_exact(kind, fmt):
    model = OpModel(kind)
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(1)) * 3
    x[0, :4] = torch.tensor([1e4, -1e4, 0.0, -0.0])
    if kind.startswith("fp8"):
        x[1, :3] = torch.tensor([math.inf, -math.inf, 1e-7])
    data = export_bytes(model, x, KINDS[kind], fmt)
    proto = onnx.load_from_string(data)
    onnx.checker.check_model(proto, full_check=True)
    types = [n.op_type for n in proto.graph.node]
    assert types.count("QuantizeLinear") == 1 and types.count("DequantizeLinear") == 1
    q = next(n for n in proto.graph.node if n.op_type == "QuantizeLinear")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in q.attribute}
    if kind.startswith("fp8"):
        assert attrs["saturate"] == (0 if "e5m2" in kind else 1)
    else:
        assert attrs["block_size"] == 16 and attrs["axis"] == 1
    y = run_ort(data, x)
    ref = model(x).detach().numpy()
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    assert np.array_equal(y.view(np.int32)[~np.isnan(ref)], ref.view(np.int32)[~np.isnan(ref)])


def test_old_opsets_are_refused_naming_the_opset():
    x = torch.randn(6, 64)
    with pytest.raises(ValueError, match="needs ONNX opset 19 or later"):
        export_bytes(OpModel("fp8_e4m3_tensor"), x, 17, "qdq")
    with pytest.raises(ValueError, match="needs ONNX opset 21 or later"):
        export_bytes(OpModel("int4_group_sym"), x, 19, "qdq")


def test_prepared_model_fp8_activations_int4_group_weights_runs_in_onnxruntime():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)).eval()
    prepared = prepare_by_platform(model, BackendType.Academic, {"extra_qconfig_dict": {
        "w_qscheme": {"bit": 4, "per_channel": True, "group_size": 16},
        "a_qscheme": {"dtype": "fp8_e4m3"}, "w_fakequantize": "LearnableFakeQuantize",
        "a_fakequantize": "LearnableFakeQuantize", "w_observer": "MinMaxObserver",
        "a_observer": "EMAMinMaxObserver"}})
    x = torch.randn(8, 64)
    enable_calibration(prepared)
    prepared(x)
    enable_quantization(prepared)
    opt = torch.optim.SGD(prepared.parameters(), lr=1e-3)
    for _ in range(3):  # a few QAT steps: learned scales, not only calibrated ones
        opt.zero_grad()
        prepared(x).pow(2).mean().backward()
        opt.step()
    prepared.eval()
    data = export_bytes(prepared, x, 21, "qdq")
    proto = onnx.load_from_string(data)
    onnx.checker.check_model(proto, full_check=True)
    types = [n.op_type for n in proto.graph.node]
    assert types.count("QuantizeLinear") >= 4
    # ORT_ENABLE_BASIC: see test_onnxruntime_drops_a_relu_before_an_fp8_quantize_linear. The
    # remaining difference: the integer weights' QuantizeLinear rounds x / s, our (torch's)
    # integer kernels x * float32(1 / s), which moves <1% of the weights by one step.
    y = run_ort(data, x, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    ref = prepared(x).detach().numpy()
    np.testing.assert_allclose(y, ref, rtol=0, atol=0.02 * np.abs(ref).max())


def test_onnxruntime_drops_a_relu_before_an_fp8_quantize_linear():
    """A known onnxruntime (1.32) fault, documented in docs/formats.md: from
    ORT_ENABLE_EXTENDED on, its Relu + QuantizeLinear fusion removes a Relu in front of an FP8
    QuantizeLinear (zero point 0), so negative values pass. BASIC is exact. When this test
    fails, onnxruntime has fixed it: drop the workaround."""
    class ReluFp8(nn.Module):
        def forward(self, x):
            return ops.fake_quantize_fp8(torch.relu(x), torch.tensor([0.01]), None, "fp8_e4m3")

    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    data = export_bytes(ReluFp8(), x, 19, "qdq")
    ref = ReluFp8()(x).numpy()
    assert np.array_equal(run_ort(data, x, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC), ref)
    y = run_ort(data, x, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
    assert y.min() < 0 and ref.min() == 0


@pytest.mark.parametrize("fmt", ["qdq", "mqbench"])
@pytest.mark.parametrize("kind,opset", [("fp8_e4m3_tensor", 19), ("fp8_e5m2_channel", 21),
                                        ("fp8_learnable", 19), ("int4_group_sym", 21)])
def test_dynamo_export(kind, opset, fmt):
    """The dynamo exporter writes the TorchScript exporter's nodes (python/mqbench/onnx/dynamo.py):
    FP8 Q/DQ, and blocked Q/DQ for the group-wise op (CompositeImplicitAutograd, which
    torch.export keeps whole and the exporter translates rather than decomposes), in both
    formats."""
    model = OpModel(kind)
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(3)) * 3
    x[0, :3] = torch.tensor([1e4, -math.inf, -0.0])
    f = io.BytesIO()
    with export_format(fmt):
        export_onnx(model, (x,), f, opset_version=opset, dynamo=True)
    proto = onnx.load_from_string(f.getvalue())
    onnx.checker.check_model(proto, full_check=True)
    types = [n.op_type for n in proto.graph.node]
    assert types.count("QuantizeLinear") == 1
    if kind == "int4_group_sym":
        q = next(n for n in proto.graph.node if n.op_type == "QuantizeLinear")
        assert {a.name: a.i for a in q.attribute} == {"axis": 1, "block_size": 16}
        assert "Reshape" not in types[types.index("QuantizeLinear"):]
    y = run_ort(f.getvalue(), x)
    ref = model(x).detach().numpy()
    if kind.startswith("fp8"):
        assert np.array_equal(y.view(np.int32), ref.view(np.int32))
    else:
        np.testing.assert_allclose(y, ref, rtol=0, atol=0.11)  # at most one step apart


def test_dynamo_formats_need_their_opsets():
    with pytest.raises(ValueError, match="needs ONNX opset 19 or later"):
        export_onnx(OpModel("fp8_e4m3_tensor"), (torch.randn(6, 64),), io.BytesIO(),
                    opset_version=18, dynamo=True)
    with pytest.raises(ValueError, match="needs ONNX opset 21 or later"):
        export_onnx(OpModel("int4_group_sym"), (torch.randn(6, 64),), io.BytesIO(),
                    opset_version=20, dynamo=True)
