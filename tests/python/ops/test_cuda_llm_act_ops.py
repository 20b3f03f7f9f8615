"""hadamard_transform and fake_quantize_per_token on the device of the ``device`` fixture against
the CPU kernels (test_hadamard_ops.py and test_per_token_ops.py check those against dense and
torch references): the same bits, NaN where NaN, for every input layout and the four dtypes
(float16 / bfloat16 compute in float32 on both devices), on the kernels' paths: the shared-memory
transform (p up to 8192 floats, 4096 doubles), the global-memory stages above it, the product
with had; per-token rows of a warp (n <= 1024) and of a block, with and without 4-wide loads.
Gradients too, and no host synchronisation. The GPU skip and the device fixture: cuda_harness.py,
conftest.py; the "cpu" case runs the same comparisons on the CPU (every layout against the
contiguous input)."""
import pytest
import torch

from cuda_harness import no_host_sync

ops = torch.ops.mqbench
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
DTYPE_IDS = ["float32", "float64", "float16", "bfloat16"]  # tools/gpu_check.sh selects by them
LAYOUTS = ["contiguous", "offset", "transposed", "sliced", "empty"]


def values(shape, dtype, seed, specials=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    flat = x.view(-1)
    if specials and flat.numel() > 8:
        flat[:3] = torch.tensor([float("nan"), 0.0, -0.0])
        flat[flat.numel() // 2] = float("inf")
    return x.to(dtype)


def laid_out(x, layout, device):
    if layout == "empty":
        return torch.empty((0,) + tuple(x.shape[1:]), dtype=x.dtype, device=device)
    x = x.to(device)
    if layout == "contiguous":
        return x
    if layout == "offset":  # misaligned for vector loads
        flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=device)
        flat[1:] = x.reshape(-1)
        return flat[1:].view(x.shape)
    if layout == "transposed":
        dims = list(range(x.dim()))[::-1]
        return x.permute(dims).contiguous().permute(dims)
    if layout == "sliced":
        big = torch.zeros(x.shape[:-1] + (2 * x.shape[-1],), dtype=x.dtype, device=device)
        big[..., ::2] = x
        return big[..., ::2]
    raise ValueError(layout)


def assert_same(got, want, what, device):
    assert got.device.type == device and got.dtype == want.dtype, what
    got = got.cpu()
    assert got.shape == want.shape, what
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


def signs(m, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (m, m), generator=g) * 2 - 1).double()


# (rows shape, had): p = 64 .. 32768 (above the 8192-float tile: global stages), m = 1, 12, 28,
# a float had
HADAMARD = [((3, 5, 64), None), ((4, 4096), None), ((2, 16384), None), ((2, 32768), None),
            ((3, 768), "signs12"), ((2, 28 * 512), "signs28"), ((2, 12 * 16384), "signs12"),
            ((5, 4 * 8), "float4"), ((6, 1), None), ((6, 2), None)]


def had_of(name, device):
    if name is None:
        return None
    if name == "float4":
        return torch.randn(4, 4, generator=torch.Generator().manual_seed(5)).to(device)
    return signs(int(name[len("signs"):]), 3).to(device)


@pytest.mark.parametrize("shape,had_name", HADAMARD)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_hadamard_agrees_with_the_cpu_kernel(device, shape, had_name, dtype):
    x = values(shape, dtype, 0, specials=False)
    had = had_of(had_name, "cpu")
    scale = shape[-1] ** -0.5
    want = ops.hadamard_transform(x, had, scale)
    for layout in LAYOUTS:
        xd = laid_out(x, layout, device)
        got = ops.hadamard_transform(xd, None if had is None else had.to(device), scale)
        ref = want[:0] if layout == "empty" else want
        assert_same(got, ref, f"hadamard {shape} {had_name} {dtype} {layout} on {device}", device)
        assert got.is_contiguous()


@pytest.mark.parametrize("shape,had_name", [((3, 768), "signs12"), ((2, 16384), None)])
def test_hadamard_gradient_and_no_host_sync(device, shape, had_name):
    x = values(shape, torch.float32, 1, specials=False)
    dy = values(shape, torch.float32, 2, specials=False)
    had = had_of(had_name, "cpu")
    xa = x.clone().requires_grad_()
    ops.hadamard_transform(xa, had, 0.5).backward(dy)
    xd, dyd = x.to(device).requires_grad_(), dy.to(device)
    hd = None if had is None else had.to(device)
    with no_host_sync(device):
        y = ops.hadamard_transform(xd, hd, 0.5)
        y.backward(dyd)
    assert_same(xd.grad, xa.grad, f"hadamard dx on {device}", device)


# (rows shape): one element, short rows of a warp, 1024 (the last warp size), 1025 and long rows
# of a block, a length that is no multiple of 4
PER_TOKEN_SHAPES = [(7, 1), (3, 5, 6), (9, 64), (4, 1024), (3, 1025), (2, 3, 4096), (5, 4099)]
FORMATS = [(-8, 7, True, "int"), (-128, 127, False, "int"), (0, 255, True, "int"),
           (0, 0, True, "fp8_e4m3"), (0, 0, True, "fp8_e5m2")]


@pytest.mark.parametrize("shape", PER_TOKEN_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_per_token_agrees_with_the_cpu_kernel(device, shape, dtype):
    x = values(shape, dtype, 3)
    for args in FORMATS:
        want = ops.fake_quantize_per_token(x, *args)
        for layout in LAYOUTS:
            got = ops.fake_quantize_per_token(laid_out(x, layout, device), *args)
            ref = want[:0] if layout == "empty" else want
            assert_same(got, ref, f"per-token {args} {shape} {dtype} {layout} on {device}",
                        device)


def test_per_token_gradient_and_no_host_sync(device):
    x = values((6, 2048), torch.float32, 4, specials=False).to(device).requires_grad_()
    dy = values((6, 2048), torch.float32, 5, specials=False).to(device)
    with no_host_sync(device):
        y = ops.fake_quantize_per_token(x, -8, 7, True) + \
            ops.fake_quantize_per_token(x, 0, 0, True, "fp8_e4m3")
        y.backward(dy)
    assert torch.equal(x.grad, 2 * dy)
