"""FP8 and group-wise INT4 on the digits CNN (docs/formats.md): train a float model, then for
each format prepare, calibrate, run a few QAT epochs, deploy with convert_deploy (the C++
deploy passes write the standard QDQ model: FP8 QuantizeLinear at opset 19, blocked INT4
weights at opset 21) and run the deployed model in onnxruntime.

* ``fp8``: BackendType.Tensorrt with FP8 E4M3 weights (per channel) and activations (per
  tensor), chosen in extra_qconfig_dict: LearnableFP8FakeQuantize everywhere. TensorRT reads
  FP8 from a QDQ model only, so the deploy writes onnx_quantized_model.onnx alone.
* ``int4g``: BackendType.QDQ with INT4 weights, one scale per 16 input channels
  (LearnableGroupFakeQuantize, GroupMinMaxObserver), int8 activations; conv1 has one input
  channel, so it keeps a per-channel INT4 scale (w_qscheme_by_layer). Deployed as
  digits_int4g.onnx.

Usage:  python3 examples/formats_digits.py [--quick] [--output-dir DIR]
(without --output-dir the deployed files go to a temporary folder, removed at the end)
Prints float, fake-quant and onnxruntime accuracies and how often onnxruntime's prediction
equals the fake-quant model's; exits non-zero if they disagree on more than 1% of the images.
"""
import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime
import torch
import torch.nn.functional as F

from mqbench.convert_deploy import convert_deploy
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration, enable_quantization

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits import DigitsNet, load_data  # noqa: E402

FORMATS = {
    "fp8": (BackendType.Tensorrt, {"extra_qconfig_dict": {
        "w_qscheme": {"dtype": "fp8_e4m3", "per_channel": True},
        "a_qscheme": {"dtype": "fp8_e4m3"}}}, "onnx_quantized_model.onnx"),
    "int4g": (BackendType.QDQ, {
        "extra_qconfig_dict": {"w_qscheme": {"bit": 4, "per_channel": True, "group_size": 16,
                                             "symmetric_range": True}},
        "w_qscheme_by_layer": {"conv1": {"group_size": None}}}, "digits_int4g.onnx"),
}


def train(model, data, epochs, lr):
    (x, y), _ = data
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        for i in range(0, len(y), 128):
            opt.zero_grad()
            F.cross_entropy(model(x[i:i + 128]), y[i:i + 128]).backward()
            opt.step()
    return model.eval()


def accuracy(logits, y):
    return 100.0 * (logits.argmax(1) == y).float().mean().item()


def onnxruntime_logits(model_bytes, x):
    # ORT_ENABLE_BASIC: onnxruntime 1.32's Relu + QuantizeLinear fusion drops a Relu in front
    # of an FP8 QuantizeLinear (docs/formats.md)
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = onnxruntime.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    return torch.from_numpy(np.asarray(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]))


def run_format(name, float_net, data, qat_epochs, output_dir):
    backend, config, deployed = FORMATS[name]
    (x, y), (xt, yt) = data
    prepared = prepare_by_platform(float_net, backend, config)
    enable_calibration(prepared)
    with torch.no_grad():
        prepared(x[:256])
    enable_quantization(prepared)
    train(prepared, data, qat_epochs, 1e-3)
    with torch.no_grad():
        fq = prepared(xt)
    convert_deploy(prepared, backend, {"x": list(xt.shape)}, output_path=output_dir,
                   model_name=f"digits_{name}")
    with open(os.path.join(output_dir, deployed), "rb") as f:
        model_bytes = f.read()
    onnx.checker.check_model(onnx.load_from_string(model_bytes), full_check=True)
    ort = onnxruntime_logits(model_bytes, xt)
    agree = 100.0 * (ort.argmax(1) == fq.argmax(1)).float().mean().item()
    return accuracy(fq, yt), accuracy(ort, yt), agree


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer epochs (the test suite's run)")
    p.add_argument("--output-dir", default="")
    a = p.parse_args()
    set_log_level("ERROR")
    torch.manual_seed(0)
    data = load_data()
    float_net = train(DigitsNet(), data, 5 if a.quick else 30, 3e-3)
    with torch.no_grad():
        float_acc = accuracy(float_net(data[1][0]), data[1][1])
    print(f"{'model':<10}{'float':>8}{'fake-quant':>12}{'onnxruntime':>13}{'agree %':>9}")
    worst = 100.0
    with tempfile.TemporaryDirectory(prefix="mqbench_formats_") as scratch:
        for name in FORMATS:
            output_dir = os.path.join(a.output_dir, name) if a.output_dir else scratch
            fq_acc, ort_acc, agree = run_format(name, float_net, data, 1 if a.quick else 3,
                                                output_dir)
            worst = min(worst, agree)
            print(f"{name:<10}{float_acc:8.1f}{fq_acc:12.1f}{ort_acc:13.1f}{agree:9.1f}")
    if worst < 99.0:
        sys.exit(f"onnxruntime and the fake-quant model disagree on {100 - worst:.1f}% of images")


if __name__ == "__main__":
    main()
