"""``FixedFakeQuantize``: torch's FakeQuantize semantics on mqbench's ops."""
import torch

from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.utils.hook import PerChannelLoadHook

__all__ = ["FixedFakeQuantize"]


class FixedFakeQuantize(QuantizeBase):
    """Observer-driven fixed qparams in the buffers ``scale`` (float) and ``zero_point`` (int32);
    straight-through gradient to the input only.

    Example::

        fq = FixedFakeQuantize(MinMaxObserver, quant_min=-128, quant_max=127,
                               dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
        y = fq(x)      # observes x, then fake-quantizes it
    """

    def __init__(self, observer, **observer_kwargs):
        super().__init__(observer, **observer_kwargs)
        self.register_buffer("scale", torch.tensor([1.0], dtype=torch.float))
        self.register_buffer("zero_point", torch.tensor([0], dtype=torch.int))
        self.load_state_dict_hook = PerChannelLoadHook(self)

    def forward(self, X):
        if self._observer_on():
            self._observe_into_buffers(X)
        if self._fake_quant_on():
            X = self._fixed_fake_quant(X)
        return X

    @torch.jit.export
    def extra_repr(self):
        return super().extra_repr() + "scale={}, zero_point={}".format(
            self.scale if self.ch_axis == -1 else "List",
            self.zero_point if self.ch_axis == -1 else "List")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        self._resize_on_load(state_dict, prefix, strict, missing_keys)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
