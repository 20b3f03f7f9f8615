"""pytest set-up shared by tests/python: the import paths, the native ops, and the ``device``
fixture of the CUDA tests."""
import os
import sys

# Tests import the in-tree package (python/) and the references beside them.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

import mqbench  # noqa: E402,F401  (registers torch.ops.mqbench)

import pytest  # noqa: E402

from cuda_harness import DEVICES  # noqa: E402


@pytest.fixture(params=DEVICES)
def device(request):
    """"cpu", and "cuda" where a GPU is present (skipped with its reason elsewhere): the device
    of the test_cuda_*.py tests (cuda_harness.py)."""
    return request.param
