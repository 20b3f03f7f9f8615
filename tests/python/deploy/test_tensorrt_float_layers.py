"""Tensorrt and Tensorrt_NLP refuse a layer whose weight is quantized but whose input is not, which
TensorRT runs in float (Note [Float layers] in src/deploy/passes/find_float_layers.cpp);
``allow_float_layers=True`` deploys it with a warning naming it."""
import logging
import os

import pytest
import torch
import torch.nn as nn

from deploy_helpers import SmallNet, as_bytes, calibrated, check_calibration_cache, without_quantizers
from mqbench import deploy
from mqbench.convert_deploy import convert_deploy
from mqbench.prepare_by_platform import BackendType
from test_prepare_by_platform import config

SHAPE = [2, 3, 16, 16]
FC = "'/fc/Gemm' (Gemm, weight 'fc.weight')"


@pytest.fixture
def two_float_layers():
    """SmallNet for Tensorrt without the quantizers of conv2's input and of the fc's input."""
    torch.manual_seed(0)
    q = calibrated(SmallNet().eval(), BackendType.Tensorrt, SHAPE)
    return without_quantizers(q, "conv1_post_act_fake_quantizer", "flatten_post_act_fake_quantizer")


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "MQBENCH" and r.levelno == logging.WARNING]


def test_convert_deploy_refuses_every_float_layer_by_name(two_float_layers, tmp_path):
    with pytest.raises(ValueError) as e:
        convert_deploy(two_float_layers, BackendType.Tensorrt, {"x": SHAPE},
                       output_path=str(tmp_path), model_name="m", deploy_to_qlinear=True)
    why = str(e.value)
    assert why.startswith("Tensorrt: 2 layers have a quantized weight but no quantizer on their input")
    assert "'/conv2/Conv' (Conv, weight 'conv2.weight')" in why and FC in why
    assert "allow_float_layers=True" in why and "exclude_module_name" in why
    assert os.listdir(tmp_path) == []  # nothing written, the export and the QDQ model included


def test_allow_float_layers_deploys_them_with_a_warning(two_float_layers, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="MQBENCH"):
        written = convert_deploy(two_float_layers, BackendType.Tensorrt, {"x": SHAPE},
                                 output_path=str(tmp_path), model_name="m", deploy_to_qlinear=True,
                                 allow_float_layers=True)
    assert sorted(os.path.basename(p) for p in written) == [
        "m.onnx", "m_calib.cache", "m_clip_ranges.json", "m_deploy_model.onnx",
        "onnx_quantized_model.onnx"]
    (warning,) = warnings_of(caplog)
    assert warning.startswith("2 layers have a quantized weight but no quantizer on their input")
    assert "'/conv2/Conv'" in warning and FC in warning
    # the float layers' inputs have no range: the cache holds the quantized tensors only
    cache = check_calibration_cache(tmp_path, "m", as_bytes(tmp_path / "onnx_quantized_model.onnx"))
    assert "/Flatten_output_0" not in cache


def test_other_backends_ignore_allow_float_layers(two_float_layers, tmp_path, caplog):
    for backend in (BackendType.SNPE, BackendType.QDQ):
        q = calibrated(SmallNet().eval(), backend, SHAPE)
        without_quantizers(q, "flatten_post_act_fake_quantizer")
        plain, allowed = tmp_path / backend.name / "plain", tmp_path / backend.name / "allowed"
        with caplog.at_level(logging.WARNING, logger="MQBENCH"):
            convert_deploy(q, backend, {"x": SHAPE}, output_path=str(plain))
            convert_deploy(q, backend, {"x": SHAPE}, output_path=str(allowed),
                           allow_float_layers=True)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        names = sorted(os.listdir(plain))
        assert names == sorted(os.listdir(allowed)) and names
        for name in names:  # the same files, byte for byte
            assert (plain / name).read_bytes() == (allowed / name).read_bytes(), name
    with pytest.raises(TypeError, match="allow_float_layers"):
        convert_deploy(two_float_layers, BackendType.Tensorrt, {"x": SHAPE},
                       output_path=str(tmp_path), allow_float_layers="yes")


def test_the_mqbench_deploy_step_refuses_them_too(two_float_layers, tmp_path, caplog):
    convert_deploy(two_float_layers, BackendType.Tensorrt, {"x": SHAPE},
                   output_path=str(tmp_path / "out"), model_name="m", allow_float_layers=True)
    path = tmp_path / "in" / "m.onnx"
    path.parent.mkdir()
    path.write_bytes(as_bytes(tmp_path / "out" / "m.onnx"))
    with pytest.raises(ValueError, match="'/conv2/Conv' .*" + FC.replace("(", r"\(").replace(")", r"\)")):
        deploy.remove_fakequantize_and_collect_params(str(path), "m", "tensorrt")
    assert os.listdir(path.parent) == ["m.onnx"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="MQBENCH"):
        deploy.remove_fakequantize_and_collect_params(str(path), "m", "tensorrt",
                                                      allow_float_layers=True)
    assert len(warnings_of(caplog)) == 1
    for name in ("m_calib.cache", "m_clip_ranges.json", "m_deploy_model.onnx"):
        assert as_bytes(path.parent / name) == as_bytes(tmp_path / "out" / name), name


class PoolNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


def test_an_input_quantized_before_max_pooling_and_flatten_is_quantized(tmp_path):
    """The fc reads the max pool's quantized input through MaxPool and Flatten, across which
    TensorRT moves Q/DQ; the conv's input reaches it through the Pad of its reflect padding."""
    q = calibrated(PoolNet().eval(), BackendType.Tensorrt, SHAPE)
    without_quantizers(q, "flatten_post_act_fake_quantizer")
    assert {n for n, _ in q.named_modules() if n.endswith("_post_act_fake_quantizer")} == {
        "x_post_act_fake_quantizer", "relu_post_act_fake_quantizer"}
    convert_deploy(q, BackendType.Tensorrt, {"x": SHAPE}, output_path=str(tmp_path))


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.sigmoid(self.a(x)))


def test_tensorrt_nlp_refuses_them_and_academic_nlp_does_not(tmp_path):
    """A QDQ model whose MatMul has a quantized weight and a float input runs that layer in float
    in TensorRT, as Tensorrt's files would: Tensorrt_NLP refuses it; Academic_NLP (no runtime of
    its own) deploys it."""
    for backend in (BackendType.Tensorrt_NLP, BackendType.Academic_NLP):
        q = calibrated(TwoLinears().eval(), backend, [4, 16],
                       prepare_custom_config_dict=config(backend))
        names = [n for n, _ in q.named_modules() if n.endswith("_post_act_fake_quantizer")]
        assert "sigmoid_post_act_fake_quantizer" in names, names
        without_quantizers(q, "sigmoid_post_act_fake_quantizer")
        out = tmp_path / backend.name
        if backend == BackendType.Academic_NLP:
            convert_deploy(q, backend, {"x": [4, 16]}, output_path=str(out))
            continue
        with pytest.raises(ValueError, match=r"^Tensorrt_NLP: 1 layer .*'/b/Gemm' \(Gemm, weight "):
            convert_deploy(q, backend, {"x": [4, 16]}, output_path=str(out))
        assert convert_deploy(q, backend, {"x": [4, 16]}, output_path=str(out),
                              allow_float_layers=True) == [str(out / "mqbench_qmodel.onnx")]
