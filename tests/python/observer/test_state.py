"""mqbench.utils.state on a prepared model: which quantizers observe and which quantize."""
import warnings

import pytest
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


@pytest.mark.filterwarnings("ignore:enable_quantization:UserWarning")  # never calibrated here
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


def _no_warning(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn()


def test_quantizers_never_calibrated_are_named_at_qat_and_deploy_time(tmp_path):
    from mqbench.convert_deploy import convert_deploy
    # Skipping calibration: every quantizer would run with scale 1.0 ("trains" and deploys
    # silently before). enable_quantization names them.
    q = prepared()
    with pytest.warns(UserWarning, match=r"enable_quantization: 4 fake quantizer\(s\) were never "
                      r"calibrated and quantize with scale 1.0: .*0.weight_fake_quant"):
        state.enable_quantization(q)
    assert set(state.uncalibrated_quantizers(q)) == set(flags(q))
    with pytest.warns(UserWarning, match=r"convert_deploy: 4 fake quantizer\(s\) were never"):
        convert_deploy(q, BackendType.Tensorrt, {"x": [1, 3, 6, 6]}, output_path=str(tmp_path))

    # Observers left on calibrate as they run: only the others are named.
    q = prepared()
    with pytest.warns(UserWarning, match=r"enable_quantization: 2 fake quantizer\(s\) .*: "
                      r"input_1_post_act_fake_quantizer, _2_post_act_fake_quantizer\. Run"):
        state.enable_quantization(q, weight_cali_on=True)

    # Calibrated, or a scale set by hand: no warning.
    q = prepared()
    state.enable_calibration(q)
    q(torch.randn(2, 3, 6, 6))
    _no_warning(lambda: state.enable_quantization(q))
    assert state.uncalibrated_quantizers(q) == []
    _no_warning(lambda: convert_deploy(q, BackendType.Tensorrt, {"x": [1, 3, 6, 6]},
                                       output_path=str(tmp_path)))
    q = prepared()
    for _, m in q.named_modules():
        if isinstance(m, torch.quantization.FakeQuantizeBase):
            m.scale.data.fill_(0.05)
    _no_warning(lambda: state.enable_quantization(q))


def test_uncalibrated_lsq_and_nnie_quantizers_are_named():
    for backend in (BackendType.Academic, BackendType.NNIE):
        net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        scheme = {"bit": 4, "symmetry": True, "per_channel": False, "pot_scale": False}
        extra = {"extra_qconfig_dict": {
            "w_observer": "MinMaxObserver", "a_observer": "EMAMinMaxObserver",
            "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
            "w_qscheme": scheme, "a_qscheme": scheme}} if backend == BackendType.Academic else {}
        q = prepare_by_platform(net.eval(), backend, extra)
        with pytest.warns(UserWarning, match="were never calibrated"):
            state.enable_quantization(q)
        state.enable_calibration(q)
        q(torch.randn(2, 3, 6, 6))
        _no_warning(lambda: state.enable_quantization(q))
