"""QuantizeScheme's dtype and group_size: valid formats, refused combinations (the
error names the field), unchanged int schemes, and the C++ registry's view of the same fields."""
import pytest
import torch

from mqbench import _C
from mqbench.prepare_by_platform import BackendType, get_qconfig_by_platform
from mqbench.scheme import QuantizeScheme

INT8_STR = ("Symmetric: True / Bitwidth: 8 / Per channel: False / Pot scale: False / "
            "Extra kwargs: {}")


def test_int_default_is_unchanged():
    s = QuantizeScheme()
    assert s.dtype == "int" and s.group_size is None and s.bit == 8
    assert str(s) == INT8_STR
    assert s == QuantizeScheme(bit=8)
    assert s.to_observer_params() == {
        "quant_min": -128, "quant_max": 127, "dtype": torch.qint8, "pot_scale": False,
        "qscheme": torch.per_tensor_symmetric, "reduce_range": False, "ch_axis": -1}
    assert QuantizeScheme(dtype="int") == s


@pytest.mark.parametrize("dtype,bits,qmax,torch_dtype", [
    ("fp8_e4m3", 8, 448, torch.float8_e4m3fn), ("fp8_e5m2", 8, 57344, torch.float8_e5m2),
    ("mxfp8_e4m3", 8, 448, torch.float8_e4m3fn), ("mxfp4", 4, 6, torch.float4_e2m1fn_x2),
    ("nvfp4", 4, 6, torch.float4_e2m1fn_x2)])
def test_float_formats(dtype, bits, qmax, torch_dtype):
    s = QuantizeScheme(dtype=dtype)
    assert s.bit == bits and s.is_float
    p = s.to_observer_params()
    assert (p["quant_min"], p["quant_max"], p["dtype"], p["format"]) == (-qmax, qmax, torch_dtype,
                                                                         dtype)
    assert str(s) == INT8_STR.replace("Bitwidth: 8", f"Bitwidth: {bits}") + f" / Dtype: {dtype}"
    assert s != QuantizeScheme(bit=bits)
    assert QuantizeScheme.from_dict(s.to_dict()) == s
    assert QuantizeScheme(dtype=dtype, bit=bits) == s  # the element width may be given


def test_group_size():
    s = QuantizeScheme(per_channel=True, bit=4, group_size=128)
    p = s.to_observer_params()
    assert (p["quant_min"], p["quant_max"], p["ch_axis"], p["group_size"]) == (-8, 7, 1, 128)
    assert p["qscheme"] == torch.per_channel_symmetric
    assert str(s).endswith(" / Group size: 128")
    assert QuantizeScheme.from_dict(s.to_dict()) == s
    assert s != QuantizeScheme(per_channel=True, bit=4)
    a = QuantizeScheme(symmetry=False, per_channel=True, bit=4, group_size=32)
    assert a.to_observer_params()["quant_max"] == 15


@pytest.mark.parametrize("kwargs,field", [
    (dict(dtype="fp8_e4m3", bit=4), "bit (4)"),
    (dict(dtype="mxfp4", bit=8), "bit (8)"),
    (dict(dtype="fp8_e4m3", symmetry=False), "symmetry=False"),
    (dict(dtype="fp8_e5m2", per_channel=True, group_size=32), "group_size (32)"),
    (dict(dtype="nvfp4", group_size=16), "group_size (16)"),
    (dict(dtype="fp8_e4m3", symmetric_range=True), "symmetric_range"),
    (dict(dtype="mxfp8_e4m3", per_channel=True), "per_channel"),
    (dict(dtype="mxfp4", pot_scale=True), "pot_scale"),
    (dict(dtype="fp16"), "dtype must be one of"),
    (dict(bit=4, group_size=128), "set per_channel=True"),
    (dict(per_channel=True, group_size=0), "group_size must be a positive integer"),
    (dict(per_channel=True, group_size=True), "group_size must be a positive integer"),
])
def test_invalid_combinations_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(").replace(")", r"\)")):
        QuantizeScheme(**kwargs)


NAMES = {"w_fakequantize": "FixedFakeQuantize", "a_fakequantize": "FixedFakeQuantize",
         "w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver"}


def test_extra_qconfig_dict_carries_the_new_fields():
    q = get_qconfig_by_platform(BackendType.Academic, {**NAMES,
        "w_qscheme": {"bit": 4, "per_channel": True, "group_size": 64},
        "a_qscheme": {"dtype": "fp8_e4m3"}})
    w, a = q.weight.p.keywords, q.activation.p.keywords
    assert (w["group_size"], w["ch_axis"], w["quant_min"]) == (64, 1, -8)
    assert (a["format"], a["quant_max"], a["dtype"]) == ("fp8_e4m3", 448, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="a_qscheme.*group_size"):
        get_qconfig_by_platform(BackendType.Academic, {**NAMES,
            "w_qscheme": {"bit": 8}, "a_qscheme": {"bit": 4, "per_channel": True,
                                                   "group_size": 64}})
    # An int config gives exactly the arguments it gave before the new fields.
    q = get_qconfig_by_platform(BackendType.Academic, {**NAMES, "w_qscheme": {"bit": 4},
                                                        "a_qscheme": {"bit": 8}})
    assert "format" not in q.weight.p.keywords and "group_size" not in q.weight.p.keywords


def test_registry_round_trips_and_checks_the_fields():
    spec = dict(_C.get_backend("Tensorrt"))
    assert spec["w_qscheme"]["dtype"] == "int" and spec["w_qscheme"]["group_size"] == 0
    spec.update(name="Fp8TestChip", params_of="", order=999,
                w_qscheme=QuantizeScheme(dtype="fp8_e4m3", per_channel=True).to_dict(),
                a_qscheme=QuantizeScheme(dtype="fp8_e4m3").to_dict())
    bad = dict(spec, name="BadFp8TestChip",
               w_qscheme=dict(spec["w_qscheme"], symmetry=False))
    with pytest.raises(ValueError, match="symmetry=False"):
        _C.register_backend(bad)
    _C.register_backend(spec)
    back = _C.get_backend("Fp8TestChip")
    assert QuantizeScheme.from_dict(back["w_qscheme"]) == \
        QuantizeScheme(dtype="fp8_e4m3", per_channel=True)
