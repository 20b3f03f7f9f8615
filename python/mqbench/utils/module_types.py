"""Module classes by name, independent of where torch keeps them.

``canonical_type(cls)`` names a class as the C++ rules and our type tables know it:
``torch.ao.nn.intrinsic.qat.modules.conv_fused.ConvBnReLU2d`` becomes
``nn.intrinsic.qat.ConvBnReLU2d``, ``torch.nn.modules.conv.Conv2d`` becomes ``nn.Conv2d``.
A class of ours that stands for one of torch's says so with ``_canonical_name`` (our
``mqbench.nn.intrinsic.qat.ConvBn2d`` is ``nn.intrinsic.qat.ConvBn2d``), so a user's torch
module and ours match the same rules without importing torch's deprecated packages.
"""
# The table from names back to classes (resolve_type) is in mqbench.custom_quantizer.type_table:
# it imports mqbench.nn, whose QAT modules import this module.
__all__ = ["canonical_type", "is_float_module_of"]


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
