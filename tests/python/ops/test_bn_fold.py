"""The fused BatchNorm-folding op (torch.ops.mqbench.fold_bn_train) and the ConvBn QAT modules
built on it, against torch's formulation (conv / s + b, batch_norm, relu) evaluated in float64."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.intrinsic as nni
import torch.nn.intrinsic.qat as nniqat

from mqbench.nn.intrinsic import qat as qnniqat
from mqbench.prepare_by_platform import BackendType, get_qconfig_by_platform
from mqbench.utils.logger import set_log_level

set_log_level("WARNING")


def reference(x, s, b, g, be, rm, rv, factor, eps, relu):
    shape = [1, -1] + [1] * (x.dim() - 2)
    z = x / s.reshape(shape)
    if b is not None:
        z = z + b.reshape(shape)
    y = F.batch_norm(z, rm, rv, g, be, training=True, momentum=factor, eps=eps)
    return F.relu(y) if relu else y


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shape", [(4, 6, 5, 7), (3, 5, 9), (2, 3, 4, 4, 4)])
def test_forward_gradients_and_running_stats(relu, with_bias, shape):
    g = torch.Generator().manual_seed(0)
    c = shape[1]
    x = torch.randn(*shape, generator=g) * 3 + 1
    s = torch.rand(c, generator=g) + 0.5
    b = torch.randn(c, generator=g) if with_bias else None
    gamma, beta = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)
    dy = torch.randn(*shape, generator=g)
    leaves = [t.clone().requires_grad_() for t in (x, s, gamma, beta)]
    bias = b.clone().requires_grad_() if with_bias else None
    rm, rv = torch.zeros(c), torch.ones(c)
    y = torch.ops.mqbench.fold_bn_train(leaves[0], leaves[1], bias, leaves[2], leaves[3], rm, rv,
                                        0.1, 1e-5, relu)[0]
    got = torch.autograd.grad(y, leaves + ([bias] if with_bias else []), dy)
    d = [t.double().requires_grad_() for t in (x, s, gamma, beta)]
    db = b.double().requires_grad_() if with_bias else None
    rmd, rvd = torch.zeros(c, dtype=torch.float64), torch.ones(c, dtype=torch.float64)
    yd = reference(d[0], d[1], db, d[2], d[3], rmd, rvd, 0.1, 1e-5, relu)
    want = torch.autograd.grad(yd, d + ([db] if with_bias else []), dy.double())
    assert torch.allclose(y.double(), yd, atol=2e-5)
    scale = max(float(w.abs().max()) for w in want)
    for name, a, w in zip(("x", "s", "gamma", "beta", "bias"), got, want):
        # d_s and d_bias are ~0 in exact arithmetic (batch norm is scale and shift invariant):
        # compare everything on the scale of the largest gradient.
        assert (a.double() - w).abs().max() <= 1e-5 * scale + 1e-6, name
    assert torch.allclose(rm.double(), rmd, atol=1e-6)
    assert torch.allclose(rv.double(), rvd, atol=1e-5)


def test_op_errors():
    x = torch.randn(2, 3, 4)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.mqbench.fold_bn_train(x.double(), torch.ones(3), None, None, None,
                                        torch.zeros(3), torch.ones(3), 0.1, 1e-5, False)
    with pytest.raises(RuntimeError, match="scale_factor has 2 elements but x has 3 channels"):
        torch.ops.mqbench.fold_bn_train(x, torch.ones(2), None, None, None, torch.zeros(3),
                                        torch.ones(3), 0.1, 1e-5, False)
    with pytest.raises(RuntimeError, match="more than one value per channel"):
        torch.ops.mqbench.fold_bn_train(torch.randn(1, 3, 1), torch.ones(3), None, None, None,
                                        torch.zeros(3), torch.ones(3), 0.1, 1e-5, False)


_CONV_BN = {1: (nn.Conv1d, nn.BatchNorm1d), 2: (nn.Conv2d, nn.BatchNorm2d),
            3: (nn.Conv3d, nn.BatchNorm3d)}


@pytest.mark.parametrize("dims,relu,slow", [(2, False, False), (2, True, False), (1, True, False),
                                            (3, False, False), (2, True, True), (1, False, True)])
def test_modules_match_torch_qat_modules(dims, relu, slow):
    """Our ConvBn / ConvBnReLU QAT modules (owned, not torch's subclasses) against torch's: built
    from torch's fused container, same state-dict keys and version, same outputs and gradients
    over training steps (fused C++ tail, or the two-pass slow path), same eval output; and a
    state dict of torch's module loads into ours."""
    torch.manual_seed(0)
    qconfig = get_qconfig_by_platform(BackendType.Tensorrt, {})
    conv_cls, bn_cls = _CONV_BN[dims]
    conv, bn = conv_cls(3, 8, 3, padding=1, bias=True), bn_cls(8)
    name = f"ConvBn{'ReLU' if relu else ''}{dims}d"
    parts = (conv, bn, nn.ReLU()) if relu else (conv, bn)
    fused = getattr(nni, name)(*parts)  # torch's container: accepted by our from_float
    fused.qconfig = qconfig
    ours_cls, torch_cls = getattr(qnniqat, name), getattr(nniqat, name)
    ours = ours_cls.from_float(copy.deepcopy(fused))
    ref = torch_cls.from_float(copy.deepcopy(fused))
    assert not isinstance(ours, torch_cls)
    ours._enable_slow_path_for_better_numerical_stability = slow
    ref._enable_slow_path_for_better_numerical_stability = slow
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert ours.state_dict()._metadata[""]["version"] == ref.state_dict()._metadata[""]["version"]
    x = torch.randn(4, 3, *([10] * dims))
    for step in range(2):
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), ref(xb)
        assert torch.allclose(ya, yb, atol=1e-4), step
        ya.square().sum().backward()
        yb.square().sum().backward()
        assert torch.allclose(xa.grad, xb.grad, atol=1e-4, rtol=1e-3)
        assert torch.allclose(ours.weight.grad, ref.weight.grad, atol=1e-3, rtol=1e-3)
        assert torch.allclose(ours.bn.weight.grad, ref.bn.weight.grad, atol=1e-3, rtol=1e-3)
        assert torch.allclose(ours.weight_fake_quant.scale.grad, ref.weight_fake_quant.scale.grad,
                              atol=1e-4, rtol=1e-2)
        assert torch.allclose(ours.bn.running_var, ref.bn.running_var, atol=1e-5)
        assert int(ours.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked)
    fresh = ours_cls.from_float(copy.deepcopy(fused))
    fresh.load_state_dict(ref.state_dict())
    for key, value in ref.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    ours.eval()
    ref.eval()
    assert torch.allclose(ours(x), ref(x), atol=1e-5)  # eval: torch's own path
