"""onnxruntime for the tests (tools/onnxruntime_node.py): require() skips outside CI when
onnxruntime-node is missing, and fails in CI."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from onnxruntime_node import available, run  # noqa: E402,F401


def require():
    """Skips outside CI when onnxruntime-node is not installed; in CI its absence fails."""
    if not available():
        if os.environ.get("CI"):
            pytest.fail("onnxruntime-node is missing: scripts/setup.sh installs it")
        pytest.skip("onnxruntime-node not installed (run scripts/setup.sh)")
