"""The data and the small CNN shared by the examples: sklearn's 8x8 digits (a file inside the
scikit-learn package from PyPI, requirements-dev.txt: nothing is downloaded), split 1437 / 360,
and a conv-bn-relu network for it."""
import numpy as np
import onnxruntime
import torch
from sklearn.datasets import load_digits


def load_data():
    """((train images, labels), (test images, labels)); images [N, 1, 8, 8] in [0, 1]."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    return (x[360:], y[360:]), (x[:360], y[:360])


class DigitsNet(torch.nn.Module):
    """conv-bn-relu (1->16), conv-bn-relu (16->32), max-pool, conv-bn-relu (32->32), fc."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(16)
        self.relu1 = torch.nn.ReLU()
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(32)
        self.relu2 = torch.nn.ReLU()
        self.pool = torch.nn.MaxPool2d(2)
        self.conv3 = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.bn3 = torch.nn.BatchNorm2d(32)
        self.relu3 = torch.nn.ReLU()
        self.fc = torch.nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.pool(self.relu2(self.bn2(self.conv2(x))))
        x = self.relu3(self.bn3(self.conv3(x)))
        return self.fc(torch.flatten(x, 1))


def onnxruntime_run(model_bytes, x):
    """Runs a serialized ONNX model on x in onnxruntime (CPU); returns its first output."""
    sess = onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    out = sess.run(None, {sess.get_inputs()[0].name: x.detach().float().numpy()})[0]
    return torch.from_numpy(np.asarray(out, dtype=np.float32))
