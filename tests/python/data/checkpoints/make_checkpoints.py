"""Writes the checkpoint fixtures of tests/python/observer/test_own_bases.py.

Each ``<backend>.pt`` holds the state dict of a small model prepared for that backend,
calibrated and trained one step, plus the model's output for a fixed input in eval mode. The
checked-in files were written by the build before the quantizers, observers and QAT modules
stopped deriving from torch.ao's classes (commit 8f11805, whose state dicts have MQBench's keys
and torch's version metadata), so loading them checks that checkpoints of that layout still
load. To regenerate with another build: ``PYTHONPATH=<its python dir> python make_checkpoints.py``.
"""
import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
BACKENDS = ("Tensorrt", "Academic", "SNPE", "PPLW8A16", "NNIE", "Vitis", "ONNX_QNN", "OPENVINO",
            "Tengine_u8", "PPLCUDA", "STPU", "QDQ")
ACADEMIC = {"extra_qconfig_dict": {
    "w_observer": "MinMaxObserver", "a_observer": "EMAMinMaxObserver",
    "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
    "w_qscheme": {"bit": 4, "symmetry": True, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 4, "symmetry": False, "per_channel": False, "pot_scale": False}}}


class Net(nn.Module):
    """conv-bn-relu, residual conv-bn + add, transposed conv-bn-relu, conv-relu, linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.bn3 = nn.BatchNorm2d(4)
        self.conv3 = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = x + self.bn2(self.conv2(x))
        x = torch.relu(self.bn3(self.up(x)))
        x = torch.relu(self.conv3(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def build(backend):
    """The prepared model of ``backend`` (deterministic initial weights)."""
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    torch.manual_seed(0)
    config = ACADEMIC if backend == "Academic" else None
    return prepare_by_platform(Net().train(), getattr(BackendType, backend), config)


def inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 3, 8, 8, generator=g), torch.randn(2, 3, 8, 8, generator=g)


def main():
    from mqbench.utils.state import enable_calibration, enable_quantization
    calib, probe = inputs()
    for backend in BACKENDS:
        model = build(backend)
        enable_calibration(model)
        model(calib)
        enable_quantization(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        model(calib).square().mean().backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            out = model(probe)
        path = os.path.join(HERE, f"{backend}.pt")
        torch.save({"state_dict": model.state_dict(), "output": out}, path)
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    sys.exit(main())
