"""Fake (meta) kernels of the ``torch.ops.mqbench`` ops: output shapes, dtypes and strides only.

``torch.compile``, ``torch.export`` and ``FakeTensorMode`` run these instead of the CPU/CUDA
kernels while tracing; they also serve tensors on the ``meta`` device. Each mirrors what the
C++ kernel allocates (``tests/python/ops/test_torch2.py`` checks every op with
``torch.library.opcheck``, which compares them with the real kernels):

* a fake-quantized output or an input gradient: ``empty_like(x)`` in x's memory format
  (``detail::empty_output_like``);
* a gradient of a scale, zero point or clip value: the parameter's shape, contiguous, in its
  dtype (float32 for an integer zero point) (``detail::sums_like``);
* the BN fold of QAT conv-bn: a contiguous output and per-channel statistics.

Ops built from other ops (``fake_quantize_qdrop_*``, ``dorefa_normalize``,
``pot_quantization``, ``fake_quantize_(learnable_)per_group_affine``: CompositeImplicitAutograd) and the observer ops (CompositeExplicitAutograd,
which run on fake tensors directly) need none. ``observer_pot_exponent`` returns a Python int
computed from the data: it cannot be traced and breaks the graph (observers run in
calibration, outside the compiled training step).
"""
import torch

__all__ = []

_lib = "mqbench::"


def _out_like(x):
    return torch.empty_like(x, memory_format=torch.preserve_format)


def _grad_like(param):
    dtype = param.dtype if param.dtype.is_floating_point else torch.float32
    return param.new_empty(param.shape, dtype=dtype)


def _register(name, fn):
    torch.library.register_fake(_lib + name)(fn)


def _forward(x, *args, **kwargs):
    return _out_like(x)


def _backward_x(grad, x, *args, **kwargs):
    return _out_like(x)


for _name in ("fake_quantize_per_tensor_affine", "fake_quantize_per_channel_affine",
              "fake_quantize_learnable_per_tensor_affine",
              "fake_quantize_learnable_per_channel_affine", "fake_quantize_dsq_per_tensor",
              "fake_quantize_dsq_per_channel", "fake_quantize_tqt", "fake_quantize_nnie",
              "fake_quantize_pact", "fake_quantize_adaround_per_tensor",
              "fake_quantize_adaround_per_channel", "fake_quantize_fp8",
              "fake_quantize_learnable_fp8"):
    _register(_name, _forward)

for _name in ("_fake_quantize_per_tensor_affine_backward",
              "_fake_quantize_per_channel_affine_backward",
              "_fake_quantize_dsq_per_tensor_backward", "_fake_quantize_dsq_per_channel_backward",
              "_fake_quantize_fp8_backward"):
    _register(_name, _backward_x)


def _learnable_backward(grad, x, scale, zero_point, *args):
    return _out_like(x), _grad_like(scale), _grad_like(zero_point)


_register("_fake_quantize_learnable_per_tensor_affine_backward", _learnable_backward)
_register("_fake_quantize_learnable_per_channel_affine_backward", _learnable_backward)


@torch.library.register_fake(_lib + "_fake_quantize_learnable_fp8_backward")
def _learnable_fp8_backward(grad, x, scale, ch_axis, dtype, grad_factor):
    return _out_like(x), _grad_like(scale)


@torch.library.register_fake(_lib + "_fake_quantize_tqt_backward")
def _tqt_backward(grad, x, scale, zero_point, quant_min, quant_max, mth):
    return _out_like(x), _grad_like(scale)


@torch.library.register_fake(_lib + "_fake_quantize_pact_backward")
def _pact_backward(grad, x, alpha, n_alpha, scale, zero_point, quant_min, quant_max):
    return _out_like(x), _grad_like(alpha), _grad_like(n_alpha)


def _adaround_backward(grad, x, scale, zero_point, alpha, *args):
    return _out_like(alpha)  # AdaRound trains alpha only


_register("_fake_quantize_adaround_per_tensor_backward", _adaround_backward)
_register("_fake_quantize_adaround_per_channel_backward", _adaround_backward)


@torch.library.register_fake(_lib + "fold_bn_train")
def _fold_bn_train(x, scale_factor, bias, bn_weight, bn_bias, running_mean, running_var,
                   exponential_average_factor, eps, relu):
    c = x.shape[1]
    stats = x.new_empty((c,), dtype=torch.float64)
    return x.new_empty(x.shape), stats, x.new_empty((c,), dtype=torch.float64)


@torch.library.register_fake(_lib + "_fold_bn_train_backward")
def _fold_bn_train_backward(grad, x, scale_factor, bias, bn_weight, bn_bias, mean_x, rstd, relu):
    c = x.shape[1]
    return (x.new_empty(x.shape),) + tuple(x.new_empty((c,), dtype=torch.float32)
                                           for _ in range(4))


# The block-scaled formats (fake_quantize_mx, fake_quantize_nvfp4) move the block axis last and
# compute on a contiguous copy: their output is contiguous whatever x's strides.
@torch.library.register_fake(_lib + "fake_quantize_mx")
def _mx(x, elem_dtype, block_size=32, axis=-1):
    return x.new_empty(x.shape)


@torch.library.register_fake(_lib + "fake_quantize_nvfp4")
def _nvfp4(x, global_amax, block_size=16, axis=-1):
    return x.new_empty(x.shape)


# The row ops of LLM activations (hadamard_transform, fake_quantize_per_token) compute each row
# of the last axis on a contiguous copy of x: their output is contiguous, in x's dtype.
@torch.library.register_fake(_lib + "hadamard_transform")
def _hadamard_transform(x, had=None, scale=1.0):
    return x.new_empty(x.shape)


@torch.library.register_fake(_lib + "fake_quantize_per_token")
def _per_token(x, quant_min, quant_max, symmetric, format="int"):
    return x.new_empty(x.shape)
