"""Block-scaled float fake quantizers (QuantizeScheme(dtype="mxfp8_e4m3" / "mxfp6_e3m2" /
"mxfp6_e2m3" / "mxfp4" / "nvfp4"), docs/formats-mx.md): ``MXFakeQuantize`` (OCP MX: a
power-of-two scale per 32 elements, from the data) and ``NVFP4FakeQuantize`` (an E4M3 scale per
16 elements, from the data, times a per-tensor scale from the observed amax), thin modules
around ``torch.ops.mqbench.fake_quantize_mx`` / ``fake_quantize_nvfp4``."""
import torch

from mqbench.fake_quantize.quantize_base import QuantizeBase

__all__ = ["MXFakeQuantize", "NVFP4FakeQuantize", "block_axis"]

_ops = torch.ops.mqbench
# element bits and observer range bound of each format (mqbench.scheme.FLOAT_DTYPES)
_FORMATS = {"mxfp8_e4m3": (8, 448), "mxfp6_e3m2": (6, 28), "mxfp6_e2m3": (6, 7), "mxfp4": (4, 6),
            "nvfp4": (4, 6)}
MX_FORMATS = ("mxfp8_e4m3", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4")
_BY_DTYPE = {torch.float8_e4m3fn: "mxfp8_e4m3", torch.float4_e2m1fn_x2: "mxfp4"}


def block_axis(axis, x):
    """The axis the blocks run along: ``axis`` itself, or for ``axis=None`` the input-channel
    axis as layers lay tensors out: 1 for 4-d and 5-d tensors (a conv weight [O, I, kh, kw], a
    conv activation [N, C, H, W]), the last one otherwise (a linear weight [out, in], an
    activation [..., C]). Conv1d tensors are 3-d: pass ``axis=1`` for them."""
    if axis is not None:
        return axis
    return 1 if x.dim() >= 4 else -1


def _format_of(observer_kwargs, allowed, default):
    """The format named by a scheme's observer arguments (``format``, else ``dtype``); pops
    ``format`` and gives the observer a dtype it knows (its statistics are all it is used for)."""
    dtype = observer_kwargs.get("dtype")
    fmt = observer_kwargs.pop("format", None) or (dtype if isinstance(dtype, str) else None) or \
        _BY_DTYPE.get(dtype) or default
    if fmt not in allowed:
        raise ValueError(f"this fake quantizer runs {' / '.join(allowed)} (from "
                         f"QuantizeScheme(dtype=...)), got format {fmt!r}")
    elem_max = _FORMATS[fmt][1]
    # torch has no FP6 dtype (the scheme names the format instead) and no observer of FP4
    if observer_kwargs.get("dtype") in (None, torch.float4_e2m1fn_x2) or \
            isinstance(observer_kwargs.get("dtype"), str):
        observer_kwargs["dtype"] = torch.float8_e4m3fn
    observer_kwargs.setdefault("quant_min", -elem_max)
    observer_kwargs.setdefault("quant_max", elem_max)
    observer_kwargs.setdefault("qscheme", torch.per_tensor_symmetric)
    return fmt


class MXFakeQuantize(QuantizeBase):
    """OCP MX fake quantization (MXFP8 E4M3, MXFP6 E3M2 or E2M3, or MXFP4 E2M1 elements, one E8M0
    power-of-two scale per ``block_size`` elements along ``axis``, computed from each block of
    every input, as the hardware does): no scale state. The observer still runs when enabled
    (MQBench's calibration switches work unchanged; its range is informative only).
    Straight-through gradient.

    Example::

        fq = MXFakeQuantize(MinMaxObserver, **QuantizeScheme(dtype="mxfp4").to_observer_params())
        y = fq(linear.weight)      # blocks of 32 along the input channels
    """

    def __init__(self, observer=None, block_size=32, axis=None, **observer_kwargs):
        self.format = _format_of(observer_kwargs, MX_FORMATS, "mxfp8_e4m3")
        super().__init__(observer, **observer_kwargs)
        self.block_size = int(block_size)
        self.axis = axis
        self.bitwidth = _FORMATS[self.format][0]

    def forward(self, X):
        if self._observer_on():
            self.activation_post_process(X.detach())
        if self._fake_quant_on():
            X = _ops.fake_quantize_mx(X, self.format, self.block_size, block_axis(self.axis, X))
        return X

    @torch.jit.export
    def extra_repr(self):
        return super().extra_repr() + f"format={self.format}, block_size={self.block_size}, " \
            f"axis={self.axis}"


class NVFP4FakeQuantize(QuantizeBase):
    """NVIDIA NVFP4 fake quantization: E2M1 elements, one E4M3 scale per ``block_size`` (16)
    elements along ``axis`` from the data, times the FP32 per-tensor scale ``amax / (448 * 6)``.
    ``amax`` (a buffer, in the state dict) is the observer's per-tensor max |x|, refreshed on
    every observed forward: a MinMaxObserver keeps the running maximum, an EMAMinMaxObserver
    the moving average (as modelopt's and torchao's calibration). Straight-through gradient.

    Example::

        fq = NVFP4FakeQuantize(EMAMinMaxObserver,
                               **QuantizeScheme(dtype="nvfp4").to_observer_params())
        fq(calib_batch)            # amax observed
        fq.disable_observer(); y = fq(x)
    """

    def __init__(self, observer=None, block_size=16, axis=None, **observer_kwargs):
        self.format = _format_of(observer_kwargs, ("nvfp4",), "nvfp4")
        super().__init__(observer, **observer_kwargs)
        if self.is_per_channel:
            raise ValueError("NVFP4FakeQuantize: the NVFP4 global scale is per tensor; use a "
                             "per-tensor observer (QuantizeScheme(dtype='nvfp4'))")
        self.block_size = int(block_size)
        self.axis = axis
        self.bitwidth = 4
        self.register_buffer("amax", torch.tensor(float("-inf")))

    def forward(self, X):
        if self._observer_on():
            app = self.activation_post_process
            app(X.detach())
            self.amax = torch.maximum(-app.min_val, app.max_val).reshape(()).to(self.amax)
        if self._fake_quant_on():
            X = _ops.fake_quantize_nvfp4(X, self.amax, self.block_size, block_axis(self.axis, X))
        return X

    @torch.jit.export
    def extra_repr(self):
        return super().extra_repr() + f"format={self.format}, block_size={self.block_size}, " \
            f"axis={self.axis}, amax={self.amax}"
