"""Canonical module names back to classes, for the quantizer classes' rule data.

The C++ rule sets name module types canonically (``nn.Conv2d``, ``nn.qat.Conv2d``: see
:func:`mqbench.utils.module_types.canonical_type`); :func:`resolve_type` turns such a name into
the class of torch.nn or mqbench.nn that has it, for the ``isinstance`` checks of
``ModelQuantizer`` and its subclasses, its only users. It lives here, not beside
``canonical_type``, because it imports mqbench.nn, whose QAT modules import
``mqbench.utils.module_types``.
"""
import torch.nn as nn

import mqbench.nn as qnn
import mqbench.nn.intrinsic as qnni
import mqbench.nn.intrinsic.qat as qnniqat
import mqbench.nn.qat as qnnqat
from mqbench.utils.module_types import canonical_type

__all__ = ["resolve_type"]

_TYPES = None


def _type_table():
    """{canonical name: class} of torch.nn's layers and mqbench.nn's (ours win a shared name:
    ``nn.qat.Conv2d`` is our class, which a user's torch class also matches)."""
    table = {}
    for name in dir(nn):
        cls = getattr(nn, name)
        if isinstance(cls, type) and issubclass(cls, nn.Module):
            table.setdefault(canonical_type(cls), cls)
    for package in (qnn, qnni, qnnqat, qnniqat):
        for name in dir(package):
            cls = getattr(package, name)
            if isinstance(cls, type) and issubclass(cls, nn.Module):
                table[canonical_type(cls)] = cls
    return table


def resolve_type(name):
    """The class a canonical name stands for (``nn.qat.Conv2d`` -> ``mqbench.nn.qat.Conv2d``),
    or the name itself when no class of torch.nn / mqbench.nn has it."""
    global _TYPES
    if _TYPES is None:
        _TYPES = _type_table()
    return _TYPES.get(name, name)
