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


def run(model_bytes, inputs, optimize=True):
    """Runs the serialized model on {name: tensor} (CPU; floating tensors as float32, integer
    ones as they are); returns {output name: float tensor}.

    ``optimize=False`` runs the graph op by op as written (no fusion of QDQ + Conv into
    onnxruntime's integer kernels, whose int32 bias and requantization round differently):
    what the file itself computes."""
    require()
    options = onnxruntime.SessionOptions()
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    # floating inputs as float32, integer ones (token ids) as they are
    feeds = {k: (v.float() if v.is_floating_point() else v).detach().cpu().numpy()
             for k, v in inputs.items()}
    names = [o.name for o in sess.get_outputs()]
    return {n: torch.from_numpy(np.asarray(v, dtype=np.float32))
            for n, v in zip(names, sess.run(names, feeds))}
