"""The affine fake-quantize ops (fixed, LSQ, QDrop: src/ops/cuda/affine_kernel.cu) on CUDA against
the spec's formula and the CPU kernels (test_affine_ops.py checks those). The comparison rules
and the GPU skip: cuda_harness.py."""
import pytest
import torch

from cuda_harness import (CH_AXES, EXACT, FLOATS, LAYOUTS, REDUCED, Case, autograd,
                          check_half_input_is_the_float_op_cast_back,
                          check_op_agrees_with_the_cpu_kernel, lsq_factor, needs_gpu, on,
                          per_channel)
from reference import fake_quant_affine

ops = torch.ops.mqbench


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("qrange", [(-128, 127), (0, 255), (0, 15)])
def test_per_tensor_affine_matches_formula_and_cpu(dtype, qrange, device):
    qmin, qmax = qrange
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 65, 129, generator=g, dtype=dtype) * 3
    x[0, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0], dtype=dtype)
    s, z = torch.tensor([0.0173]), torch.tensor([(qmin + qmax) // 3], dtype=torch.int32)
    cpu = ops.fake_quantize_per_tensor_affine(x, s, z, qmin, qmax)
    for strided in (False, True):
        xd = x.to(device)
        if strided:
            xd = xd.transpose(0, 2)
        out = ops.fake_quantize_per_tensor_affine(xd, s.to(device), z.to(device), qmin, qmax)
        expect = cpu.transpose(0, 2) if strided else cpu
        torch.testing.assert_close(out.cpu(), expect, rtol=0, atol=0, equal_nan=True)
    # +-inf give the clamped ends (the reference's straight-through term is 0 out of range)
    ends = (torch.tensor([qmax, qmin], dtype=dtype) - int(z)) * s.to(dtype)
    assert torch.equal(cpu[0, 0, 1:3], ends)
    torch.testing.assert_close(cpu, fake_quant_affine(x, 0.0173, int(z), qmin, qmax).detach(),
                               rtol=0, atol=0, equal_nan=True)


def test_per_tensor_affine_gradient(device):
    x = (torch.randn(4096, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2)
    dy = torch.randn(4096, dtype=torch.float64)
    grads = []
    for d in ("cpu", device):
        xd = x.to(d, copy=True).requires_grad_()  # a leaf of its own on each device
        ops.fake_quantize_per_tensor_affine(
            xd, torch.tensor([0.02], device=d), torch.tensor([3], device=d), -20, 100
        ).backward(dy.to(d))
        grads.append(xd.grad.cpu())
    assert torch.equal(grads[0], grads[1])
    ref = x.clone().requires_grad_()  # dy where in range, 0 where clamped
    fake_quant_affine(ref, 0.02, 3, -20, 100).backward(dy)
    assert torch.equal(grads[0], ref.grad) and (ref.grad == 0).any()
    # Straight-through estimator: gradcheck on points away from rounding ties.
    xs = torch.linspace(-0.37, 0.41, 50, dtype=torch.float64, device=device).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: ops.fake_quantize_per_tensor_affine(
            t, torch.tensor([0.1], device=device), torch.tensor([0], device=device), -128, 127)
        - (torch.round(t.detach() / 0.1) * 0.1 - t.detach()), (xs,))


# ==== the ops, case by case ====================================================================

def _fixed_pt(x, d):
    return on(d, [0.05]), on(d, [3], torch.int32)


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


AFFINE_CASES = affine_cases()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=["float32", "float64"])
@pytest.mark.parametrize("case", AFFINE_CASES, ids=repr)
def test_affine_op_agrees_with_the_cpu_kernel(case, dtype, layout, device):
    check_op_agrees_with_the_cpu_kernel(case, dtype, layout, device)


@needs_gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", [c for c in AFFINE_CASES if c.half], ids=repr)
def test_half_input_to_an_affine_op_on_cuda_is_the_float_op_cast_back(case, dtype, layout):
    check_half_input_is_the_float_op_cast_back(case, dtype, layout)
