"""The block-scaled formats (``fake_quantize_mx``: MXFP8 / MXFP6 / MXFP4, ``fake_quantize_nvfp4``:
src/ops/cuda/mx_kernel.cu) on the device of the ``device`` fixture against the CPU op
(test_mx_ops.py checks that one against torchao and the specs): the same bits, NaN where NaN, in
every layout, on blocks that end inside the axis, along inner and outer axes, with the float4
loads of aligned blocks and the scalar loads of the others. The gradient is the straight-through
dy. Half and bfloat16 input (CUDA only) equals the float32 op on x.float(), cast back. The GPU
skip and the device fixture: cuda_harness.py, conftest.py."""
import pytest
import torch

from cuda_harness import needs_gpu

ops = torch.ops.mqbench

FORMATS = ["mxfp8_e4m3", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "nvfp4"]
# (shape, axis, block): a tail block (70 = 2 x 32 + 6) on an outer axis; whole aligned blocks
# on the last axis (float4 loads); a block of 16 and of 8; one block longer than its axis
GEOMETRIES = [((6, 70, 5), 1, 32), ((12, 160), -1, 32), ((12, 160), -1, 16), ((3, 40, 7), 1, 8),
              ((5, 9), -1, 32)]
LAYOUTS = ["contiguous", "offset", "transposed", "sliced", "empty"]


def _values(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    flat = base.view(-1)
    # specials in the first block and a huge / a tiny block further on
    flat[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    flat[flat.numel() // 2:flat.numel() // 2 + 8] *= 1e30
    flat[-8:] *= 1e-38
    return base.to(dtype)


def _laid_out(x, layout, device):
    """``x`` on ``device`` in ``layout`` (the values of ``x``; "empty": no rows)."""
    if layout == "empty":
        return torch.empty((0,) + tuple(x.shape[1:]), dtype=x.dtype, device=device)
    x = x.to(device)
    if layout == "contiguous":
        return x
    if layout == "offset":  # one element into the storage: no 16-byte alignment
        flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=device)
        flat[1:] = x.reshape(-1)
        return flat[1:].view(x.shape)
    if layout == "transposed":  # every axis reversed in memory
        dims = list(range(x.dim()))[::-1]
        return x.permute(dims).contiguous().permute(dims)
    if layout == "sliced":  # every other element of the last axis
        big = torch.zeros(x.shape[:-1] + (2 * x.shape[-1],), dtype=x.dtype, device=device)
        big[..., ::2] = x
        return big[..., ::2]
    raise ValueError(layout)


def _op(fmt, x, axis, block):
    if fmt == "nvfp4":
        amax = x.detach().float().abs().nan_to_num(posinf=0.0).amax() if x.numel() else \
            torch.zeros((), device=x.device)
        return ops.fake_quantize_nvfp4(x, amax, block, axis)
    return ops.fake_quantize_mx(x, fmt, block, axis)


def _same(got, want, what):
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"{g[0]}-axis{g[1]}-block{g[2]}")
@pytest.mark.parametrize("fmt", FORMATS)
def test_block_format_agrees_with_the_cpu_op(fmt, geometry, dtype, layout, device):
    shape, axis, block = geometry
    x = _values(shape, dtype, seed=len(shape) + block)
    want = _op(fmt, _laid_out(x, layout, "cpu").contiguous(), axis, block)
    xd = _laid_out(x, layout, device).requires_grad_()
    got = _op(fmt, xd, axis, block)
    assert got.device.type == device and got.dtype == dtype and got.shape == xd.shape
    _same(got.detach(), want, f"{fmt} {layout}")
    if xd.numel():
        assert torch.isnan(want).any() and (want != 0).any()  # the specials are in the data
    dy = torch.randn(xd.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    got.backward(dy.to(device))
    _same(xd.grad, dy, f"{fmt} {layout} gradient")  # straight through


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_half_input_to_a_block_format_is_the_float_op_cast_back(fmt, layout, dtype):
    shape, axis, block = (6, 70, 5), 1, 32
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3)) * 3
    xd = _laid_out(x.to(dtype), layout, "cuda")
    got = _op(fmt, xd, axis, block)
    assert got.dtype == dtype and got.shape == xd.shape
    _same(got, _op(fmt, xd.float(), axis, block).to(dtype).cpu(), f"{fmt} {layout} {dtype}")


@needs_gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_more_blocks_than_resident_threads(fmt):
    """2^20 blocks: every thread of the grid-stride loop takes several."""
    x = torch.randn(8192, 4096, generator=torch.Generator().manual_seed(4))
    _same(_op(fmt, x.cuda(), -1, 32), _op(fmt, x, -1, 32), fmt)
