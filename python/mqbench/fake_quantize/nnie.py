"""``NNIEFakeQuantize``: HiSilicon NNIE's logarithmic 8-bit format."""
import warnings

import torch

from mqbench.onnx.plain_export import ops as export_ops
from mqbench.fake_quantize.quantize_base import QuantizeBase, _same_state, _state_key
from mqbench.utils import no_jit_trace

__all__ = ["NNIEFakeQuantize"]


class NNIEFakeQuantize(QuantizeBase):
    """Tracks ``data_max = max(data_max, |observed range|)`` on every forward and, when fake
    quantization is on, applies ``fake_quantize_nnie(x, data_max)`` (identity gradient)."""

    def __init__(self, observer, **observer_kwargs):
        super().__init__(observer, **observer_kwargs)
        self.register_buffer("data_max", torch.tensor(float("-inf")))

    def forward(self, X):
        if torch.onnx.is_in_onnx_export():
            # An export writes the node, nothing else: no data_max update (an export never
            # moves the calibration) and no host-side check, which torch.export cannot trace
            # (the deploy refuses a data_max that is not finite).
            return export_ops().fake_quantize_nnie(X, self.data_max) \
                if self._fake_quant_on() else X
        if self._observer_on():
            self.activation_post_process(X.detach())
        with no_jit_trace():
            app = self.activation_post_process
            before = (self.data_max, app.min_val, app.max_val)
            observed = torch.maximum(-app.min_val, app.max_val).max() if app.min_val.numel() else \
                self.data_max
            self.data_max = torch.maximum(self.data_max, observed.to(self.data_max))
        if self._fake_quant_on():
            # data_max 0 (calibrated on all-zero data): the op outputs zeros
            if not self._data_max_known_finite(before):
                if not bool(torch.isfinite(self.data_max)):
                    raise RuntimeError(
                        f"NNIEFakeQuantize: data_max is {float(self.data_max)}; calibrate with "
                        "the observer enabled (enable_calibration) before quantizing")
                if not self.__dict__.get("_warned_zero") and float(self.data_max) == 0.0:
                    self._warned_zero = True
                    warnings.warn("NNIEFakeQuantize: data_max is 0 (calibrated on all-zero "
                                  "data, e.g. a zero-initialised layer): it quantizes to 0",
                                  UserWarning, stacklevel=2)
            self._checked = _state_key(self.data_max, app.min_val, app.max_val)
            X = export_ops().fake_quantize_nnie(X, self.data_max)
        return X

    def _data_max_known_finite(self, before):
        """True when this forward's data_max is the value checked finite by the previous one,
        told without reading it on the host (a CUDA synchronisation in every QAT step
        otherwise; Note [Switches without host reads] in quantize_base.py). ``before`` holds
        (data_max, observer min_val, max_val) as they were before this forward's update. If
        they are the very tensors, unwritten, that followed the last check, the observer has not
        changed since (observers assign new tensors or write in place), so ``observed`` is what
        it was and ``max(data_max, observed)`` equals the checked data_max. Any other change
        (loading a state dict, an observer step, an assignment) makes the forward check again."""
        return _same_state(self.__dict__.get("_checked"), *before)
