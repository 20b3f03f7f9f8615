"""The harness of the CUDA tests (test_cuda_*.py): which device runs, the inputs, and how a
result on the device is compared with the CPU kernel's.

The CPU kernels are the verified references (test_affine_ops.py, test_algorithm_ops.py,
test_observers.py, test_bn_fold.py check them against the spec's formulas and torch's ops).
Every op of torch.ops.mqbench runs on the same inputs on both devices:

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

Tests that need a GPU skip, with the reason printed (pytest -rs), where none is present: the
``needs_gpu`` mark here, and the ``device`` fixture (conftest.py) whose "cuda" case carries it.
CI has no GPU, the GPU machine runs them. The rest of each test's logic runs here: the op and
flow tests are parametrized by device, and their "cpu" case runs the same inputs, harness and
comparisons on the CPU (each op on every layout against the contiguous input; the flows with a
host-read detector in place of CUDA's sync check).
"""
from contextlib import contextmanager

import pytest
import torch
from torch.overrides import TorchFunctionMode

ops = torch.ops.mqbench

HAS_CUDA = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_CUDA,
                               reason="no CUDA device (CI has none; the GPU machine runs these)")

# "cpu": the same test on the CPU (the harness proven here); "cuda": the GPU run.
DEVICES = ["cpu", pytest.param("cuda", marks=needs_gpu)]


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


# ==== comparisons ===============================================================================

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


CH_AXES = [0, 1, -1]


def finite_max(t):
    t = t.detach().double()
    t = t[torch.isfinite(t)]
    return float(t.abs().max()) if t.numel() else 0.0


def assert_agree(got, want, kind, dtype, x, what):
    """got (any device) against want (CPU) by comparison kind."""
    if not isinstance(want, torch.Tensor):
        assert got == want, f"{what}: {got} != {want}"
        return
    assert got is not None, f"{what}: None, expected a tensor like the CPU's"
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


def check_op_agrees_with_the_cpu_kernel(case, dtype, layout, device):
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


def check_half_input_is_the_float_op_cast_back(case, dtype, layout):
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


def batch(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ==== host reads ==================================================================================

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
