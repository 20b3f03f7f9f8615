"""mqbench.deploy.check_deploy: a deployed file compared with its model layer by layer, in
onnxruntime and OpenVINO, on torchvision CNNs and the MiniLM; intact files report nothing, and
a copy with one weight scale, activation scale or zero point altered is caught at the layer
altered (several depths). The check of two files without the model (check_files, the command
line), convert_deploy(check_inputs=...), and bad input."""
import logging
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
import torchvision
from onnx import numpy_helper

from deploy_helpers import SmallNet, calibrated
from mqbench import _C
from mqbench.convert_deploy import convert_deploy
from mqbench.deploy import check_deploy
from mqbench.deploy.check import DeployCheckError, check_files, main
from mqbench.prepare_by_platform import BackendType

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
SHAPE = (2, 3, 32, 32)


def _input(seed=5, shape=SHAPE):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def resnet18_qdq(tmp_path_factory):
    torch.manual_seed(0)
    q = calibrated(torchvision.models.resnet18(num_classes=10), BackendType.QDQ, SHAPE)
    out = tmp_path_factory.mktemp("r18_qdq")
    convert_deploy(q, BackendType.QDQ, {"x": list(SHAPE)}, output_path=str(out), model_name="m")
    return q, out / "m.onnx"


def _producer(model, tensor):
    return next(n for n in model.graph.node if tensor in n.output)


def _set(model, name, value):
    for t in model.graph.initializer:
        if t.name == name:
            dtype = numpy_helper.to_array(t).dtype
            t.CopyFrom(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
            return
    raise KeyError(name)


def _own_input(model, node, k, value_of):
    """Gives ``node`` its own copy of input ``k`` (an initializer), with value
    ``value_of(old)``: the file altered at that one node."""
    old = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == node.input[k])
    name = node.input[k] + "_altered"
    model.graph.initializer.append(numpy_helper.from_array(
        np.asarray(value_of(old), dtype=old.dtype), name))
    node.input[k] = name


def _altered(path, tmp_path, edit):
    model = onnx.load(str(path))
    edit(model)
    out = tmp_path / ("altered_" + os.path.basename(str(path)))
    onnx.save(model, str(out))
    return out


def _weight_scale_times(where, factor):
    """An edit: the DequantizeLinear of ``where``'s weight reads its own scale times
    ``factor``."""
    def edit(model):
        dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear"
                  and n.input[0].startswith(where + ".weight"))
        _own_input(model, dq, 1, lambda s: s * factor)
    return edit


def _row(report, tensor):
    return next(r for r in report.rows if r.tensor == tensor)


def test_an_intact_qdq_resnet18_reports_nothing(resnet18_qdq, tmp_path):
    q, path = resnet18_qdq
    report = check_deploy(q, str(path), _input())
    assert report.first_divergent is None and report.ok, str(report)
    # the file as deployed (fused kernels), end to end: measured, not judged (a tie broken the
    # other way grows through a random-weight network: 3e-2 here)
    assert report.end_to_end is not None and 0 <= report.end_to_end < 0.1
    kinds = {r.kind for r in report.rows}
    assert kinds == {"activation", "weight", "output"}
    # every quantizer of the model has its row: 21 weights (20 convs and fc), each activation
    n_fq = sum(1 for n in onnx.load(str(path)).graph.node if n.op_type == "DequantizeLinear")
    assert len([r for r in report.rows if r.kind != "output"]) == n_fq
    assert all(r.max_steps <= 1 + 1e-3 for r in report.rows if r.max_steps is not None)
    assert "layer2.0.conv1" in {r.layer for r in report.rows}
    # nothing was written
    assert sorted(os.listdir(path.parent)) == ["m.onnx"]


@pytest.mark.parametrize("where", ["layer1.0.conv2", "layer3.0.downsample.0", "fc"])
def test_an_altered_weight_scale_is_named(resnet18_qdq, tmp_path, where):
    q, path = resnet18_qdq
    edit = _weight_scale_times(where, 1.5)
    report = check_deploy(q, str(_altered(path, tmp_path, edit)), _input())
    assert report.first_divergent == where, str(report)
    row = report.first_divergent_row
    assert row.kind == "weight" and row.max_steps > 1


@pytest.mark.parametrize("quantizer", ["maxpool_post_act_fake_quantizer",
                                       "layer2_1_relu_1_post_act_fake_quantizer",
                                       "layer4_0_conv2_post_act_fake_quantizer"])
def test_an_altered_activation_scale_is_named(resnet18_qdq, tmp_path, quantizer):
    q, path = resnet18_qdq
    intact = check_deploy(q, str(path), _input())
    tensor = next(r.tensor for r in intact.rows if r.quantizer == quantizer)
    expected = _row(intact, tensor).layer

    def edit(model):  # the scale Q and DQ share: a quarter of it (the range clips)
        dq = _producer(model, tensor)
        scale = dq.input[1]
        value = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == scale)
        _set(model, scale, value * 0.25)
    report = check_deploy(q, str(_altered(path, tmp_path, edit)), _input())
    assert report.first_divergent == expected, str(report)
    assert report.first_divergent_row.tensor == tensor
    # the layers after it read the file's values (lockstep): they agree
    after = report.rows[report.rows.index(report.first_divergent_row) + 1:]
    assert all(not r.diverged for r in after if r.kind != "output")


@pytest.mark.parametrize("quantizer", ["layer1_0_conv1_post_act_fake_quantizer",
                                       "layer3_1_conv2_post_act_fake_quantizer"])
def test_an_altered_zero_point_is_named(resnet18_qdq, tmp_path, quantizer):
    q, path = resnet18_qdq
    intact = check_deploy(q, str(path), _input())
    tensor = next(r.tensor for r in intact.rows if r.quantizer == quantizer)

    def edit(model):  # the DequantizeLinear alone reads zero point 3 instead of 0
        _own_input(model, _producer(model, tensor), 2, lambda z: z + 3)
    report = check_deploy(q, str(_altered(path, tmp_path, edit)), _input())
    assert report.first_divergent == _row(intact, tensor).layer, str(report)
    assert report.first_divergent_row.max_steps == pytest.approx(3, abs=1e-3)


def test_mobilenet_v2_tensorrt_qdq_model(tmp_path):
    """Tensorrt's QDQ model (deploy_to_qlinear): intact, then one depthwise weight's scale."""
    torch.manual_seed(0)
    q = calibrated(torchvision.models.mobilenet_v2(num_classes=10), BackendType.Tensorrt, SHAPE)
    convert_deploy(q, BackendType.Tensorrt, {"x": list(SHAPE)}, output_path=str(tmp_path),
                   model_name="m", deploy_to_qlinear=True)
    path = tmp_path / "onnx_quantized_model.onnx"
    assert check_deploy(q, str(path), _input()).ok
    where = "features.9.conv.1.0"

    edit = _weight_scale_times(where, 2)
    report = check_deploy(q, str(_altered(path, tmp_path, edit)), _input())
    assert report.first_divergent == where, str(report)
    # the float file holds no quantizer: the error says what to check instead
    with pytest.raises(ValueError, match="deploy_to_qlinear=True"):
        check_deploy(q, str(tmp_path / "m_deploy_model.onnx"), _input())



_ACADEMIC16 = {"extra_qconfig_dict": {
    "w_fakequantize": "FixedFakeQuantize", "a_fakequantize": "FixedFakeQuantize",
    "w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver",
    "w_qscheme": {"bit": 8, "symmetry": True, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 16, "symmetry": False, "per_channel": False, "pot_scale": False}}}
_FP8 = {"extra_qconfig_dict": {"w_qscheme": {"dtype": "fp8_e4m3", "per_channel": True},
                               "a_qscheme": {"dtype": "fp8_e4m3"}}}


@pytest.mark.parametrize("form, backend, config, deploy_kwargs", [
    ("16-bit nodes kept (emulated)", BackendType.Academic, _ACADEMIC16, {}),
    ("FP8 Q/DQ", BackendType.QDQ, _FP8, {}),
    ("dynamo exporter", BackendType.QDQ, None, {"dynamo": True}),
])
def test_other_forms_intact_and_altered(tmp_path, form, backend, config, deploy_kwargs):
    torch.manual_seed(0)
    q = calibrated(torchvision.models.resnet18(num_classes=10), backend, SHAPE,
                   **({"prepare_custom_config_dict": config} if config else {}))
    convert_deploy(q, backend, {"x": list(SHAPE)}, output_path=str(tmp_path), model_name="m",
                   **deploy_kwargs)
    path = tmp_path / "m.onnx"
    intact = check_deploy(q, str(path), _input())
    assert intact.ok, str(intact)
    if form.startswith("16-bit"):
        assert any(n.domain == "mqbench" for n in onnx.load(str(path)).graph.node)
    row = [r for r in intact.rows if r.kind == "activation"][12]

    def edit(model):  # the quantizer's scale, halved where its output is written
        node = _producer(model, row.tensor)
        _own_input(model, node, 1, lambda s: s * 0.5)
    report = check_deploy(q, str(_altered(path, tmp_path, edit)), _input())
    assert report.first_divergent == row.layer, str(report)
    assert report.first_divergent_row.tensor == row.tensor

def test_openvino_deploy_in_openvino_and_emulated(tmp_path):
    pytest.importorskip("openvino", reason="openvino is a test dependency (requirements-dev.txt)")
    torch.manual_seed(0)
    q = calibrated(torchvision.models.resnet18(num_classes=10), BackendType.OPENVINO, SHAPE)
    convert_deploy(q, BackendType.OPENVINO, {"x": list(SHAPE)}, output_path=str(tmp_path),
                   model_name="m")
    path = tmp_path / "m_deploy_model.onnx"
    for runtime in ("openvino", "onnxruntime"):
        report = check_deploy(q, str(path), _input(), runtime=runtime)
        assert report.ok, str(report)
    intact = check_deploy(q, str(path), _input(), runtime="onnxruntime")
    quantizer = "layer2_0_conv1_post_act_fake_quantizer"
    tensor = next(r.tensor for r in intact.rows if r.quantizer == quantizer)

    def edit(model):  # FakeQuantize's output range, a third too wide
        fq = _producer(model, tensor)
        _own_input(model, fq, 4, lambda hi: hi * 1.3)
    altered = _altered(path, tmp_path, edit)
    for runtime in ("openvino", "onnxruntime"):
        report = check_deploy(q, str(altered), _input(), runtime=runtime)
        assert report.first_divergent == _row(intact, tensor).layer, (runtime, str(report))


def test_onnx_qnn_integers_are_read_with_the_quantizers_qparams(tmp_path):
    torch.manual_seed(0)
    q = calibrated(SmallNet(), BackendType.ONNX_QNN, (2, 3, 16, 16))
    convert_deploy(q, BackendType.ONNX_QNN, {"x": [2, 3, 16, 16]}, output_path=str(tmp_path),
                   model_name="m")
    path = tmp_path / "m.onnx"
    x = _input(shape=(2, 3, 16, 16))
    report = check_deploy(q, str(path), x)
    assert report.ok, str(report)
    integer_rows = [r for r in report.rows if r.tensor.endswith("_quantized")]
    assert len(integer_rows) >= 4

    def edit(model):  # the second conv's output scale
        conv = [n for n in model.graph.node if n.op_type == "QLinearConv"][1]
        _own_input(model, conv, 6, lambda s: s * 1.5)
    report = check_deploy(q, str(_altered(path, tmp_path, edit)), x)
    assert report.first_divergent == "conv2", str(report)


@pytest.fixture(scope="module")
def minilm_deployed(tmp_path_factory):
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import minilm
    finally:
        sys.path.pop(0)
    from mqbench.prepare_by_platform import prepare_by_platform
    from mqbench.utils.state import enable_calibration, enable_quantization
    model, tokenizer = minilm.load()
    batch = minilm.encode(tokenizer, minilm.SENTENCES["calibration"][:2])
    q = prepare_by_platform(model, BackendType.Tensorrt_NLP,
                            prepare_custom_config_dict={"example_inputs": dict(batch)})
    enable_calibration(q)
    with torch.no_grad():
        q(**batch)
    enable_quantization(q)
    q.eval()
    out = tmp_path_factory.mktemp("minilm")
    convert_deploy(q, BackendType.Tensorrt_NLP, dummy_input=tuple(batch.values()),
                   output_path=str(out), model_name="m")
    return q, batch, out / "m.onnx"


def test_minilm_qdq_deploy(minilm_deployed, tmp_path):
    q, batch, path = minilm_deployed
    report = check_deploy(q, str(path), dict(batch))
    assert report.ok, str(report)
    layers = [r.layer for r in report.rows]
    assert "encoder.layer.3.attention.self.query" in layers
    where = "encoder.layer.2.intermediate.dense"

    edit = _weight_scale_times(where, 1.5)
    report = check_deploy(q, str(_altered(path, tmp_path, edit)), dict(batch))
    assert report.first_divergent == where, str(report)


def test_minilm_deploys_and_checks_from_either_exporter(minilm_deployed, tmp_path, caplog):
    """The dynamo exporter's file (the fixture's deploy, with the default arguments, took the
    TorchScript one, whose inputs the exporter names and the check feeds in forward()'s
    order)."""
    q, batch, _ = minilm_deployed
    with caplog.at_level(logging.INFO, logger="MQBENCH"):
        convert_deploy(q, BackendType.Tensorrt_NLP, dummy_input=tuple(batch.values()),
                       output_path=str(tmp_path), model_name="m", dynamo=True,
                       check_inputs=dict(batch))
    assert "every tensor agrees" in caplog.text


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        return torch.nn.functional.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x))


def test_an_export_the_torchscript_exporter_refuses_goes_to_dynamo(tmp_path, caplog):
    """scaled_dot_product_attention called in an fx graph: the TorchScript exporter refuses it
    at opset 13; dynamo=None takes the dynamo exporter and logs why, dynamo=False names it."""
    q = calibrated(_Attention().eval(), BackendType.Tensorrt_NLP, (2, 4, 8, 16))
    with caplog.at_level(logging.INFO, logger="MQBENCH"):
        convert_deploy(q, BackendType.Tensorrt_NLP, {"x": [2, 4, 8, 16]},
                       output_path=str(tmp_path), model_name="m",
                       check_inputs=_input(shape=(2, 4, 8, 16)))
    assert "the TorchScript ONNX exporter failed (Exporting the operator " \
        "'aten::scaled_dot_product_attention'" in caplog.text
    assert "exported with torch's dynamo exporter" in caplog.text
    assert "every tensor agrees" in caplog.text
    with pytest.raises(ValueError, match=r"pass dynamo=True\).*scaled_dot_product_attention"):
        convert_deploy(q, BackendType.Tensorrt_NLP, {"x": [2, 4, 8, 16]},
                       output_path=str(tmp_path), model_name="m2", dynamo=False)


def test_convert_deploy_checks_and_logs_the_table(tmp_path, caplog):
    torch.manual_seed(0)
    q = calibrated(SmallNet(), BackendType.QDQ, (2, 3, 16, 16))
    x = _input(shape=(2, 3, 16, 16))
    with caplog.at_level(logging.INFO, logger="MQBENCH"):
        convert_deploy(q, BackendType.QDQ, {"x": [2, 3, 16, 16]}, output_path=str(tmp_path),
                       model_name="m", check_inputs=x)
    assert "every tensor agrees" in caplog.text and "max steps" in caplog.text


def test_convert_deploy_checks_the_export_of_a_float_backend(tmp_path, caplog):
    torch.manual_seed(0)
    q = calibrated(SmallNet(), BackendType.SNPE, (2, 3, 16, 16))
    with caplog.at_level(logging.INFO, logger="MQBENCH"):
        convert_deploy(q, BackendType.SNPE, {"x": [2, 3, 16, 16]}, output_path=str(tmp_path),
                       model_name="m", check_inputs=_input(shape=(2, 3, 16, 16)))
    assert "SNPE's deploy model is float" in caplog.text
    assert "m.onnx in onnxruntime" in caplog.text and "every tensor agrees" in caplog.text


def test_convert_deploy_refuses_a_file_that_departs(tmp_path, monkeypatch):
    """A translator that writes one wrong scale (simulated) is caught before anything is
    written, and the error names the layer."""
    torch.manual_seed(0)
    q = calibrated(SmallNet(), BackendType.QDQ, (2, 3, 16, 16))
    real = _C.deploy_translate

    def faulty(data, translator, *args, **kwargs):
        files, notes = real(data, translator, *args, **kwargs)
        model = onnx.load_from_string(files["m.onnx"])
        _weight_scale_times("conv2", 2)(model)
        files["m.onnx"] = model.SerializeToString()
        return files, notes
    monkeypatch.setattr(_C, "deploy_translate", faulty)
    with pytest.raises(DeployCheckError, match="layer 'conv2'") as e:
        convert_deploy(q, BackendType.QDQ, {"x": [2, 3, 16, 16]}, output_path=str(tmp_path),
                       model_name="m", check_inputs=_input(shape=(2, 3, 16, 16)))
    assert e.value.report.first_divergent == "conv2"
    assert os.listdir(tmp_path) == []


def test_two_files_without_the_model_and_the_command_line(tmp_path, capsys):
    torch.manual_seed(0)
    q = calibrated(torchvision.models.resnet18(num_classes=10), BackendType.QDQ, SHAPE)
    # the reference: the fake-quant export of a deploy with BN merge (Tensorrt's <name>.onnx)
    convert_deploy(q, BackendType.Tensorrt, {"x": list(SHAPE)}, output_path=str(tmp_path),
                   model_name="fq")
    ref = tmp_path / "fq.onnx"
    convert_deploy(q, BackendType.QDQ, {"x": list(SHAPE)}, output_path=str(tmp_path),
                   model_name="m")
    x = _input().numpy()
    np.save(tmp_path / "x.npy", x)
    report = check_files(str(tmp_path / "m.onnx"), str(ref), [x])
    assert report.ok, str(report)
    assert report.first_divergent_row is None and len(report.rows) > 40
    altered = _altered(tmp_path / "m.onnx", tmp_path, _weight_scale_times("layer2.1.conv2", 1.5))
    assert check_files(str(altered), str(ref), [x]).first_divergent == "layer2.1.conv2"
    html = tmp_path / "report.html"
    assert main([str(altered), "--reference", str(ref), "--inputs", str(tmp_path / "x.npy"),
                 "--html", str(html)]) == 1
    printed = capsys.readouterr().out
    assert "first departure: layer 'layer2.1.conv2'" in printed
    text = html.read_text()
    assert "<svg" in text and "layer2.1.conv2" in text
    assert main([str(tmp_path / "m.onnx"), "--reference", str(ref), "--inputs",
                 str(tmp_path / "x.npy")]) == 0


def test_the_cli_check_runs_without_torch(tmp_path):
    """mqbench-deploy check (the C++ tool hands it to Python) in a process where torch cannot
    be imported."""
    torch.manual_seed(0)
    q = calibrated(SmallNet(), BackendType.QDQ, (2, 3, 16, 16))
    convert_deploy(q, BackendType.Tensorrt, {"x": [2, 3, 16, 16]}, output_path=str(tmp_path),
                   model_name="fq")
    ref = tmp_path / "fq.onnx"
    convert_deploy(q, BackendType.QDQ, {"x": [2, 3, 16, 16]}, output_path=str(tmp_path),
                   model_name="m")
    np.save(tmp_path / "x.npy", _input(shape=(2, 3, 16, 16)).numpy())
    blocker = tmp_path / "no_torch"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nclass _NoTorch:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
        "sys.meta_path.insert(0, _NoTorch())\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker),
                                                       os.path.join(ROOT, "python")]))
    cli = os.environ.get("MQBENCH_DEPLOY_CLI", os.path.join(ROOT, "build", "mqbench-deploy"))
    env["MQBENCH_PYTHON"] = sys.executable
    blocked = subprocess.run([sys.executable, "-c", "import torch"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert blocked.returncode != 0 and "No module named 'torch'" in blocked.stderr
    r = subprocess.run([cli, "check", str(tmp_path / "m.onnx"), "--reference", str(ref),
                        "--inputs", str(tmp_path / "x.npy")], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "every tensor agrees" in r.stdout


def test_bad_input(resnet18_qdq, tmp_path, monkeypatch):
    q, path = resnet18_qdq
    with pytest.raises(ValueError, match=r"input 'x' has shape \[2, 3, 16, 16\].*\[2, 3, 32, 32\]"):
        check_deploy(q, str(path), _input(shape=(2, 3, 16, 16)))
    with pytest.raises(ValueError, match="runtime must be one of"):
        check_deploy(q, str(path), _input(), runtime="tensorrt")
    import builtins
    real_import = builtins.__import__

    def no_openvino(name, *args, **kwargs):
        if name == "openvino":
            raise ImportError("No module named 'openvino'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_openvino)
    with pytest.raises(ImportError, match="pip install openvino"):
        check_deploy(q, str(path), _input(), runtime="openvino")
    monkeypatch.undo()
    # a file from another model: no tensor maps
    other = calibrated(SmallNet(), BackendType.QDQ, (2, 3, 32, 32))
    with pytest.raises(ValueError, match="does not come from this model"):
        check_deploy(other, str(path), _input())
    with pytest.raises(FileNotFoundError):
        check_deploy(q, str(tmp_path / "missing.onnx"), _input())
    with pytest.raises(ValueError, match="rtol must be a positive number"):
        check_deploy(q, str(path), _input(), rtol=0)
    report = check_deploy(q, str(path), _input())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        report.to_html(tmp_path / "no_such_dir" / "r.html")


def test_the_comparison_of_non_finite_values_and_the_page_of_such_a_report(tmp_path):
    from mqbench.deploy.check import DeployCheckReport, LayerRow, _channel_view, _compare
    nan, inf = float("nan"), float("inf")
    # NaN for NaN and equal infinities agree; a NaN against a number does not
    assert _compare([nan, inf, 1.0], [nan, inf, 1.0], 0.5, 1.0, 1e-3)[4] == 0
    max_abs, _, max_steps, _, beyond = _compare([nan, 1.0], [0.0, 1.0], 0.5, 1.0, 1e-3)
    assert beyond == 1 and max_steps == inf and max_abs == inf
    assert _compare([1.0, -inf], [1.0, -inf], None, 1.0, 1e-3)[4] == 0
    assert _compare([1.0, 2.0], [1.0, inf], None, 1.0, 1e-3)[4] == 1
    # one step off is a tie, two are beyond; a 16-bit step a few float32 ulps wide still counts
    assert _compare([1.0, 2.0], [1.5, 3.0], 0.5, 1.0, 1e-3)[3:] == (1, 1)
    # a per-channel step along a negative axis
    assert _channel_view(np.array([1.0, 2.0, 3.0]), -1, 2).shape == (1, 3)
    rows = [LayerRow("a", "q", "activation", "t", inf, inf, inf, 0, 1, 4),
            LayerRow("b", "", "output", "y", 0.0, 0.0, None, 0, 0, 4)]
    for steps in (0.0, 1.0):
        page = DeployCheckReport(rows, "f.onnx", "onnxruntime", steps, 1e-3).to_html(
            tmp_path / f"r{steps}.html")
        text = open(page).read()
        assert "<svg" in text and "beyond" in text
    assert sorted(os.listdir(tmp_path)) == ["r0.0.html", "r1.0.html"]


def test_malformed_and_external_data_files_are_refused(resnet18_qdq, tmp_path):
    q, path = resnet18_qdq
    model = onnx.load(str(path))
    t = model.graph.initializer[0]
    t.data_location = onnx.TensorProto.EXTERNAL
    t.ClearField("raw_data")
    e = t.external_data.add()
    e.key, e.value = "location", "../../etc/passwd"
    with pytest.raises(ValueError, match="external data"):
        check_deploy(q, model.SerializeToString(), _input())
    with pytest.raises(ValueError, match="not an ONNX model"):
        check_deploy(q, b"\x00not onnx", _input())
    with pytest.raises(ValueError, match=r"float32 values where the file takes int64"):
        from mqbench.deploy.check import _feeds
        m = onnx.helper.make_model(onnx.helper.make_graph(
            [], "g", [onnx.helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [2])],
            []))
        _feeds(m, [np.zeros(2, np.float32)], "the file")
