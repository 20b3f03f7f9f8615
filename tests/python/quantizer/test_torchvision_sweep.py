"""The CI subset of scripts/sweep_torchvision.py: a few torchvision architectures, each covering
graph features the others do not, prepared, calibrated and quantized for every backend, and
deployed to Tensorrt and QDQ with onnxruntime agreeing with PyTorch (the script's checks: QDQ
against the fake-quantized model, cosine > 0.99; Tensorrt's float deploy model against the model
with quantization off, cosine > 0.999, and a positive clip range for every entry).

The full sweep (every classification model, docs/prepare.md "torchvision models") is run by
hand; this file reuses its functions so both check the same thing.
"""
import json
import os
import sys

import pytest
import torch
from torchvision.models.vision_transformer import VisionTransformer

import ort
from mqbench.prepare_by_platform import BackendType

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "scripts"))
import sweep_torchvision as sweep  # noqa: E402

SIZE = 64  # every architecture below accepts it (2x2 at the last stride-32 stage)


def tiny_vit():
    """torchvision's VisionTransformer with small dims: class token concat, shape unpacking
    (``n, c, h, w = x.shape``), ``x[:, 0]``, MultiheadAttention, LayerNorm, GELU."""
    return VisionTransformer(image_size=SIZE, patch_size=16, num_layers=2, num_heads=2,
                             hidden_dim=32, mlp_dim=64, num_classes=10)


# name: (what it covers that the others do not, the backends it is prepared for besides the
# deployed Tensorrt and QDQ). Every other backend is given to two architectures, to keep the file
# under a few minutes on two cores (test_every_backend_is_covered_twice).
ARCHS = {
    "shufflenet_v2_x0_5": ("view/transpose channel shuffle, chunk, concat",
                           ["Academic", "SNPE", "Vitis", "STPU", "PPLCUDA"]),
    "mobilenet_v3_small": ("hardswish/hardsigmoid, squeeze-excitation (mul), depthwise convs",
                           ["PPLW8A16", "NNIE", "OPENVINO", "Tengine_u8"]),
    "efficientnet_b0": ("SiLU, stochastic depth (identity in eval), SE block",
                        ["ONNX_QNN", "PPLCUDA", "Tensorrt_NLP", "Academic_NLP"]),
    "googlenet": ("inception concat, auxiliary branches skipped in eval, transform_input",
                  ["Academic", "PPLW8A16", "Vitis", "Tengine_u8"]),
    "regnet_x_400mf": ("grouped convs, residual add",
                       ["SNPE", "NNIE", "ONNX_QNN", "OPENVINO"]),
    "tiny_vit": ("patch embedding, class token, attention, getitem with slices",
                 ["Tensorrt_NLP", "Academic_NLP", "NNIE", "STPU"]),
}
BACKENDS = list(BackendType.__members__)
CASES = [(name, b) for name, (_, others) in ARCHS.items() for b in list(sweep.DEPLOYABLE) + others]
# Known failures, (name, backend): reason. Strict: the test fails once they are fixed.
KNOWN = {}


def build(name):
    if name == "tiny_vit":
        torch.manual_seed(0)
        m = tiny_vit()
        assert sweep.without_zero_weights(m) == ["class_token", "heads.head.weight"]
        return m.eval()
    # googlenet's default truncated-normal init takes seconds; torch's default init is enough
    kwargs = {"init_weights": False} if name == "googlenet" else {}
    return sweep.build_model(name, SIZE, **kwargs)


@pytest.fixture(scope="module")
def models():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = build(name)
        return cache[name]
    return get


def test_every_backend_is_covered_twice():
    assert set(sweep.DEPLOYABLE) <= set(BACKENDS) and len(ARCHS) >= 5
    for b in BACKENDS:
        assert sum(1 for _, backend in CASES if backend == b) >= 2, b
        assert sum(1 for n, backend in CASES if backend == b and (n, b) not in KNOWN) >= 2, b


@pytest.mark.parametrize("name,backend", CASES)
def test_prepare_calibrate_quantize_deploy(name, backend, models, tmp_path, request):
    if (name, backend) in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[name, backend], strict=True))
    if backend in sweep.DEPLOYABLE:
        ort.require()
    x = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    deploy = backend in sweep.DEPLOYABLE
    status, error, times, metrics = sweep.run_backend(
        models(name), BackendType[backend], x, deploy=deploy, workdir=str(tmp_path), name=name)
    assert status == "ok", f"{status}: {error} {metrics} ({ARCHS[name][0]})"
    assert error is None
    assert {"prepare_s", "calibrate_s", "quantize_s"} <= set(times)
    if deploy:
        if backend == "Tensorrt":
            assert metrics["cosine"] > sweep.TENSORRT_MIN_COSINE and "lockstep" not in metrics
        elif metrics["cosine"] <= sweep.QDQ_MIN_COSINE:  # rounding flips grown end to end
            ls = metrics["lockstep"]
            assert ls["max_steps"] <= 1.0001 and ls["differ"] <= 1e-3 * ls["values"], ls
            assert ls["cosine"] > sweep.QDQ_MIN_COSINE, ls
        assert os.listdir(tmp_path) == []  # the deploy directory was removed
        if backend == "Tensorrt":
            assert metrics["clip_ranges"] > 0


def test_a_wrong_deploy_model_fails_end_to_end_and_in_lockstep(models, tmp_path, monkeypatch):
    """A QDQ model whose first convolution's weights are negated fails the onnxruntime check,
    end to end and in lockstep (the first activation quantizer disagrees)."""
    import onnx
    from onnx import numpy_helper
    real = sweep.convert_deploy

    def corrupted(model, backend, shapes, output_path, model_name):
        written = real(model, backend, shapes, output_path=output_path, model_name=model_name)
        path = os.path.join(output_path, f"{model_name}.onnx")
        m = onnx.load(path)
        init = next(i for i in m.graph.initializer if len(i.dims) == 4)
        init.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(init), init.name))
        onnx.save(m, path)
        return written
    monkeypatch.setattr(sweep, "convert_deploy", corrupted)
    x = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    status, error, _, metrics = sweep.run_backend(
        models("shufflenet_v2_x0_5"), BackendType.QDQ, x, deploy=True, workdir=str(tmp_path),
        name="s")
    assert status == "onnxruntime" and metrics["cosine"] < 0.99, (error, metrics)
    assert metrics["lockstep"]["max_steps"] > 1
    assert error.startswith(f"cosine {metrics['cosine']:.6f} <= 0.99; lockstep over ")
    assert os.listdir(tmp_path) == []


def test_image_size_auto_and_size_skips(tmp_path, capsys):
    assert sweep.image_size_for("vit_b_16") == 224 and sweep.image_size_for("swin_t") == 224
    assert sweep.image_size_for("maxvit_t") == 224
    assert sweep.image_size_for("resnet18") == 96 and sweep.image_size_for("inception_v3") == 299
    assert sweep.image_size_for("vgg11_bn") == 224 and sweep.image_size_for("alexnet") == 224
    assert sweep.image_size_for("resnet18", "128") == 128
    out = tmp_path / "sweep.json"
    rc = sweep.main(["--models", "resnet18,vit_h_14", "--skip", "vit_h_14", "--max-gflops", "0.1",
                     "--json", str(out)])
    records = json.load(open(out))["records"]
    # every backend registered now (other tests may have registered more than BACKENDS)
    assert rc == 1 and len(records) == 2 * len(BackendType.__members__)
    assert {r["status"] for r in records} == {"skipped"}
    why = {r["model"]: r["error"] for r in records}
    # resnet18 at 96: 1.814 GFLOPs x (96/224)^2 = 0.33 > 0.1; vit_h_14 by name
    assert why["resnet18"] == ("too large for the 2-core CI machine: 0.3 GFLOPs at 96x96 / "
                               "12 M params")
    assert why["vit_h_14"].startswith("too large for the 2-core CI machine: ")
    assert "GFLOPs at 224x224 / 633 M params" in why["vit_h_14"]
    assert "vit_h_14: too large" in capsys.readouterr().out
