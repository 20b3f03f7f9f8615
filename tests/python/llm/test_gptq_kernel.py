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


def _in_place(w, H, scheme, block, act_order, damp=0.01):
    """gptq_quantize_weight_ on a copy of H (the op takes it as its work space)."""
    wq = _weights.resolve_w_qscheme(SCHEMES[scheme], "test")
    work = H.clone()
    got = torch.ops.mqbench.gptq_quantize_weight_(w, work, *wq.as_args(), block, damp, act_order,
                                                  "l")
    return got, work


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("act_order", [False, True])
def test_op_on_the_callers_hessian_equals_the_functional_op(scheme, act_order):
    """gptq_quantize_weight_ reorders and factors the caller's H in place: the same bits as the
    op that copies it, and H no longer the Hessian (Note [GPTQ's n x n buffers])."""
    w, H = _case(13, 130, seed=7)
    H[9, :] = 0.0  # a dead input: its unit diagonal goes to the reordered H in place too
    H[:, 9] = 0.0
    got, ref = _both(w, H, scheme, 16, act_order)
    mine, work = _in_place(w, H, scheme, 16, act_order)
    for name, a, b, c in zip(("Q", "scale", "zero_point"), mine[:3], got[:3], ref[:3]):
        assert torch.equal(a, b) and torch.equal(a, c), name
    assert mine[3] == got[3]
    assert not torch.equal(work, H)


def test_op_on_the_callers_hessian_raises_damp_from_the_intact_triangle():
    """A Hessian that is not positive definite at the first damp: the in-place factorization
    fails, the matrix is made whole from the triangle LAPACK left alone, and the raised damp
    gives the bits of the op that factors a copy each time."""
    w, H = _case(11, 60, seed=4)
    g = torch.Generator().manual_seed(6)
    v = torch.randn(60, generator=g)
    H = H - 1.5 * float(torch.linalg.eigvalsh(H)[-1]) * torch.outer(v, v) / v.dot(v)
    H = (H + H.t()) / 2
    wq = _weights.resolve_w_qscheme(SCHEMES["group10"], "test")
    ref = torch.ops.mqbench.gptq_quantize_weight(w, H, *wq.as_args(), 16, 0.01, True, "l")
    mine, _ = _in_place(w, H, "group10", 16, True)
    assert ref[3] > 0.01 and mine[3] == ref[3]
    for a, b in zip(mine[:3], ref[:3]):
        assert torch.equal(a, b)


def test_op_on_the_callers_hessian_in_other_layouts_copies_it():
    """A Hessian that is not a contiguous float32 matrix is converted, not reused: the same
    result, and the caller's tensor as it was."""
    w, H = _case(7, 40, seed=2)
    wq = _weights.resolve_w_qscheme(SCHEMES["channel3"], "test")
    ref = torch.ops.mqbench.gptq_quantize_weight(w, H, *wq.as_args(), 16, 0.01, False, "l")
    for other in (H.double(), H.t().contiguous().t()):
        before = other.clone()
        got = torch.ops.mqbench.gptq_quantize_weight_(w, other, *wq.as_args(), 16, 0.01, False,
                                                      "l")
        assert torch.equal(got[0], ref[0])
        assert torch.equal(other, before)


def _largest_allocation(fn):
    """The largest single tensor allocation ``fn`` makes (torch's profiler, CPU memory)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.self_cpu_memory_usage for e in prof.events()), default=0)


@pytest.mark.parametrize("act_order", [False, True])
def test_op_on_the_callers_hessian_allocates_no_n_by_n_matrix(act_order):
    """The memory the in-place ops save (Note [GPTQ's n x n buffers]): with the caller's H as
    work space no [n, n] matrix is allocated, where the functional op allocates the reordered
    copy; the in-place Hessian update allocates none where the functional one allocates its
    result."""
    n = 512
    w, H = _case(8, n, seed=1)
    wq = _weights.resolve_w_qscheme(SCHEMES["group10sym"] | {"group_size": 128}, "test")
    matrix = n * n * 4
    args = (*wq.as_args(), 128, 0.01, act_order, "l")
    assert _largest_allocation(
        lambda: torch.ops.mqbench.gptq_quantize_weight(w, H, *args)) >= matrix
    work = H.clone()
    assert _largest_allocation(
        lambda: torch.ops.mqbench.gptq_quantize_weight_(w, work, *args)) < matrix // 4
    x = torch.randn(300, n, generator=torch.Generator().manual_seed(3))
    H2 = torch.zeros(n, n)
    assert _largest_allocation(
        lambda: torch.ops.mqbench.gptq_hessian_update(H2, x, 0)) >= matrix
    assert _largest_allocation(
        lambda: torch.ops.mqbench.gptq_hessian_update_(H2, x, 0)) < matrix // 4
