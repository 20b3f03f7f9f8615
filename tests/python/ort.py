"""onnxruntime for the tests: runs a serialized model with ``onnxruntime.InferenceSession``.

onnxruntime is a test dependency (requirements-dev.txt): require() fails, naming the install
command, when it is missing, rather than skipping the agreement checks.
"""
import numpy as np
import pytest
import torch

from mqbench.deploy._runtime import onnxruntime_session

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
    what the file itself computes.

    The session is ``mqbench.deploy._runtime.onnxruntime_session``'s: onnxruntime's Relu +
    QuantizeLinear rewrite, which drops a Relu before an FP8 QuantizeLinear, is off (Note
    [onnxruntime drops a Relu before an FP8 QuantizeLinear]), and the quantized GEMM is
    onnxruntime's precise one on x86 CPUs without VNNI."""
    require()
    level = None if optimize else onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = onnxruntime_session(model_bytes, level=level)
    # floating inputs as float32, integer ones (token ids) as they are
    feeds = {k: (v.float() if v.is_floating_point() else v).detach().cpu().numpy()
             for k, v in inputs.items()}
    names = [o.name for o in sess.get_outputs()]
    return {n: torch.from_numpy(np.asarray(v, dtype=np.float32))
            for n, v in zip(names, sess.run(names, feeds))}
