"""The formats on the built-in backends (docs/formats.md, docs/add_a_backend.md): FP8 on
BackendType.Tensorrt and group-wise INT4 weights on Academic, ONNX_QNN and QDQ, chosen in
extra_qconfig_dict; each prepared model calibrates, trains a step, exports standard QDQ that
onnxruntime runs, and deploys with convert_deploy (ONNX_QNN, 8-bit only, refuses INT4 by name)."""
import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn

from mqbench.convert_deploy import convert_deploy
from mqbench.custom_symbolic_opset import export_format, export_onnx
from mqbench.fake_quantize import (GroupFakeQuantize, LearnableFP8FakeQuantize,
                                   LearnableGroupFakeQuantize)
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration, enable_quantization

set_log_level("ERROR")

FP8 = {"w_qscheme": {"dtype": "fp8_e4m3", "per_channel": True},
       "a_qscheme": {"dtype": "fp8_e4m3"}}
INT4_GROUP = {"w_qscheme": {"bit": 4, "per_channel": True, "group_size": 16,
                            "symmetric_range": True}}
ACADEMIC_INT4_GROUP = {"w_qscheme": {"bit": 4, "per_channel": True, "group_size": 16},
                       "a_qscheme": {"bit": 8}, "w_fakequantize": "FixedFakeQuantize",
                       "a_fakequantize": "FixedFakeQuantize", "w_observer": "MSEObserver",
                       "a_observer": "MinMaxObserver"}
CASES = {  # backend, extra_qconfig_dict, weight class, activation class, opset
    "Tensorrt-fp8": (BackendType.Tensorrt, FP8, LearnableFP8FakeQuantize,
                     LearnableFP8FakeQuantize, 19),
    "Tensorrt-int4-group": (BackendType.Tensorrt, INT4_GROUP, LearnableGroupFakeQuantize, None,
                            21),
    "QDQ-int4-group": (BackendType.QDQ, INT4_GROUP, LearnableGroupFakeQuantize, None, 21),
    "ONNX_QNN-int4-group": (BackendType.ONNX_QNN, INT4_GROUP, LearnableGroupFakeQuantize, None,
                            21),
    "Academic-int4-group": (BackendType.Academic, ACADEMIC_INT4_GROUP, GroupFakeQuantize, None,
                            21),
}


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(16, 16, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(16 * 6 * 6, 32), nn.ReLU(), nn.Linear(32, 10)).eval()


@pytest.mark.parametrize("case", list(CASES))
def test_backend_format_prepares_trains_exports_and_runs(case):
    _prepare_train_export(case)


def _prepare_train_export(case):
    """The prepared model after calibration and an SGD step, its output on x, and x; its
    standard QDQ export checked and run in onnxruntime on the way."""
    backend, extra, w_cls, a_cls, opset = CASES[case]
    prepared = prepare_by_platform(_model(), backend, {"extra_qconfig_dict": extra})
    fqs = [m for n, m in prepared.named_modules() if n.endswith("weight_fake_quant")]
    assert fqs and all(type(m) is w_cls for m in fqs), [type(m) for m in fqs]
    if a_cls is not None:
        acts = [m for n, m in prepared.named_modules() if n.endswith("post_act_fake_quantizer")]
        assert acts and all(type(m) is a_cls for m in acts)
    x = torch.randn(4, 16, 8, 8)
    enable_calibration(prepared)
    prepared(x)
    enable_quantization(prepared)
    prepared.train()
    opt = torch.optim.SGD(prepared.parameters(), lr=1e-3)
    opt.zero_grad()
    prepared(x).pow(2).mean().backward()
    opt.step()
    prepared.eval()
    f = io.BytesIO()
    with export_format("qdq"):
        export_onnx(prepared, (x,), f, opset_version=opset, dynamo=False)
    proto = onnx.load_from_string(f.getvalue())
    onnx.checker.check_model(proto, full_check=True)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(f.getvalue(), so, providers=["CPUExecutionProvider"])
    y = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    ref = prepared(x).detach().numpy()
    # FP8: bit for bit up to float accumulation order; INT weights: one step (x/s vs x*(1/s))
    np.testing.assert_allclose(y, ref, rtol=0, atol=0.02 * np.abs(ref).max())
    return prepared, ref, x


DEPLOYED = {BackendType.Tensorrt: "onnx_quantized_model.onnx", BackendType.QDQ: "m.onnx",
            BackendType.Academic: "m.onnx"}


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_backend_format_deploys_and_the_deployed_model_runs(case, dynamo, tmp_path):
    """convert_deploy writes the formats through the C++ deploy passes (FP8 Q/DQ, opset 19;
    blocked Q/DQ, opset 21): Tensorrt its QDQ model alone (group-wise weights as INT4
    initializers), QDQ and Academic their QDQ model,
    which onnxruntime runs as the fake-quant model computes; ONNX_QNN refuses them by name."""
    backend = CASES[case][0]
    prepared, ref, x = _prepare_train_export(case)
    if backend not in DEPLOYED:
        with pytest.raises(ValueError, match=r"fake quantizer '.*' is group-wise integer \[-7, 7\]"
                                             r", blocks of 16 on axis 1; ONNX_QNN deploys"):
            convert_deploy(prepared, backend, {"x": [4, 16, 8, 8]}, output_path=str(tmp_path),
                           model_name="m", dynamo=dynamo)
        return
    written = convert_deploy(prepared, backend, {"x": [4, 16, 8, 8]}, output_path=str(tmp_path),
                             model_name="m", dynamo=dynamo)
    names = sorted(p.rsplit("/", 1)[-1] for p in written)
    assert DEPLOYED[backend] in names, names
    if backend == BackendType.Tensorrt:  # the formats are read from the QDQ model only
        assert not any(n.endswith("clip_ranges.json") for n in names), names
    data = (tmp_path / DEPLOYED[backend]).read_bytes()
    proto = onnx.load_from_string(data)
    onnx.checker.check_model(proto, full_check=True)
    assert not any(n.domain == "mqbench" for n in proto.graph.node)
    qs = [n for n in proto.graph.node if n.op_type == "QuantizeLinear"]
    inits = {t.name: t for t in proto.graph.initializer}
    if case == "Tensorrt-fp8":
        assert {inits[q.input[2]].data_type for q in qs} == {onnx.TensorProto.FLOAT8E4M3FN}
    elif backend == BackendType.Tensorrt:  # weights: INT4 initializers read by DequantizeLinear
        int4 = [n for n in proto.graph.node if n.op_type == "DequantizeLinear"
                and n.input[0] in inits and inits[n.input[0]].data_type == onnx.TensorProto.INT4]
        assert len(int4) == 3 and len(qs) == 3, [n.op_type for n in proto.graph.node]
        # the integers training used: the fake quantizer's own rounding, not x / s
        fq = prepared.get_submodule("3").weight_fake_quant
        w = prepared.get_submodule("3").weight.detach()
        inv = 1 / fq.scale.detach().view(32, -1, 1)
        ints = torch.clamp(torch.round(w.view(32, -1, 16) * inv), fq.quant_min,
                           fq.quant_max).flatten().numpy()
        gemm_w = [onnx.numpy_helper.to_array(inits[n.input[0]]) for n in int4]
        assert any(a.size == ints.size and np.array_equal(a.flatten(), ints) for a in gemm_w)
    else:
        blocked = [q for q in qs if any(a.name == "block_size" for a in q.attribute)]
        assert len(blocked) == 3, [n.op_type for n in proto.graph.node]  # the three weights
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    y = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(y, ref, rtol=0, atol=0.02 * np.abs(ref).max())


def test_group_size_must_divide_the_input_channels():
    prepared = prepare_by_platform(nn.Sequential(nn.Linear(24, 8)).eval(), BackendType.QDQ,
                                   {"extra_qconfig_dict": INT4_GROUP})
    enable_calibration(prepared)
    with pytest.raises(ValueError, match=r"group_size \(16\) must divide the size of axis 1 "
                                         r"\(24\)"):
        prepared(torch.randn(2, 24))


def test_tensorrt_fp8_weight_scheme_is_per_output_channel():
    prepared = prepare_by_platform(_model(), BackendType.Tensorrt, {"extra_qconfig_dict": FP8})
    fq = prepared.get_submodule("0").weight_fake_quant
    assert fq.format == "fp8_e4m3" and fq.ch_axis == 0 and fq.quant_max == 448
    enable_calibration(prepared)
    prepared(torch.randn(2, 16, 8, 8))
    w = prepared.get_submodule("0").weight
    torch.testing.assert_close(fq.scale.detach(), w.detach().abs().amax((1, 2, 3)) / 448)


@pytest.mark.parametrize("backend", [BackendType.QDQ, BackendType.Tensorrt])
def test_a_quantized_embedding_table_deploys(backend, tmp_path):
    """An nn.Embedding's weight quantizer (group-wise here, as an LLM's embed_tokens gets) feeds
    a Gather: the deploy passes take it as a weight (before, any per-channel quantizer on a
    Gather was refused) and the deployed model runs as the fake-quant model computes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 8)).eval()
    prepared = prepare_by_platform(model, backend, {"extra_qconfig_dict": INT4_GROUP})
    assert type(prepared.get_submodule("0").weight_fake_quant) is LearnableGroupFakeQuantize
    ids = torch.randint(0, 64, (2, 5))
    enable_calibration(prepared)
    prepared(ids)
    enable_quantization(prepared)
    prepared.eval()
    with torch.no_grad():
        ref = prepared(ids).numpy()
    convert_deploy(prepared, backend, dummy_input=(ids,), output_path=str(tmp_path),
                   model_name="m")
    data = (tmp_path / DEPLOYED[backend]).read_bytes()
    proto = onnx.load_from_string(data)
    gather = next(n for n in proto.graph.node if n.op_type == "Gather")
    dq = next(n for n in proto.graph.node if n.output[0] == gather.input[0])
    assert dq.op_type == "DequantizeLinear" and \
        {a.name: a.i for a in dq.attribute}["block_size"] == 16
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    y = sess.run(None, {sess.get_inputs()[0].name: ids.numpy()})[0]
    np.testing.assert_allclose(y, ref, rtol=0, atol=0.02 * np.abs(ref).max())
