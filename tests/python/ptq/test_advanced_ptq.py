"""mqbench.advanced_ptq: the AdaRound ops against their formulas, the schedules and the loss,
the units found in real architectures, and reconstruction end to end (error against the float
model lower than plain calibration's, weights on the grid, deployable, the user's model left
alone)."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
import torchvision

import mqbench
from mqbench.advanced_ptq import (CosineTempDecay, LinearTempDecay, LossFunction, _Config,
                                  _units, extract_block, extract_layer, lp_loss,
                                  ptq_reconstruction)
from mqbench.fake_quantize.adaround_quantizer import AdaRoundFakeQuantize
from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.config import UnknownNameError
from mqbench.utils.state import enable_calibration_woquantization, enable_quantization

ops = torch.ops.mqbench
GAMMA, ZETA = -0.1, 1.1


def _h(alpha):
    return torch.clamp(torch.sigmoid(alpha) * (ZETA - GAMMA) + GAMMA, 0, 1)


# -- ops ---------------------------------------------------------------------------------------

def test_rectified_sigmoid_and_regularizer_follow_the_paper():
    alpha = torch.linspace(-8, 8, 101, dtype=torch.float64)
    assert torch.allclose(ops.adaround_rectified_sigmoid(alpha), _h(alpha))
    for beta in (20.0, 7.5, 2.0):
        want = (1 - (2 * _h(alpha) - 1).abs().pow(beta)).sum()
        assert torch.allclose(ops.adaround_regularizer(alpha, beta), want)
    a = torch.randn(17, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ops.adaround_regularizer(t, 3.0), (a,))
    with pytest.raises(RuntimeError, match="beta must be a positive"):
        ops.adaround_regularizer(a, 0.0)


@pytest.mark.parametrize("ch_axis", [-1, 0, 1])
def test_alpha_init_makes_the_soft_weight_equal_the_weight(ch_axis):
    torch.manual_seed(0)
    w = torch.randn(6, 5, 3)
    channels = 1 if ch_axis == -1 else w.shape[ch_axis]
    scale = torch.rand(channels) * 0.2 + 0.05
    zp = torch.zeros(channels, dtype=torch.int32)
    alpha = ops.adaround_alpha_init(w, scale, ch_axis)
    shape = [1] * w.dim()
    if ch_axis != -1:
        shape[ch_axis] = channels
    s = scale.reshape(shape) if ch_axis != -1 else scale
    rest = w / s - torch.floor(w / s)
    assert torch.allclose(_h(alpha), rest, atol=1e-5)
    if ch_axis == -1:
        soft = ops.fake_quantize_adaround_per_tensor(w, scale, zp, alpha, -128, 127, False)
    else:
        soft = ops.fake_quantize_adaround_per_channel(w, scale, zp, alpha, ch_axis, -128, 127,
                                                      False)
    assert torch.allclose(soft, w, atol=1e-5)


def test_alpha_init_refuses_bad_scales():
    w = torch.randn(4, 3)
    with pytest.raises(RuntimeError, match="scale has 3 elements but x has 4 channels"):
        ops.adaround_alpha_init(w, torch.ones(3), 0)
    with pytest.raises(RuntimeError, match="every scale must be positive"):
        ops.adaround_alpha_init(w, torch.zeros(1), -1)
    with pytest.raises(RuntimeError, match="per-tensor scale must have one element"):
        ops.adaround_alpha_init(w, torch.ones(4), -1)


def test_dfq_scale_formula():
    torch.manual_seed(0)
    w1, w2 = torch.randn(4, 3, 3, 3), torch.randn(5, 4, 1, 1)
    w1[2] *= 0.01
    w2[:, 2] *= 0.01  # r1 + r2 < 0.5 -> 1
    s = ops.dfq_equalization_scale(w1, w2)
    for i in range(4):
        r1, r2 = w1[i].abs().max(), w2[:, i].abs().max()
        want = 1.0 if r1 + r2 < 0.5 else float(torch.sqrt(r1 * r2) / r2)
        assert s[i].item() == pytest.approx(want, rel=1e-6)


# -- schedules and loss --------------------------------------------------------------------------

def test_temperature_schedules():
    lin = LinearTempDecay(t_max=100, warm_up=0.2, start_b=20, end_b=2)
    assert lin(0) == 20 and lin(19) == 20
    assert lin(20) == pytest.approx(20) and lin(60) == pytest.approx(11) and lin(100) == 2
    assert lin(150) == 2
    cos = CosineTempDecay(t_max=100, warm_up=0.2, start_b=20, end_b=2)
    assert cos(10) == 20 and cos(60) == pytest.approx(11) and cos(100) == pytest.approx(2)
    assert cos(40) > lin(40)  # the half cosine stays high longer


def test_loss_function_adds_the_regularizer_after_the_warm_up():
    fq = AdaRoundFakeQuantize(mqbench.observer.MinMaxObserver, quant_min=-8, quant_max=7)
    layer = torch.nn.Linear(4, 3)
    layer.weight_fake_quant = fq
    fq(layer.weight)  # calibrate
    fq.init(layer.weight.data)
    sub = torch.nn.Sequential(layer)
    loss = LossFunction(sub, weight=0.5, max_count=10, b_range=(20, 2), warm_up=0.3)
    pred, tgt = torch.randn(2, 3), torch.randn(2, 3)
    assert float(loss(pred, tgt)) == pytest.approx(float(lp_loss(pred, tgt)))
    for _ in range(2):
        loss(pred, tgt)  # count 3: the warm-up (0.3 * 10) ends here
    total = loss(pred, tgt)
    beta = LinearTempDecay(10, 0.3, 20, 2)(4)
    want = lp_loss(pred, tgt) + 0.5 * (1 - (2 * _h(fq.alpha) - 1).abs().pow(beta)).sum()
    assert total.item() == pytest.approx(want.item(), rel=1e-5)
    assert lp_loss(torch.ones(2, 3, 4), torch.zeros(2, 3, 4)).item() == pytest.approx(3.0)


# -- units ---------------------------------------------------------------------------------------

ADAROUND_QDROP = {"extra_qconfig_dict": {
    "w_observer": "MSEObserver", "a_observer": "EMAMSEObserver",
    "w_fakequantize": "AdaRoundFakeQuantize", "a_fakequantize": "QDropFakeQuantize",
    "w_qscheme": {"bit": 4, "symmetry": False, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 4, "symmetry": False, "per_channel": False, "pot_scale": False}}}


def _names(units):
    return [[n.name for n in u] for u in units]


def test_brecq_blocks_of_resnet18_are_its_basic_blocks():
    model = prepare_by_platform(torchvision.models.resnet18(), BackendType.Academic,
                                ADAROUND_QDROP)
    modules = dict(model.named_modules())
    units = _names(_units(model, modules, _Config({"pattern": "block"})))
    assert len(units) == 10  # stem, 8 basic blocks, fc
    block = units[3]  # layer2.0: two convs, the downsample, the add and the relu after it
    assert block[0] == "layer2_0_conv1" and "layer2_0_downsample_0" in block
    assert "add_2" in block and block[-1] == "layer2_0_relu_1_post_act_fake_quantizer"
    assert units[-1] == ["fc"]
    layers = _names(_units(model, modules, _Config({"pattern": "layer"})))
    assert len(layers) == 21  # every conv and the fc on its own
    assert layers[1] == ["layer1_0_conv1", "layer1_0_bn1", "layer1_0_relu",
                         "layer1_0_relu_post_act_fake_quantizer"]
    assert layers[2] == ["layer1_0_conv2", "layer1_0_bn2"]  # stops before the add


def test_brecq_blocks_of_mobilenet_v2_close_at_the_shortcut():
    model = prepare_by_platform(torchvision.models.mobilenet_v2(), BackendType.Academic,
                                ADAROUND_QDROP)
    modules = dict(model.named_modules())
    node_units = _units(model, modules, _Config({"pattern": "block"}))
    units = _names(node_units)
    # no shortcut: the stem and block 1 stack as three layers
    assert units[0][0] == "features_0_0" and "features_1_conv_1" in units[0]
    block3 = next(u for u in units if u[0] == "features_3_conv_0_0")
    # an inverted residual with a shortcut ends with its add (and the add's quantizer)
    assert "add" in block3 and block3[-1] == "add_post_act_fake_quantizer"
    assert "features_2_conv_2" not in block3
    for unit in node_units:  # 1-3 weighted layers each (4 where the head meets the classifier)
        n = sum(1 for node in unit if hasattr(modules.get(str(node.target)), "weight_fake_quant"))
        assert 1 <= n <= 4
    covered = {n for u in units for n in u}
    convs = [n.name for n in model.graph.nodes
             if n.op == "call_module" and hasattr(modules[n.target], "weight_fake_quant")]
    assert set(convs) <= covered
    assert sum(len(u) for u in units) == len(covered)  # no node in two units


def test_block_search_is_bounded():
    model = prepare_by_platform(torchvision.models.resnet18(), BackendType.Academic,
                                ADAROUND_QDROP)
    modules = dict(model.named_modules())
    node = next(n for n in model.graph.nodes if n.name == "layer1_0_conv1")
    assert extract_block(node.all_input_nodes, modules, max_nodes=3) == []
    nodes, _ = extract_layer(node, modules)
    assert nodes[0] is node


# -- end to end ----------------------------------------------------------------------------------

class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.conv3 = torch.nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.fc = torch.nn.Linear(16, 5)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)) + x)
        x = F.relu(self.conv3(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _calibrated(backend=BackendType.Academic, wbit=3, abit=4, cfg=None):
    """SmallNet with realistic BatchNorm statistics, prepared (with `cfg`, or ADAROUND_QDROP at
    wbit / abit) and calibrated as MQBench's PTQ example does: activations first, weights
    after; returns (float net, prepared model, calibration batches)."""
    torch.manual_seed(0)
    net = SmallNet()
    net.train()
    with torch.no_grad():  # realistic BatchNorm statistics
        for _ in range(3):
            net(torch.randn(16, 3, 8, 8))
    net.eval()
    if cfg is None:
        cfg = copy.deepcopy(ADAROUND_QDROP)
        cfg["extra_qconfig_dict"]["w_qscheme"]["bit"] = wbit
        cfg["extra_qconfig_dict"]["a_qscheme"]["bit"] = abit
    model = prepare_by_platform(copy.deepcopy(net).train(), backend, cfg)
    model.eval()
    cali = [torch.randn(16, 3, 8, 8) for _ in range(3)]
    enable_calibration_woquantization(model, quantizer_type="act_fake_quant")
    with torch.no_grad():
        for b in cali:
            model(b)
    enable_calibration_woquantization(model, quantizer_type="weight_fake_quant")
    with torch.no_grad():
        model(cali[0])
    enable_quantization(model)
    return net, model, cali


def _rel_err(net, model, x):
    with torch.no_grad():
        ref = net(x)
        return float((model(x) - ref).pow(2).sum() / ref.pow(2).sum())


def _states(model):
    return {n: (int(m.fake_quant_enabled[0]), int(m.observer_enabled[0]))
            for n, m in model.named_modules() if isinstance(m, QuantizeBase)}


CONFIG = {"warm_up": 0.2, "weight": 0.01, "max_count": 500, "b_range": [20, 2],
          "keep_gpu": True, "round_mode": "learned_hard_sigmoid", "progress": False}


@pytest.mark.parametrize("pattern,prob", [("layer", 1.0), ("block", 1.0), ("block", 0.5)])
def test_reconstruction_lowers_the_error_against_the_float_model(pattern, prob):
    net, model, cali = _calibrated()
    test = torch.randn(64, 3, 8, 8)
    naive = _rel_err(net, model, test)
    before = _states(model)
    weights_before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    config = dict(CONFIG, pattern=pattern, prob=prob)
    if prob < 1:
        config["scale_lr"] = 4e-5
    rec = ptq_reconstruction(model, cali, config)
    err = _rel_err(net, rec, test)
    assert err < 0.8 * naive, (naive, err)
    # the user's model is unchanged: quantizer switches and every tensor
    assert _states(model) == before
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights_before[k]), k
    # the result: fake quantization on, observers off, rounding written into the weights
    for name, m in rec.named_modules():
        if isinstance(m, QuantizeBase):
            assert int(m.fake_quant_enabled[0]) == 1 and int(m.observer_enabled[0]) == 0, name
            assert getattr(m, "prob", 1.0) == 1.0
        if isinstance(m, AdaRoundFakeQuantize):
            assert not m.adaround


def test_reconstructed_weights_lie_on_the_grid_and_survive_deploy(tmp_path):
    net, model, cali = _calibrated()
    torch.manual_seed(1)
    rec = ptq_reconstruction(model, cali, dict(CONFIG, pattern="layer", max_count=60))
    fc = rec.fc
    fq = fc.weight_fake_quant
    s = fq.scale.reshape(-1, 1)
    z = fq.zero_point.reshape(-1, 1).float()
    q = fc.weight.detach() / s + z
    assert torch.allclose(q, q.round(), atol=1e-3)
    # the fixed fake quantizer leaves an on-grid weight as it is
    assert torch.allclose(fq(fc.weight.detach()), fc.weight.detach(), atol=1e-6)
    # learned rounding differs from nearest rounding somewhere (it learned something)
    w_float = model.fc.weight.detach()
    nearest = torch.clamp(torch.round(w_float / s) + z, fq.quant_min, fq.quant_max)
    assert (nearest != q.round()).any()
    from mqbench.convert_deploy import convert_deploy
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        want = rec(x)
    convert_deploy(rec, BackendType.Academic, {"x": [4, 3, 8, 8]}, output_path=str(tmp_path),
                   model_name="rec")
    import onnxruntime
    sess = onnxruntime.InferenceSession(str(tmp_path / "rec.onnx"),
                                        providers=["CPUExecutionProvider"])
    got = torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0])
    assert torch.allclose(got, want, atol=1e-3 * want.abs().max().item() + 1e-4)


def test_qdrop_learns_activation_scales_and_batch_size_draws_rows():
    net, model, cali = _calibrated()
    scales = {n: m.scale.detach().clone() for n, m in model.named_modules()
              if n.endswith("post_act_fake_quantizer")}
    torch.manual_seed(1)
    rec = ptq_reconstruction(model, cali, dict(CONFIG, pattern="block", drop_prob=0.5,
                                               scale_lr=1e-1, batch_size=8, max_count=30))
    moved = [n for n, s in scales.items()
             if n != "x_post_act_fake_quantizer"
             and not torch.equal(rec.get_submodule(n).scale.detach(), s)]
    assert moved  # the quantizers inside the units learned their scales
    # a large learning rate may push a scale towards zero: it is kept positive
    for n in scales:
        assert rec.get_submodule(n).scale.detach().min().item() > 0


def test_config_errors_say_what_to_change():
    net, model, cali = _calibrated()
    with pytest.raises(UnknownNameError, match="max_count"):
        ptq_reconstruction(model, cali, dict(CONFIG, max_cout=3))
    with pytest.raises(NotImplementedError, match="pattern 'net'"):
        ptq_reconstruction(model, cali, dict(CONFIG, pattern="net"))
    with pytest.raises(ValueError, match="prob"):
        ptq_reconstruction(model, cali, dict(CONFIG, prob=0.4, drop_prob=0.4))
    with pytest.raises(ValueError, match="non-empty list"):
        ptq_reconstruction(model, [], dict(CONFIG))
    with pytest.raises(TypeError, match="GraphModule"):
        ptq_reconstruction(net, cali, dict(CONFIG))


def test_a_weight_quantizer_without_adaround_is_refused():
    torch.manual_seed(0)
    model = prepare_by_platform(SmallNet().train(), BackendType.Tensorrt)  # fixed quantizers
    model.eval()
    cali = [torch.randn(4, 3, 8, 8)]
    with pytest.raises(TypeError, match="AdaRoundFakeQuantize"):
        ptq_reconstruction(model, cali, dict(CONFIG, pattern="layer", max_count=2))


def test_excluded_nodes_keep_nearest_rounding():
    net, model, cali = _calibrated()
    torch.manual_seed(1)
    rec = ptq_reconstruction(model, cali, dict(CONFIG, pattern="layer", max_count=20,
                                               exclude_node=["fc"],
                                               exclude_node_prefix=["conv3"]))
    assert torch.equal(rec.fc.weight, model.fc.weight)
    assert torch.equal(rec.conv3.weight, model.conv3.weight)
    assert not torch.equal(rec.conv1.weight, model.conv1.weight)


def test_mqbench_module_paths_and_easydict_configs():
    easydict = pytest.importorskip("easydict")
    from mqbench.ptq_reconstruction import ptq_reconstruction as alias
    assert alias is ptq_reconstruction
    net, model, cali = _calibrated()
    torch.manual_seed(1)
    cfg = easydict.EasyDict(dict(CONFIG, pattern="layer", max_count=5))
    rec = alias(model, cali, cfg)
    assert isinstance(rec, torch.fx.GraphModule)
    assert math.isfinite(_rel_err(net, rec, cali[0]))


def test_mqbench_ptq_example_flow_runs_unchanged():
    """The body of MQBench's application/imagenet_example/PTQ/ptq/ptq.py with its qdrop
    r18_2_4.yaml config (as the EasyDict its parse_config returns; max_count shortened, the
    .cuda() calls dropped), on resnet18 with random data."""
    easydict = pytest.importorskip("easydict")
    from mqbench.prepare_by_platform import prepare_by_platform, BackendType  # noqa: F811
    from mqbench.ptq_reconstruction import ptq_reconstruction as ptq
    config = easydict.EasyDict({
        "extra_prepare_dict": {"extra_qconfig_dict": {
            "w_observer": "MSEObserver", "a_observer": "EMAMSEObserver",
            "w_fakequantize": "AdaRoundFakeQuantize", "a_fakequantize": "QDropFakeQuantize",
            "w_qscheme": {"bit": 2, "symmetry": False, "per_channel": True, "pot_scale": False,
                          "p": 2.4},
            "a_qscheme": {"bit": 4, "symmetry": False, "per_channel": False, "pot_scale": False,
                          "p": 2.4}}},
        "quantize": {"quantize_type": "advanced_ptq", "cali_batchsize": 2,
                     "reconstruction": {"pattern": "block", "scale_lr": 4.0e-5, "warm_up": 0.2,
                                        "weight": 0.01, "max_count": 3, "b_range": [20, 2],
                                        "keep_gpu": True,
                                        "round_mode": "learned_hard_sigmoid", "prob": 0.5}},
        "model": {"type": "resnet18", "kwargs": {"num_classes": 10}},
        "process": {"seed": 1005}})
    torch.manual_seed(config.process.seed)
    model = torchvision.models.resnet18(**config.model.kwargs)
    backend_type = BackendType.Academic if not hasattr(config, "backend") else None
    extra_prepare_dict = {} if not hasattr(config, "extra_prepare_dict") \
        else config.extra_prepare_dict
    model = prepare_by_platform(model, backend_type, extra_prepare_dict)
    cali_data = [torch.randn(2, 3, 32, 32) for _ in range(config.quantize.cali_batchsize)]
    model.eval()
    enable_calibration_woquantization(model, quantizer_type="act_fake_quant")
    for batch in cali_data:
        model(batch)
    enable_calibration_woquantization(model, quantizer_type="weight_fake_quant")
    model(cali_data[0])
    if hasattr(config.quantize, "reconstruction"):
        model = ptq(model, cali_data, config.quantize.reconstruction)
    enable_quantization(model)
    with torch.no_grad():
        out = model(torch.randn(4, 3, 32, 32))
    assert out.shape == (4, 10) and torch.isfinite(out).all()


def _fused_calibrated():
    """SmallNet prepared for Tensorrt in training mode: conv-bn(-relu) become BN-folding QAT
    modules (ConvBnReLU2d, ConvBn2d), with AdaRound weights and QDrop activations."""
    torch.manual_seed(0)
    net = SmallNet()
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(16, 3, 8, 8))
    net.eval()
    cfg = {"extra_qconfig_dict": {"w_fakequantize": "AdaRoundFakeQuantize",
                                  "a_fakequantize": "QDropFakeQuantize"}}
    model = prepare_by_platform(copy.deepcopy(net).train(), BackendType.Tensorrt, cfg)
    model.eval()
    cali = [torch.randn(16, 3, 8, 8) for _ in range(2)]
    enable_calibration_woquantization(model)
    with torch.no_grad():
        for b in cali:
            model(b)
    enable_quantization(model)
    return net, model, cali


def test_fused_conv_bn_weights_are_rounded_through_the_folding():
    net, model, cali = _fused_calibrated()
    fused = model.get_submodule("conv1")
    assert hasattr(fused, "bn"), type(fused)  # a BN-folding QAT module
    torch.manual_seed(1)
    rec = ptq_reconstruction(model, cali, dict(CONFIG, pattern="block", max_count=40))
    layer = rec.get_submodule("conv1")
    fq = layer.weight_fake_quant
    bn = layer.bn
    factor = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).reshape(-1, 1, 1, 1)
    seen = (layer.weight * factor).detach()
    q = seen / fq.scale.reshape(-1, 1, 1, 1) + fq.zero_point.reshape(-1, 1, 1, 1).float()
    assert torch.allclose(q, q.round(), atol=1e-3)  # the folded weight is on the grid
    assert rec.conv1.bn.training is False and model.conv1.bn.training is False
    assert _rel_err(net, rec, torch.randn(32, 3, 8, 8)) < 1.0


class ChunkNet(torch.nn.Module):
    """A YOLO-style split: conv -> chunk(2) -> two branches -> cat, with two inputs."""

    def __init__(self):
        super().__init__()
        self.cv1 = torch.nn.Conv2d(3, 8, 1)
        self.cv2 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.cv3 = torch.nn.Conv2d(8, 6, 1)

    def forward(self, x, scale):
        a, b = self.cv1(x).chunk(2, 1)
        y = torch.cat([a, F.relu(self.cv2(b))], 1)
        return self.cv3(y) * scale


@pytest.mark.parametrize("pattern", ["layer", "block"])
def test_units_never_end_on_a_tuple_and_tuple_batches_are_spread(pattern):
    torch.manual_seed(0)
    net = ChunkNet().eval()
    model = prepare_by_platform(copy.deepcopy(net), BackendType.Academic, ADAROUND_QDROP)
    model.eval()
    cali = [(torch.randn(8, 3, 6, 6), torch.tensor(2.0)) for _ in range(2)]
    enable_calibration_woquantization(model)
    with torch.no_grad():
        for b in cali:
            model(*b)
    enable_quantization(model)
    modules = dict(model.named_modules())
    for unit in _units(model, modules, _Config({"pattern": pattern})):
        assert unit[-1].target != "chunk", [n.name for n in unit]
    torch.manual_seed(1)
    rec = ptq_reconstruction(model, cali, dict(CONFIG, pattern=pattern, max_count=20))
    for name in ("cv1", "cv2", "cv3"):
        assert not torch.equal(rec.get_submodule(name).weight, model.get_submodule(name).weight)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU machine runs "
                    "this (tools/gpu_check.sh)")
def test_reconstruction_on_cuda_matches_the_cpu_setup():
    net, model, cali = _calibrated()
    net, model = net.cuda(), model.cuda()
    cali = [b.cuda() for b in cali]
    test = torch.randn(64, 3, 8, 8, device="cuda")
    naive = _rel_err(net, model, test)
    torch.manual_seed(1)
    rec = ptq_reconstruction(model, cali, dict(CONFIG, pattern="block", prob=0.5,
                                               scale_lr=4e-5))
    assert next(rec.parameters()).is_cuda
    assert _rel_err(net, rec, test) < 0.8 * naive
    torch.manual_seed(1)
    rec = ptq_reconstruction(model, [b.cpu() for b in cali], dict(CONFIG, pattern="layer",
                                                                   keep_gpu=False))
    assert _rel_err(net, rec, test) < 0.8 * naive


# -- MQBench's shipped PTQ recipes (application/imagenet_example/PTQ/configs) ---------------------

def _recipe(w_fq, a_fq, wbit, abit, symmetric):
    """The extra_prepare_dict of an MQBench PTQ yaml (adaround/, brecq/, qdrop/ share it)."""
    def scheme(bit, per_channel):
        return {"bit": bit, "symmetry": symmetric, "per_channel": per_channel,
                "pot_scale": False, "p": 2.4}
    return {"extra_qconfig_dict": {"w_observer": "MSEObserver", "a_observer": "EMAMSEObserver",
                                   "w_fakequantize": w_fq, "a_fakequantize": a_fq,
                                   "w_qscheme": scheme(wbit, True),
                                   "a_qscheme": scheme(abit, False)}}


# (yaml, backend, a_fakequantize, bits, symmetric, reconstruction keys that differ by recipe)
SHIPPED_RECIPES = [
    ("adaround/r18_2_4", BackendType.Academic, "FixedFakeQuantize", (2, 4), False,
     {"pattern": "layer", "prob": 1.0}),
    ("adaround/r18_8_8_trt", BackendType.Tensorrt, "FixedFakeQuantize", (8, 8), True,
     {"pattern": "layer", "prob": 1.0}),
    ("brecq/r18_2_4", BackendType.Academic, "QDropFakeQuantize", (2, 4), False,
     {"pattern": "block", "prob": 1.0}),
    ("qdrop/r18_2_4", BackendType.Academic, "QDropFakeQuantize", (2, 4), False,
     {"pattern": "block", "prob": 0.5}),
]


@pytest.mark.parametrize("recipe,backend,a_fq,bits,symmetric,keys", SHIPPED_RECIPES,
                         ids=[r[0] for r in SHIPPED_RECIPES])
def test_shipped_mqbench_recipes_run_unchanged(recipe, backend, a_fq, bits, symmetric, keys):
    """Each recipe's prepare dict and reconstruction dict as shipped (scale_lr included; only
    max_count shortened): Fixed activation scales stay as calibrated with one warning naming
    them, learnable ones learn, and the result is at least as close to the float model as
    plain calibration."""
    net, model, cali = _calibrated(backend, cfg=_recipe("AdaRoundFakeQuantize", a_fq, *bits,
                                                         symmetric))
    test = torch.randn(64, 3, 8, 8)
    naive = _rel_err(net, model, test)
    act = {n: m.scale.detach().clone() for n, m in model.named_modules()
           if n.endswith("post_act_fake_quantizer")}
    config = dict(keys, scale_lr=4.0e-5, warm_up=0.2, weight=0.01, max_count=120,
                  b_range=[20, 2], keep_gpu=True, round_mode="learned_hard_sigmoid",
                  progress=False)
    torch.manual_seed(1)
    import warnings as _warnings
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        rec = ptq_reconstruction(model, cali, config)
    fixed_warnings = [w for w in caught if "buffer scale" in str(w.message)]
    if a_fq == "FixedFakeQuantize":
        assert len(fixed_warnings) == 1, [str(w.message) for w in caught]
        message = str(fixed_warnings[0].message)
        assert "x_post_act_fake_quantizer (FixedFakeQuantize)" in message
        assert "QDropFakeQuantize" in message  # says how to learn them
        for n, s in act.items():  # calibrated scales kept
            assert torch.equal(rec.get_submodule(n).scale.detach(), s), n
    else:
        assert not fixed_warnings
    err = _rel_err(net, rec, test)
    print(f"{recipe}: naive {naive:.4g}, reconstructed {err:.4g}")
    assert err <= naive * 1.02 + 1e-6, (recipe, naive, err)


def test_fixed_scales_are_listed_for_activation_quantizers_only():
    """The warning's list: activation quantizers with a buffer scale, never weight ones."""
    from mqbench.advanced_ptq import _fixed_scale_quantizers
    torch.manual_seed(0)
    model = prepare_by_platform(SmallNet().train(), BackendType.Academic,
                                _recipe("AdaRoundFakeQuantize", "FixedFakeQuantize", 4, 8, False))
    names = _fixed_scale_quantizers(model)
    assert names and all("FixedFakeQuantize" in n for n in names)
    assert not any("weight_fake_quant" in n for n in names)
