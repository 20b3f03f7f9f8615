"""``TqtFakeQuantize`` (Jain et al. 2020, Trained Quantization Thresholds), for Vitis."""
import torch

from mqbench.onnx.plain_export import ops as export_ops
from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.utils.hook import PerChannelLoadHook

__all__ = ["TqtFakeQuantize"]

_QUANT_TYPES = ("input", "tensor", "param")


class TqtFakeQuantize(QuantizeBase):
    """Power-of-two step ``2^-floor(log2(1/s))``; ``mth`` 3 rounds half to even (parameters),
    ``mth`` 2 rounds negative ties up (activations). Symmetric per-tensor only. Call
    :meth:`set_quant_type` ('input', 'tensor' or 'param') first; it also sets the observer's."""

    def __init__(self, observer, scale=1., zero_point=0., **observer_kwargs):
        super().__init__(observer, **observer_kwargs)
        self.register_buffer("scale", torch.tensor([scale]))
        self.register_buffer("zero_point", torch.tensor([zero_point]))
        self.register_buffer("eps", torch.tensor([torch.finfo(torch.float32).eps]))
        self.quant_type = None
        self.mth = None
        self.load_state_dict_hook = PerChannelLoadHook(self)

    def set_quant_type(self, qtype):
        if qtype not in _QUANT_TYPES:
            raise ValueError(f"TqtFakeQuantize.set_quant_type: {qtype!r} is not one of "
                             f"{list(_QUANT_TYPES)}")
        self.quant_type = qtype
        if hasattr(self.activation_post_process, "set_quant_type"):
            self.activation_post_process.set_quant_type(qtype)
        self.set_forward_method()

    def set_forward_method(self):
        """``mth`` from ``quant_type``: 3 (round, then clamp) for 'param', 2 (clamp, then round
        negative ties up) otherwise, as MQBench (which does not check ``quant_type`` here
        either). ``mth`` is a Python int (MQBench: a 0-d tensor of the same value)."""
        self.mth = 3 if self.quant_type == "param" else 2

    @torch.jit.export
    def extra_repr(self):
        return super().extra_repr() + "quant_type={}, scale={}, zero_point={}".format(
            self.quant_type, self.scale if self.ch_axis == -1 else "List",
            self.zero_point if self.ch_axis == -1 else "List")

    def forward(self, X):
        scale = self._observe_into_parameters(X)
        if self._fake_quant_on():
            assert self.is_symmetric_quant, "TqtFakeQuantize only supports symmetric quantization"
            assert not self.is_per_channel, "TqtFakeQuantize only supports per-tensor quantization"
            if self.mth is None:
                raise ValueError("Invalid method None encoding!")
            zero_point = self._edit_in_place(self.zero_point, lambda z: z.zero_())
            X = export_ops().fake_quantize_tqt(X, scale, zero_point, self.quant_min,
                                                   self.quant_max, self.mth)
        return X
