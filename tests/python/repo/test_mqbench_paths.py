"""MQBench's module paths (main and 1.10) import, and the names added for them behave as
MQBench's: the fusers of ``mqbench.fuser_method_mappings`` (both call forms) and its
``fuse_custom_config_dict`` (no torch global changed), ``mqbench.utils.fusion``, the public BN
merge functions of ``mqbench.fusion_method``, the transposed-conv + FrozenBatchNorm2d modules,
bias fake quantizers (``mqbench.quantization.default_bias_fake_quant``, opt-in on our QAT
modules), ``mqbench.utils``'s graph helpers and ``TqtFakeQuantize.set_forward_method``."""
import collections
import copy
import importlib
import inspect
import operator
import os
import subprocess
import sys

import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

import mqbench
import mqbench.nn.intrinsic as qnni
import mqbench.nn.intrinsic.qat as qnniqat
import mqbench.nn.qat as qnnqat
from mqbench._base import QConfig
from mqbench.fake_quantize import FixedFakeQuantize, TqtFakeQuantize
from mqbench.nn import FrozenBatchNorm2d
from mqbench.observer import MinMaxFloorObserver, MinMaxObserver
from mqbench.prepare_by_platform import BackendType, prepare_by_platform

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(mqbench.__file__)

# -- (a) module paths ---------------------------------------------------------------------------
# Every path /tmp/mqbench_facts.md section 1 lists as both branches (B), 1.10 (10) or main (M).
PATHS = [
    "mqbench", "mqbench.prepare_by_platform", "mqbench.convert_deploy",
    "mqbench.custom_symbolic_opset", "mqbench.fuser_method_mappings", "mqbench.fusion_method",
    "mqbench.observer", "mqbench.scheme",
    "mqbench.custom_quantizer", "mqbench.custom_quantizer.model_quantizer",
    "mqbench.custom_quantizer.academic_quantizer", "mqbench.custom_quantizer.tensorrt_quantizer",
    "mqbench.custom_quantizer.onnx_qnn_quantizer", "mqbench.custom_quantizer.openvino_quantizer",
    "mqbench.custom_quantizer.vitis_quantizer", "mqbench.custom_quantizer.tengine_u8_quantizer",
    "mqbench.custom_quantizer.total_int_quantizer", "mqbench.custom_quantizer.nlp_quantizer",
    "mqbench.fake_quantize", "mqbench.fake_quantize.quantize_base", "mqbench.fake_quantize.lsq",
    "mqbench.fake_quantize.fixed", "mqbench.fake_quantize.dorefa", "mqbench.fake_quantize.dsq",
    "mqbench.fake_quantize.pact", "mqbench.fake_quantize.tqt", "mqbench.fake_quantize.nnie",
    "mqbench.fake_quantize.adaround_quantizer", "mqbench.fake_quantize.qdrop_quantizer",
    "mqbench.nn", "mqbench.nn.modules", "mqbench.nn.modules.freezebn", "mqbench.nn.intrinsic",
    "mqbench.nn.intrinsic.modules", "mqbench.nn.intrinsic.modules.fused",
    "mqbench.nn.intrinsic.qat", "mqbench.nn.intrinsic.qat.modules",
    "mqbench.nn.intrinsic.qat.modules.conv_fused", "mqbench.nn.intrinsic.qat.modules.deconv_fused",
    "mqbench.nn.intrinsic.qat.modules.freezebn", "mqbench.nn.intrinsic.qat.modules.linear_fused",
    "mqbench.nn.qat", "mqbench.nn.qat.modules", "mqbench.nn.qat.modules.conv",
    "mqbench.nn.qat.modules.deconv", "mqbench.nn.qat.modules.linear",
    "mqbench.nn.qat.modules.embedding",
    "mqbench.quantization", "mqbench.quantization.default_bias_fake_quant",
    "mqbench.quantization.qconfig_mapping_utils",
    "mqbench.utils", "mqbench.utils.utils", "mqbench.utils.fusion", "mqbench.utils.hook",
    "mqbench.utils.logger", "mqbench.utils.registry", "mqbench.utils.state",
    "mqbench.tools", "mqbench.tools.replace_syncbn",
]
DEPLOY_PATHS = ["mqbench.deploy", "mqbench.deploy.common", "mqbench.deploy.deploy_linear",
                "mqbench.deploy.deploy_nnie", "mqbench.deploy.deploy_onnx_qlinear",
                "mqbench.deploy.deploy_onnx_qnn", "mqbench.deploy.deploy_openvino",
                "mqbench.deploy.deploy_tengine", "mqbench.deploy.deploy_stpu",
                "mqbench.deploy.convert_xir"]
# the advanced-PTQ and analysis modules, with MQBench's second path of the driver
PTQ_PATHS = ["mqbench.advanced_ptq", "mqbench.ptq_reconstruction",
             "mqbench.mix_precision.hessian_per_layer", "mqbench.mix_precision.mix_precision",
             "mqbench.weight_equalization", "mqbench.utils.profiling"]


def _params():
    return [pytest.param(p, id=p) for p in PATHS + DEPLOY_PATHS + PTQ_PATHS]


@pytest.mark.parametrize("path", _params())
def test_mqbench_module_path_imports(path):
    assert importlib.import_module(path).__name__ == path


# MQBench's exports per path (facts section 4.4; utils section 4.6), and where ours live.
EXPORTS = {
    "mqbench.nn.modules": ["FrozenBatchNorm2d"],
    "mqbench.nn.modules.freezebn": ["FrozenBatchNorm2d"],
    "mqbench.nn.intrinsic.modules": [
        "LinearBn1d", "ConvTransposeBn2d", "ConvTransposeReLU2d", "ConvTransposeBnReLU2d",
        "ConvBnReLU2d", "ConvBn2d", "ConvReLU2d", "ConvFreezebn2d", "ConvFreezebnReLU2d",
        "ConvTransposeFreezebn2d", "ConvTransposeFreezebnReLU2d"],
    "mqbench.nn.intrinsic.qat.modules": [
        "LinearBn1d", "ConvTransposeBnReLU2d", "ConvTransposeBn2d", "ConvTransposeReLU2d",
        "ConvBnReLU2d", "ConvBn2d", "ConvReLU2d", "ConvFreezebn2d", "ConvFreezebnReLU2d",
        "ConvTransposeFreezebn2d", "ConvTransposeFreezebnReLU2d"],
    "mqbench.nn.intrinsic.qat.modules.freezebn": [
        "ConvFreezebn2d", "ConvFreezebnReLU2d", "ConvTransposeFreezebn2d",
        "ConvTransposeFreezebnReLU2d"],
    "mqbench.nn.intrinsic.qat.modules.conv_fused": ["ConvBn2d", "ConvBnReLU2d", "ConvReLU2d"],
    "mqbench.nn.intrinsic.qat.modules.deconv_fused": [
        "ConvTransposeBn2d", "ConvTransposeBnReLU2d", "ConvTransposeReLU2d"],
    "mqbench.nn.intrinsic.qat.modules.linear_fused": ["LinearBn1d"],
    "mqbench.nn.qat.modules": ["Linear", "ConvTranspose2d", "Conv2d", "Embedding"],
    "mqbench.nn.qat.modules.conv": ["Conv2d"],
    "mqbench.nn.qat.modules.deconv": ["ConvTranspose2d"],
    "mqbench.nn.qat.modules.linear": ["Linear"],
    "mqbench.nn.qat.modules.embedding": ["Embedding"],
}
HOME = {"mqbench.nn.modules": "mqbench.nn", "mqbench.nn.modules.freezebn": "mqbench.nn",
        "mqbench.nn.intrinsic.modules": "mqbench.nn.intrinsic"}


@pytest.mark.parametrize("path", sorted(EXPORTS))
def test_paths_export_mqbench_names_as_the_same_class_objects(path):
    module = importlib.import_module(path)
    if path.startswith("mqbench.nn.intrinsic.qat"):
        home = importlib.import_module("mqbench.nn.intrinsic.qat")
    elif path.startswith("mqbench.nn.qat"):
        home = qnnqat
    else:
        home = importlib.import_module(HOME[path])
    for name in EXPORTS[path]:
        assert getattr(module, name) is getattr(home, name), f"{path}.{name}"


def test_utils_exports_mqbench_utils_names():
    import mqbench.utils as utils
    import mqbench.utils.utils as uu
    for name in ("USE_LINK", "USE_DDP", "sync_tensor", "pot_quantization", "is_symmetric_quant",
                 "no_jit_trace", "is_tracing_state", "deepcopy_graphmodule",
                 "deepcopy_mixedmodule", "topology_order", "getitem2node",
                 "_fix_succ_recursivly", "get_flattened_qconfig_dict"):
        assert getattr(utils, name) is getattr(uu, name), name
    from mqbench.quantization.qconfig_mapping_utils import get_flattened_qconfig_dict
    assert get_flattened_qconfig_dict is uu.get_flattened_qconfig_dict


# -- mqbench.utils.fusion ---------------------------------------------------------------------
def _randomize_bn(bn, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = bn.num_features
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(n, generator=g))
        bn.running_var.copy_(torch.rand(n, generator=g) + 0.5)
        bn.weight.copy_(torch.randn(n, generator=g))
        bn.bias.copy_(torch.randn(n, generator=g))
    return bn


@pytest.mark.parametrize("groups,bias", [(1, True), (2, True), (2, False), (3, True)])
def test_fuse_deconv_bn_eval_matches_deconv_then_bn(groups, bias):
    from mqbench.utils.fusion import fuse_deconv_bn_eval, fuse_deconv_bn_weights
    torch.manual_seed(0)
    deconv = nn.ConvTranspose2d(6, 3 * groups, 3, stride=2, padding=1, output_padding=1,
                                groups=groups, bias=bias).eval()
    bn = _randomize_bn(nn.BatchNorm2d(3 * groups)).eval()
    x = torch.randn(2, 6, 5, 5)
    fused = fuse_deconv_bn_eval(deconv, bn)
    assert type(fused) is nn.ConvTranspose2d and fused is not deconv
    assert fused.groups == groups and fused.bias is not None
    torch.testing.assert_close(fused(x), bn(deconv(x)), atol=1e-5, rtol=1e-5)
    # the original deconv is untouched
    assert deconv.bias is None if not bias else deconv.bias is not fused.bias
    # groups inferred from the shapes (MQBench's signature has no groups argument)
    w, b = fuse_deconv_bn_weights(deconv.weight, deconv.bias, bn.running_mean, bn.running_var,
                                  bn.eps, bn.weight, bn.bias)
    assert isinstance(w, nn.Parameter) and isinstance(b, nn.Parameter)
    torch.testing.assert_close(w, fused.weight)
    torch.testing.assert_close(b, fused.bias)


def test_fuse_deconv_bn_weights_defaults_and_errors():
    from mqbench.utils.fusion import fuse_deconv_bn_eval, fuse_deconv_bn_weights
    w = torch.randn(4, 2, 3, 3)
    rm, rv = torch.randn(2), torch.rand(2) + 1
    fw, fb = fuse_deconv_bn_weights(w, None, rm, rv, 1e-5, None, None)  # gamma 1, beta 0, bias 0
    std = torch.sqrt(rv + 1e-5)
    torch.testing.assert_close(fw, w / std.reshape(1, 2, 1, 1))
    torch.testing.assert_close(fb, -rm / std)
    with pytest.raises(ValueError, match="groups=3"):
        fuse_deconv_bn_weights(w, None, torch.zeros(4), rv.repeat(2), 1e-5, None, None, groups=3)
    with pytest.raises(ValueError, match="eval"):
        fuse_deconv_bn_eval(nn.ConvTranspose2d(2, 2, 1).train(), nn.BatchNorm2d(2).eval())


# -- mqbench.fuser_method_mappings ------------------------------------------------------------
def _chain(kind, train):
    """(modules, float reference) of one MQBench fusion chain."""
    torch.manual_seed(0)
    if kind == "linear_bn":
        mods = (nn.Linear(4, 3), _randomize_bn(nn.BatchNorm1d(3)))
    else:
        layer = nn.ConvTranspose2d(4, 4, 2, stride=2, groups=2) if kind.startswith("deconv") \
            else nn.Conv2d(4, 4, 3, padding=1)
        bn = FrozenBatchNorm2d(4) if "freezebn" in kind else nn.BatchNorm2d(4)
        mods = (layer, _randomize_bn(bn))
        if kind.endswith("relu"):
            mods += (nn.ReLU(),)
    for m in mods:
        m.train(train)
    return mods


FUSERS = {
    "fuse_linear_bn": ("linear_bn", qnni.LinearBn1d, nn.Linear),
    "fuse_deconv_bn": ("deconv_bn", qnni.ConvTransposeBn2d, nn.ConvTranspose2d),
    "fuse_deconv_bn_relu": ("deconv_bn_relu", qnni.ConvTransposeBnReLU2d,
                            qnni.ConvTransposeReLU2d),
    "fuse_conv_freezebn": ("conv_freezebn", qnni.ConvFreezebn2d, nn.Conv2d),
    "fuse_conv_freezebn_relu": ("conv_freezebn_relu", qnni.ConvFreezebnReLU2d, qnni.ConvReLU2d),
    "fuse_deconv_freezebn": ("deconv_freezebn", qnni.ConvTransposeFreezebn2d, nn.ConvTranspose2d),
    "fuse_deconv_freezebn_relu": ("deconv_freezebn_relu", qnni.ConvTransposeFreezebnReLU2d,
                                  qnni.ConvTransposeReLU2d),
}


def _input(kind):
    return torch.randn(5, 4) if kind == "linear_bn" else torch.randn(2, 4, 6, 6)


@pytest.mark.parametrize("name", sorted(FUSERS))
def test_fusers_take_both_call_forms(name):
    import mqbench.fuser_method_mappings as fmm
    fuser = getattr(fmm, name)
    kind, container, folded_type = FUSERS[name]
    params = list(inspect.signature(fuser).parameters)
    assert params[0] == "is_qat" and len(params) == len(_chain(kind, True)) + 1
    # 1.10's form: train -> the fused container (same module objects), eval -> folded
    mods = _chain(kind, train=True)
    fused = fuser(*mods)
    assert type(fused) is container and all(a is b for a, b in zip(fused, mods))
    mods = _chain(kind, train=False)
    folded = fuser(*mods)
    assert type(folded) is folded_type
    x = _input(kind)
    ref = x
    for m in mods:
        ref = m(ref)
    torch.testing.assert_close(folded(x), ref, atol=1e-5, rtol=1e-5)
    # main's form: is_qat decides (True gives the container even in eval mode)
    assert type(fuser(True, *_chain(kind, train=False))) is container
    assert type(fuser(False, *_chain(kind, train=False))) is folded_type
    with pytest.raises(ValueError, match="eval"):
        fuser(False, *_chain(kind, train=True))
    with pytest.raises(TypeError, match="is_qat"):
        fuser(*_chain(kind, train=True)[:1])


def test_fusers_check_modes_and_shapes():
    import mqbench.fuser_method_mappings as fmm
    conv, bn, relu = _chain("conv_freezebn_relu", train=True)
    assert not bn.training  # FrozenBatchNorm2d: the conv's mode is the one that counts
    with pytest.raises(ValueError, match="same mode"):
        fmm.fuse_conv_freezebn_relu(conv, bn, relu.eval())
    bn = nn.BatchNorm2d(4).eval()  # a plain BatchNorm in eval mode is not a frozen one
    bn.training = True
    with pytest.raises(ValueError, match="frozen BatchNorm must be in eval"):
        fmm.fuse_conv_freezebn(conv, bn)
    deconv, bn = _chain("deconv_bn", train=True)
    with pytest.raises(ValueError, match="same mode"):
        fmm.fuse_deconv_bn(deconv, bn.eval())
    with pytest.raises(ValueError, match="4 output channels"):
        fmm.fuse_deconv_bn(deconv, nn.BatchNorm2d(3))


def test_fuse_custom_config_dict_changes_no_torch_global():
    """MQBench 1.10 updated torch's default fuser / fusion-pattern / QAT tables at import; this
    module must not: every dict of torch's quantization modules is the same before and after."""
    code = r"""
import sys, torch, torch.ao.quantization, torch.ao.quantization.quantize_fx
def snapshot():
    out = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith(("torch.ao.quantization", "torch.quantization")) or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            if isinstance(value, dict):
                out[(name, attr)] = (id(value), dict(value))
    return out
before = snapshot()
assert any("QAT_MODULE_MAPPINGS" in a for _, a in before), sorted(a for _, a in before)
import mqbench.fuser_method_mappings as fmm
after = snapshot()
changed = [k for k in before if k in after and after[k][1] != before[k][1]]
assert not changed, changed
ours = set(fmm.fuse_custom_config_dict["additional_qat_module_mapping"].values())
for k, (_, d) in after.items():
    assert not ours & set(v for v in d.values() if isinstance(v, type)), k
print("ok", len(before))
"""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(PACKAGE))
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr


class _FuseNet(nn.Module):
    def __init__(self, functional_relu=False):
        super().__init__()
        self.up = nn.ConvTranspose2d(3, 4, 2, stride=2)
        self.bn = nn.BatchNorm2d(4)
        self.relu = F.relu if functional_relu else nn.ReLU()
        self.up2 = nn.ConvTranspose2d(4, 4, 2, stride=2, groups=2)
        self.fbn = FrozenBatchNorm2d(4)
        self.relu2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 6)
        self.bn1d = nn.BatchNorm1d(6)

    def forward(self, x):
        x = self.relu(self.bn(self.up(x)))
        x = self.relu2(self.fbn(self.up2(x)))
        return self.bn1d(self.fc(torch.flatten(self.pool(x), 1)))


def test_fuse_custom_config_dict_works_as_extra_fuse_dict():
    from mqbench.fuser_method_mappings import fuse_custom_config_dict
    assert set(fuse_custom_config_dict) >= {"additional_fuser_method_mapping",
                                            "additional_fusion_pattern",
                                            "additional_qat_module_mappings"}
    torch.manual_seed(0)
    model = _FuseNet().eval()  # eval: the FrozenBatchNorm2d chain has one mode throughout
    _randomize_bn(model.bn)
    _randomize_bn(model.fbn, 1)
    _randomize_bn(model.bn1d, 2)
    config = {"extra_fuse_dict": fuse_custom_config_dict}
    q = prepare_by_platform(copy.deepcopy(model), BackendType.Tensorrt, config)
    assert type(q.up) is qnniqat.ConvTransposeBnReLU2d
    assert type(q.up2) is qnniqat.ConvTransposeFreezebnReLU2d
    assert type(q.fc) is qnniqat.LinearBn1d
    assert not hasattr(q, "bn") and not hasattr(q, "fbn") and not hasattr(q, "relu2")
    # the same structure as without the dict for the chains our rules fuse themselves
    plain = prepare_by_platform(copy.deepcopy(model), BackendType.Tensorrt)
    assert type(plain.up) is type(q.up) and type(plain.fc) is type(q.fc)
    # with quantization off, the prepared model computes the float one
    from mqbench.utils.state import disable_all
    disable_all(q)
    x = torch.randn(2, 3, 4, 4)
    torch.testing.assert_close(q(x), model(x), atol=1e-5, rtol=1e-5)


def test_fuse_custom_config_dict_fuses_a_functional_relu_into_the_longest_chain():
    """The dict's patterns are tried before the built-in rules: deconv + bn + F.relu must not
    stop at deconv + bn."""
    from mqbench.fuser_method_mappings import fuse_custom_config_dict
    model = _FuseNet(functional_relu=True).train()
    model.up2, model.fbn = nn.ConvTranspose2d(4, 4, 1), nn.Identity()  # no frozen BN in train
    q = prepare_by_platform(model, BackendType.Tensorrt,
                            {"extra_fuse_dict": fuse_custom_config_dict})
    assert type(q.up) is qnniqat.ConvTransposeBnReLU2d
    assert not any(n.target is F.relu for n in q.graph.nodes)


def test_conv_bn_functional_relu_fuses_in_eval_mode():
    model = _FuseNet(functional_relu=True).eval()
    q = prepare_by_platform(model, BackendType.Tensorrt)
    assert type(q.up) is qnniqat.ConvTransposeBnReLU2d


# -- transposed conv + FrozenBatchNorm2d ------------------------------------------------------
def _qconfig():
    return QConfig(activation=FixedFakeQuantize.with_args(observer=MinMaxObserver),
                   weight=FixedFakeQuantize.with_args(observer=MinMaxObserver,
                                                      qscheme=torch.per_tensor_symmetric,
                                                      dtype=torch.qint8, quant_min=-128,
                                                      quant_max=127))


@pytest.mark.parametrize("relu", [False, True])
def test_conv_transpose_freezebn_qat_module(relu):
    torch.manual_seed(0)
    deconv = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, groups=2)
    fbn = _randomize_bn(FrozenBatchNorm2d(6))
    float_cls = qnni.ConvTransposeFreezebnReLU2d if relu else qnni.ConvTransposeFreezebn2d
    qat_cls = qnniqat.ConvTransposeFreezebnReLU2d if relu else qnniqat.ConvTransposeFreezebn2d
    with pytest.raises(TypeError):
        float_cls(nn.Conv2d(4, 6, 3), fbn, *([nn.ReLU()] if relu else []))
    fused = float_cls(deconv, fbn, *([nn.ReLU()] if relu else [])).train()
    fused.qconfig = _qconfig()
    qat = qat_cls.from_float(fused)
    assert qat.weight is deconv.weight and qat.bn.running_var is fbn.running_var
    qat.train()
    assert qat.freeze_bn and not qat.bn.training
    qat.update_bn_stats()  # frozen for good
    assert qat.freeze_bn and not qat.bn.training
    qat.weight_fake_quant.disable_fake_quant()
    x = torch.randn(2, 4, 5, 5)
    ref = fbn(deconv(x))
    ref = F.relu(ref) if relu else ref
    running = fbn.running_mean.clone()
    torch.testing.assert_close(qat(x), ref, atol=1e-5, rtol=1e-5)  # training mode, BN frozen
    assert torch.equal(fbn.running_mean, running)
    direct = qat_cls(4, 6, 3, stride=2, padding=1, groups=2, qconfig=_qconfig())
    assert direct.freeze_bn and not direct.bn.training  # frozen when built directly too
    assert set(direct.state_dict()) == set(qnniqat.ConvTransposeBn2d(
        4, 6, 3, stride=2, padding=1, groups=2, qconfig=_qconfig()).state_dict())


class _FrozenDeconvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(3, 4, 2, stride=2)
        self.fbn = FrozenBatchNorm2d(4)
        self.relu = nn.ReLU()
        self.up2 = nn.ConvTranspose2d(4, 4, 2, stride=2)
        self.fbn2 = FrozenBatchNorm2d(4)

    def forward(self, x):
        return self.fbn2(self.up2(self.relu(self.fbn(self.up(x)))))


def test_deconv_freezebn_chains_fuse_to_our_classes():
    """The C++ rules' kinds ConvTransposeFreezebnReLU2d / ConvTransposeFreezebn2d name the
    mqbench.nn.intrinsic containers."""
    from mqbench.custom_quantizer import ModelQuantizer
    from mqbench.custom_quantizer.tracer import CustomedTracer
    model = _FrozenDeconvNet().eval()
    gm = torch.fx.GraphModule(model, CustomedTracer().trace(model))
    fused = ModelQuantizer({}, {})._fuse_fx(gm, True)
    assert type(fused.up) is qnni.ConvTransposeFreezebnReLU2d
    assert type(fused.up2) is qnni.ConvTransposeFreezebn2d
    assert fused.up[1] is model.fbn


def test_deconv_freezebn_chains_become_qat_modules_by_default():
    q = prepare_by_platform(_FrozenDeconvNet().eval(), BackendType.Tensorrt)
    assert type(q.up) is qnniqat.ConvTransposeFreezebnReLU2d
    assert type(q.up2) is qnniqat.ConvTransposeFreezebn2d


def test_freezebn_chains_fuse_in_training_mode():
    q = prepare_by_platform(_FrozenDeconvNet().train(), BackendType.Tensorrt)
    assert isinstance(q.up, (qnni.ConvTransposeFreezebnReLU2d,
                             qnniqat.ConvTransposeFreezebnReLU2d))


# -- mqbench.fusion_method ------------------------------------------------------------------
def test_fusion_method_public_names_are_registered_for_their_types():
    import mqbench.fusion_method as fm
    from mqbench.utils.registry import FUSED_MODULE_CONVERT_FUNCTION as table
    expected = {
        fm.convert_qnni_linearbn: [qnni.LinearBn1d],
        fm.convert_qnniqat_linearbn: [qnniqat.LinearBn1d],
        fm.convert_nniqat_convbn: [qnniqat.ConvFreezebn2d, qnniqat.ConvBn1d, qnniqat.ConvBn2d,
                                   qnniqat.ConvBn3d],
        fm.convert_nniqat_convbnrelu: [qnniqat.ConvFreezebnReLU2d, qnniqat.ConvBnReLU1d,
                                       qnniqat.ConvBnReLU2d, qnniqat.ConvBnReLU3d],
        fm.convert_qnni_deconvbn: [qnni.ConvTransposeFreezebn2d, qnni.ConvTransposeBn2d],
        fm.convert_qnniqat_deconvbn: [qnniqat.ConvTransposeFreezebn2d, qnniqat.ConvTransposeBn2d],
        fm.convert_qnni_deconvbnrelu: [qnni.ConvTransposeFreezebnReLU2d,
                                       qnni.ConvTransposeBnReLU2d],
        fm.convert_qnniqat_deconvbnrelu: [qnniqat.ConvTransposeFreezebnReLU2d,
                                          qnniqat.ConvTransposeBnReLU2d],
    }
    for fn, types in expected.items():
        assert list(inspect.signature(fn).parameters) == ["model", "fused_node"]
        for t in types:
            assert table[t] is fn, (fn.__name__, t.__name__)
    # MQBench's Vitis-only ones exist but are not the default handler (Note [Bias fake
    # quantizers]: our ConvBn2d is also torch's)
    assert callable(fm.convert_qnniqat_convbn) and callable(fm.convert_qnniqat_convbnrelu)
    assert fm.convert_qnniqat_convbn not in table.values()


def test_merge_of_deconv_freezebn_keeps_the_output():
    from mqbench.fuser_method_mappings import fuse_custom_config_dict
    from mqbench.fusion_method import convert_merge_bn
    from mqbench.utils.state import enable_calibration, enable_quantization
    torch.manual_seed(0)
    model = _FrozenDeconvNet().eval()
    _randomize_bn(model.fbn)
    _randomize_bn(model.fbn2, 1)
    q = prepare_by_platform(model, BackendType.Tensorrt, {"extra_fuse_dict":
                                                          fuse_custom_config_dict})
    x = torch.randn(2, 3, 4, 4)
    enable_calibration(q)
    q(x)
    enable_quantization(q)
    before = q(x)
    convert_merge_bn(q)
    assert type(q.up) is qnnqat.ConvTranspose2d and type(q.up2) is qnnqat.ConvTranspose2d
    torch.testing.assert_close(q(x), before, atol=1e-5, rtol=1e-5)


def _bias_qconfig():
    """A qconfig with MQBench's ``bias`` field (our QConfig and torch's have none)."""
    from mqbench.quantization.default_bias_fake_quant import bias_fake_quantizer
    BiasQConfig = collections.namedtuple("QConfig", ["activation", "weight", "bias"])
    q = _qconfig()
    return BiasQConfig(q.activation, q.weight, bias_fake_quantizer)


def test_convert_qnniqat_convbn_adds_a_param_bias_quantizer_and_nniqat_does_not():
    import mqbench.fusion_method as fm
    for fn, has_bias_fq in ((fm.convert_nniqat_convbn, False), (fm.convert_qnniqat_convbn, True),
                            (fm.convert_qnniqat_convbnrelu, True)):
        torch.manual_seed(0)
        relu = fn is fm.convert_qnniqat_convbnrelu
        fused = (qnni.ConvBnReLU2d if relu else qnni.ConvBn2d)(
            nn.Conv2d(3, 4, 3), _randomize_bn(nn.BatchNorm2d(4)), *([nn.ReLU()] if relu else []))
        fused.qconfig = _qconfig()
        root = nn.Module()
        root.conv = (qnniqat.ConvBnReLU2d if relu else qnniqat.ConvBn2d).from_float(fused).eval()
        graph = torch.fx.Graph()
        graph.output(graph.call_module("conv", (graph.placeholder("x"),)))
        gm = torch.fx.GraphModule(root, graph)
        fn(gm, next(n for n in gm.graph.nodes if n.op == "call_module"))
        gm.recompile()
        assert type(gm.conv) is qnnqat.Conv2d
        assert hasattr(gm.conv, "bias_fake_quant") == has_bias_fq
        if has_bias_fq:
            fq = gm.conv.bias_fake_quant
            assert isinstance(fq, TqtFakeQuantize) and fq.quant_type == "param" and fq.mth == 3
        # MQBench's merge: a ReLU module named relu on the parent, called after the conv
        assert any(n.op == "call_module" and n.target == "relu" for n in gm.graph.nodes) == relu
        assert isinstance(getattr(gm, "relu", None), nn.ReLU) == relu


# -- bias fake quantizers -----------------------------------------------------------------------
def test_default_bias_fake_quant_is_mqbench_tqt_factory():
    from mqbench.quantization import default_bias_fake_quant as d
    assert d.bias_fake_quantizer is d.b_qconfig and d.b_fakequantize is TqtFakeQuantize
    assert d.bias_fakeq_param == {}
    s = d.bias_qscheme
    assert (s.symmetry, s.per_channel, s.pot_scale, s.bit) == (True, False, True, 8)
    a, b = d.bias_fake_quantizer(), d.bias_fake_quantizer()
    assert a is not b and type(a) is TqtFakeQuantize
    assert type(a.activation_post_process) is MinMaxFloorObserver
    assert (a.quant_min, a.quant_max, a.qscheme, a.ch_axis) == (
        -128, 127, torch.per_tensor_symmetric, -1)
    assert a.activation_post_process.pot_scale
    # TQT needs its quant type before quantizing, as MQBench's
    with pytest.raises(ValueError, match="set the observer type|Invalid method None"):
        a(torch.randn(4))
    a.set_quant_type("param")
    x = torch.tensor([0.3, -1.7, 0.05, 2.2])
    y = a(x)
    scale = a.scale.item()
    assert scale == 2.0 ** round(torch.log2(torch.tensor(scale)).item())  # a power of two
    assert torch.equal(y / scale, torch.round(y / scale)) and not torch.equal(y, x)


def _is_on_grid(fq, t):
    scale = fq.scale.item()
    return torch.equal(t / scale, torch.round(t / scale))


@pytest.mark.parametrize("name", ["Conv2d", "Linear", "ConvReLU2d"])
def test_qat_modules_quantize_their_bias_when_asked(name):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 6) if name != "Linear" else torch.randn(5, 3)
    build = {"Conv2d": lambda q: qnnqat.Conv2d(3, 4, 3, qconfig=q),
             "Linear": lambda q: qnnqat.Linear(3, 4, qconfig=q),
             "ConvReLU2d": lambda q: qnniqat.ConvReLU2d(3, 4, 3, qconfig=q)}[name]
    plain = build(_qconfig())
    assert not hasattr(plain, "bias_fake_quant")
    assert not any("bias_fake_quant" in k for k in plain.state_dict())
    biased = build(_bias_qconfig())
    biased.load_state_dict(plain.state_dict(), strict=False)
    fq = biased.bias_fake_quant
    assert type(fq) is TqtFakeQuantize
    assert {k for k in biased.state_dict() if k.startswith("bias_fake_quant.")} >= {
        "bias_fake_quant.scale", "bias_fake_quant.zero_point"}
    fq.set_quant_type("param")
    out = biased(x)
    qb = fq(biased.bias.detach())
    assert _is_on_grid(fq, qb) and not torch.equal(qb, biased.bias.detach())
    w = biased.weight_fake_quant(biased.weight)
    ref = F.linear(x, w, qb) if name == "Linear" else F.conv2d(x, w, qb)
    torch.testing.assert_close(out, F.relu(ref) if name == "ConvReLU2d" else ref)
    # a bias quantizer set on a module (as MQBench's BN merge does) is used too
    plain.bias_fake_quant = copy.deepcopy(fq)
    torch.testing.assert_close(plain(x), biased(x))


def test_conv_bn_with_bias_quantizer_folds_as_mqbench():
    """MQBench's Vitis ConvBn2d: conv(x, fq(w * gamma / std), bfq(full_bias)), then back
    through the BatchNorm, which in eval mode gives that conv exactly."""
    torch.manual_seed(0)
    fused = qnni.ConvBn2d(nn.Conv2d(3, 4, 3), _randomize_bn(nn.BatchNorm2d(4)))
    fused.qconfig = _bias_qconfig()
    qat = qnniqat.ConvBn2d.from_float(fused).eval()
    qat.bias_fake_quant.set_quant_type("param")
    x = torch.randn(2, 3, 6, 6)
    out = qat(x)
    bn = qat.bn
    std = torch.sqrt(bn.running_var + bn.eps)
    w = qat.weight_fake_quant(qat.weight * (bn.weight / std).reshape(-1, 1, 1, 1))
    full_bias = (qat.bias - bn.running_mean) / std * bn.weight + bn.bias
    qb = qat.bias_fake_quant(full_bias)
    assert _is_on_grid(qat.bias_fake_quant, qb)
    torch.testing.assert_close(out, F.conv2d(x, w, qb), atol=1e-5, rtol=1e-5)
    # and the BN merge keeps that bias quantizer
    root = nn.Module()
    root.conv = qat
    graph = torch.fx.Graph()
    graph.output(graph.call_module("conv", (graph.placeholder("x"),)))
    gm = torch.fx.GraphModule(root, graph)
    from mqbench.fusion_method import convert_merge_bn
    fq = qat.bias_fake_quant
    convert_merge_bn(gm)
    assert type(gm.conv) is qnnqat.Conv2d and gm.conv.bias_fake_quant is fq
    torch.testing.assert_close(gm(x), out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["Tensorrt", "Vitis"])
def test_only_vitis_fused_convs_have_bias_quantizers(backend):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3),
                          nn.ReLU(), nn.Flatten(), nn.Linear(16, 2))
    q = prepare_by_platform(model, getattr(BackendType, backend))
    biased = sorted(n for n, m in q.named_modules() if hasattr(m, "bias_fake_quant"))
    # Vitis: conv + BN + ReLU and conv + ReLU (MQBench 1.10's Vitis modules), not the linear
    assert biased == (["0", "3"] if backend == "Vitis" else [])
    assert any("bias_fake_quant" in k for k in q.state_dict()) == (backend == "Vitis")


# -- get_flattened_qconfig_dict ------------------------------------------------------------
def test_get_flattened_qconfig_dict():
    from mqbench.utils import get_flattened_qconfig_dict
    a, b, c = object(), object(), object()
    d = {"": a, "object_type": {torch.add: b}, "module_name": {"conv": c},
         "module_name_regex": {"x.*": c}}
    assert get_flattened_qconfig_dict(d) == {"": a, torch.add: b, "conv": c}
    assert get_flattened_qconfig_dict({"object_type": [(torch.add, b)]}) == {torch.add: b}
    assert get_flattened_qconfig_dict({}) == {}


# -- mqbench.utils graph helpers ------------------------------------------------------------
class _Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        return torch.relu(self.conv(x)) + 1


def test_deepcopy_graphmodule_gives_an_independent_graph():
    from mqbench.utils import deepcopy_graphmodule
    gm = torch.fx.symbolic_trace(_Small())
    x = torch.randn(1, 3, 4, 4)
    ref = gm(x)
    names = [n.name for n in gm.graph.nodes]
    copied = deepcopy_graphmodule(gm)
    assert copied.graph is not gm.graph and copied.conv is not gm.conv
    assert [n.name for n in copied.graph.nodes] == names
    relu = next(n for n in copied.graph.nodes if n.target is torch.relu)
    relu.replace_all_uses_with(relu.args[0])
    copied.graph.erase_node(relu)
    copied.recompile()
    with torch.no_grad():
        copied.conv.weight.zero_()
    assert [n.name for n in gm.graph.nodes] == names
    torch.testing.assert_close(gm(x), ref)
    assert len(list(copied.graph.nodes)) == len(names) - 1


def test_deepcopy_mixedmodule_copies_the_graphs_of_the_listed_children():
    from mqbench.utils import deepcopy_mixedmodule
    mm = nn.Module()
    mm.backbone = torch.fx.symbolic_trace(_Small())
    mm.head = nn.Linear(2, 2)
    copied = deepcopy_mixedmodule(mm, ["backbone"])
    assert copied.backbone.graph is not mm.backbone.graph
    assert copied.head is not mm.head
    n = len(list(mm.backbone.graph.nodes))
    out = next(n for n in copied.backbone.graph.nodes if n.op == "output")
    copied.backbone.graph.erase_node(out)
    assert len(list(mm.backbone.graph.nodes)) == n


def test_topology_order():
    from mqbench.utils import topology_order
    gm = torch.fx.symbolic_trace(_Small())
    order = topology_order(gm)
    nodes = list(gm.graph.nodes)
    assert order == {node: i for i, node in enumerate(nodes)}
    assert order[nodes[0]] == 0 and nodes[0].op == "placeholder"


class _DictModel(nn.Module):
    """Builds dicts with update: flat, nested, merged from another dict (MQBench main)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.conv2 = nn.Conv2d(3, 3, 1)

    def forward(self, x, feats, other):
        feats.update({"a": self.conv(x), "nested": {"b": self.conv2(x)}})
        a = feats["a"]
        nested = feats["nested"]
        b = nested["b"]
        other.update(feats)
        c = other["a"]
        missing = feats["zzz"]
        return a + b + c + missing


def test_getitem2node_resolves_updates_and_nested_dicts():
    from mqbench.custom_quantizer import graph_ir
    from mqbench.utils import getitem2node
    gm = torch.fx.symbolic_trace(_DictModel())
    nodes = {n.name: n for n in gm.graph.nodes}
    getitems = [n for n in gm.graph.nodes if n.target is operator.getitem]
    a, nested, b, c, missing = getitems
    mapping = getitem2node(gm)
    assert mapping == {a: nodes["conv"], b: nodes["conv2"], c: nodes["conv"]}
    assert nested not in mapping and missing not in mapping
    assert getitem2node(gm.graph) == mapping
    # the quantizer's one-level version agrees where it has an answer
    for k, v in graph_ir.getitem2node(gm.graph).items():
        assert mapping[k] is v


def test_getitem2node_refuses_an_update_it_cannot_read():
    from mqbench.utils import getitem2node

    class M(nn.Module):
        def forward(self, x, feats):
            feats.update([("k", x)])
            return feats["k"]

    with pytest.raises(ValueError, match="Wrong type for update"):
        getitem2node(torch.fx.symbolic_trace(M()))


def test_fix_succ_recursivly():
    from mqbench.utils import _fix_succ_recursivly
    old, new = object(), object()
    out = _fix_succ_recursivly([old, 1, (old, [old, 2]), {"k": old, "n": 3, "l": [old]}], old,
                               new)
    assert isinstance(out, tuple)
    assert out[0] is new and out[1] == 1
    assert isinstance(out[2], tuple) and out[2][0] is new
    assert isinstance(out[2][1], list) and out[2][1][0] is new and out[2][1][1] == 2
    assert out[3]["k"] is new and out[3]["n"] == 3 and out[3]["l"][0] is new
    assert _fix_succ_recursivly({"k": old}, old, new) == {"k": new}
    with pytest.raises(NotImplementedError):
        _fix_succ_recursivly(old, old, new)


def test_pot_quantization_modes_and_tracing_helpers():
    from mqbench.utils import is_tracing_state, no_jit_trace, pot_quantization, sync_tensor
    t = torch.tensor([0.3, 1.0, 5.0], requires_grad=True)
    assert torch.equal(pot_quantization(t, "ceil").detach(), torch.tensor([0.5, 1.0, 8.0]))
    assert torch.equal(pot_quantization(t, "floor").detach(), torch.tensor([0.25, 1.0, 4.0]))
    assert torch.equal(pot_quantization(t).detach(), torch.tensor([0.25, 1.0, 4.0]))
    pot_quantization(t, "ceil").sum().backward()
    assert torch.all(t.grad > 0)  # straight-through rounding
    with pytest.raises(ValueError, match="ceil"):
        pot_quantization(t, "nearest")
    x = torch.ones(2)
    assert sync_tensor(x) is x and torch.equal(x, torch.ones(2))  # no DDP: unchanged
    seen = []

    def f(y):
        seen.append(bool(is_tracing_state()))
        with no_jit_trace():
            seen.append(bool(is_tracing_state()))
        return y * 2

    torch.jit.trace(f, torch.ones(2), check_trace=False)
    assert seen == [True, False] and not is_tracing_state()


# -- TqtFakeQuantize.set_forward_method ---------------------------------------------------------
def test_tqt_set_forward_method():
    fq = TqtFakeQuantize(MinMaxFloorObserver, quant_min=-128, quant_max=127, dtype=torch.qint8,
                         qscheme=torch.per_tensor_symmetric)
    assert fq.mth is None
    for qtype, mth in (("param", 3), ("tensor", 2), ("input", 2)):
        fq.quant_type = qtype
        fq.set_forward_method()
        assert fq.mth == mth
    fq.quant_type = None
    fq.set_forward_method()  # MQBench does not check the type here either
    assert fq.mth == 2
    fq.set_quant_type("param")
    assert (fq.quant_type, fq.mth) == ("param", 3)
    with pytest.raises(ValueError, match="weight"):
        fq.set_quant_type("weight")
    # the method set is the one forward uses: on a negative tie mth 3 rounds to even, mth 2 up
    fq.disable_observer()
    fq.scale.fill_(1.0)
    x = torch.tensor([-1.5, 1.5])
    assert torch.equal(fq(x), torch.tensor([-2.0, 2.0]))
    fq.quant_type = "tensor"
    fq.set_forward_method()
    assert torch.equal(fq(x), torch.tensor([-1.0, 2.0]))


# -- mqbench.tools.replace_syncbn (MQBench main) -----------------------------------------------

def test_replace_bn_to_syncbn_reaches_every_level_and_shares_the_statistics():
    """Plain, nested and fused (QAT ConvBn's ``bn``) BatchNorm2d all become SyncBatchNorm (or the
    given class, at every level: MQBench's recursion dropped it); parameters and running
    statistics are the same tensors; outside a process group the model computes as before."""
    from mqbench.tools.replace_syncbn import replace_bn_to_syncbn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
            self.block = nn.Sequential(nn.Sequential(nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4)))
            self.bn1d = nn.BatchNorm1d(4)  # not a BatchNorm2d: kept, as MQBench

        def forward(self, x):
            return self.bn1d(self.block(self.stem(x)).mean((2, 3)))

    torch.manual_seed(0)
    net = Net()
    prepared = prepare_by_platform(net, BackendType.Tensorrt)
    x = torch.randn(2, 3, 12, 12)
    prepared.eval()
    with torch.no_grad():
        before = prepared(x)
    bns = {n: m for n, m in prepared.named_modules() if type(m) is nn.BatchNorm2d}
    assert bns  # the fused QAT modules' bn among them
    assert any(n.endswith(".bn") for n in bns)
    out = replace_bn_to_syncbn(prepared)
    assert out is prepared
    mods = dict(prepared.named_modules())
    assert not any(type(m) is nn.BatchNorm2d for m in mods.values())
    for n, bn in bns.items():
        new = mods[n]
        assert type(new) is nn.SyncBatchNorm, n
        assert new.weight is bn.weight and new.running_var is bn.running_var, n
    assert type(mods["bn1d"]) is nn.BatchNorm1d
    with torch.no_grad():
        assert torch.equal(prepared(x), before)

    class MyBN(nn.BatchNorm2d):
        pass

    deep = nn.Sequential(nn.Sequential(nn.Sequential(nn.BatchNorm2d(3))))
    replace_bn_to_syncbn(deep, custombn=MyBN)
    assert type(deep[0][0][0]) is MyBN
    assert type(replace_bn_to_syncbn(nn.BatchNorm2d(3))) is nn.SyncBatchNorm
