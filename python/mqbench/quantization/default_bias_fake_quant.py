"""The default bias fake quantizer (MQBench's ``mqbench.quantization.default_bias_fake_quant``):
TQT (``TqtFakeQuantize``) with a ``MinMaxFloorObserver``, 8-bit symmetric per-tensor with a
power-of-two scale. ``bias_fake_quantizer`` is a factory: call it for a module.

Example::

    >>> fq = bias_fake_quantizer()
    >>> fq.set_quant_type('param')      # as MQBench's BN merge and Vitis quantizer do
    >>> conv.bias_fake_quant = fq       # mqbench.nn.qat.Conv2d then quantizes its bias
"""
from mqbench.fake_quantize import TqtFakeQuantize
from mqbench.observer import MinMaxFloorObserver
from mqbench.scheme import QuantizeScheme

__all__ = ["bias_fakeq_param", "bias_qscheme", "b_fakequantize", "b_qconfig",
           "bias_fake_quantizer"]

bias_fakeq_param = {}
bias_qscheme = QuantizeScheme(symmetry=True, per_channel=False, pot_scale=True, bit=8)
b_fakequantize = TqtFakeQuantize
b_qconfig = b_fakequantize.with_args(observer=MinMaxFloorObserver, **bias_fakeq_param,
                                     **bias_qscheme.to_observer_params())
bias_fake_quantizer = b_qconfig
