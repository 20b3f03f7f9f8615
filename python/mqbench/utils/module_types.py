"""Module classes by name, independent of where torch keeps them.

``canonical_type(cls)`` names a class as the C++ rules and our type tables know it:
``torch.ao.nn.intrinsic.qat.modules.conv_fused.ConvBnReLU2d`` becomes
``nn.intrinsic.qat.ConvBnReLU2d``, ``torch.nn.modules.conv.Conv2d`` becomes ``nn.Conv2d``.
A class of ours that stands for one of torch's says so with ``_canonical_name`` (our
``mqbench.nn.intrinsic.qat.ConvBn2d`` is ``nn.intrinsic.qat.ConvBn2d``), so a user's torch
module and ours match the same rules without importing torch's deprecated packages.
"""
__all__ = ["canonical_type", "is_float_module_of", "resolve_type"]


def canonical_type(cls):
    """``nn.Conv2d``, ``nn.intrinsic.qat.ConvBn2d``, ``mqbench.nn.qat.Embedding``, ..."""
    own = cls.__dict__.get("_canonical_name")
    if own is not None:
        return own
    path = cls.__module__
    for prefix in ("torch.ao.", "torch."):
        if path.startswith(prefix):
            path = path[len(prefix):]
            break
    parts = path.split(".")
    if "modules" in parts:
        parts = parts[:parts.index("modules")]
    return ".".join(parts + [cls.__qualname__])


def is_float_module_of(module, qat_cls):
    """True when ``module``'s exact type is ``qat_cls``'s float module (``_FLOAT_MODULE``), ours
    or torch's class of the same canonical name."""
    expected = qat_cls._FLOAT_MODULE
    expected = expected if isinstance(expected, tuple) else (expected,)
    names = {canonical_type(c) for c in expected}
    return canonical_type(type(module)) in names


_TYPES = None


def _type_table():
    """{canonical name: class} of torch.nn's layers and mqbench.nn's (ours win a shared name:
    ``nn.qat.Conv2d`` is our class, which a user's torch class also matches)."""
    import torch.nn as nn

    import mqbench.nn as qnn
    import mqbench.nn.intrinsic as qnni
    import mqbench.nn.intrinsic.qat as qnniqat
    import mqbench.nn.qat as qnnqat
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
