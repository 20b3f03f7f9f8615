"""onnxruntime for the tests: runs a serialized model with ``onnxruntime.InferenceSession``.

onnxruntime is a test dependency (requirements-dev.txt): require() fails, naming the install
command, when it is missing, rather than skipping the agreement checks.
"""
import numpy as np
import pytest
import torch

try:
    import onnxruntime
except ImportError:  # reported by require(), where a test needs it
    onnxruntime = None


def require():
    """Fails the test when onnxruntime is not importable."""
    if onnxruntime is None:
        pytest.fail("onnxruntime is not installed: scripts/setup.sh installs requirements-dev.txt")


def run(model_bytes, inputs):
    """Runs the serialized model on {name: tensor} (CPU); returns {output name: float tensor}."""
    require()
    sess = onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    feeds = {k: v.detach().cpu().float().numpy() for k, v in inputs.items()}
    names = [o.name for o in sess.get_outputs()]
    return {n: torch.from_numpy(np.asarray(v, dtype=np.float32))
            for n, v in zip(names, sess.run(names, feeds))}
