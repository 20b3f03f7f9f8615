"""``PerTokenFakeQuantize``: dynamic activation quantization with one scale (and zero point) per
token, computed from the data at every call (QuantizeScheme(dynamic="per_token")), a thin module
around ``torch.ops.mqbench.fake_quantize_per_token``."""
import torch

from mqbench.fake_quantize.fp8 import fp8_format_of
from mqbench.fake_quantize.quantize_base import QuantizeBase

__all__ = ["PerTokenFakeQuantize"]

_ops = torch.ops.mqbench
_INT = "int"


class PerTokenFakeQuantize(QuantizeBase):
    """Fake-quantizes each row of the last dimension (a token's hidden vector) on its own grid:
    integer (``quant_min`` .. ``quant_max``; symmetric: max|x| / ((qmax - qmin) / 2), zero point
    0; asymmetric: the row's min / max, zero point rounded) or FP8 (amax / 448 for E4M3). The
    scales are not state: nothing is calibrated, and the observer (kept so that MQBench's
    ``enable_calibration`` / ``enable_quantization`` and state dicts work as for every fake
    quantizer) is never called. As every fake quantizer, it passes its input through while
    ``fake_quant_enabled`` is off (calibration). The gradient is straight through (every value
    lies inside its row's range).

    Example::

        fq = PerTokenFakeQuantize(MinMaxObserver, **QuantizeScheme(
            bit=4, symmetry=True, dynamic="per_token").to_observer_params())
        y = fq(x)      # x [..., hidden]: one INT4 grid per token
    """

    def __init__(self, observer, **observer_kwargs):
        dynamic = observer_kwargs.pop("dynamic", "per_token")
        if dynamic != "per_token":
            raise ValueError(f"PerTokenFakeQuantize: dynamic must be 'per_token', got {dynamic!r}")
        fmt = observer_kwargs.get("format", _INT)
        if fmt == _INT:
            observer_kwargs.pop("format", None)
        else:
            fmt = fp8_format_of(observer_kwargs)
        self.format = fmt
        self.dynamic = dynamic
        super().__init__(observer, **observer_kwargs)
        if self.is_per_channel:
            raise ValueError("PerTokenFakeQuantize: a per-channel qscheme does not apply (one "
                             "scale per token)")

    def forward(self, X):
        if self._fake_quant_on():
            X = _ops.fake_quantize_per_token(X, self.quant_min, self.quant_max,
                                             self.is_symmetric_quant, self.format)
        return X

    def calculate_qparams(self):
        raise RuntimeError("PerTokenFakeQuantize has no qparams: its scales are computed per "
                           "token at every call")

    @torch.jit.export
    def extra_repr(self):
        return super().extra_repr() + f"format={self.format}, dynamic={self.dynamic}"
