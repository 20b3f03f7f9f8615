"""Group-wise integer fake quantizers (QuantizeScheme(group_size=...), docs/formats.md): one
scale and zero point per ``group_size`` consecutive elements along ``ch_axis`` (a weight's
input channels), ``GroupFakeQuantize`` (observer-driven) and ``LearnableGroupFakeQuantize``
(LSQ / LSQ+ per group). Thin modules around ``torch.ops.mqbench.fake_quantize_per_group_affine``
and ``fake_quantize_learnable_per_group_affine``."""
import torch
from torch.nn.parameter import Parameter

from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.utils import is_symmetric_quant

__all__ = ["GroupFakeQuantize", "LearnableGroupFakeQuantize"]

_ops = torch.ops.mqbench


def _group_observer(observer, observer_kwargs):
    from mqbench.observer import group_observer_for
    if observer is None:
        from mqbench.observer import MinMaxObserver as observer
    if "group_size" not in observer_kwargs:
        raise ValueError("a group-wise fake quantizer needs group_size (QuantizeScheme("
                         "group_size=..., per_channel=True))")
    observer_kwargs.setdefault("ch_axis", 1)
    return group_observer_for(observer)


class _GroupBase(QuantizeBase):
    def __init__(self, observer, **observer_kwargs):
        super().__init__(_group_observer(observer, observer_kwargs), **observer_kwargs)
        app = self.activation_post_process
        self.group_size = app.group_size
        self.ch_axis = app.group_axis  # the grouped axis (the observer's rows use axis 0)
        self.is_per_channel = True

    @torch.jit.export
    def extra_repr(self):
        return super().extra_repr() + f"group_size={self.group_size}, scale=List[" \
            f"{tuple(self.scale.shape)}]"

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        self._resize_on_load(state_dict, prefix, strict, missing_keys)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


class GroupFakeQuantize(_GroupBase):
    """Observer-driven group-wise fake quantization (the group-wise twin of FixedFakeQuantize);
    ``scale`` / ``zero_point`` buffers have the weight's shape with size(ch_axis) / group_size.

    Example::

        fq = GroupFakeQuantize(MinMaxObserver, **QuantizeScheme(
            bit=4, per_channel=True, group_size=128).to_observer_params())
        w_q = fq(linear.weight)            # INT4, one scale per 128 input channels
    """

    def __init__(self, observer=None, **observer_kwargs):
        super().__init__(observer, **observer_kwargs)
        self.register_buffer("scale", torch.tensor([1.0], dtype=torch.float))
        self.register_buffer("zero_point", torch.tensor([0], dtype=torch.int))

    def forward(self, X):
        if self._observer_on():
            self._observe_into_buffers(X)
        if self._fake_quant_on():
            X = _ops.fake_quantize_per_group_affine(X, self.scale, self.zero_point, self.ch_axis,
                                                    self.group_size, self.quant_min,
                                                    self.quant_max)
        return X


class LearnableGroupFakeQuantize(_GroupBase):
    """LSQ (symmetric) / LSQ+ (asymmetric) per group: scale and zero point Parameters shaped as
    GroupFakeQuantize's buffers, initialised by the observer; gradients multiplied by
    ``1/sqrt(group_size * quant_max)`` unless ``use_grad_scaling=False``."""

    def __init__(self, observer=None, scale=1., zero_point=0., use_grad_scaling=True,
                 **observer_kwargs):
        super().__init__(observer, **observer_kwargs)
        self.use_grad_scaling = use_grad_scaling
        self.scale = Parameter(torch.tensor([scale]))
        self.zero_point = Parameter(torch.tensor([zero_point]))
        self.register_buffer("eps", torch.tensor([torch.finfo(torch.float32).eps]))

    def _grad_factor(self, X):
        if not self.use_grad_scaling:
            return 1.0
        return 1.0 / (self.group_size * self.quant_max) ** 0.5

    def forward(self, X):
        scale = self._observe_into_parameters(X)
        if self._fake_quant_on():
            if is_symmetric_quant(self.qscheme):
                zero_point = self._edit_in_place(self.zero_point, lambda z: z.zero_())
            else:
                zero_point = self._edit_in_place(
                    self.zero_point, lambda z: z.clamp_(self.quant_min, self.quant_max))
            X = _ops.fake_quantize_learnable_per_group_affine(
                X, scale, zero_point, self.ch_axis, self.group_size, self.quant_min,
                self.quant_max, self._grad_factor(X))
        return X
