"""Observers (MQBench's ``mqbench.observer``).

Each observer is a thin ``nn.Module``: buffers with MQBench's names (``min_val``, ``max_val``,
``eps``) and a forward that calls one ``torch.ops.mqbench.observer_*`` op, so the statistics,
searches and qparam formulas run in C++ (docs/observers.md). ``ch_axis=-1`` observes the whole
tensor; any other axis observes per channel. Only finite elements are counted.

Example::

    from mqbench.observer import EMAMinMaxObserver
    obs = EMAMinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric,
                            quant_min=-127, quant_max=127)
    for batch in loader:
        obs(batch)
    scale, zero_point = obs.calculate_qparams()
"""
import math
import numbers

import torch

from mqbench import _C
from mqbench._base import UniformObserverBase
from mqbench.utils import is_symmetric_quant, pot_quantization, sync_tensor
from mqbench.utils.hook import PerChannelLoadHook
from mqbench.utils.logger import logger

__all__ = ["ObserverBase", "MinMaxObserver", "MovingAverageMinMaxObserver", "MinMaxFloorObserver",
           "EMAMinMaxObserver", "PoTModeObserver", "EMAQuantileObserver", "ClipStdObserver", "LSQObserver",
           "LSQPlusObserver", "MSEObserver", "EMAMSEObserver", "GroupMinMaxObserver",
           "GroupEMAMinMaxObserver", "GroupMSEObserver", "GroupEMAMSEObserver", "group_observer_for"]

_ops = torch.ops.mqbench


class ObserverBase(UniformObserverBase):
    """Per-tensor (``ch_axis=-1``) or per-channel observer with MQBench's state and qparams.

    Args:
        dtype: ``torch.qint8`` (signed) or ``torch.quint8`` (unsigned); decides the default
            range and the symmetric zero point.
        qscheme: one of torch's per-tensor / per-channel, affine / symmetric qschemes.
        reduce_range: torch's halved default range (only without quant_min/quant_max).
        quant_min, quant_max: the integer range; any width (16-bit included).
        ch_axis: the channel axis, or -1 for per-tensor.
        pot_scale: round the scale to a power of two.
        factory_kwargs: accepted and ignored, as in MQBench.
    """

    min_val: torch.Tensor
    max_val: torch.Tensor

    def __init__(self, dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, ch_axis=-1, pot_scale=False, factory_kwargs=None):
        # Any width is accepted (MQBench built torch's base with an 8-bit range and put the
        # real one back); reduce_range only halves the default range.
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max)
        self.ch_axis = ch_axis
        self.pot_scale = pot_scale
        self.register_buffer("min_val", torch.tensor(float("inf")))
        self.register_buffer("max_val", torch.tensor(float("-inf")))
        self.load_state_dict_hook = PerChannelLoadHook(self, hook_param=["min_val", "max_val"])

    # -- helpers ---------------------------------------------------------------------------
    def _symmetric_zero_point(self):
        if self.dtype == torch.quint8:
            return (self.quant_min + self.quant_max) // 2 if self.has_customized_qrange else 128
        return 0

    def _prepare(self, x_orig):
        """The batch as the observer's dtype, detached; None for an empty batch."""
        if x_orig.numel() == 0:
            return None
        return x_orig.detach().to(self.min_val.dtype)

    def _batch_range(self, x):
        """(min, max) of one batch; subclasses clip or search it."""
        return _ops.observer_min_max(x, self.ch_axis)

    def _update(self, cur_min, cur_max):
        """Combines a batch's range with the state: running min/max (MinMaxObserver's rule)."""
        self.min_val, self.max_val = _ops.observer_running_min_max(
            self.min_val, self.max_val, cur_min, cur_max)

    def _ema_update(self, cur_min, cur_max):
        """The EMA observers' rule: first batch as is, then ``v = v * r + batch * (1 - r)``."""
        self.min_val, self.max_val = _ops.observer_ema_min_max(
            self.min_val, self.max_val, cur_min, cur_max, self.ema_ratio)

    def forward(self, x_orig):
        """Observes ``x_orig`` (finite elements only) and returns it as the observer's dtype."""
        x = self._prepare(x_orig)
        if x is None:
            return x_orig
        self._update(*self._batch_range(x))
        return x

    def _calculate_qparams(self, min_val, max_val):
        """torch's qparam formula (Note [Observer qparams]); int32 zero point; [1] for scalars."""
        return _ops.observer_calculate_qparams(
            min_val, max_val, self.quant_min, self.quant_max, is_symmetric_quant(self.qscheme),
            self._symmetric_zero_point(), self.eps)

    @staticmethod
    def _synced(scale, zero_point):
        """Averages the qparams across DDP ranks (a no-op outside DDP)."""
        scale.data = sync_tensor(scale).data
        zero_point.data = sync_tensor(zero_point).data
        return scale, zero_point

    def _finish(self, scale, zero_point):
        if self.pot_scale:
            scale = pot_quantization(scale)
        return self._synced(scale, zero_point)

    @torch.jit.export
    def calculate_qparams(self):
        """Scale and zero point of the observed range (scale 1, zero point 0 before any data)."""
        scale, zero_point = self._calculate_qparams(self.min_val, self.max_val)
        return self._finish(scale, zero_point)

    @torch.jit.export
    def _calculate_qmin_qmax(self):
        if self.has_customized_qrange:
            return self.quant_min, self.quant_max
        if self.dtype == torch.qint8:
            return (-64, 63) if self.reduce_range else (-128, 127)
        if self.dtype == torch.quint8:
            return (0, 127) if self.reduce_range else (0, 255)
        return 0, 15

    @torch.jit.export
    def extra_repr(self):
        return "min_val={}, max_val={} ch_axis={} pot={}".format(
            self.min_val if self.ch_axis == -1 else "List",
            self.max_val if self.ch_axis == -1 else "List", self.ch_axis, self.pot_scale)


class MinMaxObserver(ObserverBase):
    """Running min/max over every batch observed."""


class MovingAverageMinMaxObserver(ObserverBase):
    """torch's ``MovingAverageMinMaxObserver``, ours: the first batch's range, then
    ``v = v + c * (batch - v)`` with ``c = averaging_constant`` (torch's arithmetic). It is the
    default observer of a fake quantizer built without one, as in MQBench."""

    def __init__(self, averaging_constant=0.01, dtype=torch.quint8,
                 qscheme=torch.per_tensor_affine, reduce_range=False, quant_min=None,
                 quant_max=None, ch_axis=-1, pot_scale=False, factory_kwargs=None):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, ch_axis, pot_scale,
                         factory_kwargs)
        self.averaging_constant = averaging_constant

    def _update(self, cur_min, cur_max):
        if self.min_val.shape != cur_min.shape:
            self.min_val, self.max_val = cur_min.clone(), cur_max.clone()
            return
        c = self.averaging_constant
        # The first batch is taken as is: a select on the state's device, not a host read of
        # `isinf(min_val).all()` (a synchronisation per batch on CUDA).
        first = torch.isinf(self.min_val).all()
        self.min_val = torch.where(first, cur_min, self.min_val + c * (cur_min - self.min_val))
        self.max_val = torch.where(first, cur_max, self.max_val + c * (cur_max - self.max_val))


class EMAMinMaxObserver(ObserverBase):
    """Exponential moving average of the batch min/max: ``v = v * r + batch * (1 - r)``."""

    def __init__(self, dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, ch_axis=-1, pot_scale=False, ema_ratio=0.9,
                 factory_kwargs=None):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, ch_axis, pot_scale,
                         factory_kwargs)
        self.ema_ratio = ema_ratio

    _update = ObserverBase._ema_update


class MinMaxFloorObserver(ObserverBase):
    """Power-of-two scale for Vitis: min/max of the current batch, then a search over
    ``range_n`` power-of-two steps for the least squared TQT error on that batch.

    Call :meth:`set_quant_type` ('input', 'tensor' or 'param') before ``calculate_qparams``.
    """

    def __init__(self, dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, ch_axis=-1, pot_scale=False, factory_kwargs=None):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, ch_axis, pot_scale,
                         factory_kwargs)
        self.quant_type = None
        self._x = None

    def forward(self, x_orig):
        x = self._prepare(x_orig)
        if x is None:
            return x_orig
        if self.ch_axis != -1:
            logger.warning("The per-tensor observer does not support per-channel min-max!")
        self.min_val, self.max_val = _ops.observer_min_max(x, -1)
        self._x = x
        return x

    def _search_exponent(self):
        if self.quant_type is None:
            raise ValueError("You should set the observer type before forward!")
        range_n = 1 if self.quant_type == "input" else 5
        mth = 3 if self.quant_type == "param" else 2
        return _ops.observer_pot_exponent(self._x, self.min_val, self.max_val, self.quant_min,
                                          self.quant_max, range_n, mth)

    def _pot_qparams(self, exponent):
        scale = torch.tensor([2.0 ** -exponent], dtype=self.min_val.dtype,
                             device=self.min_val.device)
        zero_point = torch.zeros(1, dtype=torch.int32, device=self.min_val.device)
        if not is_symmetric_quant(self.qscheme) and 0.0 <= float(self.min_val) < math.inf:
            zero_point = self.quant_min - torch.round(self.min_val.reshape(1) / scale)
        return self._synced(scale, zero_point)

    def calculate_qparams(self):
        if self._x is None:  # nothing observed yet
            if self.quant_type is None:
                raise ValueError("You should set the observer type before forward!")
            return super().calculate_qparams()
        return self._pot_qparams(self._search_exponent())

    def set_quant_type(self, qtype):
        self.quant_type = qtype


class PoTModeObserver(MinMaxFloorObserver):
    """MinMaxFloorObserver that keeps a histogram of the exponents found batch after batch and
    uses the most frequent one (exponents -7 .. 12)."""

    def __init__(self, dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, ch_axis=-1, pot_scale=False, factory_kwargs=None):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, ch_axis, pot_scale,
                         factory_kwargs)
        self.counter = [0] * 20

    def calculate_qparams(self):
        if self._x is None:
            return super().calculate_qparams()
        exponent = self._search_exponent()
        # MQBench indexes counter[e + 7] and would wrap around for e < -7 (a scale above 128).
        self.counter[min(max(exponent, -7), 12) + 7] += 1
        exponent = self.counter.index(max(self.counter)) - 7
        return self._pot_qparams(exponent)


class EMAQuantileObserver(EMAMinMaxObserver):
    """EMA of a clipped range: the clip value is the ``threshold`` quantile of ``|x|`` read from a
    ``bins``-bin histogram (built in C++). Per tensor only."""

    def __init__(self, dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, ch_axis=-1, pot_scale=False, ema_ratio=0.9,
                 threshold=0.99999, bins=2048, factory_kwargs=None):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, ch_axis, pot_scale,
                         ema_ratio, factory_kwargs)
        assert self.ch_axis == -1, "Quantile observer only support in per-tensor scheme."
        max_bins = _C.MAX_QUANTILE_BINS
        if isinstance(bins, bool) or not isinstance(bins, numbers.Integral) or \
                not 1 <= bins <= max_bins:
            raise ValueError(f"EMAQuantileObserver: bins must be an integer in [1, {max_bins}], "
                             f"got {bins!r}")
        if not isinstance(threshold, numbers.Real) or not 0.0 < threshold <= 1.0:
            raise ValueError(f"EMAQuantileObserver: threshold must be in (0, 1], got {threshold!r}")
        self.threshold = threshold
        self.bins = bins

    def _batch_range(self, x):
        return _ops.observer_quantile_range(x, self.threshold, self.bins)


class ClipStdObserver(ObserverBase):
    """Range of the current batch widened to ``mean -+ std_scale * std``."""

    def __init__(self, dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, ch_axis=-1, pot_scale=False, std_scale=2.6,
                 factory_kwargs=None):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, ch_axis, pot_scale,
                         factory_kwargs)
        self.std_scale = std_scale

    def _batch_range(self, x):
        return _ops.observer_clip_std_range(x, self.ch_axis, self.std_scale)

    def _update(self, cur_min, cur_max):  # the current batch only
        self.min_val, self.max_val = cur_min, cur_max


class LSQObserver(ObserverBase):
    """LSQ initialisation (Esser et al. 2020): ``s = 2 * mean|x| / sqrt(quant_max)`` from the
    current batch (per channel: each channel's mean, min and max). With an asymmetric scheme
    the zero point is ``quant_min - round(min_val / s)``, clamped to the range."""

    def __init__(self, dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, ch_axis=-1, pot_scale=False, factory_kwargs=None):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, ch_axis, pot_scale,
                         factory_kwargs)
        self.tensor_norm = None

    def forward(self, x_orig):
        x = self._prepare(x_orig)
        if x is None:
            return x_orig
        _, _, mean_abs, mn, mx = _ops.observer_moments(x, self.ch_axis)
        self.tensor_norm = mean_abs
        self.min_val, self.max_val = mn, mx
        return x

    def calculate_qparams(self):
        if self.tensor_norm is None:
            return super().calculate_qparams()
        scale, zero_point = _ops.observer_lsq_qparams(
            self.tensor_norm, self.min_val, self.quant_min, self.quant_max,
            is_symmetric_quant(self.qscheme), bool(self.pot_scale), self.eps)
        return self._synced(scale, zero_point)


class LSQPlusObserver(LSQObserver):
    """LSQ+ initialisation (Bhalgat et al. 2020):
    ``s = max(|mean - 3 std|, |mean + 3 std|) / (quant_max - quant_min + 1)``; min/max stay
    global per channel, as in MQBench, and give the zero point only when min >= 0."""

    def __init__(self, dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, ch_axis=-1, pot_scale=False, factory_kwargs=None):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, ch_axis, pot_scale,
                         factory_kwargs)
        self.mean = None
        self.std = None

    def forward(self, x_orig):
        x = self._prepare(x_orig)
        if x is None:
            return x_orig
        self.mean, self.std, _, mn, mx = _ops.observer_moments(x, self.ch_axis)
        self.min_val, self.max_val = (mn, mx) if self.ch_axis == -1 else \
            _ops.observer_min_max(x, -1)
        return x

    def calculate_qparams(self):
        if self.mean is None:
            return ObserverBase.calculate_qparams(self)
        scale, zero_point = _ops.observer_lsq_plus_qparams(
            self.mean, self.std, self.min_val, self.quant_min, self.quant_max,
            is_symmetric_quant(self.qscheme), bool(self.pot_scale), self.eps)
        return self._synced(scale, zero_point)


class MSEObserver(ObserverBase):
    """Range minimising the Lp error of fake quantization: the batch range shrunk by 1% steps
    (95 candidates per tensor, 80 per channel, each channel independently), all scored in one
    pass over the data; the running min/max of the chosen ranges."""

    def __init__(self, dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, ch_axis=-1, pot_scale=False, p=2.0,
                 factory_kwargs=None):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, ch_axis, pot_scale,
                         factory_kwargs)
        self.p = p

    def lp_loss(self, pred, tgt):
        """Loss of one candidate measured in the Lp norm: ``mean(|pred - tgt|^p)``."""
        return (pred - tgt).abs().pow(self.p).mean()

    def _batch_range(self, x):
        iters = 95 if self.ch_axis == -1 else 80
        return _ops.observer_mse_range(x, self.ch_axis, self.quant_min, self.quant_max,
                                       is_symmetric_quant(self.qscheme),
                                       self._symmetric_zero_point(), self.eps, float(self.p),
                                       iters)


class EMAMSEObserver(MSEObserver):
    """MSEObserver whose chosen ranges are averaged across batches by EMA."""

    def __init__(self, dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, ch_axis=-1, pot_scale=False, p=2.0,
                 ema_ratio=0.9, factory_kwargs=None):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, ch_axis, pot_scale,
                         p, factory_kwargs)
        self.ema_ratio = ema_ratio

    _update = ObserverBase._ema_update


# ---- group-wise observers (QuantizeScheme(group_size=...), docs/formats.md) -------------------

class _GroupObserverMixin:
    """Observes one range per ``group_size`` consecutive elements along ``ch_axis`` (a weight's
    input channels: axis 1). The batch is viewed as rows of one group each (the grouped axis
    moved last; Note [Group-wise ops are per-channel ops on a view] in
    src/ops/fake_quantize_group.cpp) and the per-channel statistics op of the base observer runs
    along axis 0 of that view, so the maths is the per-channel observer's, in C++. The qparams
    come back shaped as the op wants them: x's shape with size(ch_axis) / group_size there.

    Example::

        obs = GroupMinMaxObserver(dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                                  quant_min=-8, quant_max=7, ch_axis=1, group_size=128)
        obs(linear.weight)                    # [out, in]
        scale, zero_point = obs.calculate_qparams()   # [out, in / 128]
    """

    def __init__(self, *args, group_size=None, **kwargs):
        axis = kwargs.pop("ch_axis", 1)
        if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or \
                group_size < 1:
            raise ValueError(f"{type(self).__name__}: group_size must be a positive integer, "
                             f"got {group_size!r}")
        if axis == -1:
            raise ValueError(f"{type(self).__name__}: ch_axis is the grouped axis (1 for a "
                             "weight's input channels), got -1 (per tensor)")
        super().__init__(*args, ch_axis=0, **kwargs)
        self.group_axis = axis
        self.group_size = int(group_size)
        self._moved_shape = None

    def _prepare(self, x_orig):
        x = super()._prepare(x_orig)
        if x is None:
            return None
        axis = self.group_axis % x.dim()
        n = x.shape[axis]
        if n % self.group_size:
            raise ValueError(f"{type(self).__name__}: group_size ({self.group_size}) must divide "
                             f"the size of axis {axis} ({n}) of the observed tensor "
                             f"{tuple(x.shape)}")
        moved = x.movedim(axis, -1)
        self._moved_shape = tuple(moved.shape[:-1]) + (n // self.group_size,)
        return moved.reshape(-1, self.group_size)

    def forward(self, x_orig):
        super().forward(x_orig)
        return x_orig

    def _grouped(self, t):
        if self._moved_shape is None or t.numel() != math.prod(self._moved_shape):
            return t
        return t.reshape(self._moved_shape).movedim(-1, self.group_axis % len(self._moved_shape))

    @torch.jit.export
    def calculate_qparams(self):
        scale, zero_point = super().calculate_qparams()
        return self._grouped(scale), self._grouped(zero_point)

    @torch.jit.export
    def extra_repr(self):
        return super().extra_repr() + f" group_axis={self.group_axis} group_size={self.group_size}"


class GroupMinMaxObserver(_GroupObserverMixin, MinMaxObserver):
    """Running min/max per group (MinMaxObserver on groups)."""


class GroupEMAMinMaxObserver(_GroupObserverMixin, EMAMinMaxObserver):
    """EMA of the min/max per group (EMAMinMaxObserver on groups)."""


class GroupMSEObserver(_GroupObserverMixin, MSEObserver):
    """MSE range search per group (MSEObserver's C++ search, one group per channel)."""


class GroupEMAMSEObserver(_GroupObserverMixin, EMAMSEObserver):
    """MSE range search per group, averaged across batches by EMA."""


_GROUP_OBSERVERS = {MinMaxObserver: GroupMinMaxObserver, EMAMinMaxObserver: GroupEMAMinMaxObserver,
                    MSEObserver: GroupMSEObserver, EMAMSEObserver: GroupEMAMSEObserver}


def group_observer_for(observer):
    """The group-wise twin of an observer class (MinMaxObserver -> GroupMinMaxObserver, ...);
    a group observer is returned as is."""
    if isinstance(observer, type) and issubclass(observer, _GroupObserverMixin):
        return observer
    base = getattr(observer, "p", None)  # a with_args partial
    cls = base.func if base is not None and hasattr(base, "func") else observer
    if cls in _GROUP_OBSERVERS:
        twin = _GROUP_OBSERVERS[cls]
        return twin.with_args(**base.keywords) if base is not None else twin
    raise ValueError(f"group_size needs a group-wise observer; {getattr(cls, '__name__', cls)} "
                     f"has none. Use one of {[c.__name__ for c in _GROUP_OBSERVERS]}")
