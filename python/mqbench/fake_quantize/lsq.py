"""``LearnableFakeQuantize``: LSQ (symmetric) and LSQ+ (asymmetric, learnable zero point)."""
import torch
from torch.nn.parameter import Parameter

from mqbench.onnx.plain_export import ops as export_ops
from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.utils import is_symmetric_quant
from mqbench.utils.hook import PerChannelLoadHook

__all__ = ["LearnableFakeQuantize"]


class LearnableFakeQuantize(QuantizeBase):
    """Scale and zero point are Parameters trained by backpropagation (Esser et al. 2020, LSQ;
    Bhalgat et al. 2020, LSQ+). The observer initialises them; with the observer off, the scale is
    kept positive (``|s|``, at least ``eps``). Gradients to scale and zero point are multiplied by
    ``1/sqrt(n * quant_max)`` (n = elements per scale) unless ``use_grad_scaling=False``.

    Example::

        fq = LearnableFakeQuantize(EMAMinMaxObserver, quant_min=-127, quant_max=127,
                                   dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
        fq(calib_batch)                  # observer on: initialises scale
        fq.disable_observer()
        loss = fq(x).sum(); loss.backward()   # fq.scale.grad is set
    """

    def __init__(self, observer, scale=1., zero_point=0., use_grad_scaling=True, **observer_kwargs):
        super().__init__(observer, **observer_kwargs)
        self.use_grad_scaling = use_grad_scaling
        self.scale = Parameter(torch.tensor([scale]))
        self.zero_point = Parameter(torch.tensor([zero_point]))
        self.register_buffer("eps", torch.tensor([torch.finfo(torch.float32).eps]))
        self.load_state_dict_hook = PerChannelLoadHook(self)

    @torch.jit.export
    def extra_repr(self):
        return super().extra_repr() + "scale={}, zero_point={}".format(
            self.scale if self.ch_axis == -1 else "List[%s]" % str(self.scale.shape),
            self.zero_point if self.ch_axis == -1 else "List")

    def forward(self, X):
        scale = self._observe_into_parameters(X)
        if self._fake_quant_on():
            if is_symmetric_quant(self.qscheme):
                zero_point = self._edit_in_place(self.zero_point, lambda z: z.zero_())
            else:
                zero_point = self._edit_in_place(
                    self.zero_point, lambda z: z.clamp_(self.quant_min, self.quant_max))
            ops = export_ops()
            g = self._grad_factor(X)
            if self.is_per_channel:
                X = ops.fake_quantize_learnable_per_channel_affine(
                    X, scale, zero_point, self.ch_axis, self.quant_min, self.quant_max, g)
            else:
                X = ops.fake_quantize_learnable_per_tensor_affine(
                    X, scale, zero_point, self.quant_min, self.quant_max, g)
        return X
