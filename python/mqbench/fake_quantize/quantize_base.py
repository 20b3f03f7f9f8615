"""``QuantizeBase``: the base of every MQBench fake quantizer."""
import weakref

import torch

from mqbench._base import FakeQuantizeBase
from mqbench.onnx.plain_export import _is_exporting, ops as export_ops
from mqbench.utils import is_per_channel, is_symmetric_quant

__all__ = ["QuantizeBase"]

_PER_TENSOR = (torch.per_tensor_affine, torch.per_tensor_symmetric)


def _version_of(tensor):
    """The version counter of ``tensor`` (None for inference tensors, which have none)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def _state_key(*tensors):
    """What tells, without reading values, that tensors are unchanged: a weak reference to each
    (a tensor replaced by ``.to()`` or an assignment is another object; nothing is kept alive)
    and its version counter (bumped by every in-place write)."""
    return tuple((weakref.ref(t), _version_of(t)) for t in tensors)


def _same_state(key, *tensors):
    """True when ``tensors`` are the very tensors of ``key``, unwritten since."""
    return key is not None and len(key) == len(tensors) and all(
        ref() is t and version is not None and version == _version_of(t)
        for (ref, version), t in zip(key, tensors))


# Host-side caches of tensor state (weak references: not picklable, meaningless in a copy).
_HOST_CACHES = ("_switch_seen", "_checked")


class QuantizeBase(FakeQuantizeBase):
    """A fake quantizer: an observer (``activation_post_process``) plus one fake-quantize op.

    ``forward`` observes the input when ``observer_enabled`` and fake-quantizes it when
    ``fake_quant_enabled`` (both uint8 buffers in the state dict, as torch's). The quantization
    range, dtype, qscheme, ``pot_scale`` and ``ch_axis`` are read from the observer, which is
    built as ``observer(**observer_kwargs)``.
    """

    def __init__(self, observer=None, **observer_kwargs):
        super().__init__()
        if observer is None:  # torch's default, ours (observer.py)
            from mqbench.observer import MovingAverageMinMaxObserver as observer
        self.activation_post_process = observer(**observer_kwargs)
        app = self.activation_post_process
        self.dtype = app.dtype
        self.qscheme = app.qscheme
        self.quant_min = app.quant_min
        self.quant_max = app.quant_max
        assert self.quant_min <= self.quant_max, "quant_min must be less than or equal to quant_max"
        # torch's own observers have no pot_scale (MQBench would raise AttributeError there).
        self.pot_scale = getattr(app, "pot_scale", False)
        self.ch_axis = getattr(app, "ch_axis", -1)
        assert is_per_channel(self.qscheme) or self.qscheme in _PER_TENSOR, \
            "Only per channel and per tensor quantization are supported in fake quantize" + \
            " got qscheme: " + str(self.qscheme)
        self.is_per_channel = is_per_channel(self.qscheme)
        bitrange = torch.tensor(self.quant_max - self.quant_min + 1).double()
        self.bitwidth = int(torch.log2(bitrange).item())
        self.is_symmetric_quant = is_symmetric_quant(self.qscheme)
        self.only_enable_observer = False
        self.run_fquant_time = 0
        self._record_switch("observer_enabled", True)  # FakeQuantizeBase's initial values
        self._record_switch("fake_quant_enabled", True)
        self.register_load_state_dict_post_hook(self._refresh_switches)

    # -- the two switches, readable by torch.compile ----------------------------------------
    # fake_quant_enabled / observer_enabled are uint8 buffers (torch's, in the state dict). A
    # branch on a tensor is a graph break under torch.compile, so each switch also has a Python
    # mirror: eager code reads the buffer (the truth, which a user may also write directly) and
    # refreshes the mirror; compiled code branches on the mirror (dynamo guards on it, so a
    # switch flipped with enable_*/disable_* or seen in an eager call recompiles).
    # Note [Switches without host reads]: reading a CUDA buffer's value is a host
    # synchronisation, which a QAT step must not have. So eager code reads a buffer only when it
    # changed since the mirror was last set: the mirror remembers the buffer object (a weak
    # reference) and its version counter (bumped by every in-place write: `fq.observer_enabled[0]
    # = 0`, load_state_dict, a DDP buffer broadcast); `.to()` gives a new object. enable_* write
    # the buffer and then record it as seen, so switching never costs a read either.
    def _switch_value(self, name):
        buf = getattr(self, name)
        seen = self.__dict__.get("_switch_seen", {}).get(name)
        if seen is not None and _same_state(seen[0], buf):
            return seen[1]
        return self._record_switch(name, bool(buf[0] == 1))

    def _record_switch(self, name, value):
        """Remembers ``value`` as the current value of the switch buffer ``name`` (and mirrors it
        for torch.compile); returns it."""
        buf = getattr(self, name)
        self.__dict__.setdefault("_switch_seen", {})[name] = (_state_key(buf), value)
        if name == "observer_enabled":
            self._observer_on_mirror = value
        else:
            self._fake_quant_on_mirror = value
        return value

    def _observer_on(self):
        if torch.onnx.is_in_onnx_export():  # an export never moves the calibration
            return False
        if torch.compiler.is_compiling():
            return self._observer_on_mirror
        return self._switch_value("observer_enabled")

    def _fake_quant_on(self):
        if torch.compiler.is_compiling():
            return self._fake_quant_on_mirror
        return self._switch_value("fake_quant_enabled")

    @torch.jit.export
    def enable_fake_quant(self, enabled: bool = True) -> None:
        self.fake_quant_enabled[0] = 1 if enabled else 0
        self._record_switch("fake_quant_enabled", bool(enabled))

    @torch.jit.export
    def enable_observer(self, enabled: bool = True) -> None:
        self.observer_enabled[0] = 1 if enabled else 0
        self._record_switch("observer_enabled", bool(enabled))

    def _refresh_switches(self, module, incompatible_keys):
        """load_state_dict hook: the switches come from the checkpoint."""
        self._record_switch("observer_enabled", bool(self.observer_enabled[0] == 1))
        self._record_switch("fake_quant_enabled", bool(self.fake_quant_enabled[0] == 1))

    def __getstate__(self):
        state = super().__getstate__()
        for name in _HOST_CACHES:  # a copy or an unpickled module reads its buffers again
            state.pop(name, None)
        return state

    def enable_only_observer(self, enable=True):
        self.only_enable_observer = enable
        self.run_fquant_time = 1

    @torch.jit.export
    def calculate_qparams(self):
        return self.activation_post_process.calculate_qparams()

    @torch.jit.export
    def extra_repr(self):
        return "fake_quant_enabled={}, observer_enabled={}, quant_min={}, quant_max={}, " \
               "dtype={}, qscheme={}, ch_axis={}, ".format(
                   self.fake_quant_enabled, self.observer_enabled, self.quant_min,
                   self.quant_max, self.dtype, self.qscheme, self.ch_axis)

    # -- shared pieces of the subclasses ------------------------------------------------------
    def _grad_factor(self, X):
        """LSQ's gradient scale: 1/sqrt(n * quant_max), n = elements per scale."""
        if not getattr(self, "use_grad_scaling", True):
            return 1.0
        n = X.numel() / X.shape[self.ch_axis] if self.is_per_channel else X.numel()
        return 1.0 / (n * self.quant_max) ** 0.5

    def _observe_into_buffers(self, X):
        """Observes X and copies the qparams into the ``scale``/``zero_point`` buffers, resizing
        them when the shape changes (first per-channel observation)."""
        self.activation_post_process(X.detach())
        _scale, _zero_point = self.calculate_qparams()
        _scale, _zero_point = _scale.to(self.scale.device), _zero_point.to(self.zero_point.device)
        if self.scale.shape != _scale.shape:
            self.scale.resize_(_scale.shape)
            self.zero_point.resize_(_zero_point.shape)
        self.scale.copy_(_scale)
        self.zero_point.copy_(_zero_point)

    def _observe_into_parameters(self, X):
        """LSQ-style update: observe, then copy the qparams into ``scale``/``zero_point`` (float),
        re-allocating them per channel; when the observer is off, keep ``scale >= eps``.
        Returns the scale to quantize with (``self.scale``; under torch.export, see
        :meth:`_edit_in_place`)."""
        if self._observer_on():
            self.activation_post_process(X.detach())
            _scale, _zero_point = self.activation_post_process.calculate_qparams()
            _scale = _scale.to(self.scale.device)
            _zero_point = _zero_point.to(self.zero_point.device)
            if self.ch_axis != -1:
                self.scale.data = torch.ones_like(_scale, dtype=self.scale.dtype)
                self.zero_point.data = torch.zeros_like(_zero_point, dtype=self.zero_point.dtype)
            self.scale.data.copy_(_scale)
            self.zero_point.data.copy_(_zero_point.to(self.zero_point.dtype))
            return self.scale
        # A tensor bound: the same values as MQBench's eps.item(), without a host read.
        return self._edit_in_place(self.scale, lambda s: s.abs_().clamp_(min=self.eps))

    @staticmethod
    def _edit_in_place(param, edit):
        """Applies ``edit`` (in place, outside autograd) to a parameter's values and returns the
        tensor to compute with. Eager code edits ``param.data``, which the ONNX exporter's tracer
        does not record (a no_grad edit would be exported as nodes computing the scale); compiled
        code edits under no_grad, which dynamo traces as a mutation of the parameter (``.data``
        would break the graph). Under torch.export (the dynamo ONNX exporter's capture too) the
        edit runs on a copy inside the graph and the parameter is left as it is: each no_grad
        region becomes a submodule that export inlines again one by one, recompiling the whole
        module each time, which made exporting a prepared model quadratic in its quantizers
        (all-MiniLM-L6-v2: 148 s of recompiles; docs/design/build-and-ci.md). The exported
        program computes the same values; it does not write them back into the parameter."""
        if _is_exporting():
            return edit(param.clone())
        if torch.compiler.is_compiling():
            with torch.no_grad():
                edit(param)
        else:
            edit(param.data)
        return param

    def _fixed_fake_quant(self, X):
        ops = export_ops()
        if self.is_per_channel:
            return ops.fake_quantize_per_channel_affine(X, self.scale, self.zero_point, self.ch_axis,
                                                        self.quant_min, self.quant_max)
        return ops.fake_quantize_per_tensor_affine(X, self.scale, self.zero_point, self.quant_min,
                                                   self.quant_max)

    def _resize_on_load(self, state_dict, prefix, strict, missing_keys, names=("scale", "zero_point")):
        """Resizes buffers to the checkpoint's shapes before loading (torch FakeQuantize's rule)."""
        for name in names:
            key = prefix + name
            if key in state_dict:
                getattr(self, name).resize_(state_dict[key].shape)
            elif strict:
                missing_keys.append(key)
