"""The format fake quantizers and observers (docs/formats.md): FP8 with amax observers (min-max,
EMA) per tensor and per channel, learnable FP8, group-wise INT with min-max / EMA / MSE per
group, and get_qconfig_by_platform / prepare_by_platform picking them by the scheme."""
import pytest
import torch
import torch.nn as nn

from mqbench.fake_quantize import (FixedFakeQuantize, FP8FakeQuantize, GroupFakeQuantize,
                                   LearnableFakeQuantize, LearnableFP8FakeQuantize,
                                   LearnableGroupFakeQuantize)
from mqbench.observer import (EMAMinMaxObserver, GroupEMAMinMaxObserver, GroupMinMaxObserver,
                              GroupMSEObserver, MinMaxObserver, MSEObserver)
from mqbench.prepare_by_platform import (BackendType, get_qconfig_by_platform,
                                         prepare_by_platform)
from mqbench.scheme import QuantizeScheme
from mqbench.utils.state import enable_calibration, enable_quantization

FP8 = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}


def fp8_reference(x, scale, fmt):
    fp8, m = FP8[fmt]
    v = x / scale
    if fmt == "fp8_e4m3":
        v = v.clamp(-m, m)
    return v.to(fp8).float() * scale


@pytest.mark.parametrize("fmt", list(FP8))
@pytest.mark.parametrize("per_channel", [False, True])
def test_fp8_fake_quantize_scale_is_amax_over_max(fmt, per_channel):
    params = QuantizeScheme(dtype=fmt, per_channel=per_channel).to_observer_params()
    fq = FP8FakeQuantize(MinMaxObserver, **params)
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(0)) * 5
    y = fq(x)
    _, m = FP8[fmt]
    amax = x.abs().amax(dim=1) if per_channel else x.abs().max().reshape(1)
    torch.testing.assert_close(fq.scale, amax / m, rtol=1e-6, atol=0)
    s = fq.scale.reshape(-1, 1) if per_channel else fq.scale
    assert torch.equal(y, fp8_reference(x, s, fmt))
    assert fq.format == fmt and fq.zero_point.abs().sum() == 0


def test_fp8_ema_observer():
    params = QuantizeScheme(dtype="fp8_e4m3").to_observer_params()
    fq = FP8FakeQuantize(EMAMinMaxObserver, **params, ema_ratio=0.5)
    fq(torch.tensor([1.0, -4.0]))
    fq(torch.tensor([2.0, -1.0]))
    # EMA of the ranges: min -4 -> -2.5, max 1 -> 1.5; amax 2.5
    torch.testing.assert_close(fq.scale, torch.tensor([2.5 / 448]))


def test_learnable_fp8_trains_its_scale():
    params = QuantizeScheme(dtype="fp8_e4m3", per_channel=True).to_observer_params()
    fq = LearnableFP8FakeQuantize(MinMaxObserver, **params)
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1))
    fq(x)
    assert fq.scale.shape == (4,)
    torch.testing.assert_close(fq.scale.detach(), x.abs().amax(1) / 448)
    fq.disable_observer()
    xx = x.clone().requires_grad_()
    y = fq(xx)
    assert torch.equal(y.detach(), fp8_reference(x, fq.scale.detach().reshape(-1, 1), "fp8_e4m3"))
    y.pow(2).sum().backward()
    assert fq.scale.grad is not None and fq.scale.grad.shape == (4,)
    assert torch.isfinite(fq.scale.grad).all() and fq.scale.grad.abs().sum() > 0


def group_amax_scale(w, gs, qmin, qmax):
    g = w.reshape(w.shape[0], -1, gs)
    lo = torch.minimum(g.amin(-1), torch.zeros(()))
    hi = torch.maximum(g.amax(-1), torch.zeros(()))
    return torch.maximum(-lo, hi) / ((qmax - qmin) / 2)


@pytest.mark.parametrize("bits", [4, 8])
def test_group_fake_quantize_min_max(bits):
    params = QuantizeScheme(bit=bits, per_channel=True, group_size=16).to_observer_params()
    fq = GroupFakeQuantize(MinMaxObserver, **params)
    assert isinstance(fq.activation_post_process, GroupMinMaxObserver)
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    y = fq(w)
    qmin, qmax = params["quant_min"], params["quant_max"]
    assert fq.scale.shape == (8, 4)
    torch.testing.assert_close(fq.scale, group_amax_scale(w, 16, qmin, qmax), rtol=1e-6, atol=0)
    ref = torch.fake_quantize_per_channel_affine(w.reshape(-1, 16), fq.scale.reshape(-1),
                                                 fq.zero_point.reshape(-1), 0, qmin, qmax)
    assert torch.equal(y, ref.reshape(w.shape))


def test_group_observers_on_a_conv_weight_keep_the_group_shape():
    w = torch.randn(4, 32, 3, 3, generator=torch.Generator().manual_seed(3))
    obs = GroupEMAMinMaxObserver(dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                                 quant_min=-8, quant_max=7, ch_axis=1, group_size=8)
    obs(w)
    scale, _ = obs.calculate_qparams()
    assert scale.shape == (4, 4, 3, 3)
    g = w.reshape(4, 4, 8, 3, 3).abs().amax(2)
    torch.testing.assert_close(scale, g / 7.5, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match=r"group_size \(8\) must divide the size of axis 1 \(12\)"):
        obs(torch.randn(4, 12, 3, 3))


def test_group_mse_observer_is_the_per_channel_search_per_group():
    w = torch.randn(6, 48, generator=torch.Generator().manual_seed(4))
    kw = dict(dtype=torch.qint8, qscheme=torch.per_channel_symmetric, quant_min=-8, quant_max=7)
    obs = GroupMSEObserver(**kw, ch_axis=1, group_size=16)
    obs(w)
    ref = MSEObserver(**kw, ch_axis=0)
    ref(w.reshape(-1, 16))
    s, z = obs.calculate_qparams()
    rs, rz = ref.calculate_qparams()
    assert torch.equal(s, rs.reshape(6, 3)) and torch.equal(z, rz.reshape(6, 3))
    # the search picked clipped ranges somewhere (not plain min-max everywhere)
    assert (s < group_amax_scale(w, 16, -8, 7) - 1e-7).any()


def test_learnable_group_fake_quantize():
    params = QuantizeScheme(bit=4, per_channel=True, group_size=32,
                            symmetry=False).to_observer_params()
    fq = LearnableGroupFakeQuantize(MinMaxObserver, **params)
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    fq(w)
    assert fq.scale.shape == (4, 2) and fq.zero_point.shape == (4, 2)
    fq.disable_observer()
    ww = w.clone().requires_grad_()
    fq(ww).sum().backward()
    assert fq.scale.grad.shape == (4, 2) and fq.zero_point.grad.shape == (4, 2)
    assert ww.grad.shape == w.shape


def test_qconfig_picks_the_format_twins():
    q = get_qconfig_by_platform(BackendType.Academic, {
        "w_qscheme": {"bit": 4, "per_channel": True, "group_size": 32},
        "a_qscheme": {"dtype": "fp8_e4m3"}, "w_fakequantize": "FixedFakeQuantize",
        "a_fakequantize": "LearnableFakeQuantize", "w_observer": "MSEObserver",
        "a_observer": "EMAMinMaxObserver"})
    w, a = q.weight(), q.activation()
    assert type(w) is GroupFakeQuantize and isinstance(w.activation_post_process, GroupMSEObserver)
    assert type(a) is LearnableFP8FakeQuantize and a.format == "fp8_e4m3"
    with pytest.raises(ValueError, match="DSQFakeQuantize has no fp8 variant"):
        get_qconfig_by_platform(BackendType.Academic, {
            "w_qscheme": {"bit": 8}, "a_qscheme": {"dtype": "fp8_e5m2"},
            "w_fakequantize": "FixedFakeQuantize", "a_fakequantize": "DSQFakeQuantize",
            "w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver"})
    # integer schemes keep their classes
    q = get_qconfig_by_platform(BackendType.Academic, {
        "w_qscheme": {"bit": 4}, "a_qscheme": {"bit": 8},
        "w_fakequantize": "FixedFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
        "w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver"})
    assert type(q.weight()) is FixedFakeQuantize and type(q.activation()) is LearnableFakeQuantize


def test_prepare_a_model_with_fp8_activations_and_int4_group_weights():
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    prepared = prepare_by_platform(model, BackendType.Academic, {"extra_qconfig_dict": {
        "w_qscheme": {"bit": 4, "per_channel": True, "group_size": 32},
        "a_qscheme": {"dtype": "fp8_e4m3"}, "w_fakequantize": "FixedFakeQuantize",
        "a_fakequantize": "FixedFakeQuantize", "w_observer": "MinMaxObserver",
        "a_observer": "MinMaxObserver"}})
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(6))
    enable_calibration(prepared)
    prepared(x)
    enable_quantization(prepared)
    y = prepared(x)
    fqs = {n: m for n, m in prepared.named_modules()
           if isinstance(m, (GroupFakeQuantize, FP8FakeQuantize))}
    assert any(isinstance(m, GroupFakeQuantize) for m in fqs.values())
    assert any(isinstance(m, FP8FakeQuantize) for m in fqs.values())
    w_fq = prepared.get_submodule("0").weight_fake_quant
    assert w_fq.scale.shape == (32, 2)
    torch.testing.assert_close(y, model(x), rtol=0.3, atol=0.3)


def test_academic_first_and_last_layers_keep_the_fp8_range():
    """Academic's rule gives the first and last layers 8-bit integer ranges; a float format
    keeps its own (an FP8 quantizer with [-128, 127] would scale by amax / 127.5)."""
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    prepared = prepare_by_platform(model, BackendType.Academic, {"extra_qconfig_dict": {
        "w_qscheme": {"dtype": "fp8_e4m3", "per_channel": True},
        "a_qscheme": {"dtype": "fp8_e4m3"}, "w_fakequantize": "FixedFakeQuantize",
        "a_fakequantize": "FixedFakeQuantize", "w_observer": "MinMaxObserver",
        "a_observer": "MinMaxObserver"}})
    fqs = [m for m in prepared.modules() if isinstance(m, FP8FakeQuantize)]
    assert len(fqs) >= 4
    assert all((m.quant_min, m.quant_max) == (-448, 448) for m in fqs)
    # integer group-wise weights still get the rule's 8-bit first and last layers
    prepared = prepare_by_platform(model, BackendType.Academic, {"extra_qconfig_dict": {
        "w_qscheme": {"bit": 4, "per_channel": True, "group_size": 8},
        "a_qscheme": {"bit": 4}, "w_fakequantize": "FixedFakeQuantize",
        "a_fakequantize": "FixedFakeQuantize", "w_observer": "MinMaxObserver",
        "a_observer": "MinMaxObserver"}})
    w = prepared.get_submodule("0").weight_fake_quant
    assert type(w) is GroupFakeQuantize and (w.quant_min, w.quant_max) == (-128, 127)
