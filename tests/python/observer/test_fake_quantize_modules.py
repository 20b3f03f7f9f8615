"""mqbench.fake_quantize modules: modes, numerics against torch / the ops, state dicts as
MQBench's, checkpoints, copies and dtype moves."""
import copy
import io

import pytest
import torch

from mqbench.fake_quantize import (AdaRoundFakeQuantize, DoReFaFakeQuantize, DSQFakeQuantize,
                                   FixedFakeQuantize, LearnableFakeQuantize, NNIEFakeQuantize,
                                   PACTFakeQuantize, QDropFakeQuantize, TqtFakeQuantize)
from mqbench.observer import EMAMinMaxObserver, MinMaxFloorObserver, MinMaxObserver
import reference

ops = torch.ops.mqbench
SYM8 = dict(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric, quant_min=-128, quant_max=127)
ASYM8 = dict(dtype=torch.quint8, qscheme=torch.per_tensor_affine, quant_min=0, quant_max=255)
SYM8_CH = dict(dtype=torch.qint8, qscheme=torch.per_channel_symmetric, quant_min=-127,
               quant_max=127, ch_axis=0)
APP = ["activation_post_process.eps", "activation_post_process.min_val",
       "activation_post_process.max_val"]
FLAGS = ["fake_quant_enabled", "observer_enabled"]


def build(cls, kw=SYM8, observer=MinMaxObserver, **extra):
    fq = cls(observer, **kw, **extra)
    if isinstance(fq, TqtFakeQuantize):
        fq.set_quant_type("tensor")
    return fq


ALL = [FixedFakeQuantize, LearnableFakeQuantize, NNIEFakeQuantize, DoReFaFakeQuantize,
       DSQFakeQuantize, PACTFakeQuantize, TqtFakeQuantize, AdaRoundFakeQuantize, QDropFakeQuantize]


@pytest.mark.parametrize("cls,keys", [
    (FixedFakeQuantize, FLAGS + ["scale", "zero_point"] + APP),
    (LearnableFakeQuantize, ["scale", "zero_point"] + FLAGS + ["eps"] + APP),
    (NNIEFakeQuantize, FLAGS + ["data_max"] + APP),
    (DoReFaFakeQuantize, FLAGS + ["scale", "zero_point"] + APP),
    (DSQFakeQuantize, FLAGS + ["scale", "zero_point"] + APP),
    (PACTFakeQuantize, ["alpha"] + FLAGS + ["scale", "zero_point"] + APP),
    (TqtFakeQuantize, FLAGS + ["scale", "zero_point", "eps"] + APP),
    (AdaRoundFakeQuantize, FLAGS + ["scale", "zero_point"] + APP),
    (QDropFakeQuantize, ["scale"] + FLAGS + ["zero_point"] + APP),
], ids=lambda v: getattr(v, "__name__", ""))
def test_state_dict_keys_are_mqbench_s(cls, keys):
    assert list(build(cls).state_dict()) == keys


def test_asymmetric_pact_adds_n_alpha():
    assert list(build(PACTFakeQuantize, ASYM8).state_dict())[:2] == ["alpha", "n_alpha"]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_calibration_quantization_and_both(cls):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, 5, 5, generator=g)
    fq = build(cls)
    fq.train()
    # calibration: observer on, fake quant off -> identity (DoReFa always normalises)
    fq.enable_observer()
    fq.disable_fake_quant()
    y = fq(x)
    expect = ops.dorefa_normalize(x) if cls is DoReFaFakeQuantize else x
    assert torch.equal(y, expect)
    app = fq.activation_post_process
    assert torch.isfinite(app.max_val).all()
    # quantization: observer off -> the stored qparams are used and the observer state stays
    fq.disable_observer()
    fq.enable_fake_quant()
    state = copy.deepcopy(fq.state_dict())
    y = fq(x * 0.5)
    if cls is not DSQFakeQuantize:  # DSQ observes whenever training, as MQBench
        assert torch.equal(app.max_val, state["activation_post_process.max_val"])
    assert not torch.equal(y, x * 0.5)
    levels = y.unique().numel()
    assert levels <= 256
    # both
    fq.enable_observer()
    y2 = fq(x)
    assert y2.shape == x.shape and torch.isfinite(y2).all()


def test_fixed_equals_torch_fake_quant_per_tensor_and_per_channel():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, 4, 4, generator=g)
    fq = build(FixedFakeQuantize)
    y = fq(x)
    s, z = fq.scale, fq.zero_point
    assert torch.equal(y, torch.fake_quantize_per_tensor_affine(x, float(s), int(z), -128, 127))
    fqc = build(FixedFakeQuantize, SYM8_CH)
    yc = fqc(x)
    assert fqc.scale.shape == (6,)
    assert torch.equal(yc, torch.fake_quantize_per_channel_affine(x, fqc.scale, fqc.zero_point,
                                                                  0, -127, 127))


@pytest.mark.parametrize("kw", [SYM8, ASYM8, SYM8_CH], ids=["sym", "asym", "per_channel"])
def test_learnable_matches_torch_learnable_op(kw):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, 4, 4, generator=g)
    fq = build(LearnableFakeQuantize, kw, observer=EMAMinMaxObserver)
    fq(x)
    fq.disable_observer()
    xr = x.clone().requires_grad_()
    y = fq(xr)
    y.sum().backward()
    s = fq.scale.detach().clone().requires_grad_()
    z = fq.zero_point.detach().clone().requires_grad_()
    x2 = x.clone().requires_grad_()
    if fq.is_per_channel:
        gf = 1.0 / (x.numel() / x.shape[0] * fq.quant_max) ** 0.5
        y_ref = torch._fake_quantize_learnable_per_channel_affine(x2, s, z, 0, fq.quant_min,
                                                                  fq.quant_max, gf)
    else:
        gf = 1.0 / (x.numel() * fq.quant_max) ** 0.5
        y_ref = torch._fake_quantize_learnable_per_tensor_affine(x2, s, z, fq.quant_min,
                                                                 fq.quant_max, gf)
    y_ref.sum().backward()
    assert torch.equal(y, y_ref)
    assert torch.allclose(fq.scale.grad, s.grad, rtol=1e-4, atol=1e-7)
    assert torch.allclose(xr.grad, x2.grad)
    if fq.is_symmetric_quant:
        assert torch.all(fq.zero_point == 0)


def test_learnable_scale_kept_positive_when_observer_off():
    fq = build(LearnableFakeQuantize)
    fq.disable_observer()
    with torch.no_grad():
        fq.scale.fill_(-0.5)
    fq(torch.randn(10))
    assert fq.scale.item() == 0.5
    with torch.no_grad():
        fq.scale.fill_(0.0)
    fq(torch.randn(10))
    assert fq.scale.item() == pytest.approx(torch.finfo(torch.float32).eps)


def test_use_grad_scaling_false_gives_factor_one():
    x = torch.randn(100, generator=torch.Generator().manual_seed(7))
    fq = build(LearnableFakeQuantize, use_grad_scaling=False)
    fq(x)
    fq.disable_observer()
    fq(x).sum().backward()
    s = fq.scale.detach().clone().requires_grad_()
    torch._fake_quantize_learnable_per_tensor_affine(x, s, torch.zeros(1), -128, 127, 1.0).sum().backward()
    assert fq.scale.grad.item() == pytest.approx(s.grad.item(), rel=1e-4, abs=1e-5)


def test_per_channel_checkpoint_loads_into_fresh_module():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 4, 3, 3, generator=g)
    for cls in (LearnableFakeQuantize, FixedFakeQuantize, QDropFakeQuantize):
        fq = build(cls, SYM8_CH)
        fq(w)
        fq.disable_observer()
        expect = fq(w)
        buf = io.BytesIO()
        torch.save(fq.state_dict(), buf)
        buf.seek(0)
        fresh = build(cls, SYM8_CH)
        assert fresh.scale.shape == (1,)
        fresh.load_state_dict(torch.load(buf))
        assert fresh.scale.shape == (8,) and fresh.observer_enabled.item() == 0
        assert torch.equal(fresh(w), expect), cls.__name__


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_deepcopy_double_and_to(cls):
    x = torch.randn(4, 8, 3, 3, generator=torch.Generator().manual_seed(5))
    fq = build(cls)
    fq(x)
    c = copy.deepcopy(fq)
    c.disable_observer()
    fq.disable_observer()
    if cls is QDropFakeQuantize:
        torch.manual_seed(0)
    a = fq(x)
    if cls is QDropFakeQuantize:
        torch.manual_seed(0)
    assert torch.equal(c(x), a)
    d = copy.deepcopy(fq).double()
    yd = d(x.double())
    assert yd.dtype == torch.float64
    # float64 arithmetic may land an element near a rounding tie on the other side (one step)
    close = (yd.float() - a).abs() <= 1e-6
    assert close.float().mean() >= 0.99
    step = float(fq.scale.max()) if hasattr(fq, "scale") else float("inf")
    assert ((yd.float() - a).abs() <= step * 1.001 + 1e-6).all()
    e = copy.deepcopy(fq).to(torch.device("cpu"), torch.float64)
    assert e(x.double()).dtype == torch.float64


def test_with_args_and_extra_repr():
    factory = LearnableFakeQuantize.with_args(observer=MinMaxObserver, **SYM8)
    fq = factory()
    assert isinstance(fq, LearnableFakeQuantize) and fq.quant_min == -128
    assert "scale=" in repr(fq) and "quant_max=127" in repr(fq)
    assert fq.bitwidth == 8 and fq.is_symmetric_quant and not fq.is_per_channel


def test_pact_clips_and_trains_alpha_while_observing():
    x = torch.linspace(-8, 8, 101)
    fq = build(PACTFakeQuantize, alpha=4.0)
    xr = x.clone().requires_grad_()
    y = fq(xr)
    assert fq.activation_post_process.max_val.item() == 4.0
    assert fq.activation_post_process.min_val.item() == -4.0
    alpha = torch.tensor([4.0], requires_grad=True)
    y_ref = reference.pact(x, alpha, -alpha, fq.scale, fq.zero_point, -128, 127)
    assert torch.equal(y, y_ref)
    y.sum().backward()
    y_ref.sum().backward()
    assert fq.alpha.grad.item() == pytest.approx(alpha.grad.item())
    # no negative values: no lower clip, min_val 0
    fq2 = build(PACTFakeQuantize, alpha=4.0)
    fq2(torch.linspace(0, 8, 11))
    assert fq2.activation_post_process.min_val.item() == 0.0


def test_tqt_requires_a_quant_type():
    fq = TqtFakeQuantize(MinMaxFloorObserver, **SYM8)
    with pytest.raises(ValueError, match="set the observer type"):
        fq(torch.randn(10))
    fq2 = TqtFakeQuantize(MinMaxObserver, **SYM8)
    with pytest.raises(ValueError, match="Invalid method None"):
        fq2(torch.randn(10))
    with pytest.raises(ValueError, match="not one of"):
        fq2.set_quant_type("weights")
    fq2.set_quant_type("param")
    assert fq2.mth == 3


def test_tqt_output_uses_power_of_two_steps():
    fq = TqtFakeQuantize(MinMaxFloorObserver, **SYM8)
    fq.set_quant_type("param")
    y = fq(torch.randn(1000, generator=torch.Generator().manual_seed(9)))
    step = fq.scale.item()
    assert step == 2.0 ** round(torch.log2(torch.tensor(step)).item())
    assert torch.allclose(y / step, torch.round(y / step))


def test_adaround_init_soft_and_hard():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 4, 3, 3, generator=g)
    fq = build(AdaRoundFakeQuantize, SYM8_CH)
    fixed = fq(w)
    fq.init(w)
    assert fq.observer_enabled.item() == 0 and fq.adaround
    s = fq.scale.reshape(8, 1, 1, 1)
    rest = w / s - torch.floor(w / s)
    assert torch.allclose(fq.rectified_sigmoid(), rest, atol=1e-5)
    soft = fq(w)
    assert torch.allclose(soft, torch.clamp(w / s, -127, 127) * s, atol=1e-5)  # h = rest: no rounding yet
    hard = fq.get_hard_value(w)
    assert torch.allclose(hard, (torch.clamp(torch.floor(w / s) + (rest >= 0.5).float(), -127, 127)) * s,
                          atol=1e-6)
    # round-half-up of the hard decision differs from half-to-even only at exact ties
    assert torch.allclose(hard, fixed, atol=1e-6)
    soft.sum().backward()
    assert fq.alpha.grad is not None and fq.alpha.grad.abs().sum() > 0
    with pytest.raises(NotImplementedError):
        build(AdaRoundFakeQuantize).init(w, round_mode="nearest")


def test_qdrop_probability_is_reproducible():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(8))
    fq = build(QDropFakeQuantize)
    fq(x)
    fq.disable_observer()
    full = fq(x)
    fq.prob = 0.5
    torch.manual_seed(3)
    a = fq(x)
    torch.manual_seed(3)
    b = fq(x)
    assert torch.equal(a, b)
    kept = (a == x) & (full != x)
    assert 300 < int(kept.sum()) < 700


def test_nnie_tracks_data_max_and_refuses_uncalibrated():
    fq = build(NNIEFakeQuantize)
    fq.disable_observer()
    with pytest.raises(RuntimeError, match="calibrate"):
        fq(torch.randn(10))
    fq.enable_observer()
    fq(torch.tensor([-3.0, 2.0]))
    fq(torch.tensor([1.0, 2.5]))
    assert fq.data_max.item() == 3.0
    y = fq(torch.tensor([0.5, -1.0]))
    assert torch.equal(y, ops.fake_quantize_nnie(torch.tensor([0.5, -1.0]), fq.data_max))
    # calibrated on all-zero data (a zero-initialised head): the range is {0}
    zero = build(NNIEFakeQuantize)
    zero(torch.zeros(4))
    assert zero.data_max.item() == 0.0
    zero.disable_observer()
    x = (torch.rand(6) + 0.5).requires_grad_()
    y = zero(x)
    assert torch.equal(y, torch.zeros(6))
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(6))  # the op's straight-through gradient


def test_dsq_observes_in_training_only():
    fq = build(DSQFakeQuantize, alpha=0.3)
    fq.disable_observer()
    fq.train()
    fq(torch.randn(100) * 3)
    assert torch.isfinite(fq.activation_post_process.max_val)
    before = fq.activation_post_process.max_val.clone()
    fq.eval()
    x = torch.randn(100) * 10
    y = fq(x)
    assert torch.equal(fq.activation_post_process.max_val, before)
    assert torch.equal(y, torch.ops.mqbench.fake_quantize_dsq_per_tensor(
        x, fq.scale, fq.zero_point, -128, 127, 0.3))


def test_torch_observer_inside_a_fake_quantizer():
    # MQBench reads observer.pot_scale, which torch's observers lack (AttributeError there).
    fq = FixedFakeQuantize(torch.quantization.MovingAverageMinMaxObserver, quant_min=0,
                           quant_max=255)
    assert fq.pot_scale is False
    y = fq(torch.linspace(-1, 1, 50))
    assert torch.equal(y, torch.fake_quantize_per_tensor_affine(
        torch.linspace(-1, 1, 50), float(fq.scale), int(fq.zero_point), 0, 255))


def test_learnable_scale_driven_to_inf_is_a_clear_error():
    # An optimizer step can overflow the scale (MQBench clamps it to >= eps only, which lets
    # inf through); the next forward names the bad value instead of returning NaN.
    fq = build(LearnableFakeQuantize)
    fq(torch.randn(10))
    fq.disable_observer()
    with torch.no_grad():
        fq.scale.fill_(3e38)
    fq.scale.grad = torch.tensor([-1e38])
    torch.optim.SGD([fq.scale], lr=1.0).step()
    assert torch.isinf(fq.scale).all()
    with pytest.raises(RuntimeError, match=r"scale must be positive and finite, got scale\[0\] = inf"):
        fq(torch.randn(10))


def test_pact_refuses_a_per_channel_scheme():
    # One learned alpha per tensor: a per-channel scheme used to fail only at ONNX export.
    with pytest.raises(ValueError, match="PACTFakeQuantize learns one clipping threshold per tensor"):
        PACTFakeQuantize(MinMaxObserver, quant_min=-8, quant_max=7, dtype=torch.qint8,
                         qscheme=torch.per_channel_symmetric, ch_axis=0)
