"""Group-wise INT fake quantization (one scale / zero point per group_size consecutive elements
along an axis) against two references built with torch ops: rows of groups through
torch.fake_quantize_per_channel_affine, and an elementwise formula with the scales repeated
group_size times along the axis; learnable (LSQ) gradients against torch's
_fake_quantize_learnable_per_channel_affine on the rows."""
import pytest
import torch

import mqbench  # noqa: F401

ops = torch.ops.mqbench


def group_shape(x, axis, gs):
    shape = list(x.shape)
    shape[axis] //= gs
    return shape


def rows_reference(x, scale, zp, axis, gs, qmin, qmax):
    """torch's per-channel op over [rows, group_size]: each group one row."""
    xm = x.movedim(axis, -1)
    s = scale.reshape(group_shape(x, axis, gs)).movedim(axis, -1).reshape(-1)
    z = zp.reshape(group_shape(x, axis, gs)).movedim(axis, -1).reshape(-1)
    out = torch.fake_quantize_per_channel_affine(xm.reshape(-1, gs), s.float(), z.int(), 0,
                                                 qmin, qmax)
    return out.reshape(xm.shape).movedim(-1, axis)


def elementwise_reference(x, scale, zp, axis, gs, qmin, qmax):
    """out = (clamp(rint(x * float32(1/s)) + z, qmin, qmax) - z) * s with s, z repeated."""
    s = scale.reshape(group_shape(x, axis, gs)).float().repeat_interleave(gs, dim=axis)
    z = zp.reshape(group_shape(x, axis, gs)).float().repeat_interleave(gs, dim=axis)
    inv = (1.0 / s).to(x.dtype)
    q = torch.clamp(torch.round(x * inv) + z.to(x.dtype), qmin, qmax)
    return (q - z.to(x.dtype)) * s.to(x.dtype)


CASES = [  # shape, axis, group_size
    ((16, 256), 1, 128), ((16, 256), 1, 32), ((8, 64, 3, 3), 1, 16), ((3, 5, 48), -1, 8),
    ((48, 7), 0, 16), ((4, 32), 1, 32), ((4, 32), 1, 1)]


@pytest.mark.parametrize("shape,axis,gs", CASES)
@pytest.mark.parametrize("bits,symmetric", [(4, True), (4, False), (8, True), (8, False)])
def test_forward_matches_both_references(device, shape, axis, gs, bits, symmetric):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g) * 2
    x.view(-1)[:4] = torch.tensor([1e4, -1e4, 0.0, 0.5])  # clamped, and exact values
    qmin, qmax = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if symmetric else (0, 2 ** bits - 1)
    gshape = group_shape(x, axis % x.dim(), gs)
    scale = torch.rand(gshape, generator=g) * 0.2 + 0.01
    zp = torch.zeros(gshape, dtype=torch.int32) if symmetric else \
        torch.randint(qmin, qmax + 1, gshape, generator=g, dtype=torch.int32)
    out = ops.fake_quantize_per_group_affine(x.to(device), scale.to(device), zp.to(device), axis,
                                             gs, qmin, qmax).cpu()
    a = axis % x.dim()
    assert torch.equal(out, rows_reference(x, scale, zp, a, gs, qmin, qmax))
    assert torch.equal(out, elementwise_reference(x, scale, zp, a, gs, qmin, qmax))
    # a flat scale with one element per group is accepted too
    flat = ops.fake_quantize_per_group_affine(x, scale.reshape(-1), zp.reshape(-1), axis, gs,
                                              qmin, qmax)
    assert torch.equal(flat, out)


def test_non_contiguous_input_and_float64():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 32, generator=g, dtype=torch.float64).t()  # [32, 64], strided
    scale = torch.rand(32, 4, generator=g) * 0.1 + 0.01
    zp = torch.zeros(32, 4, dtype=torch.int32)
    out = ops.fake_quantize_per_group_affine(x, scale, zp, 1, 16, -8, 7)
    assert torch.equal(out, elementwise_reference(x, scale, zp, 1, 16, -8, 7))


def test_ste_backward():
    x = torch.tensor([[0.1, 5.0, -0.2, -9.0]], requires_grad=True)
    scale = torch.tensor([[0.1, 0.5]])
    ops.fake_quantize_per_group_affine(x, scale, torch.zeros(1, 2), 1, 2, -8, 7).backward(
        torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    assert x.grad.tolist() == [[1.0, 0.0, 3.0, 0.0]]  # 5.0 / 0.1 and -9 / 0.5 are clamped


@pytest.mark.parametrize("symmetric", [True, False])
def test_learnable_gradients_match_torch_per_group(device, symmetric):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 64, generator=g)
    qmin, qmax = (-8, 7) if symmetric else (0, 15)
    scale = torch.rand(6, 4, generator=g) * 0.3 + 0.05
    zp = torch.zeros(6, 4) if symmetric else torch.randint(0, 16, (6, 4), generator=g).float()
    dy = torch.randn(x.shape, generator=g)
    xa, sa, za = (t.clone().to(device).requires_grad_() for t in (x, scale, zp))
    ops.fake_quantize_learnable_per_group_affine(xa, sa, za, 1, 16, qmin, qmax, 0.5).backward(
        dy.to(device))
    xr, sr, zr = (t.clone().requires_grad_() for t in (x, scale, zp))
    ref = torch._fake_quantize_learnable_per_channel_affine(
        xr.reshape(-1, 16), sr.reshape(-1), zr.reshape(-1), 0, qmin, qmax, 0.5).reshape(x.shape)
    ref.backward(dy)
    torch.testing.assert_close(xa.grad.cpu(), xr.grad)
    torch.testing.assert_close(sa.grad.cpu(), sr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(za.grad.cpu(), zr.grad, rtol=1e-4, atol=1e-5)
    assert sa.grad.shape == scale.shape


def test_errors_name_the_argument():
    x = torch.randn(4, 30)
    s, z = torch.ones(4, 3), torch.zeros(4, 3)
    with pytest.raises(RuntimeError, match=r"group_size \(16\) must divide x.size\(1\) = 30"):
        ops.fake_quantize_per_group_affine(x, s, z, 1, 16, -8, 7)
    with pytest.raises(RuntimeError, match="one element per group"):
        ops.fake_quantize_per_group_affine(x, torch.ones(4, 2), torch.zeros(4, 2), 1, 10, -8, 7)
    with pytest.raises(RuntimeError, match="group_size must be >= 1"):
        ops.fake_quantize_per_group_affine(x, s, z, 1, 0, -8, 7)


def test_meta_and_compile_shapes():
    x = torch.empty(8, 64, device="meta")
    out = ops.fake_quantize_per_group_affine(x, torch.empty(8, 2, device="meta"),
                                             torch.empty(8, 2, device="meta"), 1, 32, -8, 7)
    assert out.shape == x.shape
