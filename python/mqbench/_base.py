"""The small bases our quantizers, observers and qconfigs stand on, owned by this package.

MQBench derives its observers and fake quantizers from ``torch.ao.quantization``'s private
classes (``_ObserverBase``, ``FakeQuantizeBase``) and its qconfig from torch's ``QConfig``.
``torch.ao.quantization`` is deprecated and will be removed, so these are ours, with the same
public attributes, buffers and state-dict keys (checkpoints saved by MQBench or by builds that
used torch's bases load into them; docs/design/capture-and-quantizer.md):

* :func:`with_args` / :class:`PartialWrapper`: the ``Cls.with_args(**kw)`` factories a qconfig
  holds (``factory.p`` is the ``functools.partial``, ``factory.with_args`` chains), as torch's.
* :class:`QConfig`: the ``(activation, weight)`` namedtuple.
* :class:`FakeQuantizeBase`: the ``fake_quant_enabled`` / ``observer_enabled`` uint8 buffers
  and their switches.
* :class:`UniformObserverBase`: ``dtype``, ``qscheme``, ``reduce_range``, ``quant_min``,
  ``quant_max``, ``has_customized_qrange`` and the ``eps`` buffer.

Objects built from torch's classes are still accepted where a user passes them (a torch
``FakeQuantize`` in a qconfig, torch's ``QConfig``): code asks :func:`is_fake_quantizer`, which
knows torch's class by name, without importing it. When torch has loaded its
``torch.ao.quantization`` modules anyway (torch.fx does), our two bases are registered as
virtual subclasses of torch's abstract ones, so torch's helpers (``model.apply(
torch.ao.quantization.disable_observer)``) still reach our quantizers.
"""
import functools
import sys
from collections import namedtuple

import torch
import torch.nn as nn

__all__ = ["PartialWrapper", "with_args", "QConfig", "FakeQuantizeBase", "UniformObserverBase",
           "is_fake_quantizer", "default_qrange"]


class PartialWrapper:
    """A module factory: ``factory()`` builds a new instance with the bound keywords.

    ``p`` is the ``functools.partial`` (``p.keywords`` are the bound arguments),
    ``with_args(**kw)`` returns a factory with more keywords bound, ``with_callable_args(**kw)``
    one whose keywords are produced by calling the given functions at each build.
    """

    def __init__(self, p):
        self.p = p
        self.callable_args = {}

    def __call__(self, *args, **keywords):
        for name, make in self.callable_args.items():
            keywords.setdefault(name, make())
        return self.p(*args, **keywords)

    def __repr__(self):
        return repr(self.p) + repr(self.callable_args)

    def with_args(self, **kwargs):
        return with_args(self, **kwargs)

    def with_callable_args(self, **kwargs):
        result = PartialWrapper(self.p)
        result.callable_args = {**self.callable_args, **kwargs}
        return result


def with_args(cls_or_factory, **kwargs):
    """A :class:`PartialWrapper` building ``cls_or_factory(**kwargs, **more)``."""
    return PartialWrapper(functools.partial(cls_or_factory, **kwargs))


class QConfig(namedtuple("QConfig", ["activation", "weight"])):
    """Activation and weight fake-quantizer factories (torch's ``QConfig`` fields).

    Each member is a factory (``FakeQuantize.with_args(...)``), not an instance: every module
    gets its own quantizer."""

    __slots__ = ()

    def __new__(cls, activation, weight):
        if isinstance(activation, nn.Module) or isinstance(weight, nn.Module):
            raise ValueError("QConfig received an nn.Module instance; pass factories "
                             "(e.g. FixedFakeQuantize.with_args(...)), not instances")
        return super().__new__(cls, activation, weight)


def default_qrange(dtype, reduce_range):
    """torch's default integer range of an 8-bit (or quint4x2) dtype."""
    if dtype in (torch.qint8, torch.int8):
        return (-64, 63) if reduce_range else (-128, 127)
    if dtype in (torch.quint8, torch.uint8):
        return (0, 127) if reduce_range else (0, 255)
    if dtype == torch.qint32:
        return -2 ** 31, 2 ** 31 - 1
    if dtype == torch.quint4x2:
        return 0, 15
    raise ValueError(f"no default quantization range for dtype {dtype}; pass quant_min and "
                     "quant_max")


_QSCHEMES = (torch.per_tensor_affine, torch.per_tensor_symmetric, torch.per_channel_affine,
             torch.per_channel_symmetric, torch.per_channel_affine_float_qparams)
_DTYPES = (torch.qint8, torch.quint8, torch.quint4x2, torch.qint32, torch.int8, torch.uint8,
           torch.int16, torch.int32,
           # FP8 schemes (QuantizeScheme(dtype="fp8_*")): symmetric, range +-(largest finite
           # element), so the symmetric qparams are scale = amax / max and zero point 0.
           torch.float8_e4m3fn, torch.float8_e5m2)


class UniformObserverBase(nn.Module):
    """Base of the uniform-quantization observers (torch's ``_ObserverBase`` attributes).

    Args:
        dtype: the quantized dtype (``torch.quint8``, ``torch.qint8``, ...).
        qscheme: a per-tensor or per-channel, affine or symmetric qscheme.
        reduce_range: torch's halved default range (used only without quant_min/quant_max).
        quant_min, quant_max: the integer range, any width; must contain 0.
        eps: the smallest scale, kept as the ``eps`` buffer (state-dict key ``eps``).
    """

    # torch's observer state-dict version (3: per-channel buffers are min_val / max_val, eps is
    # a buffer); kept so checkpoints carry the same metadata as torch's observers write.
    _version = 3

    eps: torch.Tensor

    def __init__(self, dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, eps=torch.finfo(torch.float32).eps):
        super().__init__()
        if qscheme not in _QSCHEMES:
            raise ValueError(f"unsupported qscheme {qscheme}; use one of {list(_QSCHEMES)}")
        if dtype not in _DTYPES:
            raise ValueError(f"unsupported observer dtype {dtype}; use one of {list(_DTYPES)}")
        self.dtype = dtype
        self.qscheme = qscheme
        self.reduce_range = reduce_range
        self.is_dynamic = False
        self.register_buffer("eps", torch.tensor([eps]))
        self.has_customized_qrange = quant_min is not None and quant_max is not None
        if self.has_customized_qrange:
            if not quant_min <= 0 <= quant_max:
                raise ValueError(f"the quantization range [{quant_min}, {quant_max}] must "
                                 "include 0")
            if quant_min >= quant_max:
                raise ValueError(f"quant_min ({quant_min}) must be less than quant_max "
                                 f"({quant_max})")
            self.quant_min, self.quant_max = int(quant_min), int(quant_max)
        else:
            self.quant_min, self.quant_max = default_qrange(dtype, reduce_range)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        if local_metadata.get("version", None) in (None, 1):
            # before version 2, eps was no buffer
            state_dict.setdefault(prefix + "eps", torch.tensor([torch.finfo(torch.float32).eps]))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    with_args = classmethod(with_args)

    @classmethod
    def with_callable_args(cls, **kwargs):
        return PartialWrapper(functools.partial(cls)).with_callable_args(**kwargs)


class FakeQuantizeBase(nn.Module):
    """Base of the fake quantizers: the two switches, as uint8 buffers (state-dict keys
    ``fake_quant_enabled`` and ``observer_enabled``; uint8 because NCCL broadcasts no bool)."""

    fake_quant_enabled: torch.Tensor
    observer_enabled: torch.Tensor

    def __init__(self):
        super().__init__()
        self.register_buffer("fake_quant_enabled", torch.tensor([1], dtype=torch.uint8))
        self.register_buffer("observer_enabled", torch.tensor([1], dtype=torch.uint8))

    def calculate_qparams(self, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not compute qparams")

    @torch.jit.export
    def enable_fake_quant(self, enabled: bool = True) -> None:
        self.fake_quant_enabled[0] = 1 if enabled else 0

    @torch.jit.export
    def disable_fake_quant(self):
        self.enable_fake_quant(False)

    @torch.jit.export
    def enable_observer(self, enabled: bool = True) -> None:
        self.observer_enabled[0] = 1 if enabled else 0

    @torch.jit.export
    def disable_observer(self):
        self.enable_observer(False)

    with_args = classmethod(with_args)


# torch's fake-quantizer base, by where it lives (torch.quantization re-exports the same class).
_TORCH_FAKE_QUANT_BASES = ("torch.ao.quantization.fake_quantize.FakeQuantizeBase",)


def is_fake_quantizer(module):
    """True for our fake quantizers and for torch's (``torch.ao.quantization.FakeQuantize`` and
    subclasses, recognised by class path without importing torch.ao.quantization)."""
    if isinstance(module, FakeQuantizeBase):
        return True
    return any(f"{c.__module__}.{c.__qualname__}" in _TORCH_FAKE_QUANT_BASES
               for c in type(module).__mro__)


def _register_with_loaded_torch_bases():
    """Our bases as virtual subclasses of torch's abstract ones, when torch loaded those modules
    itself: torch's isinstance-based helpers then treat our modules as theirs. Nothing is
    imported here; with a torch that no longer has the modules, this does nothing."""
    fake_quantize = sys.modules.get("torch.ao.quantization.fake_quantize")
    observer = sys.modules.get("torch.ao.quantization.observer")
    pairs = ((fake_quantize, "FakeQuantizeBase", FakeQuantizeBase),
             (observer, "ObserverBase", UniformObserverBase))
    for module, name, ours in pairs:
        base = getattr(module, name, None) if module is not None else None
        if base is not None and hasattr(base, "register"):
            base.register(ours)


_register_with_loaded_torch_bases()
