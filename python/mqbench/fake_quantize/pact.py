"""``PACTFakeQuantize`` (Choi et al. 2018, PACT: Parameterized Clipping Activation)."""
import torch
from torch.nn.parameter import Parameter

from mqbench.onnx.plain_export import ops as export_ops
from mqbench.fake_quantize.quantize_base import QuantizeBase

__all__ = ["PACTFakeQuantize"]


class PACTFakeQuantize(QuantizeBase):
    """Learnable clip ``alpha`` (and ``n_alpha = -alpha`` for asymmetric schemes).

    As MQBench writes it: while the observer is enabled the input is clipped to
    ``[lower, alpha]`` (lower: ``-alpha`` symmetric, ``n_alpha`` asymmetric, none when the batch
    has no negative value), the observer's range is set to the clip range and the qparams follow
    from it; gradients then reach ``alpha``. With the observer disabled the input is only
    fake-quantized with the stored qparams.
    """

    def __init__(self, observer, alpha=6.0, **observer_kwargs):
        super().__init__(observer, **observer_kwargs)
        if self.is_per_channel:
            # One learned clip alpha per tensor; a per-channel scheme failed only at export.
            raise ValueError("PACTFakeQuantize learns one clipping threshold per tensor: give it a "
                             "per-tensor scheme (it is meant for activations)")
        self.alpha = Parameter(torch.tensor([alpha]))
        if not self.is_symmetric_quant:
            self.n_alpha = Parameter(torch.tensor([-alpha]))
        self.register_buffer("scale", torch.tensor([1.0], dtype=torch.float))
        self.register_buffer("zero_point", torch.tensor([0], dtype=torch.int))

    @torch.jit.export
    def extra_repr(self):
        return super().extra_repr() + "alpha={}".format(self.alpha)

    def _lower(self, X):
        """The lower clip as a tensor, or None when the batch has no negative value."""
        if float(X.detach().min()) >= 0:
            return None
        return -self.alpha if self.is_symmetric_quant else self.n_alpha

    def forward(self, X):
        lower = None
        clip = self._observer_on()
        if clip:
            app = self.activation_post_process
            app(X.detach())
            lower = self._lower(X)
            app.max_val = self.alpha.data.detach().reshape(()).to(app.max_val.dtype).clone()
            app.min_val = (lower.data.detach().reshape(()).to(app.min_val.dtype).clone()
                           if lower is not None else torch.zeros_like(app.max_val))
            self._observe_qparams()
        no_lower = torch.full_like(self.alpha, float("-inf"))
        if self._fake_quant_on():
            if clip:
                return export_ops().fake_quantize_pact(
                    X, self.alpha, lower if lower is not None else no_lower, self.scale,
                    self.zero_point, self.quant_min, self.quant_max)
            return self._fixed_fake_quant(X)
        if clip:  # clip only (calibration without quantization)
            X = torch.minimum(X, self.alpha)
            if lower is not None:
                X = torch.maximum(X, lower)
        return X

    def _observe_qparams(self):
        _scale, _zero_point = self.activation_post_process.calculate_qparams()
        self.scale.resize_(_scale.shape).copy_(_scale.to(self.scale.device))
        self.zero_point.resize_(_zero_point.shape).copy_(_zero_point.to(self.zero_point.device))
