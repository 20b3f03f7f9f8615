"""``AdaRoundFakeQuantize`` (Nagel et al. 2020, Up or Down? Adaptive Rounding), weights only."""
import torch
from torch.nn.parameter import Parameter

from mqbench.onnx.plain_export import ops as export_ops
from mqbench.fake_quantize.fixed import FixedFakeQuantize
from mqbench.utils.hook import PerChannelLoadHook

__all__ = ["AdaRoundFakeQuantize"]


class AdaRoundFakeQuantize(FixedFakeQuantize):
    """Fixed fake quantization until :meth:`init` switches it to learned rounding:
    ``out = (clamp(floor(x/s) + h(alpha) + z, qmin, qmax) - z) * s`` with the rectified sigmoid
    ``h(alpha) = clamp(sigmoid(alpha) * (zeta - gamma) + gamma, 0, 1)``; only ``alpha`` learns.
    """

    def __init__(self, observer, **observer_kwargs):
        super().__init__(observer, **observer_kwargs)
        self.load_state_dict_hook.close()
        self.load_state_dict_hook = PerChannelLoadHook(self, hook_param=["scale", "zero_point",
                                                                         "alpha"])
        self.adaround = False
        # the stretch of the rectified sigmoid; our AdaRound ops use these values (read-only)
        self.gamma, self.zeta = -0.1, 1.1

    def init(self, weight_tensor, round_mode="learned_hard_sigmoid"):
        """Starts learned rounding of ``weight_tensor`` (the weight this quantizer sees): the
        observer is disabled, fake quantization enabled, and ``alpha`` initialised so that
        ``h(alpha)`` equals the fractional part of ``weight / scale``."""
        if round_mode != "learned_hard_sigmoid":
            raise NotImplementedError(f"AdaRoundFakeQuantize: round_mode {round_mode!r} is not "
                                      "supported; use 'learned_hard_sigmoid'")
        self.adaround = True
        self.disable_observer()
        self.enable_fake_quant()
        self.round_mode = round_mode
        ch_axis = self.ch_axis if self.is_per_channel else -1
        self.alpha = Parameter(torch.ops.mqbench.adaround_alpha_init(
            weight_tensor.detach(), self.scale.data, ch_axis))

    def rectified_sigmoid(self):
        """h(alpha), the soft rounding offset in [0, 1]."""
        return torch.ops.mqbench.adaround_rectified_sigmoid(self.alpha)

    def _adaround(self, X, hard):
        ops = export_ops()
        if self.is_per_channel:
            return ops.fake_quantize_adaround_per_channel(
                X, self.scale.data, self.zero_point, self.alpha, self.ch_axis, self.quant_min,
                self.quant_max, hard)
        return ops.fake_quantize_adaround_per_tensor(X, self.scale.data, self.zero_point, self.alpha,
                                                     self.quant_min, self.quant_max, hard)

    def get_hard_value(self, X):
        """The weight rounded with the final hard decision ``alpha >= 0``."""
        return self._adaround(X, hard=True)

    def forward(self, X):
        if not self.adaround:
            return super().forward(X)
        if self._observer_on():
            self._observe_into_buffers(X)
        if self._fake_quant_on():
            X = self._adaround(X, hard=False)
        return X
