"""``DoReFaFakeQuantize`` (Zhou et al. 2016, DoReFa-Net)."""
import torch

from mqbench.onnx.plain_export import ops as export_ops
from mqbench.fake_quantize.fixed import FixedFakeQuantize

__all__ = ["DoReFaFakeQuantize"]


class DoReFaFakeQuantize(FixedFakeQuantize):
    """Always normalises ``x = tanh(x) / (max|tanh(x)| + 1e-5)`` (even with both flags off, as
    MQBench), then observes and fake-quantizes like :class:`FixedFakeQuantize`."""

    def forward(self, X):
        X = export_ops().dorefa_normalize(X)
        return super().forward(X)
