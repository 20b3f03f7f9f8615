"""prepare_by_platform on torchvision models and small models: placement of quantizers per the
spec's rules (A.2, A.6), numerics after calibration, training, checkpoints, options, bad input."""
import copy
import io
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

import mqbench.nn.intrinsic.qat as qnniqat
import mqbench.nn.qat as qnnqat
from mqbench.fake_quantize import LearnableFakeQuantize, TqtFakeQuantize
from mqbench.prepare_by_platform import BackendType, UnknownNameError, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import (disable_all, enable_calibration, enable_quantization)

set_log_level("WARNING")

ACADEMIC = {"extra_qconfig_dict": {
    "w_qscheme": {"bit": 8, "symmetry": True, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 8, "symmetry": True, "per_channel": False, "pot_scale": False},
    "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
    "w_observer": "MinMaxObserver", "a_observer": "EMAMinMaxObserver"}}


def config(backend):
    return ACADEMIC if backend.name.startswith("Academic") else {}


def act_quantizers(model):
    return [n for n, _ in model.named_modules() if n.endswith("_post_act_fake_quantizer")]


def cosine(a, b):
    return F.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()


def with_bn_statistics(model, shape=(8, 3, 224, 224)):
    """Random-weight nets have near-zero activations deep down; a few forward passes in train
    mode set BatchNorm's running statistics so that activations keep a unit scale."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.momentum = None
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(*shape, generator=g))
    return model.eval()


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    return with_bn_statistics(torchvision.models.resnet18())


@pytest.fixture(scope="module")
def mobilenet_v2():
    torch.manual_seed(0)
    return with_bn_statistics(torchvision.models.mobilenet_v2())


def tensorrt_resnet18_sites():
    """The spec's A.2.2 description for resnet18 + Tensorrt, spelled out: the input, every
    fused conv output, the maxpool output, both inputs of every residual add, every post-add
    ReLU output and the flatten."""
    names = ["x", "conv1", "maxpool"]
    for layer in range(1, 5):
        for block in range(2):
            p = f"layer{layer}_{block}"
            names += [f"{p}_conv1", f"{p}_conv2"]
            if block == 0 and layer > 1:
                names.append(f"{p}_downsample_0")
            names.append(f"{p}_relu_1")
    names.append("flatten")
    return [n + "_post_act_fake_quantizer" for n in names]


@pytest.mark.parametrize("backend,added,removed", [
    # TotalINT: each quant-input node's output too; all are inputs already except the network
    # output, fc.
    (BackendType.SNPE, {"fc"}, set()),
    (BackendType.PPLCUDA, {"fc"}, set()),
    # ONNX_QNN: Linear stays float, so nothing quantizes the flatten for it; the avgpool's output
    # is quantized (an average pool is a quant-input type there, its user a flatten).
    (BackendType.ONNX_QNN, {"avgpool"}, {"flatten"}),
], ids=lambda v: getattr(v, "name", ""))
def test_resnet18_sites_of_other_rule_sets(backend, added, removed, resnet18):
    q = prepare_by_platform(resnet18, backend)
    expected = set(tensorrt_resnet18_sites())
    expected -= {n + "_post_act_fake_quantizer" for n in removed}
    expected |= {n + "_post_act_fake_quantizer" for n in added}
    assert set(act_quantizers(q)) == expected


def test_vitis_resnet18_quantizes_outputs(resnet18):
    """VitisQuantizer: the outputs of every fused conv (downsample included), every residual
    add, every post-add ReLU module, the adaptive average pool and the fc."""
    q = prepare_by_platform(resnet18, BackendType.Vitis)
    expected = {"conv1", "avgpool", "fc"}
    adds = iter(["add"] + [f"add_{i}" for i in range(1, 8)])
    for layer in range(1, 5):
        for block in range(2):
            p = f"layer{layer}_{block}"
            expected |= {f"{p}_conv1", f"{p}_conv2", f"{p}_relu_1", next(adds)}
            if block == 0 and layer > 1:
                expected.add(f"{p}_downsample_0")
    assert set(act_quantizers(q)) == {n + "_post_act_fake_quantizer" for n in expected}
    # MQBench 1.10's Vitis modules quantize the folded bias: a power-of-two TQT 'param'
    # quantizer on every fused convolution (20 in resnet18), none on the fc
    from mqbench.fake_quantize import TqtFakeQuantize
    biased = {n for n, m in q.named_modules() if hasattr(m, "bias_fake_quant")}
    assert len(biased) == 20 and "fc" not in biased
    for name in biased:
        fq = q.get_submodule(name).bias_fake_quant
        assert isinstance(fq, TqtFakeQuantize) and fq.quant_type == "param"
        assert fq.quant_min == -128 and fq.quant_max == 127
    assert not any(hasattr(m, "bias_fake_quant") for m in
                   prepare_by_platform(resnet18, BackendType.Tensorrt).modules())


def test_tensorrt_resnet18_structure(resnet18):
    q = prepare_by_platform(resnet18, BackendType.Tensorrt)
    assert sorted(act_quantizers(q)) == sorted(tensorrt_resnet18_sites())
    assert type(q.conv1) is qnniqat.ConvBnReLU2d
    assert type(q.layer1.get_submodule("0").conv2) is qnniqat.ConvBn2d
    assert type(q.fc) is qnnqat.Linear
    assert isinstance(q.conv1.weight_fake_quant, LearnableFakeQuantize)
    assert q.conv1.weight_fake_quant.scale.shape == (64,)  # sized at prepare time
    assert "x_post_act_fake_quantizer = self.x_post_act_fake_quantizer(x)" in q.code
    assert "conv1 = self.conv1(x_post_act_fake_quantizer)" in q.code
    # shared with the float model, as MQBench
    assert q.conv1.weight is resnet18.conv1.weight
    assert hasattr(q.layer1.get_submodule("0"), "relu_dup1")
    assert not q.training  # the float model was in eval mode


@pytest.mark.parametrize("backend", list(BackendType)[:14], ids=lambda b: b.name)
def test_every_backend_prepares_calibrates_and_stays_close(backend, resnet18, mobilenet_v2):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 3, 224, 224, generator=g)
    # Metric: cosine similarity of the 8-bit fake-quant logits to the float logits.
    for model, bar in ((resnet18, 0.995), (mobilenet_v2, 0.95)):
        q = prepare_by_platform(model, backend, config(backend))
        with torch.no_grad():
            y_float = model(x)
            disable_all(q)
            assert cosine(q(x), y_float) > 0.99999  # fusion and QAT swap keep the function
            enable_calibration(q)
            q(x)
            enable_quantization(q)
            y = q(x)
        assert cosine(y, y_float) > bar, (type(model).__name__, cosine(y, y_float))
        assert not torch.equal(y, y_float)


def test_backward_reaches_every_parameter(resnet18):
    q = prepare_by_platform(copy.deepcopy(resnet18).train(), BackendType.Tensorrt)
    x = torch.randn(2, 3, 64, 64)
    enable_calibration(q)
    q(x)
    enable_quantization(q)
    q(x).sum().backward()
    missing = [n for n, p in q.named_parameters() if p.requires_grad and p.grad is None]
    assert missing == []
    assert q.conv1.weight_fake_quant.scale.grad.abs().sum() > 0


def test_state_dict_round_trip_and_deepcopy(resnet18):
    x = torch.randn(2, 3, 64, 64)
    q = prepare_by_platform(copy.deepcopy(resnet18), BackendType.Tensorrt)
    enable_calibration(q)
    q(x)
    enable_quantization(q)
    expect = q(x)
    buf = io.BytesIO()
    torch.save(q.state_dict(), buf)
    buf.seek(0)
    fresh = prepare_by_platform(copy.deepcopy(resnet18), BackendType.Tensorrt)
    fresh.load_state_dict(torch.load(buf))
    assert torch.equal(fresh(x), expect)
    assert "conv1.weight_fake_quant.scale" in q.state_dict()
    assert "conv1.bn.running_mean" in q.state_dict()
    assert not any(k.startswith(("bn1.", "relu.")) for k in q.state_dict())  # fused away
    assert "x_post_act_fake_quantizer.activation_post_process.min_val" in q.state_dict()
    assert torch.equal(copy.deepcopy(q)(x), expect)


def test_train_eval_switching(resnet18):
    q = prepare_by_platform(copy.deepcopy(resnet18), BackendType.Tensorrt)
    q.train()
    assert q.conv1.bn.training and q.x_post_act_fake_quantizer.training
    q.eval()
    assert not q.conv1.bn.training
    frozen = prepare_by_platform(copy.deepcopy(resnet18).train(), BackendType.Tensorrt,
                                 freeze_bn=True)
    assert not frozen.conv1.bn.training


def test_extra_quantizer_dict_changes_the_plan(resnet18):
    base = set(act_quantizers(prepare_by_platform(copy.deepcopy(resnet18), BackendType.Tensorrt)))
    q = prepare_by_platform(copy.deepcopy(resnet18), BackendType.Tensorrt, {
        "extra_quantizer_dict": {"exclude_node_name": ["maxpool"],
                                 "additional_function_type": [torch.flatten],
                                 "exclude_module_name": ["fc"]}})
    names = set(act_quantizers(q))
    # An excluded node's inputs are not quantized for it (conv1 fed only maxpool); flatten
    # becomes a quant-input type (its input, avgpool, is quantized); fc is excluded as a module,
    # so its input (flatten) is not.
    assert names == (base - {"conv1_post_act_fake_quantizer", "flatten_post_act_fake_quantizer"}) \
        | {"avgpool_post_act_fake_quantizer"}
    assert type(q.fc) is nn.Linear  # excluded from the QAT swap
    q2 = prepare_by_platform(copy.deepcopy(resnet18), BackendType.Tensorrt, {
        "extra_quantizer_dict": {"additional_node_name": ["avgpool"]}})
    assert "layer4_1_relu_1_post_act_fake_quantizer" in act_quantizers(q2)
    with pytest.raises(UnknownNameError, match="did you mean 'exclude_node_name'.*valid keys"):
        prepare_by_platform(copy.deepcopy(resnet18), BackendType.Tensorrt,
                            {"extra_quantizer_dict": {"exclude_nodes": ["x"]}})


def test_extra_qconfig_dict_and_vitis_quant_types(resnet18):
    q = prepare_by_platform(copy.deepcopy(resnet18), BackendType.Tensorrt, {
        "extra_qconfig_dict": {"a_fakequantize": "FixedFakeQuantize", "a_observer": "MSEObserver"}})
    assert type(q.x_post_act_fake_quantizer).__name__ == "FixedFakeQuantize"
    v = prepare_by_platform(copy.deepcopy(resnet18), BackendType.Vitis)
    assert isinstance(v.conv1.weight_fake_quant, TqtFakeQuantize)
    assert v.conv1.weight_fake_quant.quant_type == "param"
    assert v.conv1_post_act_fake_quantizer.quant_type == "tensor"


def test_openvino_and_academic_ranges(resnet18):
    ov = prepare_by_platform(copy.deepcopy(resnet18), BackendType.OPENVINO)
    assert (ov.conv1.weight_fake_quant.quant_min, ov.conv1.weight_fake_quant.quant_max) == (-64, 63)
    assert ov.conv1_post_act_fake_quantizer.quant_min == 0  # a ReLU output: unsigned
    assert ov.x_post_act_fake_quantizer.quant_min == -128
    cfg = copy.deepcopy(ACADEMIC)
    cfg["extra_qconfig_dict"]["w_qscheme"]["bit"] = 4
    cfg["extra_qconfig_dict"]["a_qscheme"]["bit"] = 4
    ac = prepare_by_platform(copy.deepcopy(resnet18), BackendType.Academic, cfg)
    assert type(ac.bn1) is nn.BatchNorm2d  # Academic does not fuse
    assert (ac.conv1.weight_fake_quant.quant_min, ac.conv1.weight_fake_quant.quant_max) == (-128, 127)
    assert (ac.layer1.get_submodule("0").conv1.weight_fake_quant.quant_max) == 7
    assert ac.x_post_act_fake_quantizer.quant_max == 127


class Chunky(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        a, b = self.conv(x).chunk(2, 1)  # unpacking a Proxy: fails in torch 1.13 on Python 3.11
        return self.fc(F.adaptive_avg_pool2d(a + b, 1).flatten(1))


def test_unpacking_a_proxy_traces():
    q = prepare_by_platform(Chunky().eval(), BackendType.Tensorrt)
    names = act_quantizers(q)
    assert {"getitem_post_act_fake_quantizer", "getitem_1_post_act_fake_quantizer",
            "add_post_act_fake_quantizer"} <= set(names)
    assert q(torch.randn(2, 4, 8, 8)).shape == (2, 2)


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = Gate()

    def forward(self, x):
        return self.gate(x)


class Gate(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


def test_control_flow_error_names_the_module():
    with pytest.raises(Exception, match="module 'gate' \\(Gate\\).*leaf_module"):
        prepare_by_platform(Branchy(), BackendType.Tensorrt)
    q = prepare_by_platform(Branchy(), BackendType.Tensorrt, {"leaf_module": [Gate]})
    assert q(torch.ones(3)).sum() == 3


def test_bad_models_and_keys(resnet18):
    with pytest.raises(TypeError, match="model.module"):
        prepare_by_platform(nn.DataParallel(resnet18), BackendType.Tensorrt)
    q = prepare_by_platform(copy.deepcopy(resnet18), BackendType.Tensorrt)
    with pytest.raises(ValueError, match="prepared before"):
        prepare_by_platform(q, BackendType.Tensorrt)
    with pytest.raises(UnknownNameError, match="valid keys"):
        prepare_by_platform(resnet18, BackendType.Tensorrt, {"extra_qconfig": {}})
    with pytest.raises(UnknownNameError, match="did you mean 'Tensorrt'"):
        prepare_by_platform(resnet18, "TensorRT")
    # MQBench's docs misspell concrete_args; the error says which key was meant.
    with pytest.raises(UnknownNameError, match="'concrete_arg' \\(did you mean 'concrete_args'"):
        prepare_by_platform(resnet18, BackendType.Tensorrt, {"concrete_arg": {}})


class WithAttr(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.tag = "kept"

    def forward(self, x):
        return self.fc(x)

    def describe(self):
        return f"{self.tag}:{type(self.fc).__name__}"


def test_preserve_attr_and_methods():
    q = prepare_by_platform(WithAttr(), BackendType.Tensorrt,
                            {"preserve_attr": {"": ["tag", "describe"]}})
    assert q.tag == "kept" and q.describe() == "kept:Linear"


class TinyTransformer(nn.Module):
    def __init__(self, vocab=50, d=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(8, d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, ids, positions):
        h = self.tok(ids) + self.pos(positions)
        att = torch.matmul(self.q(h), self.k(h).transpose(1, 2)) / 4.0
        out = torch.matmul(att.softmax(-1), self.v(h))
        return self.o(out) + h


def test_nlp_backends_on_a_transformer_block():
    model = TinyTransformer().eval()
    ids, pos = torch.randint(0, 50, (2, 8)), torch.arange(8).expand(2, 8)
    q = prepare_by_platform(model, BackendType.Tensorrt_NLP)
    names = act_quantizers(q)
    assert "add_post_act_fake_quantizer" in names          # h feeds the linears
    assert "q_post_act_fake_quantizer" in names and "transpose_post_act_fake_quantizer" in names
    assert "softmax_post_act_fake_quantizer" in names     # matmul inputs
    assert not any(n.startswith(("tok_", "pos_")) for n in names)  # embedding sum not quantized
    from mqbench.nn.qat import Embedding
    assert type(q.tok) is Embedding and q.tok.weight_fake_quant.ch_axis == 1
    assert q.tok.weight is model.tok.weight
    enable_calibration(q)
    q(ids, pos)
    enable_quantization(q)
    assert cosine(q(ids, pos), model(ids, pos)) > 0.99
    a = prepare_by_platform(TinyTransformer().eval(), BackendType.Academic_NLP, ACADEMIC)
    assert "add_1_post_act_fake_quantizer" not in act_quantizers(a)


class Decoder(nn.Module):
    """Conv + FrozenBatchNorm2d + ReLU, transposed convs with BN (+ ReLU), grouped and plain."""

    def __init__(self):
        super().__init__()
        from mqbench.nn import FrozenBatchNorm2d
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fbn = FrozenBatchNorm2d(8)
        self.relu = nn.ReLU()
        self.up = nn.ConvTranspose2d(8, 6, 2, stride=2)
        self.bn = nn.BatchNorm2d(6)
        self.relu2 = nn.ReLU()
        self.up2 = nn.ConvTranspose2d(6, 4, 3, padding=1, groups=2)
        self.bn2 = nn.BatchNorm2d(4)
        self.up3 = nn.ConvTranspose2d(4, 4, 3, padding=1)

    def forward(self, x):
        x = self.relu(self.fbn(self.conv(x)))
        x = self.relu2(self.bn(self.up(x)))
        return self.up3(self.bn2(self.up2(x)))


def test_transposed_convs_and_frozen_bn():
    from mqbench.nn.intrinsic import qat as qnniqat
    from mqbench.nn.qat import ConvTranspose2d
    torch.manual_seed(0)
    model = with_bn_statistics(Decoder(), shape=(8, 3, 8, 8))
    x = torch.randn(4, 3, 8, 8)
    q = prepare_by_platform(model, BackendType.Tensorrt)
    assert type(q.conv) is qnniqat.ConvFreezebnReLU2d
    assert type(q.up) is qnniqat.ConvTransposeBnReLU2d
    assert type(q.up2) is qnniqat.ConvTransposeBn2d
    assert type(q.up3) is ConvTranspose2d
    assert q.up.weight_fake_quant.ch_axis == 1 and q.up.weight_fake_quant.scale.shape == (6,)
    ov = prepare_by_platform(model, BackendType.OPENVINO)  # 7-bit weights keep ch_axis 1
    assert ov.up.weight_fake_quant.quant_max == 63 and ov.up.weight_fake_quant.ch_axis == 1
    with torch.no_grad():
        y_float = model(x)
        disable_all(q)
        assert torch.allclose(q(x), y_float, atol=1e-5)  # folding keeps the function
        enable_calibration(q)
        q(x)
        enable_quantization(q)
        assert cosine(q(x), y_float) > 0.99
    q.train()
    assert not q.conv.bn.training  # frozen BN stays frozen
    assert q.up.bn.training
    q(x).sum().backward()
    assert q.up.weight.grad is not None and q.up.bn.weight.grad is not None


class ConvSig(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.act = nn.Sigmoid()
        self.fc = nn.Linear(4 * 6 * 6, 2)

    def forward(self, x):
        return self.fc(self.act(self.conv(x)).flatten(1))


class ConvSigmoid2d(nn.Sequential):
    pass


class QATConvSigmoid2d(torch.nn.qat.Conv2d):
    _FLOAT_MODULE = ConvSigmoid2d

    def forward(self, x):
        return torch.sigmoid(super().forward(x))

    @classmethod
    def from_float(cls, mod):
        conv = mod[0]
        conv.qconfig = mod.qconfig
        qat = torch.nn.qat.Conv2d.from_float.__func__(torch.nn.qat.Conv2d, conv)
        qat.__class__ = cls
        return qat


def test_extra_fuse_dict_patterns_and_qat_mapping():
    fused_calls = []

    def fuse_conv_sigmoid(is_qat, conv, act):
        fused_calls.append(is_qat)
        return ConvSigmoid2d(conv, act)

    model = ConvSig().eval()
    x = torch.randn(2, 3, 8, 8)
    q = prepare_by_platform(model, BackendType.Tensorrt, {"extra_fuse_dict": {
        "additional_fuser_method_mapping": {(nn.Conv2d, nn.Sigmoid): fuse_conv_sigmoid},
        "additional_qat_module_mapping": {ConvSigmoid2d: QATConvSigmoid2d}}})
    assert fused_calls == [True]
    assert type(q.conv) is QATConvSigmoid2d and not hasattr(q, "act")
    disable_all(q)
    assert torch.allclose(q(x), model(x), atol=1e-6)


def _blocks():
    for layer in range(1, 5):
        for block in range(2):
            yield layer, block, f"layer{layer}_{block}"


def _expected_sites(backend):
    """The activation quantizer sites of resnet18 for each rule set, derived from the spec's
    rules (A.6) rather than from our output."""
    trt = {n[:-len("_post_act_fake_quantizer")] for n in tensorrt_resnet18_sites()}
    name = backend.name
    if name in ("Tensorrt", "NNIE", "QDQ"):
        return trt
    if name in ("SNPE", "PPLW8A16", "PPLCUDA", "STPU"):
        return trt | {"fc"}
    if name == "Tengine_u8":  # + each add's output (its user, a ReLU module, is no pass op) + fc
        return trt | {"fc"} | {"add"} | {f"add_{i}" for i in range(1, 8)}
    if name == "OPENVINO":  # inputs of qualified consumers; maxpool->conv and flatten->fc propagate
        s = {"x", "conv1", "avgpool"}
        for layer, block, p in _blocks():
            s |= {f"{p}_conv1", f"{p}_conv2", f"{p}_relu_1"}
            if block == 0 and layer > 1:
                s.add(f"{p}_downsample_0")
        return s
    if name == "Academic":  # no fusion: inputs of every conv and the fc
        s = {"x", "maxpool", "flatten"}
        for layer, block, p in _blocks():
            s.add(f"{p}_relu")  # conv2's input
            if (layer, block) != (4, 1):
                s.add(f"{p}_relu_1")  # the next block's input (its conv1 and downsample)
        return s
    if name == "Tensorrt_NLP":  # both inputs of each residual add, and the fc's input
        s = {"flatten", "maxpool"}  # maxpool: layer1_0's identity
        for layer, block, p in _blocks():
            s.add(f"{p}_conv2")
            if block == 0 and layer > 1:
                s.add(f"{p}_downsample_0")
            if block == 1:
                s.add(f"layer{layer}_0_relu_1")  # the identity of the second block
        return s
    if name == "Academic_NLP":  # only the inputs of Linear layers
        return {"flatten"}
    raise KeyError(name)


@pytest.mark.parametrize("backend", [b for b in list(BackendType)[:14]
                                     if b.name not in ("ONNX_QNN", "Vitis")], ids=lambda b: b.name)
def test_resnet18_exact_sites_per_backend(backend, resnet18):
    q = prepare_by_platform(resnet18, backend, config(backend))
    got = {n[:-len("_post_act_fake_quantizer")] for n in act_quantizers(q)}
    assert got == _expected_sites(backend)


def test_is_qat_false_folds_batchnorm_at_prepare(resnet18):
    x = torch.randn(2, 3, 64, 64)
    q = prepare_by_platform(copy.deepcopy(resnet18), BackendType.Tensorrt, is_qat=False)
    assert type(q.conv1) is qnniqat.ConvReLU2d
    assert type(q.layer1.get_submodule("0").conv2) is qnnqat.Conv2d
    assert not any(".bn" in k or k.startswith("bn1.") for k in q.state_dict())
    disable_all(q)
    with torch.no_grad():
        assert cosine(q(x), resnet18(x)) > 0.99999
    dec = with_bn_statistics(Decoder(), shape=(8, 3, 8, 8))
    d = prepare_by_platform(dec, BackendType.Tensorrt, is_qat=False)
    assert type(d.up).__name__ == "ConvTransposeReLU2d"
    disable_all(d)
    xd = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.allclose(d(xd), dec(xd), atol=1e-5)  # grouped deconv folding included
    with pytest.raises(ValueError, match="eval mode"):
        prepare_by_platform(copy.deepcopy(resnet18).train(), BackendType.Tensorrt, is_qat=False)


# ---- old call signatures fail at once, naming the parameter ----------------------------------

def test_an_old_positional_order_names_the_parameter_and_the_signature():
    """MQBench's test_load_ckpt.py calls prepare_by_platform(model, backend, True, config, None,
    True): the bool lands on prepare_custom_config_dict."""
    import torchvision
    model = torchvision.models.resnet18()
    with pytest.raises(TypeError, match=r"prepare_by_platform: argument 'prepare_custom_config_dict' "
                                        r"\(3rd positional\) got bool True; expected a dict") as e:
        prepare_by_platform(model, BackendType.Tensorrt, True, {}, None, True)
    assert "prepare_by_platform(model, deploy_backend, prepare_custom_config_dict=None" in str(e.value)
    with pytest.raises(TypeError, match="'custom_tracer'.*got dict"):
        prepare_by_platform(model, BackendType.Tensorrt, {}, {"leaf_module": []})
    with pytest.raises(TypeError, match="'is_qat'.*got str"):
        prepare_by_platform(model, BackendType.Tensorrt, None, None, "yes")
    with pytest.raises(TypeError, match="'model'.*got str"):
        prepare_by_platform("resnet18", BackendType.Tensorrt)


def test_the_other_entry_points_check_their_arguments(tmp_path):
    from mqbench.advanced_ptq import ptq_reconstruction
    from mqbench.convert_deploy import convert_deploy
    from mqbench.utils.profiling import profiling
    model = prepare_by_platform(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)), BackendType.Tensorrt)
    with pytest.raises(TypeError, match=r"convert_deploy: argument 'input_shape_dict' \(3rd "
                                        r"positional\) got list"):
        convert_deploy(model, BackendType.Tensorrt, [1, 3, 8, 8], output_path=str(tmp_path))
    with pytest.raises(TypeError, match="'output_path'.*got int"):
        convert_deploy(model, BackendType.Tensorrt, {"x": [1, 3, 8, 8]}, None, 3)
    with pytest.raises(TypeError, match=r"ptq_reconstruction: argument 'config' \(3rd positional\) "
                                        r"got str"):
        ptq_reconstruction(model, [torch.randn(1, 3, 8, 8)], "adaround.yaml")
    with pytest.raises(TypeError, match="'cali_data'.*got Tensor"):
        ptq_reconstruction(model, torch.randn(1, 3, 8, 8), {})
    with pytest.raises(TypeError, match=r"profiling: argument 'profiling_type' \(3rd positional\) "
                                        r"got list"):
        profiling(model, [torch.randn(1, 3, 8, 8)], ["standalone"])
    with pytest.raises(TypeError, match="'module_list'.*got str"):
        profiling(model, [torch.randn(1, 3, 8, 8)], "standalone", "conv")
    assert os.listdir(tmp_path) == []
