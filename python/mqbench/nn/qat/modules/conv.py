"""``Conv1d`` / ``Conv2d`` / ``Conv3d`` QAT modules: the convolution with its weight through
``weight_fake_quant`` (torch's ``nn.qat`` modules, owned here: same constructor, attributes and
state-dict keys ``weight``, ``bias``, ``weight_fake_quant.*``).

Note [Bias fake quantizers]
MQBench has two classes where we have one: torch's ``nn.qat.Conv2d`` (what its default QAT
swap makes, no bias quantizer) and its own ``mqbench.nn.qat.Conv2d``, which always builds
``bias_fake_quant = bias_fake_quantizer()`` (``mqbench.quantization.default_bias_fake_quant``)
and fake-quantizes its bias (so do its ``Linear``, from ``qconfig.bias``, and the Vitis
``ConvBn2d`` / ``ConvBnReLU2d`` / ``ConvReLU2d``). Our class plays both parts, so a bias
quantizer is there only when asked for: a qconfig with a ``bias`` factory (MQBench's
``Linear`` requirement) builds ``bias_fake_quant`` from it, and a ``bias_fake_quant``
submodule set on the module (what MQBench's BN merge ``convert_qnniqat_convbn`` does, and
``VitisQuantizer`` on the fused convolutions, as MQBench 1.10's Vitis mapping) is used from
then on. The other backends' prepared models, state dicts and checkpoints are unchanged
(docs/compatibility.md, rows 91-92). A checkpoint saved without a module's bias quantizer (a
Vitis model of an earlier wave) still loads and computes what it computed when saved: the
quantizer is switched off (observer and fake quantization) and a warning says to calibrate
again (``fill_missing_bias_quant``).
"""
import warnings

import torch.nn as nn

from mqbench.utils.module_types import is_float_module_of

__all__ = ["Conv1d", "Conv2d", "Conv3d", "qat_from_float", "bias_fake_quant_from",
           "quantized_bias", "fill_missing_bias_quant", "mark_bias_quant_layout"]


def bias_fake_quant_from(qconfig):
    """``qconfig.bias()`` when the qconfig has a ``bias`` factory (MQBench's bias qconfig), else
    None (torch's and our ``QConfig`` have no such field). Note [Bias fake quantizers]."""
    factory = getattr(qconfig, "bias", None)
    return factory() if factory is not None else None


def quantized_bias(module, bias):
    """``bias`` through ``module.bias_fake_quant`` when the module has that submodule and a
    bias; else ``bias`` unchanged. Note [Bias fake quantizers]."""
    fq = module._modules.get("bias_fake_quant")
    return fq(bias) if fq is not None and bias is not None else bias


# Set in a module's state-dict metadata by the QAT convolutions of this layout (which may carry
# a bias quantizer); a checkpoint without it was saved before bias quantizers existed.
BIAS_QUANT_LAYOUT = "mqbench_bias_quant"


def mark_bias_quant_layout(module, state_dict, prefix, local_metadata):
    """State-dict hook of the QAT convolutions: marks their metadata (BIAS_QUANT_LAYOUT)."""
    local_metadata[BIAS_QUANT_LAYOUT] = 1


def fill_missing_bias_quant(module, state_dict, prefix, local_metadata):
    """Loading a checkpoint saved before bias quantizers (no BIAS_QUANT_LAYOUT mark) into
    ``module``: when the module has a bias quantizer the checkpoint knows nothing of, its state
    is filled in switched off (a strict load passes and the model computes what the checkpoint
    did) and a warning says to calibrate again. A state dict of this layout is loaded as it is.
    Note [Bias fake quantizers]."""
    fq = module._modules.get("bias_fake_quant")
    if fq is None or local_metadata.get(BIAS_QUANT_LAYOUT):
        return
    key_prefix = prefix + "bias_fake_quant."
    keys = list(state_dict)
    if any(k.startswith(key_prefix) for k in keys) or not any(k.startswith(prefix) for k in keys):
        return
    filled = fq.state_dict(prefix=key_prefix)
    for switch in ("fake_quant_enabled", "observer_enabled"):
        if key_prefix + switch in filled:
            filled[key_prefix + switch] = filled[key_prefix + switch].clone().zero_()
    state_dict.update(filled)
    warnings.warn(f"{prefix.rstrip('.') or 'the model'}: the checkpoint has no bias_fake_quant "
                  "state (saved before bias quantization); the bias quantizer is off: calibrate "
                  "the model again (enable_calibration) to use it", UserWarning, stacklevel=3)


def qat_from_float(cls, mod, build):
    """The shared checks of ``from_float``: ``mod`` is ``cls``'s float module (or torch's class
    of the same name) and carries a qconfig. ``build(inner, qconfig)`` makes the QAT module from
    the float layer (``mod`` itself, or ``mod[0]`` of a fused container)."""
    if not is_float_module_of(mod, cls):
        expected = cls._FLOAT_MODULE
        raise TypeError(f"{cls.__name__}.from_float expects {expected.__name__}, got "
                        f"{type(mod).__name__}")
    qconfig = getattr(mod, "qconfig", None)
    if not qconfig:
        raise ValueError(f"{cls.__name__}.from_float: the float module needs a qconfig")
    inner = mod[0] if isinstance(mod, nn.Sequential) else mod
    return build(inner, qconfig)


def _conv_class(base, name, dims):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", qconfig=None, device=None,
                 dtype=None):
        base.__init__(self, in_channels, out_channels, kernel_size, stride=stride,
                      padding=padding, dilation=dilation, groups=groups, bias=bias,
                      padding_mode=padding_mode, device=device, dtype=dtype)
        if not qconfig:
            raise ValueError(f"{name}: a QAT module needs a qconfig")
        self.qconfig = qconfig
        self.weight_fake_quant = qconfig.weight()
        bias_fq = bias_fake_quant_from(qconfig)
        if bias_fq is not None:
            self.bias_fake_quant = bias_fq
        self._register_state_dict_hook(mark_bias_quant_layout)

    def forward(self, input):
        return self._conv_forward(input, self.weight_fake_quant(self.weight),
                                  quantized_bias(self, self.bias))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):
        fill_missing_bias_quant(self, state_dict, prefix, local_metadata)
        base._load_from_state_dict(self, state_dict, prefix, local_metadata, *args)

    @classmethod
    def from_float(cls, mod, use_precomputed_fake_quant=False):
        def build(conv, qconfig):
            qat = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                      padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                      bias=conv.bias is not None, padding_mode=conv.padding_mode,
                      qconfig=qconfig)
            qat.weight = conv.weight  # shared with the float model, as torch's from_float
            qat.bias = conv.bias
            return qat
        return qat_from_float(cls, mod, build)

    def to_float(self):
        conv = base(self.in_channels, self.out_channels, self.kernel_size, self.stride,
                    self.padding, self.dilation, self.groups, self.bias is not None,
                    self.padding_mode)
        conv.weight = nn.Parameter(self.weight.detach())
        if self.bias is not None:
            conv.bias = nn.Parameter(self.bias.detach())
        conv.train(self.training)
        return conv

    return type(name, (base,), {
        "__doc__": f"nn.{name} whose weight goes through ``weight_fake_quant`` (a {dims}-d QAT "
                   "convolution); its bias goes through ``bias_fake_quant`` when it has one "
                   "(Note [Bias fake quantizers] in mqbench.nn.qat.modules.conv).",
        "__module__": __name__, "_FLOAT_MODULE": base, "_canonical_name": f"nn.qat.{name}",
        "__init__": __init__, "forward": forward, "from_float": from_float,
        "to_float": to_float, "_load_from_state_dict": _load_from_state_dict,
    })


Conv1d = _conv_class(nn.Conv1d, "Conv1d", 1)
Conv2d = _conv_class(nn.Conv2d, "Conv2d", 2)
Conv3d = _conv_class(nn.Conv3d, "Conv3d", 3)
