"""``DSQFakeQuantize`` (Gong et al. 2019, Differentiable Soft Quantization)."""
import torch

from mqbench.onnx.plain_export import ops as export_ops
from mqbench.fake_quantize.fixed import FixedFakeQuantize

__all__ = ["DSQFakeQuantize"]


class DSQFakeQuantize(FixedFakeQuantize):
    """Soft rounding with a tanh of sharpness set by ``alpha`` (0.4 by default); straight-through
    round on top. As in MQBench, the observer runs whenever the module is in training mode,
    regardless of ``observer_enabled``."""

    def __init__(self, observer, alpha=0.4, **observer_kwargs):
        super().__init__(observer, **observer_kwargs)
        self.alpha = alpha

    def forward(self, X):
        if self.training:
            self._observe_into_buffers(X)
        if self._fake_quant_on():
            ops = export_ops()
            if self.is_per_channel:
                X = ops.fake_quantize_dsq_per_channel(X, self.scale, self.zero_point, self.ch_axis,
                                                      self.quant_min, self.quant_max, self.alpha)
            else:
                X = ops.fake_quantize_dsq_per_tensor(X, self.scale, self.zero_point,
                                                     self.quant_min, self.quant_max, self.alpha)
        return X
