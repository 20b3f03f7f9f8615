"""pytest conftest for running MQBench's own test suites (``test/`` of ModelTC/MQBench, both the
main and the mqb-torch1.10 branches) unchanged against this package, with the suites' two
environment bugs repaired, so that what fails is about us (docs/compatibility.md, "MQBench's
test suites"):

* fourteen tests of main use ``torchvision`` without importing it: it is put into builtins;
* ``torch.hub.load('pytorch/vision...', name, ...)`` and ``torch.hub.list('pytorch/vision...')``
  download torchvision's code from GitHub: they are answered with the installed torchvision's
  model ``name`` (the arguments are kept) and its list of models.

Nothing else is changed. Usage (from a checkout of MQBench, with this package importable)::

    cp <this file> test/conftest.py
    PYTHONPATH=<mqbench>/python python -m pytest test -q -rf

Tests that load pretrained weights from a hub (BERT, ``pretrained=True``) still fail without a
network: those are the suite's, not ours.
"""
import builtins

import torch
import torchvision

builtins.torchvision = torchvision
_hub_load = torch.hub.load


def _load(repo_or_dir, model, *args, **kwargs):
    if _is_vision(repo_or_dir):
        return torchvision.models.get_model_builder(model)(*args, **kwargs)
    return _hub_load(repo_or_dir, model, *args, **kwargs)


def _is_vision(repo_or_dir):
    return isinstance(repo_or_dir, str) and repo_or_dir.split(":")[0] == "pytorch/vision"


_hub_list = torch.hub.list


def _list(repo_or_dir, *args, **kwargs):
    if _is_vision(repo_or_dir):
        return torchvision.models.list_models()
    return _hub_list(repo_or_dir, *args, **kwargs)


torch.hub.load = _load
torch.hub.list = _list
