"""hadamard_transform against the dense product x @ M^T, M = scale * kron(had, S_p), with
Sylvester's S_p built here by Kronecker products: sizes n = 1 to 4096 and 768 = 12 * 64 (a 12 x 12
Hadamard matrix and random +-1 matrices), leading dimensions, strided and empty input, the four
dtypes; orthogonality at scale 1 / sqrt(n); the gradient (gradcheck in float64, and its closed
form hadamard_transform(dy, had^T, scale)); the errors; fake tensors, torch.compile and
torch.export."""
import math

import pytest
import torch

import mqbench  # noqa: F401

ops = torch.ops.mqbench


def sylvester(p):
    """S_p by Kronecker products of [[1, 1], [1, -1]] (float64)."""
    s = torch.ones(1, 1, dtype=torch.float64)
    h2 = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    while s.shape[0] < p:
        s = torch.kron(h2, s)
    return s


def paley12():
    """A 12 x 12 Hadamard matrix (Paley's construction with q = 11)."""
    q = 11
    residues = {(k * k) % q for k in range(1, q)}
    chi = [0] + [1 if k in residues else -1 for k in range(1, q)]
    c = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    c[0, 1:] = 1
    c[1:, 0] = -1
    for i in range(q):
        for j in range(q):
            c[i + 1, j + 1] = chi[(j - i) % q]
    h = torch.eye(q + 1, dtype=torch.float64) + c
    assert torch.equal(h @ h.T, 12 * torch.eye(12, dtype=torch.float64))
    return h


def random_signs(m, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (m, m), generator=g) * 2 - 1).double()


def dense(x, had, scale):
    """x @ M^T in float64."""
    n = x.shape[-1]
    m = 1 if had is None else had.shape[0]
    k = sylvester(n // m) if had is None else torch.kron(had.double(), sylvester(n // m))
    return x.double() @ (scale * k).T


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64).to(dtype)


# (n, had): no had for powers of two, a 12 x 12 Hadamard and random +-1 matrices otherwise
SIZES = [(1, None), (2, None), (64, None), (256, None), (4096, None), (768, "paley12"),
         (768, "signs12"), (12, "paley12"), (28 * 4, "signs28"), (64, "signs1"), (8, "float4")]


def make_had(name):
    if name is None:
        return None
    if name == "paley12":
        return paley12()
    if name == "float4":  # any float values work
        return randn(4, 4, seed=7)
    return random_signs(int(name[len("signs"):]), seed=3)


@pytest.mark.parametrize("n,had_name", SIZES)
def test_float64_equals_the_dense_product(n, had_name):
    had = make_had(had_name)
    x = randn(3, 5, n)
    scale = 1.0 / math.sqrt(n)
    y = ops.hadamard_transform(x, had, scale)
    assert y.shape == x.shape and y.dtype == torch.float64 and y.is_contiguous()
    torch.testing.assert_close(y, dense(x, had, scale), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n,had_name", SIZES)
def test_float32_within_rounding_of_the_dense_product(n, had_name):
    had = make_had(had_name)
    x = randn(7, n, dtype=torch.float32, seed=1)
    scale = 0.5
    y = ops.hadamard_transform(x, None if had is None else had.float(), scale)
    ref = dense(x, had, scale)
    # float32 butterflies: log2(p) + m additions per output, each within half an ulp
    bound = 4e-7 * (math.log2(max(n, 2)) + 12) * ref.abs().max().item() + 1e-30
    assert (y.double() - ref).abs().max().item() <= bound


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,had_name", [(256, None), (768, "paley12"), (4096, None)])
def test_half_types_compute_in_float_and_round_once(dtype, n, had_name):
    had = make_had(had_name)
    x = randn(4, n, dtype=dtype, seed=2)
    scale = 1.0 / math.sqrt(n)
    y = ops.hadamard_transform(x, had, scale)
    assert y.dtype == dtype
    # the float32 op on the same values, rounded to the half type once
    want = ops.hadamard_transform(x.float(), had, scale).to(dtype)
    assert torch.equal(y, want)
    ref = dense(x, had, scale)
    ulp = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[dtype]
    assert (y.double() - ref).abs().max().item() <= ulp * ref.abs().max().item()


@pytest.mark.parametrize("n,had_name", [(4096, None), (768, "paley12"), (12, "paley12")])
def test_orthogonal_at_one_over_sqrt_n(n, had_name):
    had = make_had(had_name)
    x = randn(16, n, dtype=torch.float32, seed=4)
    y = ops.hadamard_transform(x, None if had is None else had.float(), 1.0 / math.sqrt(n))
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=0)
    # and the inverse is the transpose: H^T applied after H gives x back
    back = ops.hadamard_transform(y, None if had is None else had.float().T, 1.0 / math.sqrt(n))
    torch.testing.assert_close(back, x, rtol=1e-5, atol=1e-5)


def test_leading_dimensions_strides_and_empty_input():
    had = paley12()
    x = randn(2, 3, 4, 768, dtype=torch.float32)
    want = ops.hadamard_transform(x, had, 0.1)
    # any leading shape: the same rows
    assert torch.equal(ops.hadamard_transform(x.reshape(24, 768), had, 0.1).reshape(x.shape), want)
    assert torch.equal(ops.hadamard_transform(x[1, 2, 3], had, 0.1), want[1, 2, 3])
    # strided views: made contiguous, same values, contiguous output
    t = x.transpose(0, 2).contiguous().transpose(0, 2)
    out = ops.hadamard_transform(t, had, 0.1)
    assert out.is_contiguous() and torch.equal(out, want)
    big = torch.zeros(2, 3, 4, 1536)
    big[..., ::2] = x
    assert torch.equal(ops.hadamard_transform(big[..., ::2], had, 0.1), want)
    # a transposed last axis
    sq = randn(64, 64, dtype=torch.float32, seed=5)
    assert torch.equal(ops.hadamard_transform(sq.T, None, 1.0),
                       ops.hadamard_transform(sq.T.contiguous(), None, 1.0))
    # empty
    for shape in [(0, 768), (3, 0, 768)]:
        e = ops.hadamard_transform(torch.empty(shape), had, 1.0)
        assert e.shape == shape
    assert ops.hadamard_transform(torch.empty(4, 0), None, 1.0).shape == (4, 0)


def test_had_may_have_any_floating_dtype_and_scale_default_is_one():
    had = paley12()
    x = randn(3, 768, dtype=torch.float32)
    want = ops.hadamard_transform(x, had.float(), 1.0)
    assert torch.equal(ops.hadamard_transform(x, had), want)
    assert torch.equal(ops.hadamard_transform(x, had.half()), want)
    assert torch.equal(ops.hadamard_transform(x[:, :256].contiguous()),
                       ops.hadamard_transform(x[:, :256].contiguous(), None, 1.0))


def test_specials_propagate_as_in_the_sums():
    x = torch.zeros(2, 8)
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    y = ops.hadamard_transform(x, None, 1.0)
    assert torch.isnan(y[0]).all()          # every output sums the NaN
    assert torch.isinf(y[1]).all()          # +-inf, no inf - inf (one infinite input)
    assert torch.equal(torch.sign(y[1]), sylvester(8)[:, 5].float())


@pytest.mark.parametrize("had_name,n", [(None, 16), ("signs3", 12), ("float4", 32)])
def test_gradcheck(had_name, n):
    had = make_had(had_name)
    x = randn(3, n).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: ops.hadamard_transform(t, had, 0.3), (x,))
    assert torch.autograd.gradgradcheck(lambda t: ops.hadamard_transform(t, had, 0.3), (x,))


def test_backward_is_the_transform_by_the_transpose():
    had = random_signs(12, seed=9) + 0.5 * randn(12, 12, seed=10)  # not symmetric
    x = randn(5, 768, dtype=torch.float32).requires_grad_()
    dy = randn(5, 768, dtype=torch.float32, seed=11)
    ops.hadamard_transform(x, had, 0.2).backward(dy)
    assert torch.equal(x.grad, ops.hadamard_transform(dy, had.T, 0.2))
    torch.testing.assert_close(x.grad.double(), dy.double() @ (0.2 * torch.kron(
        had, sylvester(64))), rtol=1e-5, atol=1e-5)


def test_errors_name_the_offending_sizes():
    x = torch.randn(4, 36)
    with pytest.raises(RuntimeError, match=r"x.size\(-1\) \(36\) must be a power of two when "
                                           r"had is None"):
        ops.hadamard_transform(x, None, 1.0)
    with pytest.raises(RuntimeError, match=r"x.size\(-1\) \(36\) must be m \* 2\^k for had of "
                                           r"size m = 12, but 36 / 12 = 3 is not a power of two"):
        ops.hadamard_transform(x, paley12(), 1.0)
    with pytest.raises(RuntimeError, match=r"x.size\(-1\) \(40\) must be m \* 2\^k for had of "
                                           r"size m = 12, but 40 is not a multiple of 12"):
        ops.hadamard_transform(torch.randn(2, 40), paley12(), 1.0)
    with pytest.raises(RuntimeError, match=r"had must be a square \[m, m\] matrix, got shape "
                                           r"\[12, 6\]"):
        ops.hadamard_transform(x, torch.ones(12, 6), 1.0)
    with pytest.raises(RuntimeError, match=r"had must be a square \[m, m\] matrix, got shape "
                                           r"\[12\]"):
        ops.hadamard_transform(x, torch.ones(12), 1.0)
    with pytest.raises(RuntimeError, match="had must be a floating-point matrix, got dtype Long"):
        ops.hadamard_transform(x, torch.ones(12, 12, dtype=torch.long), 1.0)
    with pytest.raises(RuntimeError, match="x must be a float32, float64, float16 or bfloat16 "
                                           "tensor, got dtype Int"):
        ops.hadamard_transform(torch.ones(2, 4, dtype=torch.int32), None, 1.0)
    with pytest.raises(RuntimeError, match="x must have at least one dimension"):
        ops.hadamard_transform(torch.tensor(1.0), None, 1.0)
    with pytest.raises(RuntimeError, match=r"had requires grad, but the op gives no gradient to "
                                           r"had \(a fixed rotation\); pass had.detach\(\)"):
        ops.hadamard_transform(x, paley12().requires_grad_(), 1.0)
    # an had that requires grad is fine where no graph is recorded
    with torch.no_grad():
        ops.hadamard_transform(torch.randn(2, 24), paley12().requires_grad_(), 1.0)


def test_fake_tensors_compile_and_export():
    had = paley12().float()
    x = randn(2, 3, 768, dtype=torch.float32)
    meta = ops.hadamard_transform(torch.empty(2, 3, 768, device="meta"), had.to("meta"), 0.5)
    assert meta.shape == (2, 3, 768) and meta.device.type == "meta"

    class Rotate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("had", had)

        def forward(self, t):
            return ops.hadamard_transform(t, self.had, 1.0 / math.sqrt(768)) * 2.0

    model = Rotate()
    want = model(x)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), want)
    exported = torch.export.export(model, (x,))
    targets = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert ops.hadamard_transform.default in targets
    assert torch.equal(exported.module()(x), want)
    # gradients through the compiled graph (AOT autograd)
    xa = x.clone().requires_grad_()
    compiled(xa).sum().backward()
    xb = x.clone().requires_grad_()
    model(xb).sum().backward()
    assert torch.equal(xa.grad, xb.grad)


def test_both_cpu_kernels_give_the_same_bits():
    """The baseline copy (scalar stages below a register) and the avx2 copy (lane permutes) of
    the CPU kernel, in two processes (Note [CPU capability dispatch])."""
    import os
    import subprocess
    import sys
    code = ("import sys, torch, mqbench; g = torch.Generator().manual_seed(0); "
            "h = torch.randn(12, 12, generator=g, dtype=torch.float64); out = b''\n"
            "for dt in (torch.float32, torch.float64, torch.bfloat16):\n"
            "    for n, had in ((2, None), (8, None), (4096, None), (768, h), (48, h)):\n"
            "        x = torch.randn(5, n, generator=g, dtype=torch.float64).to(dt)\n"
            "        y = torch.ops.mqbench.hadamard_transform(x, had, 0.3)\n"
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
