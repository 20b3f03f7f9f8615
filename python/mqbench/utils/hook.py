"""Module hooks (MQBench's ``mqbench.utils.hook``)."""
from functools import partial

import torch

__all__ = ["StopForwardException", "DataSaverHook", "PerChannelLoadHook"]


class StopForwardException(Exception):
    """Raised by :class:`DataSaverHook` to stop a forward pass early."""


class DataSaverHook:
    """Forward hook that stores a module's input and/or output and can stop the forward."""

    def __init__(self, store_input=False, store_output=False, stop_forward=False):
        self.store_input = store_input
        self.store_output = store_output
        self.stop_forward = stop_forward
        self.input_store = None
        self.output_store = None

    def __call__(self, module, input_batch, output_batch):
        if self.store_input:
            self.input_store = input_batch
        if self.store_output:
            self.output_store = output_batch
        if self.stop_forward:
            raise StopForwardException


class PerChannelLoadHook:
    """A ``load_state_dict`` pre-hook for per-channel quantizers.

    When ``module.ch_axis != -1``, every listed parameter or buffer whose shape differs from the
    checkpoint's is re-allocated as ``ones_like(checkpoint tensor)`` (keeping its dtype, device
    and Parameter-ness), so that loading then copies the values in. This lets a fresh module,
    whose per-channel ``scale`` still has one element, load a calibrated checkpoint.
    """

    def __init__(self, module, hook_param=("scale", "zero_point")):
        self.hook_param = tuple(hook_param)
        self.hook = module._register_load_state_dict_pre_hook(partial(self.hook_fn, module=module))

    def hook_fn(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                error_msgs, module):
        if getattr(module, "ch_axis", -1) == -1:
            return
        for name in self.hook_param:
            key = prefix + name
            if key not in state_dict:
                continue
            current = module._parameters.get(name)
            if current is None:
                current = module._buffers.get(name)
            if current is None:
                continue
            loaded = state_dict[key]
            if current.shape != loaded.shape:
                current.data = torch.ones_like(loaded, dtype=current.dtype, device=current.device)

    def close(self):
        """Removes the hook."""
        self.hook.remove()
