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
import torch

__all__ = ["canonical_type", "is_conv1d", "is_float_module_of", "parameter_holders"]


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


def is_conv1d(mod):
    """transformers' ``Conv1D`` (GPT-2 and its family): a Linear whose weight is stored
    [in, out], y = x @ W + b. Checked without importing transformers for models that do not use
    it."""
    # the parameter dict, not getattr: under an fx trace, getattr gives a Proxy
    w = getattr(mod, "_parameters", {}).get("weight")
    return is_conv1d_class(type(mod)) and isinstance(w, torch.Tensor) and w.dim() == 2


def is_conv1d_class(cls):
    """Whether ``cls`` is transformers' ``Conv1D`` (``is_conv1d`` for a class)."""
    return cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers")


def parameter_holders(model):
    """{id(parameter): how many modules of ``model`` hold it directly}: above 1 for a tied
    parameter (an embedding table shared with the head)."""
    holders = {}
    for mod in model.modules():
        for p in mod._parameters.values():
            if p is not None:
                holders[id(p)] = holders.get(id(p), 0) + 1
    return holders
