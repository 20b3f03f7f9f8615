"""Registries that let users replace MQBench's behaviour per backend (``mqbench.utils.registry``).

``DEFAULT_MODEL_QUANTIZER`` maps a ``BackendType`` to the quantizer class that prepares models
for it. The built-in classes (``mqbench.custom_quantizer``) read their rules from the C++ rule
sets; a user class registered with :func:`register_model_quantizer` replaces them (the last
registration wins, as in MQBench). It is constructed as ``cls(extra_quantizer_dict,
extra_fuse_dict)`` and must provide ``prepare(model, qconfig)``.
"""
from collections import OrderedDict

__all__ = ["DEFAULT_MODEL_QUANTIZER", "register_model_quantizer", "BACKEND_DEPLOY_FUNCTION",
           "register_deploy_function", "FUSED_MODULE_CONVERT_FUNCTION",
           "register_convert_function", "WEIGHT_EQUALIZATION_FUNCTION",
           "register_weight_equalization_function"]

DEFAULT_MODEL_QUANTIZER = OrderedDict()
BACKEND_DEPLOY_FUNCTION = OrderedDict()
FUSED_MODULE_CONVERT_FUNCTION = OrderedDict()


def register_model_quantizer(backend_type):
    """Class decorator: ``cls`` prepares models for ``backend_type``."""
    def insert(quantizer_cls):
        DEFAULT_MODEL_QUANTIZER[backend_type] = quantizer_cls
        return quantizer_cls
    return insert


def register_deploy_function(backend_type):
    """Function decorator: appends ``fn`` to ``backend_type``'s deploy steps (kept in order)."""
    def insert(func):
        BACKEND_DEPLOY_FUNCTION.setdefault(backend_type, []).append(func)
        return func
    return insert


def register_convert_function(module_type):
    """Function decorator: ``fn(model, node)`` merges a fused module of ``module_type`` at deploy."""
    def insert(func):
        FUSED_MODULE_CONVERT_FUNCTION[module_type] = func
        return func
    return insert


# {type of layer 1: {type of layer 2: fn(modules, weq_pair)}}, used by
# mqbench.weight_equalization.
WEIGHT_EQUALIZATION_FUNCTION = OrderedDict()


def register_weight_equalization_function(layer1, layer2):
    """Function decorator: ``fn(modules, weq_pair)`` equalizes a pair whose first layer is a
    ``layer1`` and second a ``layer2`` (or subclasses). Registrations add up: a second pair
    with the same ``layer1`` keeps the first (MQBench replaced the inner dict)."""
    for what, cls in (("layer1", layer1), ("layer2", layer2)):
        if not isinstance(cls, type):
            raise TypeError(f"register_weight_equalization_function: {what} must be a module "
                            f"class, got {cls!r}")

    def insert(func):
        WEIGHT_EQUALIZATION_FUNCTION.setdefault(layer1, OrderedDict())[layer2] = func
        return func
    return insert
