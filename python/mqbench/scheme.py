"""``QuantizeScheme`` (MQBench's ``mqbench.scheme``): bit width, symmetry, per-channel, pot scale."""
import numbers

import torch

__all__ = ["QuantizeScheme"]

# The bit widths the registry accepts (src/scheme.cpp): 2^24 levels is float32's exact range.
MIN_BIT, MAX_BIT = 1, 24

# The element formats (docs/formats.md): "int" is MQBench's integers; each float format maps to
# (element bits, observer range bound, torch element dtype or None where torch has none). The
# bound is the largest finite element, rounded down to an integer for MXFP6 E2M3 (7.5 -> 7):
# observer ranges are integers, and an MX observer's range informs only (src/scheme.cpp).
INT_DTYPE = "int"
FLOAT_DTYPES = {
    "fp8_e4m3": (8, 448, "float8_e4m3fn"),
    "fp8_e5m2": (8, 57344, "float8_e5m2"),
    "mxfp8_e4m3": (8, 448, "float8_e4m3fn"),
    "mxfp6_e3m2": (6, 28, None),
    "mxfp6_e2m3": (6, 7, None),
    "mxfp4": (4, 6, "float4_e2m1fn_x2"),
    "nvfp4": (4, 6, "float4_e2m1fn_x2"),
}
DTYPES = (INT_DTYPE,) + tuple(FLOAT_DTYPES)
# Formats with blocks fixed by their spec (no per_channel, no pot_scale choice).
# Activation scales computed from the data at every call: "per_token", one per row of the last
# dimension (an LLM's token).
DYNAMIC = ("per_token",)
BLOCK_DTYPES = ("mxfp8_e4m3", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "nvfp4")


def _is_flag(value):
    return isinstance(value, bool) or (isinstance(value, numbers.Integral) and value in (0, 1))


class QuantizeScheme(object):
    """How to quantize weights or activations.

    Args:
        symmetry: symmetric (signed range, zero point 0) or asymmetric (unsigned range).
        per_channel: one scale per output channel (``ch_axis=0``) or one per tensor.
        pot_scale: power-of-two scales.
        bit: bit width of ``dtype="int"`` (default 8); leave it out for a float ``dtype``
            (it is the format's element width, 8, 6 or 4).
        dtype (kwarg): the element format: ``"int"`` (default, MQBench's integers),
            ``"fp8_e4m3"``, ``"fp8_e5m2"`` (a float scale per tensor or per channel),
            ``"mxfp8_e4m3"``, ``"mxfp6_e3m2"``, ``"mxfp6_e2m3"``, ``"mxfp4"``, ``"nvfp4"``
            (block scales fixed by their specs).
            Float formats are symmetric. See docs/formats.md.
        group_size (kwarg): integer formats: one scale (and zero point) per ``group_size``
            consecutive elements along the input-channel axis (axis 1 of a weight) within each
            output channel; needs ``per_channel=True``.
        dynamic (kwarg): ``"per_token"``: activations with one scale (and zero point) per
            token (row of the last dimension), computed from the data at every call
            (``PerTokenFakeQuantize``); integer or FP8 dtypes, not per_channel.
        symmetric_range (kwarg): ``[-(2^(b-1) - 1), 2^(b-1) - 1]`` instead of
            ``[-2^(b-1), 2^(b-1) - 1]``.
        **kwargs: merged into the observer's arguments (e.g. ``ema_ratio``).

    Example::

        QuantizeScheme(symmetry=True, per_channel=True, bit=8, symmetric_range=True)
            .to_observer_params()   # quant_min=-127, quant_max=127, ch_axis=0, qint8, ...
        QuantizeScheme(per_channel=True, bit=4, group_size=128)   # INT4, 128 per group
        QuantizeScheme(dtype="fp8_e4m3", per_channel=True)      # FP8 E4M3, per channel
    """

    def __init__(self, symmetry=True, per_channel=False, pot_scale=False, bit=None, **kwargs):
        dtype = kwargs.pop("dtype", INT_DTYPE)
        group_size = kwargs.pop("group_size", None)
        dynamic = kwargs.pop("dynamic", None)
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ValueError(f"QuantizeScheme: dtype must be one of {list(DTYPES)}, got {dtype!r}")
        for field, value in (("symmetry", symmetry), ("per_channel", per_channel),
                             ("pot_scale", pot_scale)):
            if not _is_flag(value):
                raise ValueError(f"QuantizeScheme: {field} must be True or False, got {value!r}")
        symmetric_range = kwargs.pop("symmetric_range", False)
        if not _is_flag(symmetric_range):
            raise ValueError(f"QuantizeScheme: symmetric_range must be True or False, "
                             f"got {symmetric_range!r}")
        if dtype != INT_DTYPE:
            self._check_float(dtype, bit, symmetry, per_channel, pot_scale, symmetric_range,
                              group_size)
            bit = FLOAT_DTYPES[dtype][0]
        elif bit is None:
            bit = 8
        if group_size is not None:
            if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or \
                    group_size < 1:
                raise ValueError(f"QuantizeScheme: group_size must be a positive integer, "
                                 f"got {group_size!r}")
            if not per_channel:
                raise ValueError(f"QuantizeScheme: group_size ({group_size}) gives one scale per "
                                 "group within each output channel; set per_channel=True")
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
        self.dtype = dtype
        self.group_size = None if group_size is None else int(group_size)
        self.dynamic = self._check_dynamic(dynamic, dtype, per_channel, pot_scale, group_size)
        self.kwargs = kwargs

    @staticmethod
    def _check_dynamic(dynamic, dtype, per_channel, pot_scale, group_size):
        if dynamic in (None, False):
            return None
        if dynamic not in DYNAMIC:
            raise ValueError(f"QuantizeScheme: dynamic must be one of {list(DYNAMIC)} or None, "
                             f"got {dynamic!r}")
        if dtype not in (INT_DTYPE, "fp8_e4m3", "fp8_e5m2"):
            raise ValueError(f"QuantizeScheme: dynamic={dynamic!r} takes an integer or FP8 dtype, "
                             f"got {dtype!r}")
        for field, value in (("per_channel", per_channel), ("pot_scale", pot_scale),
                             ("group_size", group_size)):
            if value:
                raise ValueError(f"QuantizeScheme: dynamic={dynamic!r} computes one scale per "
                                 f"token at run time; {field} does not apply")
        return dynamic

    @staticmethod
    def _check_float(dtype, bit, symmetry, per_channel, pot_scale, symmetric_range, group_size):
        bits = FLOAT_DTYPES[dtype][0]
        if bit is not None and (isinstance(bit, bool) or bit != bits):
            raise ValueError(f"QuantizeScheme: bit ({bit!r}) does not apply to dtype {dtype!r}, "
                             f"whose elements are {bits} bits wide; leave bit out")
        if not symmetry:
            raise ValueError(f"QuantizeScheme: dtype {dtype!r} is symmetric (a scale, no zero "
                             f"point); symmetry=False is not a {dtype} scheme")
        if group_size is not None:
            raise ValueError(f"QuantizeScheme: group_size ({group_size!r}) is for integer "
                             f"formats; dtype {dtype!r} has " +
                             ("its block size fixed by its spec" if dtype in BLOCK_DTYPES
                              else "a scale per tensor or per channel"))
        if symmetric_range:
            raise ValueError(f"QuantizeScheme: symmetric_range is for integer formats; dtype "
                             f"{dtype!r} is symmetric by construction")
        if dtype in BLOCK_DTYPES and per_channel:
            raise ValueError(f"QuantizeScheme: per_channel does not apply to dtype {dtype!r} "
                             "(one scale per block of the input-channel axis, fixed by its spec)")
        if dtype in BLOCK_DTYPES and pot_scale:
            raise ValueError(f"QuantizeScheme: pot_scale does not apply to dtype {dtype!r} "
                             "(its block scales are set by its spec)")

    @property
    def is_float(self):
        """Whether ``dtype`` is a float format (FP8, MX, NVFP4)."""
        return self.dtype != INT_DTYPE

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
        if self.is_float:
            # +-(largest finite element, rounded down to an integer: MXFP6 E2M3's 7.5 is 7): a
            # symmetric observer's amax / ((qmax - qmin) / 2) is then the per-tensor formats'
            # scale (the block formats compute theirs from the data and read no observer
            # range). "dtype" is the element's torch dtype (or the format's name where torch has
            # none: MXFP6); "format" says which op family runs.
            bits, max_finite, torch_name = FLOAT_DTYPES[self.dtype]
            dtype = self.dtype if torch_name is None else getattr(torch, torch_name, self.dtype)
            naive_para.update(quant_min=-max_finite, quant_max=max_finite, dtype=dtype,
                              format=self.dtype)
        if self.group_size is not None:  # groups run along the weight's input-channel axis
            naive_para.update(ch_axis=1, group_size=self.group_size)
        if self.dynamic is not None:  # read by PerTokenFakeQuantize, not by observers
            naive_para.update(dynamic=self.dynamic, format=self.dtype)
        naive_para.update(self.kwargs)
        return naive_para

    def to_dict(self):
        """The fields as the C++ registry holds them (include/mqbench/scheme.h)."""
        return {"symmetry": self.symmetry, "per_channel": self.per_channel,
                "pot_scale": self.pot_scale, "bit": self.bit,
                "symmetric_range": self.symmetric_range, "kwargs": dict(self.kwargs),
                "dtype": self.dtype, "group_size": self.group_size or 0,
                **({"dynamic": self.dynamic} if self.dynamic else {})}

    @classmethod
    def from_dict(cls, d):
        extra = {}
        dtype = d.get("dtype", INT_DTYPE)
        if dtype != INT_DTYPE:
            extra["dtype"] = dtype
        if d.get("group_size"):
            extra["group_size"] = d["group_size"]
        if d.get("dynamic"):
            extra["dynamic"] = d["dynamic"]
        return cls(symmetry=d["symmetry"], per_channel=d["per_channel"],
                   pot_scale=d["pot_scale"], bit=None if dtype != INT_DTYPE else d["bit"],
                   symmetric_range=d.get("symmetric_range", False), **extra,
                   **d.get("kwargs", {}))

    def __str__(self):
        text = "Symmetric: {} / Bitwidth: {} / Per channel: {} / Pot scale: {} / Extra kwargs: {}".format(
            self.symmetry, self.bit, self.per_channel, self.pot_scale, self.kwargs)
        if self.is_float:
            text += f" / Dtype: {self.dtype}"
        if self.group_size is not None:
            text += f" / Group size: {self.group_size}"
        if self.dynamic is not None:
            text += f" / Dynamic: {self.dynamic}"
        return text

    def __repr__(self):
        return f"QuantizeScheme({self})"

    def __eq__(self, other):
        return isinstance(other, QuantizeScheme) and self.to_dict() == other.to_dict()

    __hash__ = object.__hash__
