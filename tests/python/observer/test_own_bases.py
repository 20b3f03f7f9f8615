"""The package stands on its own bases, not torch.ao.quantization / torch.nn.intrinsic /
torch.nn.qat (docs/design/capture-and-quantizer.md): nothing of ours imports them, importing
mqbench raises no DeprecationWarning, checkpoints of the earlier layout load, our modules compute
what torch's did, and torch's classes are still accepted where a user passes them.

torch's deprecated classes appear here only as references."""
import ast
import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torchvision

import mqbench.nn.intrinsic as qnni
import mqbench.nn.intrinsic.qat as qnniqat
import mqbench.nn.qat as qnnqat
from mqbench._base import QConfig, is_fake_quantizer
from mqbench.fake_quantize import FixedFakeQuantize, QuantizeBase
from mqbench.observer import MinMaxObserver, MovingAverageMinMaxObserver
from mqbench.prepare_by_platform import BackendType, get_qconfig_by_platform, prepare_by_platform
from mqbench.utils.state import enable_calibration, enable_quantization

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "..", "..", "python", "mqbench")
CHECKPOINTS = os.path.join(HERE, "..", "data", "checkpoints")
sys.path.insert(0, CHECKPOINTS)
import make_checkpoints  # noqa: E402

DEPRECATED = ("torch.ao.quantization", "torch.quantization", "torch.nn.intrinsic", "torch.nn.qat",
              "torch.ao.nn.intrinsic", "torch.ao.nn.qat", "torch.nn.quantized",
              "torch.ao.nn.quantized")


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _deprecated(name):
    return any(name == d or name.startswith(d + ".") for d in DEPRECATED)


def test_no_module_of_ours_imports_or_uses_deprecated_torch_packages():
    offenders = []
    for root, _, files in os.walk(PACKAGE):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(root, f)
            tree = ast.parse(open(path).read(), path)
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Attribute):
                    names = [_dotted(node) or ""]
                offenders += [f"{os.path.relpath(path, PACKAGE)}:{node.lineno}: {n}"
                              for n in names if _deprecated(n)]
    assert not offenders, "\n".join(sorted(set(offenders)))


def test_import_raises_no_deprecation_warning():
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "..", "python"))
    r = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", "import mqbench"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("backend", make_checkpoints.BACKENDS)
def test_checkpoints_of_the_torch_based_layout_load(backend):
    """State dicts written by the build whose modules derived from torch.ao's classes (fixtures
    from make_checkpoints.py) load strictly and give the same output."""
    saved = torch.load(os.path.join(CHECKPOINTS, f"{backend}.pt"), weights_only=True)
    model = make_checkpoints.build(backend)
    _, probe = make_checkpoints.inputs()
    model(probe)  # per-channel buffers take their shapes (as when resuming MQBench training)
    if backend == "Vitis":  # the fused convs now quantize their bias (MQBench 1.10's Vitis)
        with pytest.warns(UserWarning, match="no bias_fake_quant state"):
            model.load_state_dict(saved["state_dict"], strict=True)
        added = set(model.state_dict()) - set(saved["state_dict"])
        assert added and all(".bias_fake_quant." in k for k in added)
        assert not any(m.bias_fake_quant.fake_quant_enabled.item() for m in model.modules()
                       if hasattr(m, "bias_fake_quant"))
    else:
        model.load_state_dict(saved["state_dict"], strict=True)
    assert set(saved["state_dict"]) <= set(model.state_dict())
    assert backend == "Vitis" or model.state_dict().keys() == saved["state_dict"].keys()
    model.eval()
    with torch.no_grad():
        out = model(probe)
    torch.testing.assert_close(out, saved["output"], rtol=1e-6, atol=1e-6)


def test_torch_helpers_still_reach_our_quantizers():
    """torch's own ``model.apply(disable_observer)``-style helpers see our quantizers as
    theirs (virtual subclasses), as they did when ours derived from torch's classes."""
    taq = pytest.importorskip("torch.ao.quantization")
    q = prepare_by_platform(make_checkpoints.Net().train(), BackendType.Tensorrt)
    q.apply(taq.disable_observer)
    q.apply(taq.disable_fake_quant)
    quantizers = [m for m in q.modules() if is_fake_quantizer(m)]
    assert quantizers
    assert all(int(m.observer_enabled[0]) == 0 and int(m.fake_quant_enabled[0]) == 0
               for m in quantizers)
    assert isinstance(quantizers[0], taq.FakeQuantizeBase)
    assert isinstance(quantizers[0].activation_post_process, taq.ObserverBase)


def test_torch_fake_quantizers_are_recognised():
    taq = pytest.importorskip("torch.ao.quantization")
    model = nn.Sequential(nn.Conv2d(3, 4, 1))
    model.fq = taq.FakeQuantize()
    assert is_fake_quantizer(model.fq)
    enable_calibration(model)
    assert int(model.fq.observer_enabled[0]) == 1 and int(model.fq.fake_quant_enabled[0]) == 0
    with pytest.raises(ValueError, match="already has fake quantizers"):
        prepare_by_platform(model, BackendType.Tensorrt)


def test_float_functionals_are_swapped_as_torch_swapped_them():
    """torchvision's quantizable resnet18 adds through FloatFunctionals (skip_add_relu): ours
    are swapped for FXFloatFunctional and get the quantizers torch's _swap_ff_with_fxff (the
    reference, applied first on a copy) gives."""
    qfx = pytest.importorskip("torch.ao.quantization.quantize_fx")
    quantizable = torchvision.models.quantization.resnet18(quantize=False).train()
    reference = copy.deepcopy(quantizable)
    qfx._swap_ff_with_fxff(reference)
    qa = prepare_by_platform(quantizable, BackendType.Tensorrt)
    qb = prepare_by_platform(reference, BackendType.Tensorrt)
    assert not any(type(m).__name__ == "FloatFunctional" for m in qa.modules())
    names = [sorted(n for n, _ in q.named_modules() if n.endswith("_post_act_fake_quantizer"))
             for q in (qa, qb)]
    assert names[0] == names[1] and len(names[0]) == 20
    assert [n.target for n in qa.graph.nodes] == [n.target for n in qb.graph.nodes]


def test_qconfig_and_factories():
    qconfig = get_qconfig_by_platform(BackendType.Tensorrt, {})
    assert isinstance(qconfig, QConfig) and qconfig._fields == ("activation", "weight")
    assert qconfig.weight.p.keywords["ch_axis"] == 0
    chained = qconfig.weight.with_args(quant_min=-7, quant_max=7)
    fq = chained()
    assert (fq.quant_min, fq.quant_max, fq.ch_axis) == (-7, 7, 0)
    assert fq is not chained()
    with pytest.raises(ValueError, match="factories"):
        QConfig(activation=FixedFakeQuantize(MinMaxObserver), weight=qconfig.weight)
    counter = iter(range(100))
    factory = MinMaxObserver.with_callable_args(quant_max=lambda: 100 + next(counter))
    assert factory.with_args(quant_min=0)().quant_max == 100
    assert factory(quant_min=0).quant_max == 101


def test_observer_base_checks_and_defaults():
    assert (MinMaxObserver().quant_min, MinMaxObserver().quant_max) == (0, 255)
    assert MinMaxObserver(dtype=torch.qint8, reduce_range=True).quant_max == 63
    wide = MinMaxObserver(quant_min=-32768, quant_max=32767)
    assert (wide.quant_min, wide.quant_max, wide.has_customized_qrange) == (-32768, 32767, True)
    assert list(wide.state_dict()) == ["eps", "min_val", "max_val"]
    with pytest.raises(ValueError, match="include 0"):
        MinMaxObserver(quant_min=1, quant_max=10)
    with pytest.raises(ValueError, match="qscheme"):
        MinMaxObserver(qscheme=torch.float32)


def test_moving_average_observer_matches_torch():
    taq = pytest.importorskip("torch.ao.quantization")
    ours, ref = MovingAverageMinMaxObserver(), taq.MovingAverageMinMaxObserver()
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        x = torch.randn(64, generator=g) * 3
        ours(x)
        ref(x)
    assert torch.equal(ours.min_val, ref.min_val) and torch.equal(ours.max_val, ref.max_val)
    (s0, z0), (s1, z1) = ours.calculate_qparams(), ref.calculate_qparams()
    assert torch.equal(s0.reshape(-1), s1.reshape(-1)) and torch.equal(z0.reshape(-1).long(),
                                                                       z1.reshape(-1).long())
    # torch's default observer of a fake quantizer, ours
    assert isinstance(QuantizeBase().activation_post_process, MovingAverageMinMaxObserver)


def _train_steps(ours, ref, x):
    for _ in range(2):
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), ref(xb)
        torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
        ya.square().sum().backward()
        yb.square().sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ours.weight.grad, ref.weight.grad, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("name", ["Conv2d", "Conv3d", "Linear", "ConvReLU2d", "LinearReLU",
                                  "LinearBn1d"])
def test_qat_modules_match_torch(name):
    """Our QAT modules against torch's (nn.qat / nn.intrinsic.qat), both built from torch's
    float module with the same qconfig: same state-dict keys, outputs, gradients, to_float."""
    taq = pytest.importorskip("torch.ao.nn.intrinsic.qat")
    import torch.ao.nn.intrinsic as tnni
    import torch.ao.nn.qat as tnnqat
    torch.manual_seed(0)
    qconfig = get_qconfig_by_platform(BackendType.Tensorrt, {})
    floats = {"Conv2d": lambda: nn.Conv2d(3, 4, 3), "Conv3d": lambda: nn.Conv3d(3, 4, 3),
              "Linear": lambda: nn.Linear(6, 4),
              "ConvReLU2d": lambda: tnni.ConvReLU2d(nn.Conv2d(3, 4, 3), nn.ReLU()),
              "LinearReLU": lambda: tnni.LinearReLU(nn.Linear(6, 4), nn.ReLU()),
              "LinearBn1d": lambda: tnni.LinearBn1d(nn.Linear(6, 4), nn.BatchNorm1d(4))}
    float_module = floats[name]()
    for m in float_module.modules():  # torch's from_float reads the inner layer's qconfig
        m.qconfig = qconfig
    fused = name in ("ConvReLU2d", "LinearReLU", "LinearBn1d")
    ours_cls = getattr(qnniqat if fused else qnnqat, name)
    ref_cls = getattr(taq if fused else tnnqat, name)
    ours = ours_cls.from_float(copy.deepcopy(float_module))
    ref = ref_cls.from_float(copy.deepcopy(float_module))
    assert list(ours.state_dict()) == list(ref.state_dict())
    shape = {"Conv2d": (2, 3, 6, 6), "Conv3d": (2, 3, 5, 5, 5), "ConvReLU2d": (2, 3, 6, 6)}
    x = torch.randn(*shape.get(name, (8, 6)))
    _train_steps(ours, ref, x)
    ours.eval()
    ref.eval()
    torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)
    a, b = ours.to_float(), ref.to_float()
    torch.testing.assert_close(a(x), b(x), atol=1e-5, rtol=1e-5)


def test_fused_containers_check_their_parts_and_keep_torch_names():
    from mqbench.utils.module_types import canonical_type
    with pytest.raises(TypeError, match="ConvBn2d expects"):
        qnni.ConvBn2d(nn.Conv2d(1, 1, 1), nn.ReLU())
    assert canonical_type(qnni.ConvBnReLU2d) == "nn.intrinsic.ConvBnReLU2d"
    assert canonical_type(qnniqat.ConvBn2d) == "nn.intrinsic.qat.ConvBn2d"
    assert canonical_type(qnnqat.Linear) == "nn.qat.Linear"
    tnni = pytest.importorskip("torch.ao.nn.intrinsic")
    assert canonical_type(tnni.ConvBnReLU2d) == canonical_type(qnni.ConvBnReLU2d)


def test_merge_bn_accepts_torch_fused_qat_modules():
    """convert_merge_bn finds a handler for torch's ConvBn2d QAT module by canonical name."""
    tnniqat = pytest.importorskip("torch.ao.nn.intrinsic.qat")
    import torch.ao.nn.intrinsic as tnni
    from mqbench.fusion_method import convert_merge_bn
    torch.manual_seed(0)
    qconfig = get_qconfig_by_platform(BackendType.Tensorrt, {})
    fused = tnni.ConvBn2d(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    fused.qconfig = qconfig
    model = torch.fx.symbolic_trace(nn.Sequential(nn.Identity()))
    model.add_submodule("cb", tnniqat.ConvBn2d.from_float(fused))
    node = next(n for n in model.graph.nodes if n.op == "call_module")
    node.target = "cb"
    model.recompile()
    x = torch.randn(2, 3, 8, 8)
    enable_calibration(model)
    model.train()(x)
    enable_quantization(model)
    model.eval()
    before = model(x)
    convert_merge_bn(model)
    assert type(model.cb) is qnnqat.Conv2d
    torch.testing.assert_close(model(x), before, atol=1e-5, rtol=1e-4)
