"""fold_bn_train (src/ops/cuda/bn_fold_kernel.cu) and its backward on CUDA against the CPU kernel
(test_bn_fold.py checks that). The comparison rules and the GPU skip: cuda_harness.py."""
import pytest
import torch

from cuda_harness import REDUCED, assert_agree, finite_max

ops = torch.ops.mqbench


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "sliced"])
@pytest.mark.parametrize("relu", [False, True], ids=["bn", "bn_relu"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_fold_bn_train_agrees_with_the_cpu(with_bias, relu, layout, device):
    """fold_bn_train (outputs, batch statistics, running statistics updated in place) and its
    backward within 1e-5 of the largest value (test_bn_fold.py's measure)."""
    def inputs(dev):
        g = torch.Generator().manual_seed(5)
        x = torch.randn(4, 6, 5, 7, generator=g) * 3 + 1
        s = torch.rand(6, generator=g) + 0.5
        b = torch.randn(6, generator=g) if with_bias else None
        gamma, beta = torch.rand(6, generator=g) + 0.5, torch.randn(6, generator=g)
        dy = torch.randn(4, 6, 5, 7, generator=g)
        x = x.to(dev)
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        elif layout == "sliced":
            big = torch.zeros(4, 6, 5, 14, device=dev)
            big[..., ::2] = x
            x = big[..., ::2]
        t = [v.to(dev) if v is not None else None for v in (s, b, gamma, beta, dy)]
        return x, *t, torch.zeros(6, device=dev), torch.ones(6, device=dev)

    def run(dev):
        x, s, b, gamma, beta, dy, rm, rv = inputs(dev)
        y, mean, rstd = ops.fold_bn_train(x, s, b, gamma, beta, rm, rv, 0.1, 1e-5, relu)
        grads = ops._fold_bn_train_backward(dy, x, s, b, gamma, beta, mean, rstd, relu)
        return [y, mean, rstd, rm, rv], grads

    (want, want_g), (got, got_g) = run("cpu"), run(device)
    for name, o, w in zip(("y", "mean", "rstd", "running_mean", "running_var"), got, want):
        assert_agree(o, w, REDUCED(), torch.float32, w, f"fold_bn_train {name}")
    scale = max(finite_max(w) for w in want_g if w is not None)
    for name, o, w in zip(("x", "scale_factor", "bias", "bn_weight", "bn_bias"), got_g, want_g):
        if w is None:
            assert o is None or not with_bias, name
            continue
        # d_scale_factor and d_bias are ~0 in exact arithmetic (batch norm is scale and shift
        # invariant): everything on the scale of the largest gradient, as test_bn_fold.py.
        torch.testing.assert_close(o.cpu(), w, rtol=0, atol=1e-5 * scale,
                                   msg=lambda m: f"fold_bn_train d{name}: {m}")
