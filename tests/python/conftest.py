"""pytest set-up shared by tests/python: the import paths, the native ops, and the ``device``
fixture of the CUDA tests."""
import os
import sys

# Tests import the in-tree package (python/), the helpers and references beside this file, and
# (by module name) the fixtures that one area's tests share with another's: each area folder
# (tests/python/<area>/, mirroring python/mqbench) is on the path. Test file names are unique
# across the folders.
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
AREAS = sorted(d for d in os.listdir(HERE)
               if os.path.isdir(os.path.join(HERE, d)) and d not in ("data", "__pycache__"))
sys.path.insert(0, os.path.join(ROOT, "python"))
for _area in AREAS:
    sys.path.insert(0, os.path.join(HERE, _area))
sys.path.insert(0, HERE)

import mqbench  # noqa: E402,F401  (registers torch.ops.mqbench)

import pytest  # noqa: E402

from cuda_harness import DEVICES  # noqa: E402


@pytest.fixture(params=DEVICES)
def device(request):
    """"cpu", and "cuda" where a GPU is present (skipped with its reason elsewhere): the device
    of the test_cuda_*.py tests (cuda_harness.py)."""
    return request.param


def pytest_addoption(parser):
    parser.addoption("--cuda-only", action="store_true",
                     help="run only the tests that need a CUDA device (those carrying a skipif "
                          "mark whose reason names CUDA): the GPU machine's selection "
                          "(tools/gpu_check.sh)")


def needs_cuda(item):
    """Whether `item` carries a skip-without-CUDA mark (``needs_gpu``, the ``device`` fixture's
    "cuda" case, or a skipif of its own whose reason names CUDA)."""
    return any("cuda" in str(m.kwargs.get("reason", "")).lower()
               for m in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--cuda-only"):
        return
    keep, drop = [], []
    for item in items:
        (keep if needs_cuda(item) else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
