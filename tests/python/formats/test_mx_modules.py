"""MXFakeQuantize / NVFP4FakeQuantize: the switches, the NVFP4 amax observation, the state
dict, and prepare_by_platform choosing them from QuantizeScheme(dtype=...)."""
import pytest
import torch

from mqbench.convert_deploy import convert_deploy
from mqbench.fake_quantize import MXFakeQuantize, NVFP4FakeQuantize
from mqbench.observer import EMAMinMaxObserver, MinMaxObserver
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.scheme import QuantizeScheme
from mqbench.utils.state import enable_calibration, enable_quantization

ops = torch.ops.mqbench


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4"])
def test_mx_module_is_the_op_between_switches(fmt):
    fq = MXFakeQuantize(MinMaxObserver, **QuantizeScheme(dtype=fmt).to_observer_params())
    assert fq.format == fmt and fq.bitwidth == (8 if fmt == "mxfp8_e4m3" else 4)
    x = randn(4, 64, seed=1, scale=3)
    torch.testing.assert_close(fq(x), ops.fake_quantize_mx(x, fmt, 32, -1), rtol=0, atol=0)
    # the observer ran (its range is informative)
    assert float(fq.activation_post_process.max_val) == float(x.max())
    # a conv weight: blocks along axis 1 (input channels)
    w = randn(8, 64, 3, 3, seed=2)
    torch.testing.assert_close(fq(w), ops.fake_quantize_mx(w, fmt, 32, 1), rtol=0, atol=0)
    fq.disable_fake_quant()
    assert fq(x) is x
    # an explicit axis and block size
    fq = MXFakeQuantize(MinMaxObserver, block_size=16, axis=0,
                        **QuantizeScheme(dtype=fmt).to_observer_params())
    fq.disable_observer()
    torch.testing.assert_close(fq(x), ops.fake_quantize_mx(x, fmt, 16, 0), rtol=0, atol=0)


def test_mx_module_refuses_other_formats():
    with pytest.raises(ValueError, match="runs mxfp8_e4m3 / mxfp6_e3m2 / mxfp6_e2m3 / mxfp4 "):
        MXFakeQuantize(MinMaxObserver, **QuantizeScheme(dtype="nvfp4").to_observer_params())
    with pytest.raises(ValueError, match="NVFP4FakeQuantize: the NVFP4 global scale is per tensor"):
        NVFP4FakeQuantize(MinMaxObserver, qscheme=torch.per_channel_symmetric, ch_axis=0)


@pytest.mark.parametrize("observer", [MinMaxObserver, EMAMinMaxObserver])
def test_nvfp4_module_observes_amax(observer):
    fq = NVFP4FakeQuantize(observer, **QuantizeScheme(dtype="nvfp4").to_observer_params())
    fq.disable_fake_quant()
    a, b = randn(8, 32, seed=3, scale=2), randn(8, 32, seed=4, scale=5)
    fq(a)
    fq(b)
    app = fq.activation_post_process
    assert float(fq.amax) == max(-float(app.min_val), float(app.max_val))
    if observer is MinMaxObserver:
        assert float(fq.amax) == float(torch.cat([a, b]).abs().max())
    fq.enable_fake_quant()
    fq.disable_observer()
    x = randn(8, 32, seed=5, scale=4)
    torch.testing.assert_close(fq(x), ops.fake_quantize_nvfp4(x, fq.amax, 16, -1), rtol=0, atol=0)
    # the state dict carries amax and the switches; a fresh module loads them
    sd = fq.state_dict()
    assert {"amax", "fake_quant_enabled", "observer_enabled"} <= set(sd)
    fq2 = NVFP4FakeQuantize(observer, **QuantizeScheme(dtype="nvfp4").to_observer_params())
    fq2.load_state_dict(sd)
    torch.testing.assert_close(fq2(x), fq(x), rtol=0, atol=0)


def test_nvfp4_module_before_calibration_says_what_to_do():
    fq = NVFP4FakeQuantize(MinMaxObserver)
    fq.disable_observer()
    with pytest.raises(RuntimeError, match="observe data"):
        fq(torch.randn(2, 16))


def test_straight_through_gradient_in_modules():
    x = randn(4, 64, seed=6).requires_grad_()
    fq = NVFP4FakeQuantize(MinMaxObserver)
    fq(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 32)
        self.fc2 = torch.nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.mark.parametrize("w_dtype,a_dtype", [("mxfp4", "mxfp8_e4m3"), ("nvfp4", "nvfp4"),
                                             ("mxfp8_e4m3", "nvfp4")])
def test_prepare_by_platform_picks_the_format_modules(w_dtype, a_dtype, tmp_path):
    torch.manual_seed(0)
    model = _Mlp().eval()
    extra = {"extra_qconfig_dict": {"w_qscheme": {"dtype": w_dtype},
                                    "a_qscheme": {"dtype": a_dtype}}}
    prepared = prepare_by_platform(model, BackendType.Tensorrt, extra)
    cls = {"mxfp4": MXFakeQuantize, "mxfp8_e4m3": MXFakeQuantize, "nvfp4": NVFP4FakeQuantize}
    wfq = prepared.fc1.weight_fake_quant
    assert type(wfq) is cls[w_dtype] and wfq.format == w_dtype
    afqs = [m for n, m in prepared.named_modules() if n.endswith("post_act_fake_quantizer")]
    assert afqs and all(type(m) is cls[a_dtype] and m.format == a_dtype for m in afqs)
    x = randn(16, 64, seed=7)
    enable_calibration(prepared)
    prepared(x)
    enable_quantization(prepared)
    y = prepared(x)
    # the weight the first layer uses is the op applied to its float weight
    w = prepared.fc1.weight
    expect = ops.fake_quantize_mx(w, w_dtype, 32, -1) if w_dtype != "nvfp4" else \
        ops.fake_quantize_nvfp4(w, w.detach().abs().max(), 16, -1)
    torch.testing.assert_close(wfq(w), expect, rtol=0, atol=0)
    # a QAT step reaches the weights
    y.sum().backward()
    assert prepared.fc1.weight.grad is not None and prepared.fc1.weight.grad.abs().sum() > 0
    # a backend that deploys integers only refuses them, naming the format and where it deploys
    # (the deploys themselves: test_mx_deploy.py)
    with pytest.raises(ValueError, match=r"is (MX|NV)FP.*SNPE deploys integer quantization.*"
                                         r"MX and NVFP4 deploy to Tensorrt"):
        convert_deploy(prepared, BackendType.SNPE, {"x": [16, 64]}, output_path=str(tmp_path))
