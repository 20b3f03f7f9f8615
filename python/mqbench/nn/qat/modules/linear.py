"""``Linear`` QAT module: nn.Linear with its weight through ``weight_fake_quant`` (torch's
``nn.qat.Linear``, owned here: same constructor, attributes and state-dict keys)."""
import torch.nn as nn
import torch.nn.functional as F

from mqbench.nn.qat.modules.conv import bias_fake_quant_from, qat_from_float, quantized_bias

__all__ = ["Linear"]


class Linear(nn.Linear):
    """nn.Linear whose weight goes through ``weight_fake_quant``, and its bias through
    ``bias_fake_quant`` when the qconfig has a ``bias`` factory or one is set (Note [Bias fake
    quantizers] in mqbench.nn.qat.modules.conv)."""

    # NonDynamicallyQuantizableLinear is the Linear inside nn.MultiheadAttention.
    _FLOAT_MODULE = (nn.Linear, nn.modules.linear.NonDynamicallyQuantizableLinear)
    _canonical_name = "nn.qat.Linear"

    def __init__(self, in_features, out_features, bias=True, qconfig=None, device=None,
                 dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        if not qconfig:
            raise ValueError("Linear: a QAT module needs a qconfig")
        self.qconfig = qconfig
        self.weight_fake_quant = qconfig.weight()
        bias_fq = bias_fake_quant_from(qconfig)
        if bias_fq is not None:
            self.bias_fake_quant = bias_fq

    def forward(self, input):
        return F.linear(input, self.weight_fake_quant(self.weight), quantized_bias(self, self.bias))

    @classmethod
    def from_float(cls, mod, use_precomputed_fake_quant=False):
        def build(linear, qconfig):
            qat = cls(linear.in_features, linear.out_features, linear.bias is not None,
                      qconfig=qconfig)
            qat.weight = linear.weight
            qat.bias = linear.bias
            return qat
        return qat_from_float(cls, mod, build)

    def to_float(self):
        linear = nn.Linear(self.in_features, self.out_features, self.bias is not None)
        linear.weight = nn.Parameter(self.weight.detach())
        if self.bias is not None:
            linear.bias = nn.Parameter(self.bias.detach())
        linear.train(self.training)
        return linear
