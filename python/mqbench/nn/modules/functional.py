"""``FXFloatFunctional``: what a torch ``FloatFunctional`` becomes before tracing.

Models written for eager-mode quantization (torchvision's quantizable models) call
``self.skip_add.add(x, y)`` on a ``torch.ao.nn.quantized.FloatFunctional``. Before tracing,
``prepare_by_platform`` replaces each with this module, whose methods are the plain torch calls,
so the traced graph has ``torch.add`` / ``torch.cat`` / ... nodes that get quantizers like any
other (torch's ``_swap_ff_with_fxff`` did this in torch.ao's FX flow)."""
import torch
import torch.nn as nn

__all__ = ["FXFloatFunctional", "swap_float_functionals"]


class FXFloatFunctional(nn.Module):
    """``add``, ``add_scalar``, ``mul``, ``mul_scalar``, ``cat``, ``add_relu``, ``matmul`` as
    torch functions; no state, no forward."""

    def forward(self, x):
        raise RuntimeError("FloatFunctional has no forward; call one of its operations "
                           "(add, cat, mul, add_relu, add_scalar, mul_scalar, matmul)")

    def add(self, x, y):
        return torch.add(x, y)

    def add_scalar(self, x, y):
        return torch.add(x, y)

    def mul(self, x, y):
        return torch.mul(x, y)

    def mul_scalar(self, x, y):
        return torch.mul(x, y)

    def cat(self, x, dim=0):
        return torch.cat(x, dim=dim)

    def add_relu(self, x, y):
        return torch.nn.functional.relu(torch.add(x, y))

    def matmul(self, x, y):
        return torch.matmul(x, y)


# torch's eager-mode container, recognised by its class path (not imported).
_FLOAT_FUNCTIONAL = "torch.ao.nn.quantized.modules.functional_modules.FloatFunctional"


def swap_float_functionals(model):
    """Replaces every torch ``FloatFunctional`` in ``model`` (in place) by
    :class:`FXFloatFunctional`; returns how many were replaced. Walks the module tree with an
    explicit stack, so a deep model cannot exhaust Python's recursion limit."""
    count = 0
    stack, seen = [model], set()
    while stack:
        parent = stack.pop()
        if id(parent) in seen:  # shared submodules (and cycles) are visited once
            continue
        seen.add(id(parent))
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            if any(f"{c.__module__}.{c.__qualname__}" == _FLOAT_FUNCTIONAL
                   for c in type(child).__mro__):
                parent._modules[name] = FXFloatFunctional()
                count += 1
            else:
                stack.append(child)
    return count
