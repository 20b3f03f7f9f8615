"""Writes the deploy fuzzer's seed corpus (tests/fuzz/corpus/): for every backend, the
fake-quantized ONNX model convert_deploy exports for a small network, and the ONNX files that
backend deploys (a deployed model fed back in is a model the translators must survive too);
for Academic, one model per fake-quantize algorithm; and the formats (FP8, group-wise INT4, MX,
NVFP4).
Small channels keep each file a few KB.

    PYTHONPATH=python .venv/bin/python tests/fuzz/make_corpus.py tests/fuzz/corpus

Needs the built package (scripts/build.sh). The files are checked in; regenerate them when the
exporter's output changes.
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.nn as nn

from mqbench.convert_deploy import convert_deploy
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration, enable_quantization

SHAPE = [1, 3, 8, 8]


class FuzzNet(nn.Module):
    """conv-bn-relu, a residual add, concat, max pooling, nearest upsampling, a transposed
    convolution, flatten and a classifier: the ops the translators treat specially."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.deconv = nn.ConvTranspose2d(8, 2, 2, stride=2)
        self.fc = nn.Linear(2 * 8 * 8, 3)

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.conv2(y) + y)
        y = torch.cat([y, self.up(self.pool(y))], 1)
        y = self.deconv(self.pool(y))
        return self.fc(torch.flatten(y, 1))


ACADEMIC = {"w_observer": "MinMaxObserver", "a_observer": "EMAMinMaxObserver",
            "w_qscheme": {"bit": 4, "symmetry": True, "per_channel": True, "pot_scale": False},
            "a_qscheme": {"bit": 4, "symmetry": False, "per_channel": False, "pot_scale": False}}
ALGORITHMS = ["FixedFakeQuantize", "LearnableFakeQuantize", "DSQFakeQuantize",
              "PACTFakeQuantize", "DoReFaFakeQuantize", "AdaRoundFakeQuantize",
              "QDropFakeQuantize"]


# The formats (docs/formats.md): FP8 Q/DQ for Tensorrt, blocked INT4 weights (groups of 2;
# conv1's 3 input channels keep one 8-bit scale per channel) for QDQ and Tensorrt.
FP8 = {"extra_qconfig_dict": {"w_qscheme": {"dtype": "fp8_e4m3", "per_channel": True},
                              "a_qscheme": {"dtype": "fp8_e4m3"}}}
INT4_GROUP = {"extra_qconfig_dict": {"w_qscheme": {"bit": 4, "per_channel": True, "group_size": 2,
                                                   "symmetric_range": True}},
              "w_qscheme_by_layer": {"conv1": {"group_size": None, "bit": 8}}}


class MxNet(nn.Module):
    """Two Linear layers whose 32 input features fill one MX block (docs/formats-mx.md)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 32), nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _formats(w_dtype, a_dtype):
    return {"extra_qconfig_dict": {"w_qscheme": {"dtype": w_dtype},
                                   "a_qscheme": {"dtype": a_dtype}}}


# stem -> (network, input shape); FuzzNet and SHAPE for the others
NETWORKS = {"tensorrt_mxfp4_mxfp8": (MxNet, [2, 32]), "qdq_nvfp4": (MxNet, [2, 32])}


def variants():
    yield "tensorrt_fp8", BackendType.Tensorrt, FP8
    yield "tensorrt_int4_group", BackendType.Tensorrt, INT4_GROUP
    yield "qdq_int4_group", BackendType.QDQ, INT4_GROUP
    yield "tensorrt_mxfp4_mxfp8", BackendType.Tensorrt, _formats("mxfp4", "mxfp8_e4m3")
    yield "qdq_nvfp4", BackendType.QDQ, _formats("nvfp4", "nvfp4")
    for backend in BackendType:
        if backend in (BackendType.Tensorrt_NLP, BackendType.Academic_NLP):
            continue  # deployed by the Academic translator, covered below
        if backend == BackendType.Academic:
            for algorithm in ALGORITHMS:
                # AdaRound and DoReFa quantize weights only, PACT activations only.
                weight_only = algorithm in ("AdaRoundFakeQuantize", "DoReFaFakeQuantize")
                extra = dict(ACADEMIC,
                             w_fakequantize="FixedFakeQuantize"
                             if algorithm == "PACTFakeQuantize" else algorithm,
                             a_fakequantize="LearnableFakeQuantize" if weight_only else algorithm)
                yield f"academic_{algorithm}", backend, {"extra_qconfig_dict": extra}
        else:
            yield backend.value.lower(), backend, {}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    args = parser.parse_args()
    set_log_level("ERROR")
    os.makedirs(args.output_dir, exist_ok=True)
    for stem, backend, prepare_kwargs in variants():
        torch.manual_seed(0)
        network, shape = NETWORKS.get(stem, (FuzzNet, SHAPE))
        q = prepare_by_platform(network().eval(), backend, prepare_kwargs)
        enable_calibration(q)
        q.train()  # DSQ observes in training mode only
        with torch.no_grad():
            q(torch.randn(*shape))
        enable_quantization(q)
        q.eval()
        # Academic's deploy is the fake-quantized model itself (other backends may write their
        # deployed model under the same name: QDQ, ONNX_QNN).
        for deploy_as, prefix in ((BackendType.Academic, ""), (backend, "deployed__")):
            if prefix and backend == BackendType.Academic:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                for path in convert_deploy(q, deploy_as, {"x": shape}, output_path=tmp,
                                           model_name=stem):
                    if path.endswith(".onnx"):
                        name = os.path.basename(path)
                        if name == "onnx_quantized_model.onnx":  # Tensorrt's fixed QDQ name
                            name = f"{stem}_{name}"
                        target = os.path.join(args.output_dir, prefix + name)
                        with open(path, "rb") as src, open(target, "wb") as dst:
                            dst.write(src.read())
                        print(f"{target}: {os.path.getsize(target)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
