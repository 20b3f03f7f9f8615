"""``QDropFakeQuantize`` (Wei et al. 2022, QDrop), activations for BRECQ / QDrop."""
import torch
from torch.nn.parameter import Parameter

from mqbench.onnx.plain_export import ops as export_ops
from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.utils.hook import PerChannelLoadHook

__all__ = ["QDropFakeQuantize"]


class QDropFakeQuantize(QuantizeBase):
    """LSQ-style fake quantization (``scale`` learns, gradient factor 1) in which each element is
    quantized with probability ``prob`` and left in float otherwise (``prob = 1``: always)."""

    def __init__(self, observer, **observer_kwargs):
        super().__init__(observer, **observer_kwargs)
        self.scale = Parameter(torch.tensor([1.0], dtype=torch.float))
        self.register_buffer("zero_point", torch.tensor([0], dtype=torch.int))
        self.prob = 1.0
        self.load_state_dict_hook = PerChannelLoadHook(self)

    @torch.jit.export
    def extra_repr(self):
        return super().extra_repr() + "prob={}".format(self.prob)

    def forward(self, X):
        if self._observer_on():
            self.activation_post_process(X.detach())
            _scale, _zero_point = self.calculate_qparams()
            _scale = _scale.to(self.scale.device)
            _zero_point = _zero_point.to(self.zero_point.device)
            if self.ch_axis != -1:
                self.scale.data = torch.ones_like(_scale, dtype=self.scale.dtype)
                self.zero_point.resize_(_zero_point.shape)
            self.scale.data.copy_(_scale)
            self.zero_point.copy_(_zero_point)
        if self._fake_quant_on():
            ops = export_ops()
            if self.is_per_channel:
                X = ops.fake_quantize_qdrop_per_channel(X, self.scale, self.zero_point, self.ch_axis,
                                                        self.quant_min, self.quant_max, self.prob)
            else:
                X = ops.fake_quantize_qdrop_per_tensor(X, self.scale, self.zero_point,
                                                       self.quant_min, self.quant_max, self.prob)
        return X
