"""fake_quantize_per_token against a reference written here with torch ops, bit for bit: INT4 and
INT8, symmetric and affine, signed and unsigned ranges, FP8 E4M3 / E5M2, float32 and float64;
float16 / bfloat16 as the float32 op cast back once. The same numbers as the observer followed
by the per-channel fake quantizer on the rows (and the FP8 one). Edge rows (zeros, NaN, +-inf,
ties at .5, values at the range's ends), strided and empty input, the straight-through gradient,
the errors, fake tensors, torch.compile and torch.export."""
import pytest
import torch

import mqbench  # noqa: F401

ops = torch.ops.mqbench
EPS = torch.finfo(torch.float32).eps
FP8 = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}


def reference(x, qmin, qmax, symmetric, fmt="int"):
    """The op's formulas with torch ops. The range: the row's min / max without NaN, in float32,
    widened to include 0, +-inf counted as +-FLT_MAX. int: torch's observer qparams (s clamped
    to float32 eps, z rounded half to even and clamped; symmetric z = 0, or (qmin + qmax + 1) // 2
    for an unsigned range), then (clamp(round(x * (1 / s)) + z, qmin, qmax) - z) * s. fp8:
    s = max(amax / max, eps), then the float8 cast of x / s (E4M3 clamped to +-448 first)
    times s."""
    xc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    inf = float("inf")
    mn = torch.where(torch.isnan(xc), inf, xc).amin(-1, keepdim=True).float()
    mx = torch.where(torch.isnan(xc), -inf, xc).amax(-1, keepdim=True).float()
    no_range = ~(mn <= mx)  # a row of NaN only: s = 1, z = 0
    largest = torch.finfo(torch.float32).max
    # widened to include 0; +-inf count as +-largest
    mn, mx = mn.clamp(-largest, 0.0), mx.clamp(0.0, largest)
    if fmt == "int":
        if symmetric:
            s = torch.maximum(-mn, mx) / ((qmax - qmin) / 2)
            z = torch.full_like(s, 0.0 if qmin < 0 else float((qmin + qmax + 1) // 2))
        else:
            s = ((mx - mn) / (qmax - qmin))
        s = s.clamp(min=EPS).nan_to_num(posinf=largest)
        if not symmetric:
            z = (qmin - torch.round(mn / s)).clamp(qmin, qmax)
        s = torch.where(no_range, 1.0, s)
        z = torch.where(no_range, 0.0, z)
        inv = (1.0 / s).to(xc.dtype)
        q = torch.round(xc * inv) + z.to(xc.dtype)
        y = (q.clamp(qmin, qmax) - z.to(xc.dtype)) * s.to(xc.dtype)
    else:
        fp8, m = FP8[fmt]
        s = (torch.maximum(-mn, mx) / m).clamp(min=EPS).nan_to_num(posinf=largest)
        s = torch.where(no_range, 1.0, s)
        v = (xc / s.to(xc.dtype)).float()
        if fmt == "fp8_e4m3":
            v = v.clamp(-m, m)
        y = v.to(fp8).to(xc.dtype) * s.to(xc.dtype)
    return y.to(x.dtype)


def assert_bits_equal(out, ref):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(out), nan)
    bad = (out != ref) & ~nan
    assert not bad.any(), (out[bad][:8], ref[bad][:8])
    itype = {torch.float64: torch.int64, torch.float32: torch.int32}.get(out.dtype, torch.int16)
    same = out.contiguous().view(itype) == ref.contiguous().view(itype)
    assert (same | nan).all()  # the sign of zero too


def rows(dtype=torch.float64, seed=0, shape=(6, 5, 70)):
    """Rows spanning magnitudes 1e-6 to 1e6, some all positive / all negative, with the edge
    rows: zeros, a NaN, only NaN, ties at .5 of a symmetric INT4 step."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    x = x * torch.logspace(-6, 6, shape[-2], dtype=torch.float64)[:, None]
    n = shape[-1]
    x[0, 0] = 0.0
    x[0, 1, min(3, n - 1)] = float("nan")
    x[0, 2] = float("nan")
    x[1, 0] = x[1, 0].abs() + 0.5        # positive only
    x[1, 1] = -x[1, 1].abs() - 0.5       # negative only
    if n >= 16:  # ties for amax 7.5 (s = 1 in symmetric INT4)
        x[2, 0, :16] = torch.arange(-8, 8, dtype=torch.float64) + 0.5
        x[2, 0, 16:] = 0.25
    return x.to(dtype)


CASES = [(-8, 7, True, "int"), (-8, 7, False, "int"), (-128, 127, True, "int"),
         (-128, 127, False, "int"), (0, 255, True, "int"), (0, 255, False, "int"),
         (0, 15, True, "int"), (-7, 7, True, "int"), (0, 0, False, "fp8_e4m3"),
         (0, 0, False, "fp8_e5m2")]


@pytest.mark.parametrize("qmin,qmax,symmetric,fmt", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bit_exact_against_the_reference(qmin, qmax, symmetric, fmt, dtype):
    x = rows(dtype)
    assert_bits_equal(ops.fake_quantize_per_token(x, qmin, qmax, symmetric, fmt),
                      reference(x, qmin, qmax, symmetric, fmt))


@pytest.mark.parametrize("qmin,qmax,symmetric,fmt", CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_are_the_float_op_cast_back(qmin, qmax, symmetric, fmt, dtype):
    x = rows(dtype, seed=1, shape=(6, 5, 67))
    out = ops.fake_quantize_per_token(x, qmin, qmax, symmetric, fmt)
    assert out.dtype == dtype
    want = ops.fake_quantize_per_token(x.float(), qmin, qmax, symmetric, fmt).to(dtype)
    assert_bits_equal(out, want)
    assert_bits_equal(out, reference(x, qmin, qmax, symmetric, fmt))


@pytest.mark.parametrize("n", [1, 3, 8, 17, 64, 4096 + 5])
def test_row_lengths_across_the_vector_width(n):
    x = rows(torch.float32, seed=2, shape=(3, 4, n))
    for case in CASES:
        assert_bits_equal(ops.fake_quantize_per_token(x, *case), reference(x, *case))


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("qmin,qmax", [(-8, 7), (0, 255)])
def test_the_observer_then_the_per_channel_quantizer(qmin, qmax, symmetric):
    """The same numbers as MQBench's observer qparams and the per-channel affine fake quantizer
    on the rows (the channels of the [rows, n] view)."""
    x = rows(torch.float32, seed=3)[1:].reshape(-1, 70)  # rows with numbers only
    mn, mx = x.amin(-1), x.amax(-1)
    zs = 0 if qmin < 0 else (qmin + qmax + 1) // 2
    s, z = ops.observer_calculate_qparams(mn, mx, qmin, qmax, symmetric, zs,
                                          torch.tensor([EPS]))
    want = ops.fake_quantize_per_channel_affine(x, s.float(), z, 0, qmin, qmax)
    assert_bits_equal(ops.fake_quantize_per_token(x, qmin, qmax, symmetric), want)


@pytest.mark.parametrize("fmt", list(FP8))
def test_fp8_is_the_fp8_observer_then_the_fp8_quantizer(fmt):
    x = rows(torch.float32, seed=4)[1:].reshape(-1, 70)
    m = int(FP8[fmt][1])
    s, _ = ops.observer_calculate_qparams(x.amin(-1), x.amax(-1), -m, m, True, 0,
                                          torch.tensor([EPS]))
    want = ops.fake_quantize_fp8(x, s.float(), 0, fmt)
    assert_bits_equal(ops.fake_quantize_per_token(x, 0, 0, True, fmt), want)


def test_documented_edge_rows():
    x = torch.zeros(5, 6)
    x[1] = torch.tensor([1.0, float("nan"), -2.0, 0.5, 3.0, -0.25])
    x[2] = float("nan")
    x[3] = torch.tensor([float("inf"), 1.0, -1.0, 0.0, 2.0, -3.0])
    x[4] = torch.tensor([1.0, float("nan"), -2.0, 0.5, 3.0, -0.25])
    x[4, 1] = 3.0  # row 1 without its NaN
    for case in CASES:
        y = ops.fake_quantize_per_token(x, *case)
        assert torch.equal(y[0], torch.zeros(6)), case                 # zeros give zeros
        assert torch.isnan(y[1, 1]) and torch.isnan(y[2]).all(), case  # NaN stays NaN
        keep = [0, 2, 3, 4, 5]                                         # and does not widen
        assert torch.equal(y[1, keep], ops.fake_quantize_per_token(x[4:5], *case)[0, keep])
        # a row with inf: a huge scale, finite values at the zero point's level (0), inf at the
        # outermost level
        assert torch.equal(y[3, 1:], torch.zeros(5)), case
        assert y[3, 0] > 1e37, case


def test_the_range_ends_and_zero():
    x = torch.tensor([[-3.0, -1.0, 0.0, 2.0, 5.0]])
    # INT8 affine: s = 8 / 255, z = -128 - round(-3 / s) = -32; the ends within half a step,
    # zero exact
    y = ops.fake_quantize_per_token(x, -128, 127, False)
    s = 8.0 / 255
    assert (y - x).abs().max() <= s / 2 and y[0, 2] == 0.0
    assert y[0, 0] == -96 * torch.tensor(s) and y[0, 4] == 159 * torch.tensor(s)
    # symmetric INT4: s = amax / 7.5 (torch's formula), so +amax rounds to 7.5 and clips to 7:
    # the positive end loses half a step; the negative end -7.5 -> -8 (half to even) is a level
    y = ops.fake_quantize_per_token(x, -8, 7, True)
    s = torch.tensor(5.0) / 7.5
    assert torch.equal(y, torch.tensor([[-4.0, -2.0, 0.0, 3.0, 7.0]]) * s)
    y = ops.fake_quantize_per_token(-x, -8, 7, True)
    assert torch.equal(y, torch.tensor([[4.0, 2.0, 0.0, -3.0, -8.0]]) * s)


def test_strided_and_empty_input():
    x = rows(torch.float32, seed=5)
    want = ops.fake_quantize_per_token(x, -8, 7, True)
    t = x.transpose(0, 1).contiguous().transpose(0, 1)
    out = ops.fake_quantize_per_token(t, -8, 7, True)
    assert out.is_contiguous() and torch.equal(out.nan_to_num(7.0), want.nan_to_num(7.0))
    big = torch.zeros(6, 5, 140)
    big[..., ::2] = x
    assert torch.equal(ops.fake_quantize_per_token(big[..., ::2], -8, 7, True).nan_to_num(7.0),
                       want.nan_to_num(7.0))
    # the last axis as a column of a transposed matrix
    m = torch.randn(40, 9)
    assert torch.equal(ops.fake_quantize_per_token(m.T, -128, 127, False),
                       ops.fake_quantize_per_token(m.T.contiguous(), -128, 127, False))
    for shape in [(0, 16), (4, 0), (2, 0, 3)]:
        assert ops.fake_quantize_per_token(torch.empty(shape), -8, 7, True).shape == shape
    one = torch.tensor([-2.5, 1.0])  # a 1-d tensor is one row
    assert torch.equal(ops.fake_quantize_per_token(one, -8, 7, True),
                       ops.fake_quantize_per_token(one[None], -8, 7, True)[0])


@pytest.mark.parametrize("fmt", ["int", "fp8_e4m3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_gradient_is_the_identity(fmt, dtype):
    x = rows(dtype, seed=6).nan_to_num(0.0).requires_grad_()
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    ops.fake_quantize_per_token(x, -8, 7, True, fmt).backward(dy)
    assert torch.equal(x.grad, dy)


def test_errors_name_the_offending_value():
    x = torch.randn(3, 8)
    with pytest.raises(RuntimeError, match=r"quant_min \(7\) must be < quant_max \(7\)"):
        ops.fake_quantize_per_token(x, 7, 7, True)
    with pytest.raises(RuntimeError, match=r"quant_min \(8\) must be <= quant_max \(-8\)"):
        ops.fake_quantize_per_token(x, 8, -8, True)
    with pytest.raises(RuntimeError, match="format must be 'int', 'fp8_e4m3' or 'fp8_e5m2', "
                                           "got 'int4'"):
        ops.fake_quantize_per_token(x, -8, 7, True, "int4")
    with pytest.raises(RuntimeError, match=r"exceeds \+-2\^24"):
        ops.fake_quantize_per_token(x, 0, 1 << 25, False)
    with pytest.raises(RuntimeError, match="x must have at least one dimension"):
        ops.fake_quantize_per_token(torch.tensor(1.0), -8, 7, True)
    with pytest.raises(RuntimeError, match="got dtype Long"):
        ops.fake_quantize_per_token(torch.ones(2, 3, dtype=torch.long), -8, 7, True)
    # FP8 ignores the integer range: any values pass
    assert torch.equal(ops.fake_quantize_per_token(x, 5, -5, False, "fp8_e4m3"),
                       ops.fake_quantize_per_token(x, 0, 0, True, "fp8_e4m3"))


def test_fake_tensors_compile_and_export():
    x = rows(torch.float32, seed=8).nan_to_num(0.0)
    meta = ops.fake_quantize_per_token(torch.empty(2, 3, 70, device="meta"), -8, 7, True)
    assert meta.shape == (2, 3, 70) and meta.device.type == "meta"

    class W4A4(torch.nn.Module):
        def forward(self, t):
            return ops.fake_quantize_per_token(t * 2.0, -8, 7, True) + \
                ops.fake_quantize_per_token(t, 0, 0, True, "fp8_e4m3")

    model = W4A4()
    want = model(x)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), want)
    exported = torch.export.export(model, (x,))
    assert sum(n.target == ops.fake_quantize_per_token.default
               for n in exported.graph.nodes) == 2
    assert torch.equal(exported.module()(x), want)
    xa = x.clone().requires_grad_()
    compiled(xa).sum().backward()
    assert torch.equal(xa.grad, torch.full_like(x, 3.0))


def test_both_cpu_kernels_give_the_same_bits():
    """The baseline and avx2 copies of the CPU kernel, in two processes."""
    import os
    import subprocess
    import sys
    code = ("import sys, torch, mqbench; g = torch.Generator().manual_seed(0); out = b''\n"
            "for dt in (torch.float32, torch.float64, torch.float16):\n"
            "    x = (torch.randn(64, 1031, generator=g, dtype=torch.float64) * "
            "torch.logspace(-4, 4, 64, dtype=torch.float64)[:, None]).to(dt)\n"
            "    for a in ((-8, 7, True, 'int'), (-128, 127, False, 'int'), (0, 255, True, 'int'),"
            " (0, 0, True, 'fp8_e4m3'), (0, 0, True, 'fp8_e5m2')):\n"
            "        y = torch.ops.mqbench.fake_quantize_per_token(x, *a)\n"
            "        out += y.view(torch.uint8).numpy().tobytes()\n"
            "sys.stdout.buffer.write(out)")
    root = os.path.join(os.path.dirname(__file__), "..", "..", "..")
    outs = []
    for cap in ("default", "avx2"):
        env = dict(os.environ, MQBENCH_CPU_CAPABILITY=cap,
                   PYTHONPATH=os.pathsep.join([os.path.join(root, "python"),
                                               os.environ.get("PYTHONPATH", "")]))
        outs.append(subprocess.run([sys.executable, "-c", code], cwd=root, env=env,
                                   capture_output=True, check=True).stdout)
    assert len(outs[0]) > 100000
    assert outs[0] == outs[1]
