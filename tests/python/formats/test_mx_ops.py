"""MXFP8 / MXFP4 / NVFP4 fake quantization (``fake_quantize_mx``, ``fake_quantize_nvfp4``)
against torchao 0.18's reference implementations, bit for bit, and against an independent scalar
reference written from the specs (OCP MX v1.0 section 6.3; NVIDIA's NVFP4 two-level scaling).

torchao's references used: ``to_mx(x, elem, 32, ScaleCalculationMode.FLOOR)`` then
``to_dtype(...)`` (FLOOR is the OCP spec's ``2^(floor(log2(amax)) - emax_elem)`` scale, the one
TensorRT and the spec's reference code use), and ``NVFP4Tensor.to_nvfp4(x,
per_tensor_scale=per_tensor_amax_to_scale(amax)).dequantize()`` (the two-level scaling of
``nvfp4_quantize``). One deliberate difference: a block whose amax is below 2^(-127 + emax_elem)
gets the smallest E8M0 scale 2^-127; torchao's FLOOR divides by 2^-126 there (its float32 clamp)
but multiplies back by 2^-127, halving the block. We follow the spec (both 2^-127); those blocks
are checked against the scalar reference instead.
"""
import math

import pytest
import torch

ops = torch.ops.mqbench

mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402

from reference import round_grid  # noqa: E402

ELEM = {"mxfp8_e4m3": torch.float8_e4m3fn, "mxfp4": torch.float4_e2m1fn_x2}
EMAX = {"mxfp8_e4m3": 8, "mxfp4": 2}


def randn(*shape, seed=0, scale=1.0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


def torchao_mx(x, fmt, block=32):
    scale, data = mx.to_mx(x.contiguous(), ELEM[fmt], block, ScaleCalculationMode.FLOOR)
    return mx.to_dtype(data, scale, ELEM[fmt], block, torch.float32).reshape(x.shape)


def torchao_nvfp4(x, amax):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    t = nv.NVFP4Tensor.to_nvfp4(x2, per_tensor_scale=nv.per_tensor_amax_to_scale(amax))
    return t.dequantize(torch.float32).reshape(x.shape)


def assert_bits_equal(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


# ---- an independent scalar reference, from the specs ---------------------------------------

def _grid(fmt):
    """The non-negative values of the element format, in encoding order (so an even index is an
    even mantissa: the tie-breaking rule)."""
    if fmt in ("mxfp4", "e2m1"):
        return [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    bits = torch.arange(0, 0x7F, dtype=torch.uint8)  # 0x7f is NaN in E4M3FN
    return bits.view(torch.float8_e4m3fn).float().tolist()


GRID = {"mxfp8_e4m3": _grid("mxfp8_e4m3"), "mxfp4": _grid("mxfp4")}



def scalar_mx(x, fmt, block=32):
    """OCP MX v1.0: X = 2^(floor(log2(amax)) - emax_elem) (>= 2^-127, the smallest E8M0), each
    element round(x / X) * X on the element grid, NaN blocks NaN."""
    rows = x.reshape(-1, x.shape[-1]).double().tolist()
    out = []
    for row in rows:
        res = []
        for c in range(0, len(row), block):
            blk = row[c:c + block]
            if any(math.isnan(v) for v in blk):
                res += [math.nan] * len(blk)
                continue
            amax = max(abs(v) for v in blk)
            if math.isinf(amax):
                e = 128 - EMAX[fmt]
            elif amax == 0 or amax < 2.0 ** -126:  # zero, float32 subnormal: exponent field 0
                e = -127
            else:
                e = max(math.floor(math.log2(amax)) - EMAX[fmt], -127)
            X = 2.0 ** e
            res += [round_grid(v / X, GRID[fmt]) * X for v in blk]
        out.append(res)
    return torch.tensor(out, dtype=torch.float64).to(torch.float32).reshape(x.shape)


# ---- MX against torchao ------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4"])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 37.0, 3e4])
def test_mx_random_matches_torchao(fmt, scale):
    x = randn(16, 256, seed=3, scale=scale)
    # blocks of very different ranges inside one tensor
    x[1] *= 1e-5
    x[2, :32] *= 1e6
    assert_bits_equal(ops.fake_quantize_mx(x, fmt), torchao_mx(x, fmt))


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4"])
def test_mx_random_matches_scalar_reference(fmt):
    x = randn(4, 96, seed=5, scale=3.0)
    assert_bits_equal(ops.fake_quantize_mx(x, fmt), scalar_mx(x, fmt))


def _tie_block(fmt, e):
    """A block whose amax sets X = 2^e and whose other elements sit exactly halfway between
    neighbouring grid values (ties) or on them, both signs."""
    grid = GRID[fmt]
    X = 2.0 ** e
    vals = [grid[-1] * X]  # amax on the largest grid value
    for a, b in zip(grid[:-1], grid[1:]):
        vals += [(a + b) / 2 * X, -(a + b) / 2 * X, b * X]
    vals = (vals * 32)[:32]
    return vals


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4"])
def test_mx_edge_values_match_torchao_and_spec(fmt):
    emax = EMAX[fmt]
    maxe = GRID[fmt][-1]
    tiny = torch.finfo(torch.float32).tiny
    blocks = [
        _tie_block(fmt, -3),
        _tie_block(fmt, 5),
        [0.0] * 32,                                               # all-zero block
        [-0.0] * 31 + [0.0],
        [maxe * 2.0 ** 100] + [-maxe * 2.0 ** 100] + [1.0] * 30,  # +-amax
        [2.0 ** (emax + 1) * 0.999] + [1e-3] * 31,                # amax just below a power of 2
        [2.0 ** emax * 1.9999] + [2.0 ** emax * 1.75] * 31,       # element saturation (> max_elem)
        [1e-38, 1e-39, -1e-40] + [1e-30] * 29,                    # float32 subnormals, small amax
        [tiny * 2 ** 9] + [tiny * 3] * 31,                        # amax 2^-117
        [float("nan")] + [1.0] * 31,                              # NaN: the whole block NaN
        [float("inf")] + [1.0] * 31,                              # inf saturates to inf
        [float("-inf")] + [-2.0] * 31,
        [3.0e38, -3.3e38] + [1.0] * 30,                           # amax near float32's max
    ]
    x = torch.tensor(blocks, dtype=torch.float32).reshape(1, -1)
    ours = ops.fake_quantize_mx(x, fmt)
    assert_bits_equal(ours, torchao_mx(x, fmt))
    assert_bits_equal(ours, scalar_mx(x, fmt))
    y = ours.reshape(-1, 32)
    assert torch.isnan(y[9]).all()
    assert y[10, 0] == float("inf") and (y[10, 1:] == 0).all()
    assert (y[2] == 0).all()


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4"])
def test_mx_smallest_scale_follows_spec(fmt):
    """amax < 2^(-127 + emax_elem): the E8M0 scale is 2^-127 on both sides (the spec), where
    torchao's FLOOR quantizes with 2^-126 and dequantizes with 2^-127."""
    x = torch.tensor([[1.5 * 2.0 ** -126, 2.0 ** -127, -1.5 * 2.0 ** -128, 0.0] * 8])
    ours = ops.fake_quantize_mx(x, fmt)
    assert_bits_equal(ours, scalar_mx(x, fmt))
    assert not torch.equal(ours, torchao_mx(x, fmt))  # the documented difference


# ---- MX: layouts, shapes, dtypes, gradient -----------------------------------------------------

@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4"])
def test_mx_axis_tail_and_strides(fmt):
    x = randn(6, 70, 5, seed=7, scale=2.0)
    # blocks along axis 1; 70 = 2 * 32 + 6: the last block is as if zero-padded
    ours = ops.fake_quantize_mx(x, fmt, 32, 1)
    padded = torch.cat([x.movedim(1, -1), torch.zeros(6, 5, 26)], -1)
    ref = torchao_mx(padded, fmt)[..., :70].movedim(-1, 1)
    assert_bits_equal(ours, ref)
    assert ours.is_contiguous()
    # a strided view gives the same values as its contiguous copy
    xt = randn(64, 9, seed=8).t()
    assert_bits_equal(ops.fake_quantize_mx(xt, fmt), ops.fake_quantize_mx(xt.contiguous(), fmt))
    # float64 is computed in float32
    xd = x.double()
    out = ops.fake_quantize_mx(xd, fmt, 32, 1)
    assert out.dtype == torch.float64
    assert_bits_equal(out.float(), ours)
    # 0-dim and empty
    assert_bits_equal(ops.fake_quantize_mx(torch.tensor(5.0), fmt),
                      scalar_mx(torch.tensor([[5.0]]), fmt).reshape(()))
    assert ops.fake_quantize_mx(torch.empty(0, 32), fmt).shape == (0, 32)
    # other block sizes (16, 8) agree with torchao's
    x2 = randn(12, 160, seed=9, scale=5.0)
    for block in (16, 8):
        assert_bits_equal(ops.fake_quantize_mx(x2, fmt, block), torchao_mx(x2, fmt, block))


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4", "nvfp4"])
def test_block_size_larger_than_the_axis_is_one_block(fmt):
    # a block_size near INT64_MAX: one block per row, as any block_size >= the axis' size (the
    # block count ceil(cols / block) must not overflow into "no blocks" and an unwritten output)
    x = randn(3, 40, seed=11, scale=3.0)
    amax = x.abs().max()
    run = (lambda b: ops.fake_quantize_nvfp4(x, amax, b)) if fmt == "nvfp4" else \
        (lambda b: ops.fake_quantize_mx(x, fmt, b))
    one_block = run(40)
    for block in (41, 2**62, 2**63 - 1):
        assert_bits_equal(run(block), one_block)


def test_mx_errors():
    x = torch.randn(2, 32)
    with pytest.raises(RuntimeError, match='elem_dtype must be "mxfp8_e4m3", "mxfp6_e3m2", "mxfp6_e2m3" or "mxfp4"'):
        ops.fake_quantize_mx(x, "mxfp6")
    with pytest.raises(RuntimeError, match="block_size must be positive, got 0"):
        ops.fake_quantize_mx(x, "mxfp4", 0)
    with pytest.raises(RuntimeError, match="axis 2 is out of range"):
        ops.fake_quantize_mx(x, "mxfp4", 32, 2)
    with pytest.raises(RuntimeError, match="call x.float"):
        ops.fake_quantize_mx(x.half(), "mxfp4")


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4"])
def test_mx_straight_through_gradient(fmt):
    x = randn(3, 64, seed=9).requires_grad_()
    dy = randn(3, 64, seed=10)
    ops.fake_quantize_mx(x, fmt).backward(dy)
    assert_bits_equal(x.grad, dy)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4"])
def test_mx_both_cpu_capabilities_agree(fmt, monkeypatch):
    """The avx2 copy (auto-vectorised loops) and the baseline copy of the kernel agree; run in a
    subprocess, since the capability is read once per process."""
    import subprocess
    import sys
    import os
    code = ("import sys, torch; sys.path.insert(0, 'python'); import mqbench; "
            "g = torch.Generator().manual_seed(1); x = torch.randn(64, 512, generator=g) * 10; "
            "x[0, :5] = float('nan'); x[1, 3] = float('inf'); x[2] = 0; "
            f"y = torch.ops.mqbench.fake_quantize_mx(x, '{fmt}'); "
            "a = torch.tensor([30.0]); z = torch.ops.mqbench.fake_quantize_nvfp4(x, a); "
            "sys.stdout.buffer.write(y.numpy().tobytes() + z.numpy().tobytes())")
    root = os.path.join(os.path.dirname(__file__), "..", "..", "..")
    outs = []
    for cap in ("default", "avx2"):
        env = dict(os.environ, MQBENCH_CPU_CAPABILITY=cap)
        outs.append(subprocess.run([sys.executable, "-c", code], cwd=root, env=env,
                                   capture_output=True, check=True).stdout)
    assert len(outs[0]) == 2 * 64 * 512 * 4
    assert outs[0] == outs[1]


# ---- NVFP4 against torchao ---------------------------------------------------------------------

@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_nvfp4_random_matches_torchao(scale):
    x = randn(8, 256, seed=11, scale=scale)
    x[3] *= 1e-4  # small blocks: their E4M3 scales go subnormal-free (clamped at 2^-6)
    amax = x.abs().max()
    assert_bits_equal(ops.fake_quantize_nvfp4(x, amax), torchao_nvfp4(x, amax))
    # a calibrated amax below the data's: blocks above it saturate, as in torchao
    small = amax * 0.3
    assert_bits_equal(ops.fake_quantize_nvfp4(x, small), torchao_nvfp4(x, small))
    # one above the data's (an EMA from larger batches)
    assert_bits_equal(ops.fake_quantize_nvfp4(x, amax * 7.3), torchao_nvfp4(x, amax * 7.3))


def test_nvfp4_edge_values_match_torchao():
    grid = GRID["mxfp4"]
    ties = []
    for a, b in zip(grid[:-1], grid[1:]):
        ties += [(a + b) / 2, -(a + b) / 2]
    blocks = [
        [6.0] + ties + [b for b in grid[1:]][:1],        # ties at block scale 1 (amax 6)
        [0.0] * 16,
        [1e-38, -1e-39] + [1e-40] * 14,                   # float32 subnormals
        [float("nan")] + [1.0] * 15,
        [float("inf")] + [1.0] * 15,
        [-float("inf")] + [-0.25] * 15,
        [1e4] * 16,                                       # above the global amax: saturates
    ]
    blocks = [(b * 16)[:16] for b in blocks]
    x = torch.tensor(blocks, dtype=torch.float32).reshape(1, -1)
    amax = torch.tensor(6.0 * 448)  # g = 1: block 0 (amax 6) gets the E4M3 scale 1, its ties stay ties
    ours = ops.fake_quantize_nvfp4(x, amax)
    assert_bits_equal(ours, torchao_nvfp4(x, amax))
    y = ours.reshape(-1, 16)
    assert torch.isnan(y[3]).all()
    assert y[4, 0] == float(amax)  # inf saturates to 6 * g * 448, the tensor amax
    assert (y[1] == 0).all()


def test_nvfp4_zero_amax_gives_zeros_and_bad_amax_raises():
    x = torch.zeros(2, 32)
    assert_bits_equal(ops.fake_quantize_nvfp4(x, torch.tensor(0.0)), x)
    with pytest.raises(RuntimeError, match="global_amax must be finite and >= 0, got inf"):
        ops.fake_quantize_nvfp4(x, torch.tensor(float("inf")))
    with pytest.raises(RuntimeError, match="global_amax must be finite and >= 0, got -1"):
        ops.fake_quantize_nvfp4(x, torch.tensor(-1.0))
    with pytest.raises(RuntimeError, match="global_amax must have exactly one element"):
        ops.fake_quantize_nvfp4(x, torch.ones(2))


def test_nvfp4_axis_gradient_and_fake_kernel():
    x = randn(5, 48, 3, seed=12, scale=4.0).requires_grad_()
    amax = x.detach().abs().max()
    out = ops.fake_quantize_nvfp4(x, amax, 16, 1)
    assert_bits_equal(out.detach(),
                      torchao_nvfp4(x.detach().movedim(1, -1), amax).movedim(-1, 1))
    dy = randn(5, 48, 3, seed=13)
    out.backward(dy)
    assert_bits_equal(x.grad, dy)


def test_opcheck_fake_kernels():
    x = randn(4, 64, seed=14)
    for args in ((x, "mxfp8_e4m3"), (x, "mxfp4", 32, -1), (x.t(), "mxfp4", 16, 0)):
        torch.library.opcheck(ops.fake_quantize_mx.default, args)
    torch.library.opcheck(ops.fake_quantize_nvfp4.default, (x, x.abs().max()))
    torch.library.opcheck(ops.fake_quantize_nvfp4.default, (x.t(), x.abs().max(), 16, 0))
