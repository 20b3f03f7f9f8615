"""mqbench.utils.state on a prepared model: which quantizers observe and which quantize."""
import torch
import torch.nn as nn

from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils import state

set_log_level("WARNING")


def flags(model):
    return {n: (int(m.observer_enabled), int(m.fake_quant_enabled)) for n, m in model.named_modules()
            if isinstance(m, torch.quantization.FakeQuantizeBase)}


def prepared():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    return prepare_by_platform(net.eval(), BackendType.Tensorrt)


def test_state_functions():
    q = prepared()
    names = set(flags(q))
    assert {"0.weight_fake_quant", "3.weight_fake_quant", "input_1_post_act_fake_quantizer"} <= names
    state.enable_calibration(q)
    assert set(flags(q).values()) == {(1, 0)}
    state.enable_quantization(q)
    assert set(flags(q).values()) == {(0, 1)}
    state.enable_quantization(q, weight_cali_on=True)
    f = flags(q)
    assert f["0.weight_fake_quant"] == (1, 1) and f["input_1_post_act_fake_quantizer"] == (0, 1)
    state.enable_quantization(q, act_cali_on=True)
    assert flags(q)["input_1_post_act_fake_quantizer"] == (1, 1)
    state.disable_all(q)
    assert set(flags(q).values()) == {(0, 0)}
    state.enable_all(q)
    assert set(flags(q).values()) == {(1, 1)}
    state.enable_calibration_woquantization(q, quantizer_type="act_fake_quant")
    f = flags(q)
    assert f["input_1_post_act_fake_quantizer"] == (1, 0) and f["0.weight_fake_quant"] == (0, 0)
    state.enable_calibration_quantization(q, quantizer_type="weight_fake_quant")
    f = flags(q)
    assert f["0.weight_fake_quant"] == (1, 1) and f["input_1_post_act_fake_quantizer"] == (0, 0)


def test_conv_relu_and_linear_relu_fuse_and_swap():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 8),
                        nn.ReLU(), nn.Linear(8, 2)).eval()
    q = prepare_by_platform(net, BackendType.Tensorrt)
    kinds = {n: type(m).__name__ for n, m in q.named_children()}
    assert kinds["0"] == "ConvReLU2d" and kinds["3"] == "LinearReLU" and kinds["5"] == "Linear"
    assert not hasattr(net[0], "qconfig")  # nothing left on the user's modules
    x = torch.randn(2, 3, 6, 6)
    state.disable_all(q)
    assert torch.allclose(q(x), net(x), atol=1e-6)
