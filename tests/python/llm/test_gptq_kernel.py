"""GPTQ's C++ op against its torch reference on shapes that reach every part of the CPU column
kernel (src/ops/cpu/gptq_kernel.cpp, one copy per CPU capability): row counts that are not a
multiple of the vector width, blocks that do not divide the columns, groups started inside a
block, per-tensor / per-channel / group grids, with and without act_order. The op and the
reference make the same float operations (Note [GPTQ column loop on the CPU]): the same bits.
The ctest python_unit_default_isa reruns this file on the baseline kernel."""
import pytest
import torch

from mqbench.llm import _weights
from reference import gptq_quantize_weight_reference, hessian_update_reference

from cuda_harness import needs_gpu

pytestmark = pytest.mark.skipif(not hasattr(torch.ops.mqbench, "gptq_quantize_weight"),
                                reason="mqbench built without the LLM ops")

SCHEMES = {
    "tensor": {"bit": 4, "per_channel": False},
    "channel3": {"bit": 3, "symmetry": False, "per_channel": True},
    "group10": {"bit": 4, "per_channel": True, "group_size": 10},
    "group10sym": {"bit": 4, "symmetry": True, "per_channel": True, "group_size": 10},
}


def _case(out_f, n, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(3 * n, max(1, n // 3), generator=g)
    x = z @ torch.randn(max(1, n // 3), n, generator=g) + 0.1 * torch.randn(3 * n, n, generator=g)
    H = hessian_update_reference(torch.zeros(n, n), x, 0)
    w = torch.randn(out_f, n, generator=g)
    return w.to(device), H.to(device)


def _both(w, H, scheme, block, act_order):
    wq = _weights.resolve_w_qscheme(SCHEMES[scheme], "test")
    ref = gptq_quantize_weight_reference(w, H, wq, block, 0.01, act_order)
    got = torch.ops.mqbench.gptq_quantize_weight(w, H, *wq.as_args(), block, 0.01, act_order, "l")
    return got, ref


@pytest.mark.parametrize("out_f", [1, 7, 13, 37])
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("act_order", [False, True])
def test_op_equals_reference_bit_for_bit(out_f, scheme, act_order):
    # 130 columns: blocks of 16 leave a block of 2, groups of 10 start inside blocks
    w, H = _case(out_f, 130, seed=out_f)
    got, ref = _both(w, H, scheme, 16, act_order)
    for name, a, b in zip(("Q", "scale", "zero_point"), got[:3], ref[:3]):
        assert torch.equal(a, b), name
    assert got[3] == ref[3]


def test_one_block_and_a_dead_input_channel():
    """A block wider than the layer (one block) and an input channel the data never fed."""
    w, H = _case(9, 40, seed=3)
    H[5, :] = 0.0
    H[:, 5] = 0.0
    got, ref = _both(w, H, "group10", 128, False)
    assert torch.equal(got[0], ref[0])
    assert torch.equal(got[0][:, 5], torch.zeros(9))


def test_rounding_ties_go_to_even():
    """Weights exactly half-way between two levels round to the even level, in the vector body
    and in the tail rows alike (an identity Hessian spreads no error: Q is RTN)."""
    n, out_f = 8, 11  # 8 vector rows and 3 tail rows with the AVX2 kernel
    w = torch.zeros(out_f, n)
    w[:, 1] = 7.5  # each row's grid from [-7.5, 7.5]: a symmetric 4-bit grid of scale 1
    w[:, 2] = -7.5
    w[:, 3] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 4.5, 5.5, -3.5, 6.5])
    wq = _weights.resolve_w_qscheme({"bit": 4, "symmetry": True, "per_channel": True}, "test")
    ref = gptq_quantize_weight_reference(w, torch.eye(n), wq, 128, 0.0, False)
    Q, scale, _, _ = torch.ops.mqbench.gptq_quantize_weight(w, torch.eye(n), *wq.as_args(), 128,
                                                            0.0, False, "l")
    assert torch.equal(Q, ref[0])
    assert torch.equal(scale, torch.ones(out_f, 1))
    assert Q[:, 3].tolist() == [0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 4.0, 4.0, 6.0, -4.0, 6.0]


def test_a_hessian_not_exactly_symmetric_is_read_as_the_reference_reads_it():
    """A Hessian a caller passes with its triangles a few ulps apart: the op's LAPACK call reads
    the triangle ATen's Cholesky reads (Note [Cholesky through LAPACK on the CPU])."""
    w, H = _case(13, 130)
    g = torch.Generator().manual_seed(5)
    H = H * (1 + 1e-6 * torch.randn(H.shape, generator=g))
    assert not torch.equal(H, H.t())
    for act_order in (False, True):
        got, ref = _both(w, H, "group10", 16, act_order)
        assert torch.equal(got[0], ref[0]), act_order


@needs_gpu
@pytest.mark.parametrize("scheme", ["tensor", "group10"])
def test_op_on_cuda_equals_the_reference_on_cuda(scheme):
    """Off the CPU the op keeps its ATen sequence: the reference's, on the same device, and the
    CPU op's result to float rounding."""
    w, H = _case(37, 130, device="cuda")
    got, ref = _both(w, H, scheme, 16, True)
    for a, b in zip(got[:3], ref[:3]):
        assert torch.equal(a, b)
    cpu, _ = _both(w.cpu(), H.cpu(), scheme, 16, True)
    torch.testing.assert_close(got[0].cpu(), cpu[0], rtol=0, atol=float(cpu[1].max()) * 1.01)
