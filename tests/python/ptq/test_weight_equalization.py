"""Tests of mqbench.weight_equalization: the DFQ scale against a per-channel loop, function
preservation and range evening on float, depthwise, linear and BatchNorm-folding QAT models, the
outlier-channel model (per-tensor 8-bit loses SQNR and accuracy, CLE recovers them), empirical
bias correction, and the error messages."""
import copy
import math

import pytest
import torch
import torch.fx
import torch.nn as nn

import mqbench.weight_equalization as we
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import disable_all, enable_calibration, enable_quantization

set_log_level("WARNING")


def per_tensor_config(w_bit=8, a_bit=8):
    """Academic, per-tensor symmetric weights, per-tensor activations, min/max observers."""
    return {"extra_qconfig_dict": {
        "w_qscheme": {"bit": w_bit, "symmetry": True, "per_channel": False, "pot_scale": False},
        "a_qscheme": {"bit": a_bit, "symmetry": False, "per_channel": False, "pot_scale": False},
        "w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver",
        "w_fakequantize": "FixedFakeQuantize", "a_fakequantize": "FixedFakeQuantize"}}


def channel_ranges(w):
    return w.detach().abs().flatten(1).amax(1)


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max())


def sqnr_db(ref, out):
    return 10 * math.log10(float(ref.pow(2).sum()) / float((ref - out).pow(2).sum()))


# ---- (1) the scale --------------------------------------------------------------------------
def reference_scale(w1, w2, s_min=1e-6, s_max=1e6, eps=0.0):
    """MQBench's rule, channel by channel: input channel i of w2 is column i % in2 of the
    output channels of group i // in2."""
    c1, c2, in2 = w1.shape[0], w2.shape[0], w2.shape[1]
    per_group = c2 // (c1 // in2)
    out = []
    for i in range(c1):
        group, j = divmod(i, in2)
        r1 = float(w1[i].abs().max())
        r2 = float(w2[group * per_group:(group + 1) * per_group, j].abs().max())
        s = min(max(math.sqrt(r1 * r2 + eps) / (r2 + eps), s_min), s_max)
        out.append(1.0 if r1 + r2 < 0.5 else s)
    return torch.tensor(out)


SHAPES = {  # (w1, w2)
    "dense": ((8, 3, 3, 3), (6, 8, 3, 3)),
    "grouped": ((8, 3, 3, 3), (6, 4, 3, 3)),       # layer 2 groups=2
    "depthwise": ((8, 3, 3, 3), (8, 1, 3, 3)),     # groups=8
    "depthwise_x2": ((8, 3, 3, 3), (16, 1, 3, 3)),  # channel multiplier 2
    "linear": ((8, 5), (4, 8)),
}


@pytest.mark.parametrize("case", list(SHAPES))
def test_dfq_scale_matches_per_channel_loop(case):
    g = torch.Generator().manual_seed(1)
    shape1, shape2 = SHAPES[case]
    w1 = torch.randn(shape1, generator=g)
    w2 = torch.randn(shape2, generator=g) * 0.3
    w1[3] *= 40  # an outlier channel
    c1, c2, in2 = shape1[0], shape2[0], shape2[1]
    per_group = c2 // (c1 // in2)
    for i in (0, 1):  # tiny channels on both sides: r1 + r2 < 0.5 -> s = 1
        w1[i] *= 0.01
        group, j = divmod(i, in2)
        w2[group * per_group:(group + 1) * per_group, j] *= 0.01
    b1 = torch.randn(c1, generator=g)
    ref = reference_scale(w1, w2)
    assert (ref[:2] == 1).all() and (ref[2:] != 1).all()
    assert torch.allclose(torch.ops.mqbench.dfq_equalization_scale(w1, w2), ref, rtol=1e-6)
    assert torch.allclose(torch.ops.mqbench.dfq_equalization_scale(w1, w2, 1e-6, 1.5),
                          reference_scale(w1, w2, s_max=1.5), rtol=1e-6)

    w1_0, b1_0, w2_0 = w1.clone(), b1.clone(), w2.clone()
    out = we.dfq_weight_equalization(w1, b1, w2)
    assert out[0] is w1 and out[1] is b1 and out[2] is w2  # in place, as MQBench
    s = out[3]
    assert torch.allclose(s, ref, rtol=1e-6)
    for i in range(c1):
        group, j = divmod(i, in2)
        rows = slice(group * per_group, (group + 1) * per_group)
        assert torch.allclose(w1[i], w1_0[i] / ref[i], rtol=1e-5)
        assert math.isclose(float(b1[i]), float(b1_0[i] / ref[i]), rel_tol=1e-5)
        assert torch.allclose(w2[rows, j], w2_0[rows, j] * ref[i], rtol=1e-5)
    # the equalized channels now have equal ranges on both sides
    for i in range(2, c1):
        group, j = divmod(i, in2)
        r2 = float(w2[group * per_group:(group + 1) * per_group, j].abs().max())
        assert math.isclose(float(w1[i].abs().max()), r2, rel_tol=1e-4)
    assert we.dfq_weight_equalization(w1.clone(), None, w2.clone())[1] is None


def test_dead_channel_is_left_unscaled():
    w1, w2 = torch.ones(4, 3), torch.ones(2, 4)
    w2[:, 1] = 0  # r2 = 0 and eps = 0: 0/0 in the formula
    s = we.dfq_weight_equalization(w1, None, w2)[3]
    assert torch.isfinite(w1).all() and s[1] == 1


# ---- (2) function preserved, ranges evened ---------------------------------------------------
class ConvReluConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 8, 3, padding=1)

    def forward(self, x):
        return self.conv2(self.relu(self.conv1(x)))


class ConvReluDepthwise(nn.Module):
    """The MobileNet pattern: conv -> relu -> depthwise -> relu (functional) -> pointwise."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.relu = nn.ReLU()
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
        self.pw = nn.Conv2d(16, 8, 1)

    def forward(self, x):
        return self.pw(torch.relu(self.dw(self.relu(self.conv1(x)))))


class LinearReluLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(16, 5)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def with_outliers(model, first, factors=(50, 75, 100)):
    """Layer ``first``'s channels 0.. scaled by ``factors`` (weights and bias)."""
    layer = getattr(model, first)
    with torch.no_grad():
        for i, f in enumerate(factors):
            layer.weight[i] *= f
            if layer.bias is not None:
                layer.bias[i] *= f
    return model


@pytest.mark.parametrize("cls,first,shape,chain", [
    (ConvReluConv, "conv1", (4, 3, 8, 8), ["conv1", "conv2"]),
    (ConvReluDepthwise, "conv1", (4, 3, 8, 8), ["conv1", "dw", "pw"]),
    (LinearReluLinear, "fc1", (6, 12), ["fc1", "fc2"]),
])
def test_float_function_kept_and_ranges_evened(cls, first, shape, chain, capsys):
    torch.manual_seed(0)
    model = with_outliers(cls(), first)
    x = torch.randn(shape)
    with torch.no_grad():
        y0 = model(x)
    before = channel_ranges(getattr(model, first).weight)
    traced = torch.fx.symbolic_trace(copy.deepcopy(model))
    groups = we.get_weight_equalization_groups(traced, input_shape_dict={"x": list(shape)})
    assert [[n.name for n in g] for g in groups] == [chain]
    assert str([chain]) in capsys.readouterr().out  # printed, as MQBench
    with torch.no_grad():
        assert rel_err(traced(x), y0) < 1e-5

    assert we.cross_layer_equalization(model) is model  # untraced model, equalized in place
    with torch.no_grad():
        assert rel_err(model(x), y0) < 1e-5
    after = channel_ranges(getattr(model, first).weight)
    ratio_before = float(before.max() / before.min())
    ratio_after = float(after.max() / after.min())
    assert ratio_before > 100 and ratio_after < ratio_before / 10, (ratio_before, ratio_after)


def test_chains_stop_at_relu6_fanout_and_residual_add():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 4, 1)
            self.c2 = nn.Conv2d(4, 4, 1)
            self.c3 = nn.Conv2d(4, 4, 1)
            self.c4 = nn.Conv2d(4, 4, 1)
            self.c5 = nn.Conv2d(4, 4, 1)
            self.c6 = nn.Conv2d(4, 4, 1)
            self.c7 = nn.Conv2d(4, 4, 1)
            self.relu6 = nn.ReLU6()

        def forward(self, x):
            a = self.relu6(self.c1(x))          # ReLU6 does not commute with scaling
            b = torch.relu(self.c2(a))          # c2 -> (c3, c4): fan-out
            c = self.c3(b) + self.c4(b)         # add: not a pass-through
            d = self.c6(nn.functional.max_pool2d(torch.relu(self.c5(c)), 1))  # chains
            return self.c7(d) + d               # c6 fans out after itself: c6 ends a chain

    gm = torch.fx.symbolic_trace(Branchy())
    groups = we.get_weight_equalization_groups(gm)
    assert [[n.name for n in g] for g in groups] == [["c5", "c6"]]


def test_fused_conv_bn_qat_modules_are_equalized_on_the_folded_weight():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16),
                          nn.ReLU(), nn.Conv2d(16, 8, 1))
    with torch.no_grad():
        for bn in (model[1], model[4]):
            bn.weight.uniform_(0.5, 2.0)
            bn.bias.uniform_(-0.5, 0.5)
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
        model[1].weight[:3] *= torch.tensor([50.0, 75.0, 100.0])  # outliers in the folded weight
        model[1].bias[:3] *= torch.tensor([50.0, 75.0, 100.0])
    q = prepare_by_platform(model.eval(), BackendType.Tensorrt)
    first = q.get_submodule("0")
    assert type(first).__name__ == "ConvBnReLU2d"
    disable_all(q)
    x = torch.randn(4, 3, 8, 8)
    train_copy = copy.deepcopy(q).train()
    with torch.no_grad():
        y0, y0_train = q(x), copy.deepcopy(train_copy)(x)
    before = channel_ranges(we._effective_weight(first))
    raw_before = first.weight.detach().clone()
    we.cross_layer_equalization(q)
    we.cross_layer_equalization(train_copy)
    with torch.no_grad():
        assert rel_err(q(x), y0) < 1e-5
        assert rel_err(train_copy(x), y0_train) < 1e-5  # batch statistics: same function
    assert torch.equal(first.weight, raw_before)  # BatchNorm's gamma/beta carried the scale
    after = channel_ranges(we._effective_weight(first))
    assert float(after.max() / after.min()) < float(before.max() / before.min()) / 10


# ---- (3) the outlier-channel model -----------------------------------------------------------
class DigitsNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = self.pool(self.relu2(self.conv2(self.relu1(self.conv1(x)))))
        return self.fc(torch.flatten(x, 1))


@pytest.fixture(scope="module")
def digits_outlier_model():
    """A DigitsNet trained briefly on sklearn's digits, then given outlier channels the way BN
    folding makes them: conv1's channels 0-2 scaled by 200/300/500 and conv2's matching inputs
    by the inverse (the float function is unchanged)."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    torch.manual_seed(0)
    model = DigitsNet()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    for _ in range(10):
        for i in range(360, len(y), 256):
            loss = nn.functional.cross_entropy(model(x[i:i + 256]), y[i:i + 256])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        for i, f in enumerate((200.0, 300.0, 500.0)):
            model.conv1.weight[i] *= f
            model.conv1.bias[i] *= f
            model.conv2.weight[:, i] /= f
    return model, (x[360:], y[360:]), (x[:360], y[:360])


def quantized_sqnr_and_accuracy(model, train, test, equalize):
    q = prepare_by_platform(copy.deepcopy(model), BackendType.Academic, per_tensor_config())
    if equalize:  # MQBench's flow: on the prepared model, before calibration
        groups = we.get_weight_equalization_groups(q, input_shape_dict={"x": [1, 1, 8, 8]})
        assert [[n.name for n in g] for g in groups] == [["conv1", "conv2", "fc"]]
    enable_calibration(q)
    with torch.no_grad():
        q(train[0][:256])
    enable_quantization(q)
    with torch.no_grad():
        y_float, y_quant = model(test[0]), q(test[0])
    accuracy = float((y_quant.argmax(1) == test[1]).float().mean())
    return sqnr_db(y_float, y_quant), accuracy


def test_outlier_channels_per_tensor_8bit_recovered_by_cle(digits_outlier_model):
    model, train, test = digits_outlier_model
    float_acc = float((model(test[0]).argmax(1) == test[1]).float().mean())
    sqnr_plain, acc_plain = quantized_sqnr_and_accuracy(model, train, test, equalize=False)
    sqnr_cle, acc_cle = quantized_sqnr_and_accuracy(model, train, test, equalize=True)
    print(f"\nper-tensor W8A8 on the outlier DigitsNet: float acc {float_acc:.4f}; "
          f"without CLE SQNR {sqnr_plain:.1f} dB acc {acc_plain:.4f}; "
          f"with CLE SQNR {sqnr_cle:.1f} dB acc {acc_cle:.4f}")
    assert float_acc > 0.9
    assert sqnr_cle - sqnr_plain > 10, (sqnr_plain, sqnr_cle)
    assert acc_plain < float_acc - 0.05, (acc_plain, float_acc)  # the outliers cost accuracy
    assert acc_cle >= float_acc - 0.005  # and CLE recovers it


# ---- (4) bias correction ---------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32, bias=False)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def layer_output_means(model, x, names):
    means, handles = {}, []
    for name in names:
        def hook(mod, args, out, name=name):
            means[name] = out.detach().mean(0)
        handles.append(model.get_submodule(name).register_forward_hook(hook))
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return means


def test_bias_correction_matches_float_means_and_reduces_heldout_error():
    torch.manual_seed(0)
    model = MLP()
    cali = [torch.randn(64, 16) + 0.5 for _ in range(4)]
    heldout = torch.randn(512, 16) + 0.5
    q = prepare_by_platform(copy.deepcopy(model), BackendType.Academic,
                            per_tensor_config(w_bit=3, a_bit=8))
    enable_calibration(q)
    with torch.no_grad():
        for batch in cali:
            q(batch)
    enable_quantization(q)
    with torch.no_grad():
        y_float, y_before = model(heldout), q(heldout)
    switches = [(int(m.fake_quant_enabled[0]), int(m.observer_enabled[0]))
                for m in q.modules() if hasattr(m, "fake_quant_enabled")]
    assert q.fc1.bias is None
    corrections = we.bias_correction(q, cali)
    assert list(corrections) == ["fc1", "fc2"] and q.fc1.bias is not None
    assert switches == [(int(m.fake_quant_enabled[0]), int(m.observer_enabled[0]))
                        for m in q.modules() if hasattr(m, "fake_quant_enabled")]
    assert q.training == model.training
    # on the calibration data each layer's mean output is now the float layer's
    x_all = torch.cat(cali)
    float_means = layer_output_means(model, x_all, ["fc1", "fc2"])
    quant_means = layer_output_means(q, x_all, ["fc1", "fc2"])
    for name in ("fc1", "fc2"):
        assert torch.allclose(quant_means[name], float_means[name], atol=1e-4), name
    with torch.no_grad():
        y_after = q(heldout)
    err_before = float((y_float - y_before).mean(0).abs().mean())
    err_after = float((y_float - y_after).mean(0).abs().mean())
    assert err_after < 0.3 * err_before, (err_before, err_after)


def test_bias_correction_on_a_fused_bn_model_keeps_raw_bias_and_moves_beta():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                          nn.ReLU(), nn.Conv2d(8, 4, 1))
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.2, 0.2)
        model[1].running_var.uniform_(0.5, 2.0)
    q = prepare_by_platform(model.eval(), BackendType.Tensorrt)
    first = q.get_submodule("0")
    cali = [torch.randn(8, 3, 6, 6) for _ in range(2)]
    enable_calibration(q)
    with torch.no_grad():
        for batch in cali:
            q(batch)
    enable_quantization(q)
    beta = first.bn.bias.detach().clone()
    corrections = we.bias_correction(q, cali, layers=["0"])
    assert list(corrections) == ["0"] and first.bias is None
    assert torch.allclose(first.bn.bias, beta + corrections["0"])


# ---- (5) errors and the registry -------------------------------------------------------------
def test_errors_name_what_to_change():
    with pytest.raises(ValueError, match="output channels"):
        we.dfq_weight_equalization(torch.randn(16, 3, 3, 3), None, torch.randn(8, 5, 3, 3))
    with pytest.raises(ValueError, match="bias_1"):
        we.dfq_weight_equalization(torch.randn(4, 3), torch.randn(5), torch.randn(2, 4))
    with pytest.raises(ValueError, match="takes 8 input channels"):
        we.equalize_pair(nn.Conv2d(3, 16, 3), nn.Conv2d(8, 4, 3))
    with pytest.raises(TypeError, match="ConvTranspose2d"):
        we.equalize_pair(nn.Conv2d(3, 4, 3), nn.ConvTranspose2d(4, 4, 3))
    gm = torch.fx.symbolic_trace(ConvReluDepthwise())
    nodes = {n.name: n for n in gm.graph.nodes}
    modules = dict(gm.named_modules())
    with pytest.raises(ValueError, match="group of 3"):
        we.weight_equalize_conv_pair(modules, [nodes["conv1"], nodes["dw"], nodes["pw"]])
    with pytest.raises(TypeError, match=r"register_weight_equalization_function\(Linear, Conv2d\)"):
        we.convert_equalization_groups({"a": nn.Linear(4, 4), "b": nn.Conv2d(4, 4, 1)},
                                       [["a", "b"]])
    with pytest.raises(ValueError, match="not inputs of the model"):
        we.get_weight_equalization_groups(gm, input_shape_dict={"image": [1, 3, 8, 8]})
    with pytest.raises(ValueError, match="enable_quantization"):
        we.bias_correction(MLP(), [torch.randn(2, 16)])
    with pytest.raises(ValueError, match="empty"):
        we.bias_correction(MLP(), [])


def test_registration_keeps_earlier_pairs_and_is_used():
    class MyConv(nn.Conv2d):
        pass

    class Other(nn.Conv2d):
        pass

    calls = []

    @we.register_weight_equalization_function(MyConv, nn.Conv2d)
    def first(modules, pair):
        calls.append(("first", [p for p in pair]))

    @we.register_weight_equalization_function(MyConv, Other)
    def second(modules, pair):
        calls.append(("second", [p for p in pair]))

    try:
        assert we.WEIGHT_EQUALIZATION_FUNCTION[MyConv] == {nn.Conv2d: first, Other: second}
        assert nn.Conv2d in we.WEIGHT_EQUALIZATION_FUNCTION[nn.Conv2d]  # built-ins kept
        modules = {"a": MyConv(3, 4, 1), "b": Other(4, 4, 1), "c": nn.Conv2d(4, 4, 1)}
        we.convert_equalization_groups(modules, [["a", "b"], ["a", "c"]])
        assert calls == [("second", ["a", "b"]), ("first", ["a", "c"])]
    finally:
        del we.WEIGHT_EQUALIZATION_FUNCTION[MyConv]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))]


@pytest.mark.parametrize("device", DEVICES)
def test_cle_and_bias_correction_run_on_the_model_device(device):
    torch.manual_seed(0)
    model = with_outliers(ConvReluDepthwise(), "conv1").to(device)
    x = torch.randn(4, 3, 8, 8, device=device)
    with torch.no_grad():
        y0 = model(x)
    we.cross_layer_equalization(model)
    with torch.no_grad():
        assert rel_err(model(x), y0) < 1e-5
    q = prepare_by_platform(model, BackendType.Academic, per_tensor_config(w_bit=4)).to(device)
    cali = [torch.randn(4, 3, 8, 8) for _ in range(2)]  # on the CPU: moved to the model's device
    enable_calibration(q)
    with torch.no_grad():
        q(cali[0].to(device))
    enable_quantization(q)
    corrections = we.bias_correction(q, cali)
    assert list(corrections) == ["conv1", "dw", "pw"]
    assert q.dw.bias is not None and q.dw.bias.device.type == device  # created where it runs
    assert all(c.device.type == device for c in corrections.values())


def test_docs_example_runs():
    import os
    import re
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "weight_equalization.md")
    with open(path) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    assert blocks, "docs/weight_equalization.md has no Python block"
    for block in blocks:
        exec(compile(block, "weight_equalization.md", "exec"), {"__name__": "docs"})


def test_equalizing_a_calibrated_model_warns(caplog):
    import logging
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3)).eval()
    q = prepare_by_platform(net, BackendType.Academic, per_tensor_config())
    enable_calibration(q)
    with torch.no_grad():
        q(torch.randn(2, 3, 8, 8))
    enable_quantization(q)
    from mqbench.utils.logger import logger
    logger.propagate, before = True, logger.propagate
    try:
        with caplog.at_level(logging.WARNING):
            we.cross_layer_equalization(q)
    finally:
        logger.propagate = before
    assert "equalize before calibrating" in caplog.text


def test_a_linear_right_after_a_conv_is_not_paired():
    """A Linear on a conv's output (no flatten) acts on the last axis, not on the channels:
    equalizing the two would change the function."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(4, 8, 1), nn.ReLU(), nn.Linear(16, 3)).eval()
    with torch.no_grad():
        net[0].weight[0] *= 50
    x = torch.randn(5, 4, 16)
    want = net(x)
    we.cross_layer_equalization(net)
    assert torch.allclose(net(x), want, rtol=1e-5, atol=1e-6)
