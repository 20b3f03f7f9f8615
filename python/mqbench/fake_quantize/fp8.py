"""FP8 fake quantizers (QuantizeScheme(dtype="fp8_e4m3" / "fp8_e5m2"), docs/formats.md):
``FP8FakeQuantize`` (observer-driven scale) and ``LearnableFP8FakeQuantize`` (LSQ scale), thin
modules around ``torch.ops.mqbench.fake_quantize_fp8`` / ``fake_quantize_learnable_fp8``."""
import torch
from torch.nn.parameter import Parameter

from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.utils.hook import PerChannelLoadHook

__all__ = ["FP8FakeQuantize", "LearnableFP8FakeQuantize", "fp8_format_of"]

_ops = torch.ops.mqbench
_BY_DTYPE = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}
_MAX = {"fp8_e4m3": 448, "fp8_e5m2": 57344}


def fp8_format_of(observer_kwargs):
    """The FP8 format named by a scheme's observer arguments (``format``, else ``dtype``);
    pops ``format``."""
    fmt = observer_kwargs.pop("format", None) or _BY_DTYPE.get(observer_kwargs.get("dtype"))
    if fmt not in _MAX:
        raise ValueError(f"an FP8 fake quantizer needs format 'fp8_e4m3' or 'fp8_e5m2' (from "
                         f"QuantizeScheme(dtype=...)), got {fmt!r}")
    observer_kwargs.setdefault("dtype", {v: k for k, v in _BY_DTYPE.items()}[fmt])
    observer_kwargs.setdefault("quant_min", -_MAX[fmt])
    observer_kwargs.setdefault("quant_max", _MAX[fmt])
    observer_kwargs.setdefault("qscheme", torch.per_tensor_symmetric)
    return fmt


class FP8FakeQuantize(QuantizeBase):
    """FP8 fake quantization with the observer's scale (amax / max finite element, per tensor or
    per channel) in the buffer ``scale``; straight-through gradient to the input.

    Example::

        fq = FP8FakeQuantize(MinMaxObserver, **QuantizeScheme(dtype="fp8_e4m3")
                             .to_observer_params())
        y = fq(x)      # observes amax, then rounds x / s to E4M3 (saturating at 448) * s
    """

    def __init__(self, observer, **observer_kwargs):
        self.format = fp8_format_of(observer_kwargs)
        super().__init__(observer, **observer_kwargs)
        self.register_buffer("scale", torch.tensor([1.0], dtype=torch.float))
        self.register_buffer("zero_point", torch.tensor([0], dtype=torch.int))
        self.load_state_dict_hook = PerChannelLoadHook(self)

    def _axis(self):
        return self.ch_axis if self.is_per_channel else None

    def forward(self, X):
        if self._observer_on():
            self._observe_into_buffers(X)
        if self._fake_quant_on():
            X = _ops.fake_quantize_fp8(X, self.scale, self._axis(), self.format)
        return X

    @torch.jit.export
    def extra_repr(self):
        return super().extra_repr() + f"format={self.format}, scale=" + (
            str(self.scale) if self.ch_axis == -1 else "List")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        self._resize_on_load(state_dict, prefix, strict, missing_keys)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


class LearnableFP8FakeQuantize(QuantizeBase):
    """FP8 fake quantization whose scale is a Parameter trained with LSQ's gradient on the FP8
    grid (docs/ops.md), initialised by the observer; the gradient is multiplied by
    ``1/sqrt(n * max)`` (n = elements per scale, max = 448 or 57344) unless
    ``use_grad_scaling=False``. ``zero_point`` stays 0 (FP8 is symmetric).

    Example::

        fq = LearnableFP8FakeQuantize(EMAMinMaxObserver,
                                      **QuantizeScheme(dtype="fp8_e4m3").to_observer_params())
        fq(calib_batch); fq.disable_observer()
        fq(x).sum().backward()         # fq.scale.grad is set
    """

    def __init__(self, observer, scale=1., use_grad_scaling=True, **observer_kwargs):
        self.format = fp8_format_of(observer_kwargs)
        super().__init__(observer, **observer_kwargs)
        self.use_grad_scaling = use_grad_scaling
        self.scale = Parameter(torch.tensor([scale]))
        self.register_buffer("zero_point", torch.tensor([0.0]))
        self.register_buffer("eps", torch.tensor([torch.finfo(torch.float32).eps]))
        self.load_state_dict_hook = PerChannelLoadHook(self)

    def forward(self, X):
        scale = self._observe_into_parameters(X)
        if self._fake_quant_on():
            X = _ops.fake_quantize_learnable_fp8(
                X, scale, self.ch_axis if self.is_per_channel else None, self.format,
                self._grad_factor(X))
        return X

    @torch.jit.export
    def extra_repr(self):
        return super().extra_repr() + f"format={self.format}, scale=" + (
            str(self.scale) if self.ch_axis == -1 else "List[%s]" % str(self.scale.shape))
