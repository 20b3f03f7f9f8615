"""BackendType / ParamsTable / get_qconfig_by_platform against section A.1 of the MQBench behaviour
spec (kept outside this repository), and a backend registered from outside the library
(examples/custom_backend)."""
import logging
import os
import sys

import pytest
import torch

import mqbench
from mqbench import fake_quantize as fqs
from mqbench import observer as obs
from mqbench.prepare_by_platform import (BackendType, FakeQuantizeDict, ObserverDict, ParamsTable,
                                         UnknownNameError, get_qconfig_by_platform,
                                         register_backend)
from mqbench.scheme import QuantizeScheme

MQBENCH_BACKENDS = ["Academic", "Tensorrt", "SNPE", "PPLW8A16", "NNIE", "Vitis", "ONNX_QNN",
                    "PPLCUDA", "OPENVINO", "Tengine_u8", "Tensorrt_NLP", "Academic_NLP", "STPU",
                    "QDQ"]

# backend: (qtype, weight (qmin, qmax, per_channel, pot), act (qmin, qmax, per_channel, pot),
#           W FQ, A FQ, W observer, A observer)   -- the spec's table A.1
L, EMA, MM = fqs.LearnableFakeQuantize, obs.EMAMinMaxObserver, obs.MinMaxObserver
SPEC = {
    "Tensorrt": ("affine", (-127, 127, True, False), (-127, 127, False, False), L, L, MM, EMA),
    "SNPE": ("affine", (0, 255, False, False), (0, 255, False, False), L, L, MM, EMA),
    "PPLW8A16": ("affine", (0, 255, False, False), (0, 65535, False, False), L, L, MM, EMA),
    "NNIE": ("nnie", (-128, 127, False, False), (-128, 127, False, False),
             fqs.NNIEFakeQuantize, fqs.NNIEFakeQuantize, MM, EMA),
    "Vitis": ("vitis", (-128, 127, False, True), (-128, 127, False, True), fqs.TqtFakeQuantize,
              fqs.TqtFakeQuantize, obs.MinMaxFloorObserver, obs.PoTModeObserver),
    "ONNX_QNN": ("affine", (0, 255, False, False), (0, 255, False, False), L, L, MM, MM),
    "PPLCUDA": ("affine", (0, 255, True, False), (0, 255, False, False), L, L, MM, MM),
    "OPENVINO": ("affine", (-128, 127, True, False), (-128, 127, False, False), L, L, MM, EMA),
    "Tengine_u8": ("affine", (0, 255, False, False), (0, 255, False, False), L, L, MM, EMA),
    "STPU": ("affine", (-127, 127, False, False), (-127, 127, False, False),
             fqs.FixedFakeQuantize, fqs.FixedFakeQuantize, MM, EMA),
    "QDQ": ("affine", (-127, 127, True, False), (-127, 127, False, False), L, L, MM, EMA),
}
SPEC["Tensorrt_NLP"] = SPEC["Tensorrt"]


def test_backend_type_members_are_mqbench_s_in_order():
    names = [b.name for b in BackendType][:14]
    assert names == MQBENCH_BACKENDS
    assert all(b.value == b.name for b in BackendType)
    assert mqbench._C.backend_names()[:14] == MQBENCH_BACKENDS


def test_dicts_match_the_cpp_registry():
    # MQBench's 9, then the format fake quantizers (FP8, group-wise, MX, NVFP4) from Python;
    # after them, what register_backend added (another test's backend) is in both, in order
    names = mqbench._C.fake_quantize_names()
    assert list(FakeQuantizeDict)[:15] == names[:15]
    assert list(FakeQuantizeDict)[15:] == [n for n in names[15:] if n in FakeQuantizeDict]
    assert set(ObserverDict) <= set(mqbench._C.observer_names())
    assert ParamsTable[BackendType.Tensorrt_NLP] is ParamsTable[BackendType.Tensorrt]
    assert ParamsTable[BackendType.Academic_NLP] is ParamsTable[BackendType.Academic]
    assert ParamsTable[BackendType.Academic] == {"qtype": "affine"}


@pytest.mark.parametrize("name", sorted(SPEC))
def test_params_table_and_qconfig_follow_the_spec(name):
    qtype, w, a, wfq, afq, wobs, aobs = SPEC[name]
    backend = BackendType[name]
    params = ParamsTable[backend]
    assert params["qtype"] == qtype
    assert params["default_weight_quantize"] is wfq and params["default_act_quantize"] is afq
    assert params["default_weight_observer"] is wobs and params["default_act_observer"] is aobs
    qconfig = get_qconfig_by_platform(backend, {})
    for factory, (qmin, qmax, per_channel, pot), fq_cls, obs_cls in (
            (qconfig.weight, w, wfq, wobs), (qconfig.activation, a, afq, aobs)):
        kw = factory.p.keywords
        assert (kw["quant_min"], kw["quant_max"]) == (qmin, qmax)
        assert kw["ch_axis"] == (0 if per_channel else -1) and kw["pot_scale"] == pot
        fq = factory()
        assert type(fq) is fq_cls and type(fq.activation_post_process) is obs_cls
        assert (fq.quant_min, fq.quant_max) == (qmin, qmax)


def test_openvino_weight_range_and_scheme_objects():
    w = ParamsTable[BackendType.OPENVINO]["w_qscheme"]
    assert isinstance(w, QuantizeScheme) and w.per_channel and w.symmetry and w.bit == 8
    assert str(w) == ("Symmetric: True / Bitwidth: 8 / Per channel: True / Pot scale: False / "
                      "Extra kwargs: {}")


def test_academic_needs_user_schemes():
    with pytest.raises(KeyError, match="w_qscheme"):
        get_qconfig_by_platform(BackendType.Academic, {"w_fakequantize": "FixedFakeQuantize"})
    with pytest.raises(UnknownNameError, match="w_fakequantize"):
        get_qconfig_by_platform(BackendType.Academic, {
            "w_qscheme": {"bit": 4}, "a_qscheme": {"bit": 4}})
    qc = get_qconfig_by_platform(BackendType.Academic_NLP, {
        "w_qscheme": {"bit": 4, "symmetry": False, "per_channel": True, "pot_scale": False},
        "a_qscheme": {"bit": 4, "symmetry": True, "per_channel": False, "pot_scale": True},
        "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "FixedFakeQuantize",
        "w_observer": "MSEObserver", "a_observer": "EMAQuantileObserver"})
    w, a = qc.weight(), qc.activation()
    assert (w.quant_min, w.quant_max, w.ch_axis) == (0, 15, 0)
    assert (a.quant_min, a.quant_max, a.pot_scale) == (-8, 7, True)
    assert isinstance(a.activation_post_process, obs.EMAQuantileObserver)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(UnknownNameError, match="MinMaxObserver") as e:
        get_qconfig_by_platform(BackendType.Tensorrt, {"w_observer": "MaxObserver"})
    assert isinstance(e.value, AssertionError) and isinstance(e.value, ValueError)
    with pytest.raises(UnknownNameError, match="LearnableFakeQuantize"):
        get_qconfig_by_platform(BackendType.Tensorrt, {"a_fakequantize": "LSQ"})
    with pytest.raises(UnknownNameError, match="did you mean 'Tensorrt'.*valid names: .*SNPE"):
        get_qconfig_by_platform("TensorRT", {})
    with pytest.raises(UnknownNameError, match="'w_obsever' \\(did you mean 'w_observer'\\?\\); "
                                               "valid keys"):
        get_qconfig_by_platform(BackendType.SNPE, {"w_obsever": "MSEObserver"})
    with pytest.raises(UnknownNameError, match="did you mean 'MinMaxObserver'"):
        get_qconfig_by_platform(BackendType.Tensorrt, {"w_observer": "MinMaxObsever"})
    with pytest.raises(ValueError, match="registered backends: Academic, Tensorrt"):
        mqbench._C.get_backend("nope")


def test_overrides_params_and_extra_args_without_leaking(caplog):
    qc = get_qconfig_by_platform(BackendType.Tensorrt, {
        "w_qscheme": {"bit": 4, "symmetry": True, "per_channel": True, "pot_scale": False},
        "a_fakequantize": "DSQFakeQuantize", "a_fakeq_params": {"alpha": 0.2},
        "a_observer": "EMAMinMaxObserver", "a_observer_extra_args": {"ema_ratio": 0.5}})
    assert qc.weight.p.keywords["quant_min"] == -8
    a = qc.activation()
    assert isinstance(a, fqs.DSQFakeQuantize) and a.alpha == 0.2
    assert a.activation_post_process.ema_ratio == 0.5
    # MQBench merged the extra args into the shared ParamsTable scheme: later calls saw them.
    assert ParamsTable[BackendType.Tensorrt]["a_qscheme"].kwargs == {}
    later = get_qconfig_by_platform(BackendType.Tensorrt, {}).activation()
    assert later.activation_post_process.ema_ratio == 0.9


def test_nnie_ignores_everything_but_observers():
    qc = get_qconfig_by_platform(BackendType.NNIE, {"w_observer": "MSEObserver",
                                                    "a_fakequantize": "FixedFakeQuantize"})
    w, a = qc.weight(), qc.activation()
    assert isinstance(w, fqs.NNIEFakeQuantize) and isinstance(a, fqs.NNIEFakeQuantize)
    assert isinstance(w.activation_post_process, obs.MSEObserver)


def test_registering_a_duplicate_or_bad_backend_fails():
    with pytest.raises(ValueError, match="already registered"):
        register_backend("Tensorrt")
    with pytest.raises(ValueError, match="unknown observer 'Nope'"):
        mqbench._C.register_backend({"name": "Bad", "default_act_observer": "Nope"})
    with pytest.raises(TypeError, match="subclass of QuantizeBase"):
        register_backend("Bad2", default_weight_quantize=torch.nn.Linear)
    assert "Bad" not in BackendType.__members__


def test_external_backend_from_examples():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples",
                                    "custom_backend"))
    import my_npu
    backend = my_npu.register()
    assert backend is BackendType.MyNPU and my_npu.register() is backend
    assert mqbench._C.get_backend("MyNPU")["default_act_observer"] == "MyNPUActObserver"
    assert ObserverDict["MyNPUActObserver"] is my_npu.MyNPUActObserver
    qc = get_qconfig_by_platform("MyNPU", {})
    w, a = qc.weight(), qc.activation()
    assert (w.quant_min, w.quant_max, w.ch_axis) == (-7, 7, 0)
    assert isinstance(a.activation_post_process, my_npu.MyNPUActObserver)
    assert a.activation_post_process.threshold == 0.9999
    x = torch.randn(4, 16, 8, 8)
    y = a(x)
    assert y.unique().numel() <= 256 and torch.isfinite(y).all()


@pytest.mark.parametrize("kwargs, message", [
    ({"bit": 0}, r"bit must be an integer in \[1, 24\], got 0"),
    ({"bit": 25}, r"bit must be an integer in \[1, 24\], got 25"),
    ({"bit": 4.5}, r"bit must be an integer in \[1, 24\], got 4.5"),
    ({"bit": "8"}, r"bit must be an integer in \[1, 24\], got '8'"),
    ({"bit": True}, r"bit must be an integer in \[1, 24\], got True"),
    ({"symmetry": "yes"}, r"symmetry must be True or False, got 'yes'"),
    ({"per_channel": None}, r"per_channel must be True or False, got None"),
    ({"pot_scale": 2}, r"pot_scale must be True or False, got 2"),
    ({"symmetric_range": "no"}, r"symmetric_range must be True or False"),
    ({"bit": 1, "symmetric_range": True}, r"bit=1 with symmetry and symmetric_range"),
])
def test_bad_schemes_are_value_errors_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        QuantizeScheme(**kwargs)
    with pytest.raises(ValueError, match=message):
        get_qconfig_by_platform(BackendType.Academic, {
            "w_qscheme": kwargs, "a_qscheme": {"bit": 8},
            "w_fakequantize": "FixedFakeQuantize", "a_fakequantize": "FixedFakeQuantize",
            "w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver"})


@pytest.mark.parametrize("symmetry, expected", [(True, (-1, 0)), (False, (0, 1))])
def test_one_bit_schemes_calibrate_and_quantize(symmetry, expected):
    qc = get_qconfig_by_platform(BackendType.Academic, {
        "w_qscheme": {"bit": 1, "symmetry": symmetry}, "a_qscheme": {"bit": 8},
        "w_fakequantize": "FixedFakeQuantize", "a_fakequantize": "FixedFakeQuantize",
        "w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver"})
    w = qc.weight()
    assert (w.quant_min, w.quant_max) == expected
    x = torch.linspace(-1, 1, 11)
    y = w(x)
    s = float(w.scale)
    assert torch.isfinite(y).all() and s > 0
    levels = torch.unique(torch.round(y / s)).tolist()
    assert set(levels) <= set(range(expected[0] - int(w.zero_point), expected[1] - int(w.zero_point) + 1))
