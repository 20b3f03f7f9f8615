"""CUDA kernels (src/ops/cuda/) against the spec's formula and the CPU kernels, and prepared
models trained and deployed on the GPU.

The CPU kernels are the verified references (test_affine_ops.py, test_algorithm_ops.py,
test_observers.py, test_bn_fold.py check them against the spec's formulas and torch's ops).
Every op of torch.ops.mqbench runs here on the same inputs on both devices:

* elementwise forward outputs and input gradients: exactly equal (NaN where NaN), except where
  the op evaluates a transcendental function (tanh, sigmoid, log, exp2: DSQ, AdaRound's soft
  rounding, DoReFa, the AdaRound helpers, NNIE in float64), whose last bit differs between
  libm / SLEEF and CUDA's libdevice: those within a few ulps (DSQ's rounded output: at most
  0.1% of the values one level apart);
* reduced gradients (LSQ d_scale / d_zero_point, TQT d_scale, PACT d_alpha, BN folding) and
  observer statistics (mean, std): within 1e-5 relative; min / max, the selecting observers
  (MSE, quantile, power-of-two) and the qparam formulas: exactly equal;
* half and bfloat16 input on CUDA: the output has the input's dtype and equals the float32 op
  on x.float(), cast back;
* no host synchronisation in a QAT step (torch.cuda.set_sync_debug_mode("error")), prepared
  models calibrated, trained and deployed from CUDA.

Tests that need a GPU skip, with the reason printed (pytest -rs), where none is present; CI
has none, the GPU machine runs them. The rest of each test's logic runs here: the op and flow
tests are parametrized by device, and their "cpu" case runs the same inputs, harness and
comparisons on the CPU (each op on every layout against the contiguous input; the flows with a
host-read detector in place of CUDA's sync check).
"""
import copy
import re
from contextlib import contextmanager

import pytest
import torch
import torch.nn as nn
import torchvision
from torch.overrides import TorchFunctionMode

import mqbench
from mqbench import observer as obs
from mqbench.convert_deploy import convert_deploy
from mqbench.fake_quantize import (AdaRoundFakeQuantize, DoReFaFakeQuantize, DSQFakeQuantize,
                                   FixedFakeQuantize, LearnableFakeQuantize, NNIEFakeQuantize,
                                   PACTFakeQuantize, QDropFakeQuantize, TqtFakeQuantize)
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration, enable_quantization
from reference import fake_quant_affine

set_log_level("WARNING")

ops = torch.ops.mqbench

HAS_CUDA = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_CUDA,
                               reason="no CUDA device (CI has none; the GPU machine runs these)")

# "cpu": the same test on the CPU (the harness proven here); "cuda": the GPU run.
DEVICES = ["cpu", pytest.param("cuda", marks=needs_gpu)]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def test_cuda_kernels_are_compiled_in_with_a_cuda_torch():
    """With a CUDA build of torch, libmqbench carries the CUDA kernels (MQBENCH_CUDA=AUTO)."""
    if torch.version.cuda is None:
        pytest.skip(f"torch {torch.__version__} is a CPU build: no CUDA kernels are built")
    assert mqbench._C.__cuda__
    assert torch._C._dispatch_has_kernel_for_dispatch_key(
        "mqbench::fake_quantize_per_tensor_affine", "CUDA")


def test_every_op_with_a_cpu_kernel_has_a_cuda_kernel():
    """Registration, checked without a GPU: each mqbench op either is a composite (it runs on
    CUDA through other ops) or has a CUDA kernel beside its CPU one, and each observer op with a
    CompositeExplicitAutograd host implementation has a CUDA kernel unless it is made of ATen ops
    only (running / EMA updates, LSQ qparams), which run on CUDA as they are."""
    if torch.version.cuda is None:
        pytest.skip(f"torch {torch.__version__} is a CPU build: no CUDA kernels are built")
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    aten_only = {"observer_running_min_max", "observer_ema_min_max", "observer_lsq_qparams",
                 "observer_lsq_plus_qparams"}
    names = sorted({str(s.name).split("::")[1] for s in torch._C._jit_get_all_schemas()
                    if str(s.name).startswith("mqbench::")})
    assert len(names) > 40, names
    missing = []
    for name in names:
        q = f"mqbench::{name}"
        if has(q, "CompositeImplicitAutograd") or name in aten_only:
            continue
        if (has(q, "CPU") or has(q, "CompositeExplicitAutograd")) and not has(q, "CUDA"):
            missing.append(name)
    assert not missing, f"ops without a CUDA kernel: {missing}"


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("qrange", [(-128, 127), (0, 255), (0, 15)])
def test_per_tensor_affine_cuda_matches_formula_and_cpu(dtype, qrange):
    qmin, qmax = qrange
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 65, 129, generator=g, dtype=dtype) * 3
    x[0, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0], dtype=dtype)
    s, z = torch.tensor([0.0173]), torch.tensor([(qmin + qmax) // 3], dtype=torch.int32)
    cpu = ops.fake_quantize_per_tensor_affine(x, s, z, qmin, qmax)
    for strided in (False, True):
        xc = x.cuda()
        if strided:
            xc = xc.transpose(0, 2)
        out = ops.fake_quantize_per_tensor_affine(xc, s.cuda(), z.cuda(), qmin, qmax)
        expect = cpu.transpose(0, 2) if strided else cpu
        torch.testing.assert_close(out.cpu(), expect, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(cpu, fake_quant_affine(x, 0.0173, int(z), qmin, qmax).detach(),
                               rtol=0, atol=0, equal_nan=True)


@needs_gpu
def test_per_tensor_affine_cuda_gradient():
    x = (torch.randn(4096, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2)
    dy = torch.randn(4096, dtype=torch.float64)
    grads = []
    for device in ("cpu", "cuda"):
        xd = x.to(device).requires_grad_()
        ops.fake_quantize_per_tensor_affine(
            xd, torch.tensor([0.02], device=device), torch.tensor([3], device=device), -20, 100
        ).backward(dy.to(device))
        grads.append(xd.grad.cpu())
    assert torch.equal(grads[0], grads[1])
    # Straight-through estimator: gradcheck on points away from rounding ties.
    xs = torch.linspace(-0.37, 0.41, 50, dtype=torch.float64, device="cuda").requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: ops.fake_quantize_per_tensor_affine(
            t, torch.tensor([0.1], device="cuda"), torch.tensor([0], device="cuda"), -128, 127)
        - (torch.round(t.detach() / 0.1) * 0.1 - t.detach()), (xs,))


# ==== inputs ===================================================================================

# Channel sizes 4, 6 and 11 on ch_axis 0, 1 and -1 (3); 2376 elements: several CUDA blocks and
# a tail that is no multiple of a vector width.
SHAPE = (4, 6, 9, 11)
EMPTY_SHAPE = (4, 6, 0, 11)  # no elements, but every channel axis has channels
# contiguous; "offset": contiguous from storage offset 1 (misaligned for float4 loads);
# transposed (every axis reversed); channels_last; "sliced": every other element of the last
# axis (not dense); "empty".
LAYOUTS = ["contiguous", "offset", "transposed", "channels_last", "sliced", "empty"]
FLOATS = [torch.float32, torch.float64]
NAN, INF = float("nan"), float("inf")


def make_x(dtype, layout, device, seed=0, scale=3.0, specials=True):
    """A SHAPE tensor of N(0, scale^2) values in `layout` on `device`: the same values for every
    layout and device (drawn on the CPU in float64, then cast). `specials` puts NaN, +inf, -inf
    and 0 in two channels of every channel axis."""
    if layout == "empty":
        return torch.empty(EMPTY_SHAPE, dtype=dtype, device=device)
    base = torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64) * scale
    if specials:
        base[0, 0, 0, :4] = torch.tensor([NAN, INF, -INF, 0.0])
        base[3, 5, 8, 10] = NAN
        base[2, 4, 7, 9] = INF
    base = base.to(device=device, dtype=dtype)
    if layout == "contiguous":
        return base
    if layout == "offset":
        flat = torch.empty(base.numel() + 1, dtype=dtype, device=device)
        flat[1:] = base.reshape(-1)
        return flat[1:].view(SHAPE)
    if layout == "transposed":
        return base.permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0)
    if layout == "channels_last":
        return base.contiguous(memory_format=torch.channels_last)
    if layout == "sliced":
        big = torch.zeros(SHAPE[:-1] + (2 * SHAPE[-1],), dtype=dtype, device=device)
        big[..., ::2] = base
        return big[..., ::2]
    raise ValueError(layout)


def on(device, values, dtype=torch.float32):
    """A tensor of `values` on `device` (built on the CPU: identical on every device)."""
    return torch.tensor(values, dtype=dtype).to(device)


def per_channel(x, ch_axis, device, qmin, qmax, float_zp=False):
    """Per-channel scales in [0.02, 0.08] and zero points spread over [qmin, qmax]."""
    c = x.shape[ch_axis]
    scale = torch.linspace(0.02, 0.08, c)
    zp = (torch.arange(c) * 7) % (qmax - qmin + 1) + qmin
    zp = zp.float() + 0.3 if float_zp else zp.to(torch.int32)
    return scale.to(device), zp.to(device)


def lsq_factor(x, per=1):
    """MQBench's LSQ gradient factor 1/sqrt(n * quant_max), n = elements per scale."""
    return 1.0 / (max(x.numel() // per, 1) * 255) ** 0.5


# ==== the ops, case by case ====================================================================

# Comparison kinds (see the module docstring).
EXACT = ("exact",)


def REDUCED(rtol=1e-5, data_scale=False):
    """Within rtol relative, with an absolute floor rtol * max|expected| (a sum near zero has no
    relative precision), or rtol * max|finite x| for statistics of x (data_scale)."""
    return ("reduced", rtol, data_scale)


def CLOSE(rtol32, rtol64):
    """Last-bit differences of a transcendental function: within rtol (by dtype) relative to
    the largest expected value."""
    return ("close", rtol32, rtol64)


ROUNDED = ("rounded",)  # an ulp in tanh may move a value by one level at a tie: <= 0.1% (or 1)
NNIE = ("nnie",)        # float64 maths: float32 exact, float64 within an ulp (exp2)


class Case:
    """One call of one op: fn(x, g, a, device) -> tuple of outputs, with x, g (a gradient) and
    a (an auxiliary input, AdaRound's alpha) of one layout; `kinds` compare the outputs."""

    def __init__(self, name, fn, kinds, x_scale=3.0, specials=True, half=True):
        self.name, self.fn, self.kinds = name, fn, kinds
        self.x_scale, self.specials, self.half = x_scale, specials, half

    def inputs(self, dtype, layout, device):
        x = make_x(dtype, layout, device, 0, self.x_scale, self.specials)
        # A positive gradient: the reduced gradients (sums of g times a per-element factor) are
        # then not dominated by cancellation, so 1e-5 relative is a fair bound for float
        # accumulation (a sum near zero of terms near one has no relative precision).
        g = make_x(dtype, layout, device, 1, 1.0, False).abs() + 0.25
        a = make_x(dtype, layout, device, 2, 2.0, False)
        return x, g, a

    def __repr__(self):
        return self.name


def autograd(forward, x, g, *params):
    """forward(x, *params) with x and the floating params as leaves; (out, x.grad, p.grad...)
    after backward(g)."""
    xl = x.detach().requires_grad_()
    leaves = [p.detach().clone().requires_grad_() for p in params]
    out = forward(xl, *leaves)
    out.backward(g)
    return (out.detach(), xl.grad) + tuple(p.grad for p in leaves)


def _fixed_pt(x, d):
    return on(d, [0.05]), on(d, [3], torch.int32)


CH_AXES = [0, 1, -1]


def affine_cases():
    c = [
        Case("fixed_per_tensor", lambda x, g, a, d: (
            ops.fake_quantize_per_tensor_affine(x, *_fixed_pt(x, d), -128, 127),), [EXACT]),
        Case("fixed_per_tensor_float_zp", lambda x, g, a, d: (
            ops.fake_quantize_per_tensor_affine(x, on(d, [0.05]), on(d, [100.3]), 0, 255),),
            [EXACT]),
        Case("fixed_per_tensor_4bit_0dim_int64", lambda x, g, a, d: (
            ops.fake_quantize_per_tensor_affine(x, on(d, 0.5), on(d, 8, torch.int64), 0, 15),),
            [EXACT]),
        Case("fixed_per_tensor_backward", lambda x, g, a, d: (
            ops._fake_quantize_per_tensor_affine_backward(g, x, *_fixed_pt(x, d), -128, 127),),
            [EXACT]),
        Case("fixed_per_tensor_autograd", lambda x, g, a, d: autograd(
            lambda t: ops.fake_quantize_per_tensor_affine(t, *_fixed_pt(x, d), -128, 127), x, g),
            [EXACT, EXACT]),
        Case("fixed_per_channel_float_zp[1]", lambda x, g, a, d: (
            ops.fake_quantize_per_channel_affine(x, *per_channel(x, 1, d, 0, 255, True), 1, 0,
                                                 255),), [EXACT]),
        Case("fixed_per_channel_autograd[1]", lambda x, g, a, d: autograd(
            lambda t: ops.fake_quantize_per_channel_affine(
                t, *per_channel(x, 1, d, -128, 127), 1, -128, 127), x, g), [EXACT, EXACT]),
        Case("lsq_per_tensor_symmetric", lambda x, g, a, d: (
            ops.fake_quantize_learnable_per_tensor_affine(
                x, on(d, [0.05]), on(d, [0.0]), -128, 127, lsq_factor(x)),), [EXACT]),
        Case("lsq_per_tensor_affine", lambda x, g, a, d: (
            ops.fake_quantize_learnable_per_tensor_affine(
                x, on(d, [0.05]), on(d, [100.4]), 0, 255, lsq_factor(x)),), [EXACT]),
        Case("lsq_per_tensor_backward_symmetric", lambda x, g, a, d:
             ops._fake_quantize_learnable_per_tensor_affine_backward(
                 g, x, on(d, [0.05]), on(d, [0.0]), -128, 127, lsq_factor(x)),
             [EXACT, REDUCED(), REDUCED()]),
        Case("lsq_per_tensor_backward_affine", lambda x, g, a, d:
             ops._fake_quantize_learnable_per_tensor_affine_backward(
                 g, x, on(d, [0.05]), on(d, [100.4]), 0, 255, lsq_factor(x)),
             [EXACT, REDUCED(), REDUCED()]),
        Case("lsq_per_tensor_autograd", lambda x, g, a, d: autograd(
            lambda t, s, z: ops.fake_quantize_learnable_per_tensor_affine(
                t, s, z, 0, 255, lsq_factor(x)), x, g, on(d, [0.05]), on(d, [100.4])),
            [EXACT, EXACT, REDUCED(), REDUCED()]),
        Case("lsq_per_channel_autograd[0]", lambda x, g, a, d: autograd(
            lambda t, s, z: ops.fake_quantize_learnable_per_channel_affine(
                t, s, z, 0, 0, 255, lsq_factor(x, x.shape[0])),
            x, g, *per_channel(x, 0, d, 0, 255, True)), [EXACT, EXACT, REDUCED(), REDUCED()]),
        Case("qdrop_per_tensor", lambda x, g, a, d: (ops.fake_quantize_qdrop_per_tensor(
            x, on(d, [0.05]), on(d, [3], torch.int32), -128, 127, 1.0),), [EXACT]),
        Case("qdrop_per_channel[1]", lambda x, g, a, d: (ops.fake_quantize_qdrop_per_channel(
            x, *per_channel(x, 1, d, -128, 127), 1, -128, 127, 1.0),), [EXACT]),
        Case("qdrop_per_tensor_autograd", lambda x, g, a, d: autograd(
            lambda t, s: ops.fake_quantize_qdrop_per_tensor(
                t, s, on(d, [3], torch.int32), -128, 127, 1.0), x, g, on(d, [0.05])),
            [EXACT, EXACT, REDUCED()]),
    ]
    for ch in CH_AXES:
        c += [
            Case(f"fixed_per_channel[{ch}]", lambda x, g, a, d, ch=ch: (
                ops.fake_quantize_per_channel_affine(x, *per_channel(x, ch, d, 0, 255), ch, 0,
                                                     255),), [EXACT]),
            Case(f"fixed_per_channel_backward[{ch}]", lambda x, g, a, d, ch=ch: (
                ops._fake_quantize_per_channel_affine_backward(
                    g, x, *per_channel(x, ch, d, -128, 127), ch, -128, 127),), [EXACT]),
            Case(f"lsq_per_channel[{ch}]", lambda x, g, a, d, ch=ch: (
                ops.fake_quantize_learnable_per_channel_affine(
                    x, *per_channel(x, ch, d, 0, 255, True), ch, 0, 255,
                    lsq_factor(x, x.shape[ch])),), [EXACT]),
            Case(f"lsq_per_channel_backward[{ch}]", lambda x, g, a, d, ch=ch:
                 ops._fake_quantize_learnable_per_channel_affine_backward(
                     g, x, *per_channel(x, ch, d, 0, 255, True), ch, 0, 255,
                     lsq_factor(x, x.shape[ch])), [EXACT, REDUCED(), REDUCED()]),
        ]
    return c


def _dsq_pt(d):
    return on(d, [0.3]), on(d, [1], torch.int32)


def _pact(d):
    return on(d, [3.0]), on(d, [-2.5])


def _pact_qparams(d):
    return on(d, [5.5 / 255]), on(d, [116], torch.int32)


def algorithm_cases():
    c = [
        Case("dsq_per_tensor", lambda x, g, a, d: (
            ops.fake_quantize_dsq_per_tensor(x, *_dsq_pt(d), -8, 7, 0.4),), [ROUNDED]),
        Case("dsq_per_tensor_backward", lambda x, g, a, d: (
            ops._fake_quantize_dsq_per_tensor_backward(g, x, *_dsq_pt(d), -8, 7, 0.4),),
            [CLOSE(2e-6, 1e-13)]),
        Case("dsq_per_tensor_autograd", lambda x, g, a, d: autograd(
            lambda t: ops.fake_quantize_dsq_per_tensor(t, *_dsq_pt(d), -8, 7, 0.4), x, g),
            [ROUNDED, CLOSE(2e-6, 1e-13)]),
        Case("tqt_activation_mth2", lambda x, g, a, d: (
            ops.fake_quantize_tqt(x, on(d, [0.013]), on(d, [0.0]), -128, 127, 2),), [EXACT]),
        Case("tqt_parameter_mth3", lambda x, g, a, d: (
            ops.fake_quantize_tqt(x, on(d, [0.013]), on(d, [0.0]), -128, 127, 3),), [EXACT]),
        Case("tqt_backward_mth2", lambda x, g, a, d: ops._fake_quantize_tqt_backward(
            g, x, on(d, [0.013]), on(d, [0.0]), -128, 127, 2), [EXACT, REDUCED()]),
        Case("tqt_backward_mth3", lambda x, g, a, d: ops._fake_quantize_tqt_backward(
            g, x, on(d, [0.3]), on(d, [0.0]), -8, 7, 3), [EXACT, REDUCED()]),
        Case("tqt_autograd", lambda x, g, a, d: autograd(
            lambda t, s: ops.fake_quantize_tqt(t, s, on(d, [0.0]), -128, 127, 2), x, g,
            on(d, [0.013])), [EXACT, EXACT, REDUCED()]),
        Case("pact_symmetric", lambda x, g, a, d: (ops.fake_quantize_pact(
            x, on(d, [3.0]), on(d, [-3.0]), on(d, [6.0 / 255]), on(d, [0], torch.int32),
            -128, 127),), [EXACT]),
        Case("pact_asymmetric", lambda x, g, a, d: (ops.fake_quantize_pact(
            x, *_pact(d), *_pact_qparams(d), 0, 255),), [EXACT]),
        Case("pact_no_lower_clip", lambda x, g, a, d: (ops.fake_quantize_pact(
            x, on(d, [2.0]), on(d, [-INF]), on(d, [0.05]), on(d, [0], torch.int32), -128, 127),),
            [EXACT]),
        Case("pact_backward", lambda x, g, a, d: ops._fake_quantize_pact_backward(
            g, x, *_pact(d), *_pact_qparams(d), 0, 255), [EXACT, REDUCED(), REDUCED()]),
        Case("pact_autograd", lambda x, g, a, d: autograd(
            lambda t, al, nal: ops.fake_quantize_pact(t, al, nal, *_pact_qparams(d), 0, 255),
            x, g, *_pact(d)), [EXACT, EXACT, REDUCED(), REDUCED()]),
        Case("nnie", lambda x, g, a, d: (ops.fake_quantize_nnie(x, on(d, 9.0)),), [NNIE]),
        Case("nnie_zero_range", lambda x, g, a, d: (ops.fake_quantize_nnie(x, on(d, 0.0)),),
             [EXACT]),
        Case("nnie_autograd", lambda x, g, a, d: autograd(
            lambda t: ops.fake_quantize_nnie(t, on(d, 9.0)), x, g), [NNIE, EXACT]),
        Case("adaround_per_tensor_soft", lambda x, g, a, d: (
            ops.fake_quantize_adaround_per_tensor(x, on(d, [0.02]), on(d, [0], torch.int32), a,
                                                  -128, 127, False),),
            [CLOSE(1e-6, 1e-14)], x_scale=0.3),
        Case("adaround_per_tensor_hard", lambda x, g, a, d: (
            ops.fake_quantize_adaround_per_tensor(x, on(d, [0.02]), on(d, [0], torch.int32), a,
                                                  -128, 127, True),), [EXACT], x_scale=0.3),
        Case("adaround_per_tensor_backward", lambda x, g, a, d: (
            ops._fake_quantize_adaround_per_tensor_backward(
                g, x, on(d, [0.02]), on(d, [0], torch.int32), a, -128, 127),),
            [CLOSE(2e-6, 1e-13)], x_scale=0.3),
        Case("adaround_per_tensor_autograd", lambda x, g, a, d: autograd(
            lambda t, al: ops.fake_quantize_adaround_per_tensor(
                t, on(d, [0.02]), on(d, [0], torch.int32), al, -128, 127, False), x, g, a),
            [CLOSE(1e-6, 1e-14), EXACT, CLOSE(2e-6, 1e-13)], x_scale=0.3),
        Case("dorefa_normalize", lambda x, g, a, d: (ops.dorefa_normalize(x),),
             [CLOSE(1e-6, 1e-14)], specials=False, half=False),
        Case("dorefa_normalize_autograd", lambda x, g, a, d: autograd(ops.dorefa_normalize, x, g),
             [CLOSE(1e-6, 1e-14), CLOSE(1e-5, 1e-12)], specials=False, half=False),
        Case("adaround_rectified_sigmoid", lambda x, g, a, d: (
            ops.adaround_rectified_sigmoid(x),), [CLOSE(1e-6, 1e-14)], half=False),
        Case("adaround_regularizer", lambda x, g, a, d: (
            ops.adaround_regularizer(x, 2.0), ops.adaround_regularizer(x, 20.0)),
            [REDUCED(), REDUCED()], specials=False, half=False),
        Case("adaround_alpha_init_per_tensor", lambda x, g, a, d: (
            ops.adaround_alpha_init(x, on(d, [0.05]), -1),), [CLOSE(1e-5, 1e-12)],
            specials=False, half=False),
    ]
    for ch in CH_AXES:
        c += [
            Case(f"dsq_per_channel[{ch}]", lambda x, g, a, d, ch=ch: (
                ops.fake_quantize_dsq_per_channel(x, *per_channel(x, ch, d, -8, 7), ch, -8, 7,
                                                  0.4),), [ROUNDED], x_scale=0.2),
            Case(f"dsq_per_channel_backward[{ch}]", lambda x, g, a, d, ch=ch: (
                ops._fake_quantize_dsq_per_channel_backward(
                    g, x, *per_channel(x, ch, d, -8, 7), ch, -8, 7, 0.4),),
                [CLOSE(2e-6, 1e-13)], x_scale=0.2),
            Case(f"adaround_per_channel_soft[{ch}]", lambda x, g, a, d, ch=ch: (
                ops.fake_quantize_adaround_per_channel(
                    x, *per_channel(x, ch, d, -128, 127), a, ch, -128, 127, False),),
                [CLOSE(1e-6, 1e-14)], x_scale=0.3),
            Case(f"adaround_per_channel_hard[{ch}]", lambda x, g, a, d, ch=ch: (
                ops.fake_quantize_adaround_per_channel(
                    x, *per_channel(x, ch, d, -128, 127), a, ch, -128, 127, True),),
                [EXACT], x_scale=0.3),
            Case(f"adaround_per_channel_backward[{ch}]", lambda x, g, a, d, ch=ch: (
                ops._fake_quantize_adaround_per_channel_backward(
                    g, x, *per_channel(x, ch, d, -128, 127), a, ch, -128, 127),),
                [CLOSE(2e-6, 1e-13)], x_scale=0.3),
        ]
    for ch in (0, 1, 3):  # adaround_alpha_init's ch_axis -1 is per tensor
        c.append(Case(f"adaround_alpha_init[{ch}]", lambda x, g, a, d, ch=ch: (
            ops.adaround_alpha_init(x, per_channel(x, ch, d, -128, 127)[0], ch),),
            [CLOSE(1e-5, 1e-12)], specials=False, half=False))
    return c


# Observers: ch_axis -1 is per tensor; 0, 1 and 3 per channel.
OBSERVER_AXES = [-1, 0, 1, 3]
STAT = REDUCED(1e-5, data_scale=True)


def _eps(d):
    return on(d, [torch.finfo(torch.float32).eps])


def observer_cases():
    c = [
        Case("observer_quantile_range[0.99999]", lambda x, g, a, d:
             ops.observer_quantile_range(x, 0.99999, 2048), [EXACT, EXACT], half=False),
        Case("observer_quantile_range[0.9]", lambda x, g, a, d:
             ops.observer_quantile_range(x, 0.9, 2048), [EXACT, EXACT], half=False),
        Case("observer_quantile_range[0.5,bins=7]", lambda x, g, a, d:
             ops.observer_quantile_range(x, 0.5, 7), [EXACT, EXACT], half=False),
    ]
    for range_n, mth in ((1, 2), (5, 2), (5, 3)):
        c.append(Case(f"observer_pot_exponent[n={range_n},mth={mth}]", lambda x, g, a, d, n=range_n,
                      m=mth: (ops.observer_pot_exponent(x, *ops.observer_min_max(x, -1), -128, 127,
                                                        n, m),), [EXACT], x_scale=0.7, half=False))
    for ch in OBSERVER_AXES:
        iters = 95 if ch == -1 else 80
        c += [
            Case(f"observer_min_max[{ch}]", lambda x, g, a, d, ch=ch:
                 ops.observer_min_max(x, ch), [EXACT, EXACT], half=False),
            Case(f"observer_moments[{ch}]", lambda x, g, a, d, ch=ch:
                 ops.observer_moments(x, ch), [STAT, STAT, STAT, EXACT, EXACT], half=False),
            Case(f"observer_clip_std_range[{ch}]", lambda x, g, a, d, ch=ch:
                 ops.observer_clip_std_range(x, ch, 2.6), [STAT, STAT], half=False),
            Case(f"observer_mse_range_symmetric_8bit[{ch}]", lambda x, g, a, d, ch=ch, it=iters:
                 ops.observer_mse_range(x, ch, -128, 127, True, 0, _eps(d), 2.0, it),
                 [EXACT, EXACT], half=False),
            Case(f"observer_mse_range_affine_4bit_p1[{ch}]", lambda x, g, a, d, ch=ch, it=iters:
                 ops.observer_mse_range(x, ch, 0, 15, False, 8, _eps(d), 1.0, it),
                 [EXACT, EXACT], half=False),
        ]
    return c


ELEMENTWISE_CASES = affine_cases() + algorithm_cases()
OBSERVER_CASES = observer_cases()
ALL_CASES = ELEMENTWISE_CASES + OBSERVER_CASES


def finite_max(t):
    t = t.detach().double()
    t = t[torch.isfinite(t)]
    return float(t.abs().max()) if t.numel() else 0.0


def assert_agree(got, want, kind, dtype, x, what):
    """got (any device) against want (CPU) by comparison kind."""
    if not isinstance(want, torch.Tensor):
        assert got == want, f"{what}: {got} != {want}"
        return
    got = got.detach().cpu()
    want = want.detach()
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, \
        f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    name = kind[0]
    if name == "nnie":
        kind = EXACT if dtype == torch.float32 else CLOSE(0, 4.5e-16)
        name = kind[0]
    if name == "exact":
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True,
                                   msg=lambda m: f"{what}: {m}")
    elif name == "reduced":
        rtol, data_scale = kind[1], kind[2]
        floor = finite_max(x) if data_scale else finite_max(want)
        torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * floor + 1e-30, equal_nan=True,
                                   msg=lambda m: f"{what}: {m}")
    elif name == "close":
        rtol = kind[1] if dtype != torch.float64 else kind[2]
        torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * finite_max(want),
                                   equal_nan=True, msg=lambda m: f"{what}: {m}")
    elif name == "rounded":
        assert torch.equal(torch.isnan(got), torch.isnan(want)), f"{what}: NaN positions differ"
        keep = ~torch.isnan(want)
        differ = (got[keep] != want[keep])
        assert int(differ.sum()) <= max(1, 1e-3 * differ.numel()), \
            f"{what}: {int(differ.sum())} of {differ.numel()} values differ"
        if differ.any():  # one level at most (per-channel steps <= 0.3)
            assert (got[keep] - want[keep]).abs().max().item() <= 0.3 * 1.0001, what
    else:
        raise ValueError(kind)


def run_case(case, dtype, layout, device):
    x, g, a = case.inputs(dtype, layout, device)
    outs = case.fn(x, g, a, device)
    assert len(outs) == len(case.kinds), case.name
    return x, outs


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=["float32", "float64"])
@pytest.mark.parametrize("case", ALL_CASES, ids=repr)
def test_op_agrees_with_the_cpu_kernel(case, dtype, layout, device):
    """The op on `device` with `layout` input against the CPU kernel on the contiguous input
    (on the CPU itself: every layout gives what the contiguous input gives). Outputs shaped
    like x keep x's memory format."""
    ref_layout = "empty" if layout == "empty" else "contiguous"
    x_ref, want = run_case(case, dtype, ref_layout, "cpu")
    x, got = run_case(case, dtype, layout, device)
    for i, (o, w, k) in enumerate(zip(got, want, case.kinds)):
        what = f"{case.name} output {i} on {device} ({layout}, {dtype})"
        if isinstance(o, torch.Tensor):
            assert o.device.type == device, what
            if o.shape == x.shape and x.numel():
                assert o.stride() == torch.empty_like(x).stride(), \
                    f"{what}: strides {o.stride()}, input {x.stride()}"
        assert_agree(o, w, k, dtype, x_ref, what)


HALF_CASES = [c for c in ELEMENTWISE_CASES if c.half]


@needs_gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", HALF_CASES, ids=repr)
def test_half_input_on_cuda_is_the_float_op_cast_back(case, dtype, layout):
    """half / bfloat16 x (and gradient, alpha) in every layout: outputs shaped like x have x's
    dtype and memory format and equal the float32 CUDA op on x.float() cast back; reduced
    gradients equal the float32 op's."""
    x, g, a = case.inputs(dtype, layout, "cuda")
    got = case.fn(x, g, a, "cuda")
    want = case.fn(x.float(), g.float(), a.float(), "cuda")
    for i, (o, w) in enumerate(zip(got, want)):
        what = f"{case.name} output {i} ({layout}, {dtype})"
        if o.shape == x.shape:
            assert o.dtype == dtype, f"{what}: dtype {o.dtype}"
            if x.numel():
                assert o.stride() == torch.empty_like(x).stride(), f"{what}: strides {o.stride()}"
            torch.testing.assert_close(o.cpu(), w.to(dtype).cpu(), rtol=0, atol=0, equal_nan=True,
                                       msg=lambda m: f"{what}: {m}")
        else:
            assert_agree(o, w.cpu(), REDUCED(), torch.float32, x, what)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", OBSERVER_CASES, ids=repr)
def test_observers_take_half_input_on_cuda(case, dtype):
    """Observers may compute and answer in float32: their statistics of half x equal the
    float32 observer's of x.float() (cast to the answer's dtype)."""
    x, g, a = case.inputs(dtype, "contiguous", "cuda")
    got = case.fn(x, g, a, "cuda")
    want = case.fn(x.float(), g.float(), a.float(), "cuda")
    for i, (o, w, k) in enumerate(zip(got, want, case.kinds)):
        what = f"{case.name} output {i} ({dtype})"
        if isinstance(o, torch.Tensor):
            assert o.dtype in (dtype, torch.float32), what
            w = w.to(o.dtype)
        assert_agree(o, w.cpu() if isinstance(w, torch.Tensor) else w, k, torch.float32, x.float(),
                     what)


# ---- ops on small state tensors ----------------------------------------------------------------

def _state_pairs(device):
    """(name, min_val, max_val, cur_min, cur_max): per tensor, per channel, the initial
    (+inf, -inf) state and batches without finite data."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(6, generator=g), torch.randn(6, generator=g)
    mn, mx = torch.minimum(a, b), torch.maximum(a, b)
    c, d = torch.randn(6, generator=g) * 2, torch.randn(6, generator=g) * 2
    cmn, cmx = torch.minimum(c, d), torch.maximum(c, d)
    cmn[2], cmx[2] = INF, -INF  # a channel without data in this batch
    init_mn, init_mx = torch.tensor(INF), torch.tensor(-INF)
    cases = [("per_tensor", mn[0], mx[0], cmn[0], cmx[0]),
             ("per_channel", mn, mx, cmn, cmx),
             ("first_per_channel_batch", init_mn, init_mx, cmn, cmx),
             ("first_per_tensor_batch", init_mn, init_mx, cmn[1], cmx[1]),
             ("per_tensor_float64", mn[0].double(), mx[0].double(), cmn[0].double(),
              cmx[0].double())]
    return [(n,) + tuple(t.to(device) for t in ts) for n, *ts in cases]


def test_observer_state_ops_agree_with_the_cpu(device):
    """Running min/max, EMA and the qparam formulas (per tensor, per channel, the initial state,
    symmetric / affine / narrow ranges, LSQ and LSQ+ initialisation): exactly the CPU's."""
    for (name, *dev), (_, *cpu) in zip(_state_pairs(device), _state_pairs("cpu")):
        for fn, label in [
            (lambda m, M, cm, cM: ops.observer_running_min_max(m, M, cm, cM), "running"),
            (lambda m, M, cm, cM: ops.observer_ema_min_max(m, M, cm, cM, 0.9), "ema"),
        ]:
            for o, w in zip(fn(*dev), fn(*cpu)):
                assert_agree(o, w, EXACT, torch.float32, w, f"{label} {name}")
        mn, mx = ops.observer_running_min_max(*cpu)
        mn_d, mx_d = ops.observer_running_min_max(*dev)
        for qrange, sym, szp in [((-128, 127), True, 0), ((-127, 127), True, 0),
                                 ((0, 255), False, 0), ((0, 15), False, 0), ((0, 255), True, 128),
                                 ((0, 65535), False, 0)]:
            eps = torch.tensor([torch.finfo(torch.float32).eps], dtype=mn.dtype)
            w = ops.observer_calculate_qparams(mn, mx, *qrange, sym, szp, eps)
            o = ops.observer_calculate_qparams(mn_d, mx_d, *qrange, sym, szp, eps.to(device))
            for oo, ww in zip(o, w):
                assert_agree(oo, ww, EXACT, torch.float32, ww, f"qparams {name} {qrange} {sym}")
        norm = mx.abs() + 0.1
        for sym in (True, False):
            for pot in (False, True):
                eps = torch.tensor([torch.finfo(torch.float32).eps])
                w = ops.observer_lsq_qparams(norm, mn, 0, 255, sym, pot, eps)
                o = ops.observer_lsq_qparams(norm.to(device), mn_d, 0, 255, sym, pot,
                                             eps.to(device))
                for oo, ww in zip(o, w):
                    assert_agree(oo, ww, EXACT, torch.float32, ww, f"lsq {name} {sym} {pot}")
                gmin = mn.min().abs()  # LSQ+ takes the global minimum (>= 0 gives an offset)
                w = ops.observer_lsq_plus_qparams(norm, norm * 0.5, gmin, 0, 255, sym, pot, eps)
                o = ops.observer_lsq_plus_qparams(norm.to(device), norm.to(device) * 0.5,
                                                  gmin.to(device), 0, 255, sym, pot,
                                                  eps.to(device))
                for oo, ww in zip(o, w):
                    assert_agree(oo, ww, EXACT, torch.float32, ww, f"lsq+ {name} {sym} {pot}")


def test_pot_quantization_and_dfq_scale_agree_with_the_cpu(device):
    s = torch.tensor([0.013, 0.25, 0.3, 7.0, 2.0 ** -20], dtype=torch.float64)
    for dtype in FLOATS:
        sc = s.to(dtype).requires_grad_()
        sd = s.to(dtype).to(device).requires_grad_()
        w, o = ops.pot_quantization(sc), ops.pot_quantization(sd)
        assert_agree(o, w.detach(), EXACT, dtype, sc, "pot_quantization")
        w.sum().backward()
        o.sum().backward()
        assert_agree(sd.grad, sc.grad, CLOSE(1e-6, 1e-14), dtype, sc, "pot_quantization grad")
    g = torch.Generator().manual_seed(4)
    w1, w2 = torch.randn(8, 4, 3, 3, generator=g), torch.randn(6, 8, 3, 3, generator=g)
    w1[2] *= 0.01
    w2[:, 5] = 0  # a dead channel keeps scale 1
    dw = torch.randn(16, 1, 3, 3, generator=g)  # a depthwise layer 2 of 16 channels
    w1d = torch.randn(16, 4, 1, 1, generator=g)
    for a, b in [(w1, w2), (w1.transpose(2, 3), w2.transpose(2, 3)), (w1d, dw)]:
        for args in [(), (1e-6, 1.5, 1e-8)]:
            want = ops.dfq_equalization_scale(a, b, *args)
            got = ops.dfq_equalization_scale(a.to(device), b.to(device), *args)
            assert_agree(got, want, EXACT, torch.float32, want, f"dfq {tuple(a.shape)} {args}")


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "sliced"])
@pytest.mark.parametrize("relu", [False, True], ids=["bn", "bn_relu"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_fold_bn_train_agrees_with_the_cpu(with_bias, relu, layout, device):
    """fold_bn_train (outputs, batch statistics, running statistics updated in place) and its
    backward within 1e-5 of the largest value (test_bn_fold.py's measure)."""
    def inputs(dev):
        g = torch.Generator().manual_seed(5)
        x = torch.randn(4, 6, 5, 7, generator=g) * 3 + 1
        s = torch.rand(6, generator=g) + 0.5
        b = torch.randn(6, generator=g) if with_bias else None
        gamma, beta = torch.rand(6, generator=g) + 0.5, torch.randn(6, generator=g)
        dy = torch.randn(4, 6, 5, 7, generator=g)
        x = x.to(dev)
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        elif layout == "sliced":
            big = torch.zeros(4, 6, 5, 14, device=dev)
            big[..., ::2] = x
            x = big[..., ::2]
        t = [v.to(dev) if v is not None else None for v in (s, b, gamma, beta, dy)]
        return x, *t, torch.zeros(6, device=dev), torch.ones(6, device=dev)

    def run(dev):
        x, s, b, gamma, beta, dy, rm, rv = inputs(dev)
        y, mean, rstd = ops.fold_bn_train(x, s, b, gamma, beta, rm, rv, 0.1, 1e-5, relu)
        grads = ops._fold_bn_train_backward(dy, x, s, b, gamma, beta, mean, rstd, relu)
        return [y, mean, rstd, rm, rv], grads

    (want, want_g), (got, got_g) = run("cpu"), run(device)
    for name, o, w in zip(("y", "mean", "rstd", "running_mean", "running_var"), got, want):
        assert_agree(o, w, REDUCED(), torch.float32, w, f"fold_bn_train {name}")
    scale = max(finite_max(w) for w in want_g if w is not None)
    for name, o, w in zip(("x", "scale_factor", "bias", "bn_weight", "bn_bias"), got_g, want_g):
        if w is None:
            assert o is None or not with_bias, name
            continue
        # d_scale_factor and d_bias are ~0 in exact arithmetic (batch norm is scale and shift
        # invariant): everything on the scale of the largest gradient, as test_bn_fold.py.
        torch.testing.assert_close(o.cpu(), w, rtol=0, atol=1e-5 * scale,
                                   msg=lambda m: f"fold_bn_train d{name}: {m}")


# ---- gradcheck in float64 (points away from rounding ties and clamp kinks) ---------------------

def test_gradcheck_on_device(device):
    """The gradients of the CPU suite's gradchecks (DoReFa, AdaRound's alpha, its rectified
    sigmoid and regularizer) and, with the straight-through rounding taken out of the numeric
    side, the input gradients of the per-channel affine, DSQ and NNIE ops."""
    f64 = dict(dtype=torch.float64, device=device)
    g = torch.Generator().manual_seed(6)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(device)

    gradcheck = torch.autograd.gradcheck
    assert gradcheck(ops.dorefa_normalize, (rand(6, 5).requires_grad_(),))
    w = rand(4, 6, scale=0.3)
    scale = torch.tensor([0.05, 0.04, 0.03, 0.02]).to(device)
    zp = torch.zeros(4, dtype=torch.int32, device=device)
    assert gradcheck(lambda a: ops.fake_quantize_adaround_per_channel(
        w, scale, zp, a, 0, -128, 127, False), (rand(4, 6).requires_grad_(),))
    assert gradcheck(lambda a: ops.fake_quantize_adaround_per_tensor(
        w, scale[:1], zp[:1], a, -128, 127, False), (rand(4, 6).requires_grad_(),))
    assert gradcheck(lambda a: ops.adaround_regularizer(a, 3.0), (rand(17).requires_grad_(),))
    assert gradcheck(ops.adaround_rectified_sigmoid,
                     (torch.linspace(-2.2, 2.2, 23, **f64).requires_grad_(),))
    # Per-channel affine: the numeric side of op(t) - (fq(t) - t).detach() is t inside the range.
    pc_scale = torch.tensor([0.1, 0.07, 0.13]).to(device)
    pc_zp = torch.tensor([0, 3, -2], dtype=torch.int32, device=device)
    t = (torch.linspace(-0.41, 0.43, 21, **f64).reshape(7, 3) + 0.013).requires_grad_()

    def per_channel_ste(v):
        out = ops.fake_quantize_per_channel_affine(v, pc_scale, pc_zp, 1, -128, 127)
        return out - (out.detach() - v.detach())
    assert gradcheck(per_channel_ste, (t,))
    # DSQ: the smooth phi with the straight-through round, u = x/s + z inside [qmin, qmax].
    ks = 1 / (1 - 0.4)
    k = torch.log(torch.tensor((ks + 1) / (ks - 1), dtype=torch.float64)).item()

    def dsq_ste(v):
        out = ops.fake_quantize_dsq_per_tensor(v, torch.tensor([0.3]).to(device),
                                               torch.tensor([1]).to(device), -8, 7, 0.4)
        u = v.detach() / 0.3 + 1
        f = torch.floor(u)
        phi = f + 0.5 * ks * torch.tanh(k * (u - f - 0.5)) + 0.5
        return out - (out.detach() - (phi - 1) * 0.3)
    # x/s + z in [-5.6, 6.8], inside [-8, 7]
    assert gradcheck(dsq_ste, (torch.linspace(-2.0, 1.75, 40, **f64).add(0.011).requires_grad_(),))

    def nnie_ste(v):
        out = ops.fake_quantize_nnie(v, torch.tensor(4.0).to(device))
        return out - (out.detach() - v.detach())
    assert gradcheck(nnie_ste, (rand(30).requires_grad_(),))


# ---- device mismatch -----------------------------------------------------------------------

def _mismatch_cases():
    """(argument, call(x_device, arg_device)): the named argument on arg_device, every other
    tensor on x_device."""
    def x(d, shape=(2, 3)):
        return torch.randn(*shape).to(d)

    def t(v, d, dtype=torch.float32):
        return torch.tensor(v, dtype=dtype).to(d)

    def zi(d, n=1):
        return torch.zeros(n, dtype=torch.int32, device=d)

    return [
        ("scale", lambda xd, ad: ops.fake_quantize_per_tensor_affine(
            x(xd), t([0.1], ad), zi(xd), -128, 127)),
        ("zero_point", lambda xd, ad: ops.fake_quantize_per_tensor_affine(
            x(xd), t([0.1], xd), zi(ad), -128, 127)),
        ("grad", lambda xd, ad: ops._fake_quantize_per_tensor_affine_backward(
            x(ad), x(xd), t([0.1], xd), zi(xd), -128, 127)),
        ("scale", lambda xd, ad: ops.fake_quantize_per_channel_affine(
            x(xd), t([0.1] * 3, ad), zi(xd, 3), 1, -128, 127)),
        ("zero_point", lambda xd, ad: ops.fake_quantize_per_channel_affine(
            x(xd), t([0.1] * 3, xd), zi(ad, 3), 1, -128, 127)),
        ("scale", lambda xd, ad: ops.fake_quantize_learnable_per_tensor_affine(
            x(xd), t([0.1], ad), t([0.0], xd), -128, 127, 1.0)),
        ("zero_point", lambda xd, ad: ops.fake_quantize_learnable_per_tensor_affine(
            x(xd), t([0.1], xd), t([0.0], ad), -128, 127, 1.0)),
        ("scale", lambda xd, ad: ops.fake_quantize_learnable_per_channel_affine(
            x(xd), t([0.1] * 2, ad), t([0.0] * 2, xd), 0, -128, 127, 1.0)),
        ("zero_point", lambda xd, ad: ops._fake_quantize_learnable_per_channel_affine_backward(
            x(xd), x(xd), t([0.1] * 2, xd), t([0.0] * 2, ad), 0, -128, 127, 1.0)),
        ("scale", lambda xd, ad: ops.fake_quantize_dsq_per_tensor(
            x(xd), t([0.1], ad), zi(xd), -8, 7, 0.4)),
        ("scale", lambda xd, ad: ops.fake_quantize_dsq_per_channel(
            x(xd), t([0.1] * 3, ad), zi(xd, 3), 1, -8, 7, 0.4)),
        ("scale", lambda xd, ad: ops.fake_quantize_tqt(
            x(xd), t([0.1], ad), t([0.0], xd), -128, 127, 2)),
        ("alpha", lambda xd, ad: ops.fake_quantize_pact(
            x(xd), t([3.0], ad), t([-3.0], xd), t([0.05], xd), zi(xd), -128, 127)),
        ("n_alpha", lambda xd, ad: ops.fake_quantize_pact(
            x(xd), t([3.0], xd), t([-3.0], ad), t([0.05], xd), zi(xd), -128, 127)),
        ("scale", lambda xd, ad: ops.fake_quantize_pact(
            x(xd), t([3.0], xd), t([-3.0], xd), t([0.05], ad), zi(xd), -128, 127)),
        ("data_max", lambda xd, ad: ops.fake_quantize_nnie(x(xd), t(3.0, ad))),
        ("alpha", lambda xd, ad: ops.fake_quantize_adaround_per_tensor(
            x(xd), t([0.1], xd), zi(xd), x(ad), -128, 127)),
        ("scale", lambda xd, ad: ops.fake_quantize_adaround_per_channel(
            x(xd), t([0.1] * 2, ad), zi(xd, 2), x(xd), 0, -128, 127)),
        ("scale", lambda xd, ad: ops.fake_quantize_qdrop_per_tensor(
            x(xd), t([0.1], ad), zi(xd), -128, 127, 1.0)),
        ("scale_factor", lambda xd, ad: ops.fold_bn_train(
            x(xd, (2, 3, 4)), t([1.0] * 3, ad), None, None, None, t([0.0] * 3, xd),
            t([1.0] * 3, xd), 0.1, 1e-5, False)),
        ("running_mean", lambda xd, ad: ops.fold_bn_train(
            x(xd, (2, 3, 4)), t([1.0] * 3, xd), None, None, None, t([0.0] * 3, ad),
            t([1.0] * 3, xd), 0.1, 1e-5, False)),
    ]


MISMATCH = _mismatch_cases()


@needs_gpu
@pytest.mark.parametrize("x_on_cuda", [True, False], ids=["x_cuda", "x_cpu"])
@pytest.mark.parametrize("case", range(len(MISMATCH)),
                         ids=[f"{i}-{name}" for i, (name, _) in enumerate(MISMATCH)])
def test_arguments_on_another_device_than_x_are_an_error(case, x_on_cuda):
    """A qparam on another device than x is a RuntimeError naming the argument and both devices
    (a CUDA kernel must not read a CPU pointer, nor the CPU kernel a device one)."""
    arg, call = MISMATCH[case]
    xd, ad = ("cuda", "cpu") if x_on_cuda else ("cpu", "cuda")
    with pytest.raises(RuntimeError) as info:
        call(xd, ad)
        torch.cuda.synchronize()
    message = str(info.value)
    assert re.search(rf"(?<![A-Za-z_]){arg}(?![A-Za-z_])", message), message
    assert "cpu" in message and "cuda" in message, message


def test_mismatch_cases_run_on_one_device():
    """The calls of the device-mismatch test are valid with every tensor on the CPU (so on the
    GPU they fail for the device alone)."""
    for _, call in MISMATCH:
        call("cpu", "cpu")


# ==== modules and models ===================================================================

_HOST_READS = {torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__float__,
               torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.tolist,
               torch.Tensor.numpy, torch.Tensor.cpu}


def _to_host(func, args, kwargs):
    """Tensor.to(...) with an explicit CPU device: a copy to the host."""
    if func is not torch.Tensor.to:
        return False
    for v in list(args[1:]) + list(kwargs.values()):
        if isinstance(v, (str, torch.device)):
            try:
                if torch.device(v).type == "cpu":
                    return True
            except RuntimeError:
                pass
    return False


class HostReadDetector(TorchFunctionMode):
    """Records every Python-level read of a tensor's values on the host (item, bool(), float(),
    int(), tolist, numpy, cpu, .to("cpu")): each is a device synchronisation on CUDA."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS or _to_host(func, args, kwargs):
            import traceback
            frame = traceback.extract_stack(limit=2)[0]
            self.reads.append(f"{getattr(func, '__name__', func)} at {frame.filename}:"
                              f"{frame.lineno}")
        return func(*args, **kwargs)


@contextmanager
def no_host_sync(device):
    """Fails the test on a host read in Python (every device) and, on CUDA, on any
    synchronisation (torch.cuda.set_sync_debug_mode("error"), which covers the C++ side)."""
    detector = HostReadDetector()
    old = torch.cuda.get_sync_debug_mode() if device == "cuda" else None
    try:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("error")
        with detector:
            yield
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode(old)
    assert not detector.reads, detector.reads


from deploy_helpers import SmallNet  # noqa: E402  (conv-bn-relu, residual, pool, fc)


ACADEMIC_LSQ = {"extra_qconfig_dict": {
    "w_qscheme": {"bit": 8, "symmetry": True, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 8, "symmetry": True, "per_channel": False, "pot_scale": False},
    "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
    "w_observer": "MinMaxObserver", "a_observer": "EMAMinMaxObserver"}}
FLOWS = {"Academic_LSQ": (BackendType.Academic, ACADEMIC_LSQ),
         "Tensorrt": (BackendType.Tensorrt, {})}


def batch(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def calibrated_net(flow, device, net=None, shape=(4, 3, 16, 16)):
    """A network prepared on `device` (the float model moved there first), calibrated on two
    batches in training mode (the BatchNorm statistics QAT will see), then in QAT mode
    (observers off, fake quantization on)."""
    backend, config = FLOWS[flow]
    torch.manual_seed(0)
    net = (net or SmallNet()).to(device).train()
    q = prepare_by_platform(net, backend, copy.deepcopy(config))
    enable_calibration(q)
    with torch.no_grad():
        for seed in (1, 2):
            q(batch(shape, seed).to(device))
    enable_quantization(q)
    return q


def qat_step(model, x, target, opt):
    opt.zero_grad()
    out = model(x)
    loss = (out - target).square().mean()
    loss.backward()
    opt.step()
    return out.detach(), loss.detach()


@pytest.mark.parametrize("flow", FLOWS)
def test_qat_step_has_no_host_synchronisation(flow, device):
    """Forward, backward and SGD step of a calibrated LSQ (Academic) or fixed (Tensorrt) model
    neither read values on the host nor, on CUDA, synchronise with the device."""
    q = calibrated_net(flow, device)
    opt = torch.optim.SGD(q.parameters(), lr=0.01, momentum=0.9)
    x, target = batch((4, 3, 16, 16), 3).to(device), batch((4, 10), 4).to(device)
    qat_step(q, x, target, opt)  # warm-up: allocator, cuDNN and cuBLAS set-up
    before = {n: p.detach().clone() for n, p in q.named_parameters()}
    with no_host_sync(device):
        for _ in range(2):
            qat_step(q, x, target, opt)
    assert any(not torch.equal(before[n], p.detach()) for n, p in q.named_parameters()
               if n.endswith(".scale")), "the step trained no quantizer scale"


@contextmanager
def full_precision_convolutions():
    """cuDNN convolutions in TF32 (torch's default on Ampere and later) round their inputs to 10
    bits: comparisons with the CPU run in float32."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def cosine(a, b):
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(),
                                                 dim=0).item()


@pytest.mark.parametrize("flow", FLOWS)
def test_qat_step_on_device_equals_the_cpu_step(flow, device):
    """From identical state (a deep copy of a model calibrated on the CPU, moved to `device`),
    one QAT step gives the same output, loss, gradients and updated parameters as on the CPU,
    within float rounding (a value at a rounding tie may land one level away on another
    device, so whole tensors are compared by cosine)."""
    cpu = calibrated_net(flow, "cpu")
    dev = copy.deepcopy(cpu).to(device)
    x, target = batch((4, 3, 16, 16), 3), batch((4, 10), 4)
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.01)
    opt_d = torch.optim.SGD(dev.parameters(), lr=0.01)
    out_c, loss_c = qat_step(cpu, x, target, opt_c)
    with full_precision_convolutions():
        out_d, loss_d = qat_step(dev, x.to(device), target.to(device), opt_d)
    assert abs(loss_d.item() - loss_c.item()) <= 1e-3 * abs(loss_c.item())
    assert cosine(out_d.cpu(), out_c) >= 0.999
    params_d = dict(dev.named_parameters())
    # Gradients that are zero in exact arithmetic (a conv bias before BatchNorm, a symmetric
    # zero point) are float noise: directions are compared for the others.
    largest = max(p.grad.norm().item() for p in cpu.parameters() if p.grad is not None)
    checked = 0
    for name, p in cpu.named_parameters():
        pd = params_d[name]
        assert pd.device.type == device, name
        if p.grad is None:
            assert pd.grad is None, name
            continue
        if p.grad.norm() > 1e-4 * largest:
            assert cosine(pd.grad.cpu(), p.grad) >= 0.99, name
            checked += 1
        torch.testing.assert_close(pd.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"{name} after the step: {m}")
    assert checked >= 8
    for (name, b), bd in zip(cpu.named_buffers(), dev.buffers()):
        if b.is_floating_point():
            torch.testing.assert_close(bd.cpu(), b, rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"buffer {name}: {m}")


@pytest.mark.parametrize("target", ["meta", pytest.param("cuda", marks=needs_gpu)])
def test_prepare_puts_quantizers_on_the_model_device(target):
    """prepare_by_platform on a model that lives on another device than the CPU builds its
    quantizers there too (a CUDA model's first forward would otherwise mix devices); the meta
    device proves it here."""
    for flow in FLOWS:
        backend, config = FLOWS[flow]
        q = prepare_by_platform(SmallNet().to(target), backend, copy.deepcopy(config))
        devices = {t.device.type for t in list(q.parameters()) + list(q.buffers())}
        assert devices == {target}, (flow, devices)


# ---- every fake quantizer and observer, calibrated on the device -----------------------------

def _sym(per_channel=False, **kw):
    return dict(dtype=torch.qint8, quant_min=-128, quant_max=127, ch_axis=0 if per_channel else -1,
                qscheme=torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric,
                **kw)


def _quant_type(qtype):
    def set_it(fq):
        fq.set_quant_type(qtype)
    return set_it


# (name, factory, setup after construction, comparison of the output)
QUANTIZERS = [
    (f"Fixed+{o.__name__}{'/per_channel' if pc else ''}",
     lambda o=o, pc=pc: FixedFakeQuantize(o, **_sym(pc)), None, EXACT)
    for o in (obs.MinMaxObserver, obs.EMAMinMaxObserver, obs.MovingAverageMinMaxObserver,
              obs.ClipStdObserver, obs.LSQObserver, obs.LSQPlusObserver, obs.MSEObserver,
              obs.EMAMSEObserver)
    for pc in (False, True)
] + [
    ("Fixed+EMAQuantileObserver", lambda: FixedFakeQuantize(obs.EMAQuantileObserver, **_sym()),
     None, EXACT),
    ("Fixed+MinMaxFloorObserver", lambda: FixedFakeQuantize(obs.MinMaxFloorObserver, **_sym()),
     lambda fq: fq.activation_post_process.set_quant_type("tensor"), EXACT),
    ("Fixed+PoTModeObserver", lambda: FixedFakeQuantize(obs.PoTModeObserver, **_sym()),
     lambda fq: fq.activation_post_process.set_quant_type("param"), EXACT),
    ("Learnable+LSQObserver", lambda: LearnableFakeQuantize(obs.LSQObserver, **_sym()), None,
     EXACT),
    ("Learnable+MinMaxObserver/per_channel",
     lambda: LearnableFakeQuantize(obs.MinMaxObserver, **_sym(True)), None, EXACT),
    ("Learnable+EMAMinMaxObserver/affine", lambda: LearnableFakeQuantize(
        obs.EMAMinMaxObserver, dtype=torch.quint8, qscheme=torch.per_tensor_affine, quant_min=0,
        quant_max=255), None, EXACT),
    ("PACT", lambda: PACTFakeQuantize(obs.EMAMinMaxObserver, alpha=4.0, **_sym()), None, EXACT),
    ("PACT/affine", lambda: PACTFakeQuantize(
        obs.EMAMinMaxObserver, alpha=4.0, dtype=torch.quint8, qscheme=torch.per_tensor_affine,
        quant_min=0, quant_max=255), None, EXACT),
    ("TQT", lambda: TqtFakeQuantize(obs.MinMaxFloorObserver, **_sym()), _quant_type("input"),
     EXACT),
    ("NNIE", lambda: NNIEFakeQuantize(obs.MinMaxObserver, **_sym()), None, NNIE),
    ("DSQ/per_channel", lambda: DSQFakeQuantize(obs.MinMaxObserver, **_sym(True)), None, ROUNDED),
    # tanh's last bit may move a normalised value across a rounding tie
    ("DoReFa", lambda: DoReFaFakeQuantize(obs.MinMaxObserver, **_sym()), None, ROUNDED),
    ("QDrop", lambda: QDropFakeQuantize(obs.EMAMinMaxObserver, **_sym()), None, EXACT),
    ("AdaRound/per_channel", lambda: AdaRoundFakeQuantize(obs.MinMaxObserver, **_sym(True)),
     "adaround", CLOSE(1e-6, 1e-14)),
]
# observers whose statistic is a mean or standard deviation: qparams within 1e-5
_STAT_OBSERVERS = ("ClipStd", "LSQObserver", "LSQPlus")


@pytest.mark.parametrize("entry", QUANTIZERS, ids=[e[0] for e in QUANTIZERS])
def test_quantizer_calibrates_and_trains_on_device_as_on_the_cpu(entry, device):
    """Calibration (observer on: host reads allowed) must work on the device and give the CPU's
    qparams; then, from the same qparams, the QAT forward and backward (observer off) equal the
    CPU's."""
    name, factory, setup, kind = entry
    torch.manual_seed(0)
    cpu = factory()
    if callable(setup):
        setup(cpu)
    dev = copy.deepcopy(cpu).to(device)
    weight = batch((6, 5, 3, 3), 7)
    calib = [weight] if setup == "adaround" else [batch((6, 5, 3, 3), s) * 2 for s in (8, 9)]
    for b in calib:
        cpu(b)
        dev(b.to(device))
    if setup == "adaround":
        cpu.init(weight)
        dev.init(weight.to(device))
    state_c, state_d = cpu.state_dict(), dev.state_dict()
    assert list(state_c) == list(state_d)
    for key, w in state_c.items():
        got = state_d[key]
        assert got.device.type == device, key
        stat = key.rsplit(".", 1)[-1] in ("scale", "min_val", "max_val")
        k = REDUCED() if stat and any(s in name for s in _STAT_OBSERVERS) else EXACT
        if key == "alpha" and setup == "adaround":
            k = CLOSE(1e-5, 1e-12)
        assert_agree(got, w, k, torch.float32, w, f"{name}: {key}")
    # From identical qparams: the QAT forward and backward.
    cpu.load_state_dict({k: v.cpu() for k, v in state_d.items()})
    cpu.disable_observer()
    dev.disable_observer()
    x, g = batch((6, 5, 3, 3), 10) * 2, batch((6, 5, 3, 3), 11)
    params_c = [p for p in cpu.parameters()]
    params_d = [p for p in dev.parameters()]
    xc, xd = x.clone().requires_grad_(), x.to(device).requires_grad_()
    out_c, out_d = cpu(xc), dev(xd)
    out_c.backward(g)
    out_d.backward(g.to(device))
    assert_agree(out_d, out_c, kind, torch.float32, x, f"{name}: output")
    # dx: the straight-through mask (exact), or a transcendental derivative (DSQ, DoReFa)
    dx_kind = {EXACT: EXACT, NNIE: EXACT, ROUNDED: CLOSE(1e-5, 1e-12)}.get(kind, kind)
    assert_agree(xd.grad, xc.grad, dx_kind, torch.float32, x, f"{name}: dx")
    for pc, pd in zip(params_c, params_d):
        if pc.grad is not None:
            assert_agree(pd.grad, pc.grad, REDUCED() if kind == EXACT else CLOSE(2e-6, 1e-13),
                         torch.float32, pc.grad, f"{name}: parameter gradient")


# ---- resnet18 end to end -------------------------------------------------------------------

R18_SHAPE = [2, 3, 64, 64]


def test_resnet18_qat_on_device_deploys_and_runs_in_onnxruntime(device, tmp_path):
    """torchvision's resnet18 (random weights) prepared for Academic with LSQ on the device,
    calibrated on two batches; one QAT step equals the same step on the CPU from identical state
    (a deep copy: loss and logits; the small network's test compares gradients, which on a
    random resnet spread from any one-level flip); three QAT steps with SGD; then moved to the
    CPU, deployed with convert_deploy and run in onnxruntime, agreeing with the prepared model
    as the CPU deploy tests require."""
    import ort
    from deploy_helpers import (activation_tensors, check_lockstep, deploy_copy, export_fakeq,
                                lockstep)
    from test_prepare_by_platform import with_bn_statistics
    ort.require()
    torch.manual_seed(0)
    net = with_bn_statistics(torchvision.models.resnet18(), (4, 3, 64, 64))
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.momentum = 0.1
    q = calibrated_net("Academic_LSQ", device, net, tuple(R18_SHAPE))
    assert {t.device.type for t in q.parameters()} == {device}
    ref = copy.deepcopy(q).cpu()
    x, target = batch(R18_SHAPE, 20), batch((2, 1000), 21) * 0.1
    opt = torch.optim.SGD(q.parameters(), lr=1e-3, momentum=0.9)
    with full_precision_convolutions():
        out_d, loss_d = qat_step(q, x.to(device), target.to(device), opt)
    out_c, loss_c = qat_step(ref, x, target, torch.optim.SGD(ref.parameters(), lr=1e-3,
                                                             momentum=0.9))
    assert abs(loss_d.item() - loss_c.item()) <= 0.02 * abs(loss_c.item())
    assert cosine(out_d.cpu(), out_c) >= 0.97
    for step in range(2):
        qat_step(q, batch(R18_SHAPE, 22 + step).to(device), target.to(device), opt)
    q = q.cpu().eval()
    convert_deploy(q, BackendType.Academic, {"x": R18_SHAPE}, output_path=str(tmp_path),
                   model_name="r18")
    with open(tmp_path / "r18.onnx", "rb") as f:
        deployed = f.read()
    merged = deploy_copy(q)
    tensors = activation_tensors(export_fakeq(merged, R18_SHAPE, tmp_path))
    assert tensors
    stats, ours, theirs = lockstep(merged, batch(R18_SHAPE, 30), deployed, tensors)
    assert len(stats) == len(tensors)
    check_lockstep(stats, identical=0.995)  # Academic's measure in test_convert_deploy.py
    assert (ours - theirs).abs().max() <= 1e-3 * max(1.0, ours.abs().max().item())


# ---- the Python side of "no host synchronisation" --------------------------------------------

def test_quantizer_switches_are_read_on_the_host_only_after_they_change():
    """QuantizeBase keeps the switches' values on the host and reads a switch buffer (a CUDA
    synchronisation) only when it changed since: a direct write, load_state_dict, .to() and
    unpickling are all seen; enable_* and disable_* cost no read."""
    import io
    fq = FixedFakeQuantize(obs.MinMaxObserver, **_sym())
    x = batch((64,), 12)
    fq(x)
    fq.disable_observer()
    with no_host_sync("cpu"):
        fq(x)
        fq.enable_fake_quant(False)
        assert torch.equal(fq(x), x)
        fq.enable_fake_quant(True)
        quantized = fq(x)
    assert not torch.equal(quantized, x)
    fq.fake_quant_enabled[0] = 0  # a direct write (advanced_ptq does this)
    assert torch.equal(fq(x), x)
    fq.fake_quant_enabled.fill_(1)
    assert torch.equal(fq(x), quantized)
    state = fq.state_dict()
    state["fake_quant_enabled"] = torch.tensor([0], dtype=torch.uint8)
    fq.load_state_dict(state)
    assert torch.equal(fq(x), x)
    fq.enable_fake_quant()
    moved = copy.deepcopy(fq).to(torch.float64)  # new buffer objects
    moved.fake_quant_enabled[0] = 0
    assert torch.equal(moved(x.double()), x.double()) and torch.equal(fq(x), quantized)
    buf = io.BytesIO()
    torch.save(fq, buf)  # the host-side cache holds weak references: not pickled
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert torch.equal(loaded(x), quantized)
    loaded.fake_quant_enabled[0] = 0
    assert torch.equal(loaded(x), x)


def test_nnie_quantizer_checks_data_max_without_a_host_read_per_step():
    """NNIEFakeQuantize refuses an uncalibrated data_max, but once checked it reads nothing on
    the host in a QAT step; a new observation or a loaded state is checked again."""
    fq = NNIEFakeQuantize(obs.MinMaxObserver, **_sym())
    fq.disable_observer()
    with pytest.raises(RuntimeError, match="calibrate"):
        fq(batch((10,), 13))
    fq.enable_observer()
    fq(torch.tensor([-3.0, 2.0]))
    fq.disable_observer()
    x = batch((100,), 14).requires_grad_()
    fq(x)
    with no_host_sync("cpu"):
        y = fq(x)
        y.sum().backward()
    assert torch.equal(y, ops.fake_quantize_nnie(x.detach(), torch.tensor(3.0)))
    fresh = NNIEFakeQuantize(obs.MinMaxObserver, **_sym())
    fresh.disable_observer()
    fq.load_state_dict(fresh.state_dict())  # back to data_max -inf, no observed range
    with pytest.raises(RuntimeError, match="data_max is -inf"):
        fq(x)
