"""convert_deploy of MX / NVFP4 models (src/deploy/block_formats.cpp; docs/formats-mx.md): the
weights become FLOAT8E4M3FN / FLOAT4E2M1 initializers whose dequantized values equal the fake
quantizer's output bit for bit; the activations compute their block scales in the graph.
onnxruntime 1.32 runs MXFP8; the FP4 models run in onnx's reference evaluator."""
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
from onnx.reference import ReferenceEvaluator

from mqbench.convert_deploy import convert_deploy
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.state import enable_calibration, enable_quantization

FP4, FP8 = onnx.TensorProto.FLOAT4E2M1, onnx.TensorProto.FLOAT8E4M3FN


def prepared_mlp(w_dtype, a_dtype, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32)).eval()
    prepared = prepare_by_platform(model, BackendType.Tensorrt, {"extra_qconfig_dict": {
        "w_qscheme": {"dtype": w_dtype}, "a_qscheme": {"dtype": a_dtype}}})
    x = torch.randn(8, 64) * 3
    enable_calibration(prepared)
    prepared(x)
    enable_quantization(prepared)
    prepared.eval()
    return prepared, x


def run(proto, feed, outputs=None):
    """The model's outputs (or the named tensors, from the nodes they need) from onnx's
    reference evaluator."""
    if outputs:
        proto = onnx.ModelProto.FromString(proto.SerializeToString())
        producer = {o: n for n in proto.graph.node for o in n.output}
        needed, todo = set(), list(outputs)
        while todo:
            n = producer.get(todo.pop())
            if n is not None and id(n) not in needed:
                needed.add(id(n))
                todo.extend(n.input)
        nodes = [n for n in proto.graph.node if id(n) in needed]
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
        del proto.graph.output[:]
        proto.graph.output.extend(onnx.helper.make_empty_tensor_value_info(o) for o in outputs)
    return ReferenceEvaluator(proto).run(None, feed)


def check_tensorrt_activations(proto, a_dtype):
    """TensorRT's dynamic-quantize ops, wired as modelopt writes them (no TensorRT here to run
    them): NVFP4 -> the FP4 codes and E4M3 scales -> two DequantizeLinear; MXFP8 -> its own
    dequantize op."""
    trt = [n for n in proto.graph.node if n.domain == "trt"]
    consumers = {}
    for n in proto.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    if a_dtype == "nvfp4":
        assert [n.op_type for n in trt] == ["TRT_FP4DynamicQuantize"] * 2
        for n in trt:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            assert attrs == {"axis": 1, "block_size": 16, "scale_type": FP8}
            codes, scales = n.output
            (s_dq,) = consumers[scales]
            (x_dq,) = consumers[codes]
            assert s_dq.op_type == x_dq.op_type == "DequantizeLinear"
            assert s_dq.input[1] == n.input[1] and x_dq.input[1] == s_dq.output[0]
    else:
        quantize = [n for n in trt if n.op_type == "TRT_MXFP8DynamicQuantize"]
        assert len(quantize) == 2 and len(trt) == 4
        for n in quantize:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            assert attrs == {"axis": 1, "block_size": 32, "output_dtype": FP8}
            (dq,) = consumers[n.output[0]]
            assert dq.op_type == "TRT_MXFP8DequantizeLinear" and list(dq.input) == list(n.output)


@pytest.mark.parametrize("backend,dynamo", [("QDQ", False), ("Tensorrt", False), ("QDQ", True)])
@pytest.mark.parametrize("w_dtype,a_dtype", [("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp4", "nvfp4"),
                                             ("nvfp4", "mxfp4")])
def test_deployed_weights_are_the_fake_quantized_ones(w_dtype, a_dtype, backend, dynamo, tmp_path):
    if dynamo:
        pytest.importorskip("onnxscript")
    prepared, x = prepared_mlp(w_dtype, a_dtype)
    paths = convert_deploy(prepared, getattr(BackendType, backend), dummy_input=x,
                           output_path=str(tmp_path), dynamo=dynamo)
    written = sorted(os.path.basename(p) for p in paths)
    if backend == "Tensorrt":  # a QDQ model alone, as for FP8 (docs/formats.md)
        assert written == ["mqbench_qmodel.onnx", "onnx_quantized_model.onnx"]
        path = os.path.join(tmp_path, "onnx_quantized_model.onnx")
    else:  # QDQ rewrites the exported model in place
        assert written == ["mqbench_qmodel.onnx"]
        path = os.path.join(tmp_path, "mqbench_qmodel.onnx")
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    assert not [n for n in proto.graph.node if n.domain == "mqbench"]
    opset = {o.domain: o.version for o in proto.opset_import}[""]
    assert opset == (21 if "mxfp4" not in (w_dtype, a_dtype) and "nvfp4" not in (w_dtype, a_dtype)
                     else 23)
    # each weight: an FP8 / FP4 initializer read by the DequantizeLinear that gives the layer its
    # weight, equal bit for bit to the fake quantizer's output
    inits = {i.name: i for i in proto.graph.initializer}
    codes = {n.input[0]: n.output[0] for n in proto.graph.node if n.op_type == "DequantizeLinear"
             and n.input[0] in inits and any(a.name == "block_size" for a in n.attribute)}
    assert len(codes) == 2
    feed = {proto.graph.input[0].name: x.numpy()}
    got = dict(zip(codes.values(), run(proto, feed, list(codes.values()))))
    for name, out in codes.items():
        layer = name.split(".")[0]
        assert inits[name].data_type == (FP8 if w_dtype == "mxfp8_e4m3" else FP4)
        wfq = prepared.get_submodule(layer).weight_fake_quant
        want = wfq(prepared.get_submodule(layer).weight).detach().numpy()
        np.testing.assert_array_equal(got[out].view(np.int32), want.view(np.int32))
    ref = prepared(x).detach().numpy()
    if backend == "Tensorrt" and a_dtype != "mxfp4":
        check_tensorrt_activations(proto, a_dtype)
        return
    if w_dtype == a_dtype == "mxfp8_e4m3":
        so = ort.SessionOptions()  # onnxruntime 1.32's Relu + QuantizeLinear fusion fault: BASIC
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        y = sess.run(None, feed)[0]
    else:
        y = run(proto, feed)[0]
    # Gemm's float sums differ in order (and NVFP4's QuantizeLinear divides by g * s where the op
    # multiplies by (1 / g) / s: a value on a rounding boundary may move one E2M1 step)
    close = np.isclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert close.mean() > (0.99 if "nvfp4" == a_dtype else 0.9999)


def test_nan_weight_and_integer_backends_are_refused(tmp_path):
    prepared, x = prepared_mlp("mxfp4", "mxfp8_e4m3")
    with pytest.raises(ValueError, match=r"MXFP8 .*blocks of 32 on axis 1; OPENVINO deploys "
                                         r"integer quantization"):
        convert_deploy(prepared, BackendType.OPENVINO, dummy_input=x, output_path=str(tmp_path))
    with torch.no_grad():
        prepared.get_submodule("2").weight[3, 5] = float("nan")
    with pytest.raises(ValueError, match=r"weight '2.weight' holds NaN at index 101, which MXFP4"):
        convert_deploy(prepared, BackendType.QDQ, dummy_input=x, output_path=str(tmp_path))
