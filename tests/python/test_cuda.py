"""CUDA kernels (src/ops/cuda/) against the spec's formula and the CPU kernels. They skip, with
the reason printed (pytest -rs), where no GPU is present; CI has none, the GPU machine runs them."""
import pytest
import torch

import mqbench
from reference import fake_quant_affine

ops = torch.ops.mqbench

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="no CUDA device (CI has none; the GPU machine runs these)")


def test_cuda_kernels_are_compiled_in_with_a_cuda_torch():
    """With a CUDA build of torch, libmqbench carries the CUDA kernels (MQBENCH_CUDA=AUTO)."""
    if torch.version.cuda is None:
        pytest.skip(f"torch {torch.__version__} is a CPU build: no CUDA kernels are built")
    assert mqbench._C.__cuda__
    assert torch._C._dispatch_has_kernel_for_dispatch_key(
        "mqbench::fake_quantize_per_tensor_affine", "CUDA")


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
