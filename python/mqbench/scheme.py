"""``QuantizeScheme`` (MQBench's ``mqbench.scheme``): bit width, symmetry, per-channel, pot scale."""
import numbers

import torch

__all__ = ["QuantizeScheme"]

# The bit widths the registry accepts (src/scheme.cpp): 2^24 levels is float32's exact range.
MIN_BIT, MAX_BIT = 1, 24


def _is_flag(value):
    return isinstance(value, bool) or (isinstance(value, numbers.Integral) and value in (0, 1))


class QuantizeScheme(object):
    """How to quantize weights or activations.

    Args:
        symmetry: symmetric (signed range, zero point 0) or asymmetric (unsigned range).
        per_channel: one scale per output channel (``ch_axis=0``) or one per tensor.
        pot_scale: power-of-two scales.
        bit: bit width.
        symmetric_range (kwarg): ``[-(2^(b-1) - 1), 2^(b-1) - 1]`` instead of
            ``[-2^(b-1), 2^(b-1) - 1]``.
        **kwargs: merged into the observer's arguments (e.g. ``ema_ratio``).

    Example::

        QuantizeScheme(symmetry=True, per_channel=True, bit=8, symmetric_range=True)
            .to_observer_params()   # quant_min=-127, quant_max=127, ch_axis=0, qint8, ...
    """

    def __init__(self, symmetry=True, per_channel=False, pot_scale=False, bit=8, **kwargs):
        for field, value in (("symmetry", symmetry), ("per_channel", per_channel),
                             ("pot_scale", pot_scale)):
            if not _is_flag(value):
                raise ValueError(f"QuantizeScheme: {field} must be True or False, got {value!r}")
        symmetric_range = kwargs.pop("symmetric_range", False)
        if not _is_flag(symmetric_range):
            raise ValueError(f"QuantizeScheme: symmetric_range must be True or False, "
                             f"got {symmetric_range!r}")
        if isinstance(bit, bool) or not isinstance(bit, numbers.Integral) or \
                not MIN_BIT <= bit <= MAX_BIT:
            raise ValueError(f"QuantizeScheme: bit must be an integer in [{MIN_BIT}, {MAX_BIT}], "
                             f"got {bit!r}")
        if symmetry and symmetric_range and bit < 2:
            raise ValueError("QuantizeScheme: bit=1 with symmetry and symmetric_range leaves the "
                             "single level 0 ([0, 0]); use bit >= 2 or symmetric_range=False "
                             "([-1, 0])")
        self.symmetry = bool(symmetry)
        self.per_channel = bool(per_channel)
        self.pot_scale = bool(pot_scale)
        self.bit = int(bit)
        if self.per_channel:
            self.torch_qscheme = torch.per_channel_symmetric if self.symmetry else \
                torch.per_channel_affine
        else:
            self.torch_qscheme = torch.per_tensor_symmetric if self.symmetry else \
                torch.per_tensor_affine
        self.symmetric_range = bool(symmetric_range)
        self.kwargs = kwargs

    def to_observer_params(self):
        """The observer/fake-quantizer keyword arguments of this scheme."""
        naive_para = {
            "quant_min": (-2 ** (self.bit - 1) + 1 if self.symmetric_range else
                          -2 ** (self.bit - 1)) if self.symmetry else 0,
            "quant_max": 2 ** (self.bit - 1) - 1 if self.symmetry else 2 ** self.bit - 1,
            "dtype": torch.qint8 if self.symmetry else torch.quint8,
            "pot_scale": self.pot_scale,
            "qscheme": self.torch_qscheme,
            "reduce_range": False,
            "ch_axis": 0 if self.per_channel else -1,
        }
        naive_para.update(self.kwargs)
        return naive_para

    def to_dict(self):
        """The fields as the C++ registry holds them (include/mqbench/scheme.h)."""
        return {"symmetry": self.symmetry, "per_channel": self.per_channel,
                "pot_scale": self.pot_scale, "bit": self.bit,
                "symmetric_range": self.symmetric_range, "kwargs": dict(self.kwargs)}

    @classmethod
    def from_dict(cls, d):
        return cls(symmetry=d["symmetry"], per_channel=d["per_channel"],
                   pot_scale=d["pot_scale"], bit=d["bit"],
                   symmetric_range=d.get("symmetric_range", False), **d.get("kwargs", {}))

    def __str__(self):
        return "Symmetric: {} / Bitwidth: {} / Per channel: {} / Pot scale: {} / Extra kwargs: {}".format(
            self.symmetry, self.bit, self.per_channel, self.pot_scale, self.kwargs)

    def __repr__(self):
        return f"QuantizeScheme({self})"

    def __eq__(self, other):
        return isinstance(other, QuantizeScheme) and self.to_dict() == other.to_dict()

    __hash__ = object.__hash__
