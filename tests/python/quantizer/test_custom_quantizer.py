"""User extension points of the model quantizer: a ModelQuantizer subclass that overrides
MQBench's type-list properties or hooks changes where quantizers go (never silently ignored),
MQBench's per-backend module paths import, and the developer guide's walkthroughs run."""
import copy
import importlib
import logging
import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mqbench.nn.qat as qnnqat
from mqbench.custom_quantizer import (AcademicQuantizer, ModelQuantizer, TotalINTQuantizer,
                                      TRTModelQuantizer, VitisQuantizer)
from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.observer import ObserverBase
from mqbench.prepare_by_platform import BackendType, prepare_by_platform, register_backend
from mqbench.scheme import QuantizeScheme
from mqbench.utils.registry import DEFAULT_MODEL_QUANTIZER, register_model_quantizer
from mqbench.utils.state import enable_calibration, enable_quantization


class Net(nn.Module):
    """conv-bn-relu, a residual add of a mul, a pool, a flatten and a linear layer."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        y = self.conv2(x)
        x = x + y * 0.5
        x = torch.flatten(self.pool(x), 1)
        return self.fc(x)


def quantizers(model):
    return sorted(n for n, _ in model.named_modules() if n.endswith("_post_act_fake_quantizer"))


@pytest.fixture(autouse=True)
def restore_registry():
    saved = dict(DEFAULT_MODEL_QUANTIZER)
    yield
    DEFAULT_MODEL_QUANTIZER.clear()
    DEFAULT_MODEL_QUANTIZER.update(saved)


def prepare_with(cls, model=None, config=None):
    register_model_quantizer(BackendType.Tensorrt)(cls)
    return prepare_by_platform(model or Net(), BackendType.Tensorrt, config or {})


BASE = None


def base_sites():
    global BASE
    if BASE is None:
        BASE = quantizers(prepare_with(ModelQuantizer))
    return BASE


def test_every_backend_has_its_mqbench_class_registered():
    expected = {"Tensorrt": ModelQuantizer, "NNIE": ModelQuantizer, "QDQ": ModelQuantizer,
                "Academic": AcademicQuantizer, "Vitis": VitisQuantizer,
                "SNPE": TotalINTQuantizer, "STPU": TotalINTQuantizer}
    for name, cls in expected.items():
        assert DEFAULT_MODEL_QUANTIZER[BackendType[name]] is cls
    assert ModelQuantizer({}, {}).module_type_to_quant_input[2] is qnnqat.Conv2d


def test_default_properties_are_mqbench_lists():
    q = ModelQuantizer({"additional_function_type": [torch.cat]}, {})
    assert q.function_type_to_quant_input == [operator.add, operator.mul,
                                              F.adaptive_avg_pool2d, F.interpolate, torch.cat]
    assert nn.MaxPool2d in q.module_type_to_quant_input
    assert q.implicit_merge_patterns == [(operator.add, operator.mul)]
    v = VitisQuantizer({}, {})
    assert torch.cat in v.function_type_to_quant_output
    assert nn.ReLU in v.module_type_to_quant_output


def test_restricting_module_types_gives_fewer_quantizers():
    class ConvOnly(ModelQuantizer):
        @property
        def module_type_to_quant_input(self):
            return (qnnqat.Conv2d,) + self.additional_module_type

    sites = quantizers(prepare_with(ConvOnly))
    # conv2's input and (functions unchanged) the mul's; not the model input (conv1 is a fused
    # ConvBnReLU2d, not in the list), nor the pool's or the linear layer's inputs
    assert sites == ["conv1_post_act_fake_quantizer", "conv2_post_act_fake_quantizer"]
    assert set(sites) < set(base_sites())


def test_torch_classes_in_an_override_match_ours():
    torch_qat = pytest.importorskip("torch.ao.nn.qat")

    class TorchConv(ModelQuantizer):
        module_type_to_quant_input = (torch_qat.Conv2d,)  # a plain class attribute works too

    assert quantizers(prepare_with(TorchConv)) == ["conv1_post_act_fake_quantizer",
                                                   "conv2_post_act_fake_quantizer"]


def test_adding_a_function_type_gives_more_quantizers():
    class WithFlatten(ModelQuantizer):
        @property
        def function_type_to_quant_input(self):
            return super().function_type_to_quant_input + [torch.flatten]

    sites = quantizers(prepare_with(WithFlatten))
    assert set(sites) == set(base_sites()) | {"pool_post_act_fake_quantizer"}


def test_implicit_merge_override():
    class NoMerge(ModelQuantizer):
        implicit_merge_patterns = []

    assert "mul_post_act_fake_quantizer" not in base_sites()
    assert "mul_post_act_fake_quantizer" in quantizers(prepare_with(NoMerge))


def test_find_act_quants_and_swap_hooks_are_called():
    calls = []

    class Hooked(ModelQuantizer):
        def _find_act_quants(self, model):
            nodes = super()._find_act_quants(model)
            calls.append("find")
            return [n for n in nodes if n.name != "x"]

        def _qat_swap_modules(self, root, additional_qat_module_mapping, *args):
            calls.append("swap")
            return super()._qat_swap_modules(root, additional_qat_module_mapping, *args)

    sites = quantizers(prepare_with(Hooked))
    assert calls == ["swap", "find"]
    assert set(sites) == set(base_sites()) - {"x_post_act_fake_quantizer"}


def test_main_style_prepare_signature_and_torch_fused_input():
    seen = {}

    class MainStyle(ModelQuantizer):
        def prepare(self, model, qconfig, is_qat, backend_config, freeze_bn):
            seen.update(is_qat=is_qat, freeze_bn=freeze_bn)
            return super().prepare(model, qconfig, is_qat, backend_config, freeze_bn)

    register_model_quantizer(BackendType.Tensorrt)(MainStyle)
    prepare_by_platform(Net(), BackendType.Tensorrt, {}, freeze_bn=True)
    assert seen == {"is_qat": True, "freeze_bn": True}


def test_vitis_output_override_and_ignored_input_list():
    class VitisNoPool(VitisQuantizer):
        @property
        def module_type_to_quant_output(self):
            return tuple(t for t in super().module_type_to_quant_output
                         if t is not nn.AdaptiveAvgPool2d)

        module_type_to_quant_input = ()  # not used by Vitis, in MQBench either

    register_model_quantizer(BackendType.Vitis)(VitisNoPool)
    sites = quantizers(prepare_by_platform(Net(), BackendType.Vitis))
    DEFAULT_MODEL_QUANTIZER[BackendType.Vitis] = VitisQuantizer
    default = quantizers(prepare_by_platform(Net(), BackendType.Vitis))
    assert set(default) - set(sites) == {"pool_post_act_fake_quantizer"}


def test_openvino_academic_mode_survives_a_pass_through_override():
    from mqbench.custom_quantizer import OPENVINOQuantizer

    class PassThrough(OPENVINOQuantizer):
        @property
        def module_type_to_quant_input(self):
            return super().module_type_to_quant_input

    config = {"extra_quantizer_dict": {"academic_mode": True}}
    register_model_quantizer(BackendType.OPENVINO)(OPENVINOQuantizer)
    default = quantizers(prepare_by_platform(Net(), BackendType.OPENVINO, copy.deepcopy(config)))
    register_model_quantizer(BackendType.OPENVINO)(PassThrough)
    assert quantizers(prepare_by_platform(Net(), BackendType.OPENVINO,
                                          copy.deepcopy(config))) == default
    assert OPENVINOQuantizer({"academic_mode": True}, {}).module_type_to_quant_input[0] \
        is nn.Conv2d


def test_overrides_as_sets_and_bad_items():
    class AsSet(ModelQuantizer):
        function_type_to_quant_input = {operator.add, operator.mul}

    class Bad(ModelQuantizer):
        module_type_to_quant_input = (3,)

    assert set(quantizers(prepare_with(AsSet))) <= set(base_sites())
    assert "add_post_act_fake_quantizer" in quantizers(prepare_with(AsSet))
    with pytest.raises(TypeError, match="got 3"):
        prepare_with(Bad)


def test_extra_fuse_dict_keys_are_checked_and_the_plural_is_read():
    import mqbench.nn.qat as qat

    class C1(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv1d(2, 2, 1)

        def forward(self, x):
            return self.c(x)

    for key in ("additional_qat_module_mapping", "additional_qat_module_mappings"):
        q = prepare_by_platform(C1(), BackendType.Tensorrt,
                                {"extra_fuse_dict": {key: {nn.Conv1d: qat.Conv1d}}})
        assert type(q.c) is qat.Conv1d
    with pytest.raises(ValueError, match="did you mean 'additional_qat_module_mapping"):
        prepare_by_platform(C1(), BackendType.Tensorrt,
                            {"extra_fuse_dict": {"additional_qat_module_mapingg": {}}})


def test_a_quantizer_instance_keeps_its_own_is_qat():
    q = ModelQuantizer({}, {})
    from mqbench.prepare_by_platform import get_qconfig_by_platform
    from mqbench.custom_quantizer.tracer import CustomedTracer
    qconfig = get_qconfig_by_platform(BackendType.Tensorrt, {})

    def traced():
        m = Net().eval()
        return torch.fx.GraphModule(m, CustomedTracer().trace(m))

    ptq = q.prepare(traced(), qconfig, False, None, False)
    assert not hasattr(ptq.conv1, "bn")  # folded at prepare (is_qat=False)
    qat = q.prepare(traced(), qconfig)   # the instance's default: QAT, BN kept for folding
    assert hasattr(qat.conv1, "bn") and q.is_qat


def test_prepare_with_three_required_arguments():
    seen = []

    class Three(ModelQuantizer):
        def prepare(self, model, qconfig, is_qat):
            seen.append(is_qat)
            return super().prepare(model, qconfig, is_qat)

    prepare_with(Three)
    assert seen == [True]


def test_hooks_decided_in_cpp_are_reported(caplog):
    class Passed(TotalINTQuantizer):
        @property
        def _passed_func_type(self):
            return (F.relu,)

    with caplog.at_level(logging.WARNING, logger="MQBENCH"):
        Passed({}, {})
    assert "_passed_func_type is not called by mqbench" in caplog.text


def test_trt_model_quantizer_merges_a_float_conv_into_the_add():
    class Add(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 4, 1)
            self.b = nn.Conv2d(3, 4, 1)

        def forward(self, x):
            return self.a(x) + self.b(x)

    config = {"extra_quantizer_dict": {"exclude_module_name": ["a", "b"]}}
    base = quantizers(prepare_by_platform(Add(), BackendType.Tensorrt, copy.deepcopy(config)))
    trt = quantizers(prepare_with(TRTModelQuantizer, Add(), copy.deepcopy(config)))
    # the add's last float conv input (b) stays unquantized; a is still quantized
    assert base == ["a_post_act_fake_quantizer", "b_post_act_fake_quantizer"]
    assert trt == ["a_post_act_fake_quantizer"]


@pytest.mark.parametrize("path", [
    "mqbench.custom_quantizer.model_quantizer", "mqbench.custom_quantizer.academic_quantizer",
    "mqbench.custom_quantizer.tensorrt_quantizer", "mqbench.custom_quantizer.onnx_qnn_quantizer",
    "mqbench.custom_quantizer.openvino_quantizer", "mqbench.custom_quantizer.vitis_quantizer",
    "mqbench.custom_quantizer.tengine_u8_quantizer",
    "mqbench.custom_quantizer.total_int_quantizer", "mqbench.custom_quantizer.nlp_quantizer"])
def test_mqbench_quantizer_module_paths(path):
    module = importlib.import_module(path)
    assert module.__all__ and all(hasattr(module, n) for n in module.__all__)


def test_custom_quantizer_does_not_import_prepare_by_platform():
    import os
    import subprocess
    import sys

    import mqbench
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(mqbench.__file__)))
    env = dict(os.environ, PYTHONPATH=package_root)
    code = ("import sys, mqbench.custom_quantizer; "
            "assert 'mqbench.prepare_by_platform' not in sys.modules, 'imported'")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# --- MQBench's developer guide, "Add a Backend to MQBench: Quick Start" -------------------------

class ExampleQuant(torch.autograd.Function):
    """The guide's quantization function: round-to-nearest with a straight-through gradient."""

    @staticmethod
    def forward(ctx, x, s, z, n, p):
        return (torch.clamp(torch.round(x / s + z), n, p) - z) * s

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None, None

    @staticmethod
    def symbolic(g, x, scale, zero_point, quant_min, quant_max):
        return g.op("::ExampleQuant", x, scale, zero_point, quant_min_i=quant_min,
                    quant_max_i=quant_max)


class ExampleObserver(ObserverBase):
    def __init__(self, dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, ch_axis=-1, pot_scale=False,
                 factory_kwargs=None):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, ch_axis, pot_scale,
                         factory_kwargs)

    def forward(self, x_orig):
        x = x_orig.detach()
        self.min_val = torch.minimum(self.min_val, x.min())
        self.max_val = torch.maximum(self.max_val, x.max())
        return x_orig

    def calculate_qparams(self):
        return self._calculate_qparams(self.min_val, self.max_val)


class ExampleFakeQuantize(QuantizeBase):
    def __init__(self, observer, scale=1., zero_point=0., use_grad_scaling=True,
                 **observer_kwargs):
        super().__init__(observer, **observer_kwargs)
        self.scale = nn.Parameter(torch.tensor([scale]))
        self.zero_point = nn.Parameter(torch.tensor([zero_point]))

    def forward(self, X):
        if self.observer_enabled[0] == 1:
            self.activation_post_process(X.detach())
            s, z = self.activation_post_process.calculate_qparams()
            self.scale.data.copy_(s)
            self.zero_point.data.copy_(z.float())
        if self.fake_quant_enabled[0] == 1:
            X = ExampleQuant.apply(X, self.scale, self.zero_point, self.quant_min,
                                   self.quant_max)
        return X


class ExampleMod(nn.Module):
    def forward(self, x):
        return x * 2


def example_func(x):
    return x - 1


torch.fx.wrap("example_func")  # traced as one call_function node, as the guide's function


def test_developer_guide_add_a_backend():
    backend = register_backend(
        "GuideExample", qtype="affine",
        w_qscheme=QuantizeScheme(symmetry=True, per_channel=False, bit=8),
        a_qscheme=QuantizeScheme(symmetry=False, per_channel=False, bit=8),
        default_weight_quantize=ExampleFakeQuantize, default_act_quantize=ExampleFakeQuantize,
        default_weight_observer=ExampleObserver, default_act_observer=ExampleObserver)

    @register_model_quantizer(backend)
    class ExampleQuantizer(ModelQuantizer):
        @property
        def module_type_to_quant_input(self):
            return super().module_type_to_quant_input + (ExampleMod,) + \
                self.additional_module_type

        @property
        def function_type_to_quant_input(self):
            return super().function_type_to_quant_input + [example_func] + \
                self.additional_function_type

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.mod = ExampleMod()

        def forward(self, x):
            x = self.conv(x)
            return example_func(self.mod(x))

    model = prepare_by_platform(Model(), backend, {"leaf_module": [ExampleMod]})
    sites = quantizers(model)
    assert sites == ["conv_post_act_fake_quantizer", "mod_post_act_fake_quantizer",
                     "x_post_act_fake_quantizer"]
    assert isinstance(model.conv.weight_fake_quant, ExampleFakeQuantize)
    x = torch.randn(2, 3, 8, 8)
    enable_calibration(model)
    model(x)
    enable_quantization(model)
    float_out = Model()
    float_out.load_state_dict({k: v for k, v in model.state_dict().items()
                               if k in float_out.state_dict()})
    torch.testing.assert_close(model(x), float_out(x), atol=0.1, rtol=0.05)


# --- "Deal with New Fusion Pattern" --------------------------------------------------------------

class FusedCBR2d(nn.Sequential):
    def __init__(self, conv, bn, relu):
        super().__init__(conv, bn, relu)


class QATCBR2d(nn.Conv2d):
    """The guide's QAT module: BN folded into the fake-quantized weight."""
    _FLOAT_MODULE = FusedCBR2d

    def __init__(self, conv, bn, relu, qconfig):
        super().__init__(conv.in_channels, conv.out_channels, conv.kernel_size,
                         stride=conv.stride, padding=conv.padding, bias=conv.bias is not None)
        self.weight, self.bias = conv.weight, conv.bias
        self.bn, self.relu = bn, relu
        self.qconfig = qconfig
        self.weight_fake_quant = qconfig.weight()

    def forward(self, x):
        running_std = torch.sqrt(self.bn.running_var + self.bn.eps)
        scale_factor = self.bn.weight / running_std
        w = self.weight_fake_quant(self.weight * scale_factor.reshape(-1, 1, 1, 1))
        y = F.conv2d(x, w, None, self.stride, self.padding) / scale_factor.reshape(1, -1, 1, 1)
        if self.bias is not None:
            y = y + self.bias.reshape(1, -1, 1, 1)
        return self.relu(self.bn(y))

    @classmethod
    def from_float(cls, mod):
        return cls(mod[0], mod[1], mod[2], mod.qconfig)


def test_developer_guide_add_a_fusion_pattern():
    def fuse_cbr(is_qat, conv, bn, relu):
        return FusedCBR2d(conv, bn, relu)

    model = Net()
    config = {"extra_fuse_dict": {
        "additional_fuser_method_mapping": {(nn.Conv2d, nn.BatchNorm2d, nn.ReLU): fuse_cbr},
        "additional_qat_module_mapping": {FusedCBR2d: QATCBR2d}}}
    prepared = prepare_by_platform(model, BackendType.Tensorrt, config)
    assert isinstance(prepared.conv1, QATCBR2d)
    x = torch.randn(2, 3, 8, 8)
    enable_calibration(prepared)
    prepared(x)
    enable_quantization(prepared)
    out = prepared(x)
    assert out.shape == (2, 4) and torch.isfinite(out).all()
