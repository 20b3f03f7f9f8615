"""convert_deploy: BN merge, export, the C++ translators of every backend, onnxruntime agreement."""
import copy
import json
import os

import onnx
import pytest
import torch
import torch.nn as nn
import torchvision

import ort
from deploy_helpers import (SmallNet, activation_tensors, as_bytes, calibrated,
                            check_calibration_cache, check_lockstep, deploy_copy, export_fakeq,
                            lockstep)
from mqbench import _C
from mqbench.convert_deploy import convert_deploy, qmin_max_dict
from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.state import disable_all, enable_calibration, enable_quantization
from test_prepare_by_platform import ACADEMIC, config, with_bn_statistics

SHAPE = [2, 3, 64, 64]
FAKE_QUANT_OPS = {"QuantizeLinear", "DequantizeLinear"}


@pytest.fixture(scope="module")
def nets():
    torch.manual_seed(0)
    return {name: with_bn_statistics(getattr(torchvision.models, name)(), (8, 3, 64, 64))
            for name in ("resnet18", "mobilenet_v2")}


def inputs(seed=5):
    return torch.randn(*SHAPE, generator=torch.Generator().manual_seed(seed))


def n_act_quantizers(model):
    return sum(1 for n, m in model.named_modules()
               if isinstance(m, QuantizeBase) and n.endswith("_post_act_fake_quantizer"))


# ---- one process, three protobuf users ------------------------------------------------------

def test_onnx_torch_and_mqbench_protobuf_coexist(tmp_path):
    """PyPI's onnx (its own static protobuf), torch (protobuf and ONNX classes linked in, package
    onnx_torch) and our deploy library (Debian's libprotobuf, onnx 1.23's classes compiled in) in one process:
    torch exports, onnx edits and serializes, the C++ passes parse and rewrite, onnx reads the
    result back and checks it (docs/design/build-and-ci.md)."""
    import onnx.helper
    q = calibrated(SmallNet().eval(), BackendType.Tensorrt, [2, 3, 16, 16])
    fakeq = export_fakeq(deploy_copy(q), [2, 3, 16, 16], tmp_path)
    m = onnx.load_from_string(fakeq)
    m.metadata_props.append(onnx.StringStringEntryProto(key="edited_by", value="onnx"))
    params = _C.deploy_fake_quant_params(m.SerializeToString())
    assert params and all(p["scale"] for p in params)
    files, _ = _C.deploy_translate(m.SerializeToString(), "tensorrt", "net")
    deployed = onnx.load_from_string(files["net_deploy_model.onnx"])
    onnx.checker.check_model(deployed)
    assert {"edited_by": "onnx"}.items() <= {p.key: p.value for p in deployed.metadata_props}.items()
    assert not any(n.domain == "mqbench" for n in deployed.graph.node)
    # And torch's own protobuf still works after ours ran.
    again = export_fakeq(deploy_copy(q), [2, 3, 16, 16], tmp_path)
    assert onnx.load_from_string(again).graph.node


@pytest.mark.parametrize("name", ["../escape", "/tmp/escape", "a\0b", "..", ".", "", "n" * 201])
def test_model_names_stay_inside_the_output_folder(name, tmp_path):
    """A model name is one file name: anything else is a ValueError before any work, and no
    file lands outside output_path."""
    q = calibrated(SmallNet().eval(), BackendType.Tensorrt, [2, 3, 16, 16])
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="model_name"):
        convert_deploy(q, BackendType.Tensorrt, {"x": [2, 3, 16, 16]}, output_path=str(out),
                       model_name=name)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="model_name"):
        _C.deploy_run(b"\x08\x07", "tensorrt", name, str(out))


# ---- onnxruntime agreement ------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["resnet18", "mobilenet_v2"])
@pytest.mark.parametrize("backend", ["QDQ", "Tensorrt"])
def test_deployed_qdq_model_agrees_with_the_simulation_in_onnxruntime(arch, backend, nets, tmp_path):
    """Metric: the deployed model runs in onnxruntime with every activation quantizer's output
    exposed; the merged fake-quant torch model runs on the same input with each activation
    quantizer fed onnxruntime's value of its input layer (lockstep, so a one-level flip at a
    rounding tie cannot grow through the net). Every quantizer's outputs within one
    quantization step, and >= 99.9% of all quantized values identical (the rest are ties that
    onnxruntime's and torch's convolutions, summing in different orders, round to neighbouring
    levels); the final output within 1e-4."""
    ort.require()
    q = calibrated(nets[arch], BackendType[backend], SHAPE)
    out = tmp_path / "out"
    written = convert_deploy(q, BackendType[backend], {"x": SHAPE}, output_path=str(out),
                             model_name=arch, deploy_to_qlinear=backend == "Tensorrt")
    name = arch + ".onnx" if backend == "QDQ" else "onnx_quantized_model.onnx"
    assert str(out / name) in written
    deployed = as_bytes(out / name)
    proto = onnx.load_from_string(deployed)
    onnx.checker.check_model(proto)
    assert {op.domain for op in proto.opset_import} <= {"", "ai.onnx"}
    assert sum(n.op_type == "QuantizeLinear" for n in proto.graph.node) == \
        sum(isinstance(m, QuantizeBase) for m in q.modules())

    merged = deploy_copy(q)
    tensors = activation_tensors(export_fakeq(merged, SHAPE, tmp_path))
    assert len(tensors) == n_act_quantizers(q)
    stats, ours, theirs = lockstep(merged, inputs(), deployed, tensors)
    assert len(stats) == len(tensors)
    check_lockstep(stats)
    assert (ours - theirs).abs().max() <= 1e-4 * max(1.0, ours.abs().max().item())


def test_academic_4bit_deploys_to_qdq_with_exact_saturation(nets, tmp_path):
    ort.require()
    cfg = copy.deepcopy(ACADEMIC)
    cfg["extra_qconfig_dict"]["w_qscheme"]["bit"] = 4
    cfg["extra_qconfig_dict"]["a_qscheme"]["bit"] = 4
    q = calibrated(nets["resnet18"], BackendType.Academic, SHAPE, prepare_custom_config_dict=cfg)
    convert_deploy(q, BackendType.Academic, {"x": SHAPE}, output_path=str(tmp_path), model_name="a4")
    deployed = as_bytes(tmp_path / "a4.onnx")
    proto = onnx.load_from_string(deployed)
    onnx.checker.check_model(proto)
    narrow = sum(isinstance(m, QuantizeBase) and (m.quant_min, m.quant_max) not in ((0, 255), (-128, 127))
                 for m in q.modules())
    assert narrow > 0 and sum(n.op_type == "Clip" for n in proto.graph.node) == narrow
    merged = deploy_copy(q)
    tensors = activation_tensors(export_fakeq(merged, SHAPE, tmp_path))
    stats, ours, theirs = lockstep(merged, inputs(), deployed, tensors)
    # Academic keeps BatchNorm unfolded and onnxruntime folds it into the convolutions itself
    # (other float rounding), so slightly more values sit one level apart.
    check_lockstep(stats, identical=0.995)
    # weights are not in lockstep: a weight at a rounding tie may land one level away
    assert (ours - theirs).abs().max() <= 1e-3 * max(1.0, ours.abs().max().item())


def test_onnx_qnn_qlinear_model_runs_in_onnxruntime(tmp_path):
    """QLinearConv / QLinearAdd / QLinearGlobalAveragePool compute in integers with their own
    rounding (requantization, integer bias), so the metric is looser than for QDQ: outputs within
    4 steps of the fc input quantizer times the fc weight norm, and the same top-1 class."""
    ort.require()
    torch.manual_seed(0)
    net = with_bn_statistics(SmallNet(), (8, 3, 16, 16))
    shape = [8, 3, 16, 16]
    q = calibrated(net, BackendType.ONNX_QNN, shape)
    convert_deploy(q, BackendType.ONNX_QNN, {"x": shape}, output_path=str(tmp_path), model_name="s")
    deployed = as_bytes(tmp_path / "s.onnx")
    proto = onnx.load_from_string(deployed)
    onnx.checker.check_model(proto)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("QLinearConv") == 2 and "QLinearAdd" in ops and "QLinearGlobalAveragePool" in ops
    assert "Conv" not in ops
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = deploy_copy(q)(x)
    theirs = list(ort.run(deployed, {"x": x}).values())[0]
    act_step = max(m.scale.item() for n, m in q.named_modules() if n.endswith("_post_act_fake_quantizer"))
    bound = 4 * act_step * q.fc.weight.abs().sum(1).max().item()
    assert (ours - theirs).abs().max().item() <= bound
    assert torch.equal(ours.argmax(1), theirs.argmax(1))


# ---- every backend --------------------------------------------------------------------------

FILES = {
    "Tensorrt": ["{}.onnx", "{}_deploy_model.onnx", "{}_clip_ranges.json", "{}_calib.cache"],
    "SNPE": ["{}.onnx", "{}_deploy_model.onnx", "{}_clip_ranges.json"],
    "PPLW8A16": ["{}.onnx", "{}_deploy_model.onnx", "{}_clip_ranges.json"],
    "PPLCUDA": ["{}.onnx", "{}_deploy_model.onnx", "{}_clip_ranges.json"],
    "NNIE": ["{}.onnx", "{}_deploy_model.onnx", "{}_gfpq_param_dict.json"],
    "Vitis": ["{}.onnx", "{}_deploy_model.onnx", "{}_clip_ranges.json"],
    "OPENVINO": ["{}.onnx", "{}_deploy_model.onnx"],
    "ONNX_QNN": ["{}.onnx"],
    "Tengine_u8": ["{}.onnx", "{}_for_tengine.onnx", "{}_for_tengine.scale"],
    "STPU": ["{}.onnx", "{}_for_stpu.onnx", "{}_stpu_minmax.json"],
    "QDQ": ["{}.onnx"],
    "Academic": ["{}.onnx"],
    "Academic_NLP": ["{}.onnx"],
    "Tensorrt_NLP": ["{}.onnx"],
}
FLOAT_DEPLOY = {"Tensorrt": "_deploy_model", "SNPE": "_deploy_model", "PPLW8A16": "_deploy_model",
                "PPLCUDA": "_deploy_model", "NNIE": "_deploy_model", "Vitis": "_deploy_model",
                "Tengine_u8": "_for_tengine", "STPU": "_for_stpu"}


def test_every_builtin_backend_has_a_deploy_table_entry():
    builtin = [b for b in _C.backend_names() if _C.get_backend(b)["deploy_translator"]]
    assert set(FILES) <= set(builtin) and len(FILES) == 14


@pytest.fixture(scope="module")
def deployed_resnet18(nets, tmp_path_factory):
    """Every backend deploys the prepared resnet18; {backend: (model, dir, files written)}."""
    out = {}
    for backend in FILES:
        be = BackendType[backend]
        q = calibrated(nets["resnet18"], be, SHAPE, prepare_custom_config_dict=config(be))
        d = tmp_path_factory.mktemp(backend)
        out[backend] = (q, d, convert_deploy(q, be, {"x": SHAPE}, output_path=str(d), model_name="r18"))
    return out


@pytest.mark.parametrize("backend", list(FILES))
def test_every_backend_writes_mqbench_files_that_pass_the_checker(backend, deployed_resnet18):
    q, d, written = deployed_resnet18[backend]
    assert sorted(written) == sorted(str(d / f.format("r18")) for f in FILES[backend])
    assert not [f for f in os.listdir(d) if f.startswith(".")]  # no temporary left
    for path in written:
        if path.endswith(".onnx"):
            onnx.checker.check_model(onnx.load(path))
    if backend in FLOAT_DEPLOY:
        proto = onnx.load(str(d / f"r18{FLOAT_DEPLOY[backend]}.onnx"))
        assert not FAKE_QUANT_OPS & {n.op_type for n in proto.graph.node}
        assert not any(n.domain == "mqbench" for n in proto.graph.node)


@pytest.mark.parametrize("backend", list(FLOAT_DEPLOY))
def test_float_deploy_models_compute_the_merged_float_model(backend, deployed_resnet18):
    """The fake-quant-free model of each linear backend is the BN-merged float net with each
    weight clipped to the range its quantizer represents, [(qmin - z) s, (qmax - z) s] (a rounded
    zero point or a power-of-two scale can cut the extreme weights)."""
    ort.require()
    q, d, _ = deployed_resnet18[backend]
    ref = deploy_copy(q)
    with torch.no_grad():
        for m in ref.modules():
            if hasattr(m, "weight_fake_quant"):
                fq = m.weight_fake_quant
                if hasattr(fq, "data_max"):  # NNIE clips to +-data_max
                    lo, hi = -fq.data_max, fq.data_max
                else:  # the quantizer maps +-huge to the ends of its range (per channel)
                    lo = fq(torch.full_like(m.weight, -1e30))
                    hi = fq(torch.full_like(m.weight, 1e30))
                m.weight.copy_(torch.max(torch.min(m.weight, hi), lo))
    disable_all(ref)
    x = inputs()
    with torch.no_grad():
        ours = ref(x)
    theirs = list(ort.run(as_bytes(d / f"r18{FLOAT_DEPLOY[backend]}.onnx"), {"x": x}).values())[0]
    assert (ours - theirs).abs().max() <= 1e-4 * ours.abs().max()


def test_tensorrt_clip_ranges_are_127_scales_of_the_activations(deployed_resnet18):
    q, d, _ = deployed_resnet18["Tensorrt"]
    ranges = json.load(open(d / "r18_clip_ranges.json"))["tensorrt"]["blob_range"]
    scales = sorted(m.scale.item() * 127 for n, m in q.named_modules()
                    if n.endswith("_post_act_fake_quantizer"))
    assert len(ranges) >= len(scales)
    values = sorted(set(ranges.values()))
    for s in scales:
        assert min(abs(v - s) for v in values) <= 1e-6 * s
    deploy_tensors = set()
    proto = onnx.load(str(d / "r18_deploy_model.onnx"))
    for n in proto.graph.node:
        deploy_tensors.update(n.input)
    assert set(ranges) <= deploy_tensors | {o.name for o in proto.graph.output}
    assert ranges["x"] == pytest.approx(q.x_post_act_fake_quantizer.scale.item() * 127)


def test_tensorrt_calibration_cache_holds_the_scales_of_the_qdq_model(deployed_resnet18):
    """<name>_calib.cache (trtexec --calib): every tensor of blob_range, the ones
    post_process_clip_ranges gave a range included, each with the float32 of range / 127, which
    is bit for bit the scale of the same tensor's QuantizeLinear in onnx_quantized_model.onnx
    (what deploy_to_qlinear writes from the same export) and the quantizer's own scale."""
    q, d, _ = deployed_resnet18["Tensorrt"]
    qdq, _ = _C.deploy_translate(as_bytes(d / "r18.onnx"), "tensorrt_qlinear", "r18")
    cache = check_calibration_cache(d, "r18", qdq["onnx_quantized_model.onnx"])
    fakeq = _C.deploy_fake_quant_params(as_bytes(d / "r18.onnx"))
    propagated = set(cache) - {fq["input"] for fq in fakeq}
    assert propagated  # the Flatten input: a range post_process_clip_ranges copied
    x_scale = q.x_post_act_fake_quantizer.scale.detach().numpy().astype("float32")
    assert cache["x"] == int(x_scale.reshape(-1).view("uint32")[0])


def test_snpe_encodings_have_wide_integer_minimums(deployed_resnet18):
    """MQBench main computes qmin - z in uint8 and gets a positive minimum for the input
    (A.13.2); an asymmetric range around zero must have min < 0 < max."""
    q, d, _ = deployed_resnet18["SNPE"]
    enc = json.load(open(d / "r18_clip_ranges.json"))
    assert enc["param_encodings"] == {}
    x = enc["activation_encodings"]["x"]
    assert len(x) == 1 and x[0]["bitwidth"] == 8 and x[0]["min"] < 0 < x[0]["max"]
    fq = q.x_post_act_fake_quantizer
    s, z = fq.scale.item(), int(fq.zero_point.round().item())
    assert x[0]["min"] == pytest.approx(s * (0 - z)) and x[0]["max"] == pytest.approx(s * (255 - z))


def test_ppl_entries_and_16bit_activations(deployed_resnet18):
    q, d, _ = deployed_resnet18["PPLW8A16"]
    ppl = json.load(open(d / "r18_clip_ranges.json"))["ppl"]
    x = ppl["x"]
    assert list(x) == ["step", "zero_point", "min", "max", "bit", "type"]
    assert x["bit"] == 16 and x["type"] == "biased"
    fq = q.x_post_act_fake_quantizer
    assert x["zero_point"] == int(fq.zero_point.round().item())  # not truncated to uint8
    assert x["min"] == pytest.approx(x["step"] * (0 - x["zero_point"]))
    assert ppl["conv1.weight"]["bit"] == 8


def test_ppl_cuda_writes_plain_text_ranges(deployed_resnet18):
    _, d, _ = deployed_resnet18["PPLCUDA"]
    lines = open(d / "r18_clip_ranges.json").read().splitlines()
    assert lines and all(": " in line for line in lines)
    name, value = lines[0].rsplit(": ", 1)
    assert float(value) > 0


def test_vitis_scales_nnie_gfpq_stpu_minmax_and_tengine_scales(deployed_resnet18):
    _, d, _ = deployed_resnet18["Vitis"]
    vitis = json.load(open(d / "r18_clip_ranges.json"))["vitis"]
    assert all(set(v) == {"scale"} and v["scale"] > 0 for v in vitis.values())
    # power-of-two scales (TQT)
    assert all(abs(torch.log2(torch.tensor(v["scale"])).item() % 1) < 1e-6 for v in vitis.values())
    # the fused convolutions' bias scales (MQBench 1.10's Vitis bias quantizers): 20 convs
    assert len([k for k in vitis if k.endswith(".bias")]) == 20
    _, d, _ = deployed_resnet18["NNIE"]
    gfpq = json.load(open(d / "r18_gfpq_param_dict.json"))["nnie"]["gfpq_param_dict"]
    assert gfpq and all(isinstance(v, list) and all(c > 0 for c in v) for v in gfpq.values())
    proto = onnx.load(str(d / "r18_deploy_model.onnx"))
    assert {n.name for n in proto.graph.node} >= set(gfpq)
    _, d, _ = deployed_resnet18["STPU"]
    stpu = json.load(open(d / "r18_stpu_minmax.json"))
    assert stpu["x"]["min"] == -stpu["x"]["max"]
    assert any(k.endswith("_weights") for k in stpu) and any(k.endswith("_bias") for k in stpu)
    assert any("emin" in v for v in stpu.values())
    # The merged ReLUs are modules named relu on their parents, as MQBench inserts them, so
    # the exporter scopes them and the keys are MQBench's: /relu/Relu_output_0 (the stem's),
    # not an unscoped /Relu_output_0.
    assert "/relu/Relu_output_0" in stpu
    assert not [k for k in stpu if k.startswith("/Relu")]
    _, d, _ = deployed_resnet18["Tengine_u8"]
    rows = [line.split() for line in open(d / "r18_for_tengine.scale")]
    assert rows and all(len(r) == 3 and float(r[1]) > 0 and 0 <= int(r[2]) <= 255 for r in rows)


def test_openvino_fakequantize_nodes(deployed_resnet18):
    q, d, _ = deployed_resnet18["OPENVINO"]
    proto = onnx.load(str(d / "r18_deploy_model.onnx"))
    fqs = [n for n in proto.graph.node if n.op_type == "FakeQuantize"]
    assert len(fqs) == sum(isinstance(m, QuantizeBase) for m in q.modules())
    assert all(n.domain == "org.openvinotoolkit" for n in fqs)
    inits = {i.name: i for i in proto.graph.initializer}
    conv_w = [n for n in fqs if n.input[0] == "conv1.weight"][0]
    levels = onnx.helper.get_attribute_value(conv_w.attribute[0])
    assert levels == 256  # 7-bit weights written as 256 levels, as MQBench
    assert list(inits[conv_w.input[1]].dims) == [64, 1, 1, 1]


def test_qmin_max_dict_is_refilled_per_export(deployed_resnet18, nets, tmp_path):
    q = calibrated(nets["resnet18"], BackendType.Tensorrt, SHAPE)
    convert_deploy(q, BackendType.Tensorrt, {"x": SHAPE}, output_path=str(tmp_path), model_name="a")
    first = dict(qmin_max_dict)
    assert first and set(first.values()) == {(-127, 127)}
    q2 = calibrated(SmallNet().eval(), BackendType.Tensorrt, [2, 3, 16, 16])
    convert_deploy(q2, BackendType.Tensorrt, {"x": [2, 3, 16, 16]}, output_path=str(tmp_path), model_name="b")
    assert len(qmin_max_dict) == sum(isinstance(m, QuantizeBase) for m in q2.modules())


# ---- BN merge -------------------------------------------------------------------------------

class FusedZoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.deconv, self.dbn = nn.ConvTranspose2d(8, 8, 2, stride=2, groups=2), nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.fc, self.fbn = nn.Linear(8 * 16 * 16, 10), nn.BatchNorm1d(10)

    def forward(self, x):
        y = self.relu(self.bn(self.conv(x)))
        y = self.relu(self.dbn(self.deconv(y)))
        return self.fbn(self.fc(torch.flatten(y, 1)))


def test_merge_bn_folds_every_fused_module_and_keeps_the_weight_quantizers():
    from mqbench.fusion_method import convert_merge_bn
    torch.manual_seed(0)
    net = with_bn_statistics(FusedZoo(), (8, 3, 8, 8))
    q = calibrated(net, BackendType.Tensorrt, [8, 3, 8, 8])
    before = {n: m.weight_fake_quant for n, m in q.named_modules() if hasattr(m, "weight_fake_quant")}
    assert {n for n, m in q.named_modules() if hasattr(m, "bn")} == {"conv", "deconv", "fc"}
    merged = convert_merge_bn(copy.deepcopy(q))
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in merged.modules())
    for n, fq in before.items():
        new = merged.get_submodule(n)
        assert torch.equal(new.weight_fake_quant.scale, fq.scale)
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = q(x), merged(x)
        assert (a - b).abs().max() <= 1e-3 * a.abs().max()
        fa, fb = copy.deepcopy(q), copy.deepcopy(merged)
        disable_all(fa), disable_all(fb)
        assert torch.allclose(fa(x), fb(x), rtol=1e-4, atol=1e-5)


def test_bn_merge_keeps_the_caller_model_untouched(tmp_path):
    q = calibrated(SmallNet().eval(), BackendType.Tensorrt, [2, 3, 16, 16])
    enable_calibration(q)  # the deploy copy turns observers off; the caller's stay on
    q.train()
    state = copy.deepcopy(q.state_dict())
    convert_deploy(q, BackendType.Tensorrt, {"x": [2, 3, 16, 16]}, output_path=str(tmp_path))
    assert hasattr(q.conv1, "bn") and q.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in q.state_dict().items())
    assert q.training and q.x_post_act_fake_quantizer.observer_enabled.item() == 1


# ---- bad input ------------------------------------------------------------------------------

def test_unwritable_output_path_fails_before_any_work(tmp_path):
    q = calibrated(SmallNet().eval(), BackendType.Tensorrt, [2, 3, 16, 16])
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        convert_deploy(q, BackendType.Tensorrt, {"x": [2, 3, 16, 16]}, output_path=str(blocker))
    with pytest.raises(ValueError, match="cannot create output directory"):
        convert_deploy(q, BackendType.Tensorrt, {"x": [2, 3, 16, 16]},
                       output_path=str(blocker / "sub"))
    assert os.listdir(tmp_path) == ["file"]


def test_unprepared_model_and_bad_arguments_are_refused(tmp_path):
    with pytest.raises(TypeError, match="GraphModule"):
        convert_deploy(SmallNet(), BackendType.Tensorrt, {"x": [1, 3, 16, 16]}, output_path=str(tmp_path))
    traced = torch.fx.symbolic_trace(SmallNet())
    with pytest.raises(ValueError, match="not prepared"):
        convert_deploy(traced, BackendType.Tensorrt, {"x": [1, 3, 16, 16]}, output_path=str(tmp_path))
    q = calibrated(SmallNet().eval(), BackendType.Tensorrt, [2, 3, 16, 16])
    with pytest.raises(ValueError, match="input_shape_dict"):
        convert_deploy(q, BackendType.Tensorrt, output_path=str(tmp_path))
    with pytest.raises(TypeError, match="BackendType"):
        convert_deploy(q, "Tensorrt", {"x": [1, 3, 16, 16]}, output_path=str(tmp_path))
    with pytest.raises(TypeError, match="unexpected keyword"):
        convert_deploy(q, BackendType.Tensorrt, {"x": [1, 3, 16, 16]}, output_path=str(tmp_path), opset=11)
    assert os.listdir(tmp_path) == []


class Unexportable(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.cummax(self.conv(x), 1)[0]


def test_an_op_the_export_cannot_handle_is_named(tmp_path):
    q = calibrated(Unexportable().eval(), BackendType.Tensorrt, [2, 3, 8, 8])
    # the TorchScript exporter's error names the op, and the other exporter to try
    with pytest.raises(ValueError, match=r"pass dynamo=True\).*cummax"):
        convert_deploy(q, BackendType.Tensorrt, {"x": [2, 3, 8, 8]}, output_path=str(tmp_path),
                       dynamo=False)
    assert not [f for f in os.listdir(tmp_path) if not f.endswith(".onnx") or f.startswith(".")]


def test_a_translator_failure_writes_nothing(tmp_path):
    """Vitis refuses per-channel weights: the translator fails before its files are written."""
    q = calibrated(SmallNet().eval(), BackendType.Tensorrt, [2, 3, 16, 16])
    convert_deploy(q, BackendType.Tensorrt, {"x": [2, 3, 16, 16]}, output_path=str(tmp_path), model_name="m")
    model = as_bytes(tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="per-channel"):
        _C.deploy_translate(model, "vitis", "v")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match="per-channel"):
        from mqbench.convert_deploy import deploy_qparams_vitis
        deploy_qparams_vitis(None, onnx_model_path=str(tmp_path / "m.onnx"), model_name="v",
                             output_path=str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage"])
def test_corrupt_onnx_is_a_clear_error(damage, tmp_path):
    q = calibrated(SmallNet().eval(), BackendType.Tensorrt, [2, 3, 16, 16])
    good = export_fakeq(deploy_copy(q), [2, 3, 16, 16], tmp_path)
    bad = {"empty": b"", "truncated": good[: len(good) // 2], "garbage": b"\x08\x07not onnx" * 50}[damage]
    with pytest.raises(ValueError, match="empty|not a valid ONNX|truncated|no graph"):
        _C.deploy_translate(bad, "tensorrt", "m")


def test_a_wrapped_model_is_refused_with_the_fix(tmp_path):
    model = calibrated(SmallNet().eval(), BackendType.Tensorrt, [1, 3, 8, 8])
    with pytest.raises(TypeError, match=r"convert_deploy\(model.module"):
        convert_deploy(torch.nn.DataParallel(model), BackendType.Tensorrt,
                       {"x": [1, 3, 8, 8]}, output_path=str(tmp_path))


# ---- MQBench's detection-style models: one dict in, nested dicts out (test_det_model.py) ------

class DictModel(nn.Module):
    """MQBench's test_det_model.py, test_model1: the dict it gets is updated and returned."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 3, 3, 3)

    def forward(self, input):
        x = input["x"]
        y = self.conv1(x)
        input.update({"y": {"z": y}})
        return input


class _Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 3, 3, 3)
        self.bn1 = nn.BatchNorm2d(3)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(3, 3, 3, 3)
        self.bn2 = nn.BatchNorm2d(3)

    def forward(self, input):
        x = input["x"]
        y = self.relu(self.bn1(self.conv1(x)))
        input.update({"y": self.bn2(self.conv2(y))})
        return input


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 3, 3, 3)

    def forward(self, input):
        input.update({"z": self.conv1(input["y"])})
        return input


class TwoStageModel(nn.Module):
    """test_det_model.py, test_model2."""

    def __init__(self):
        super().__init__()
        self.backbone = _Backbone()
        self.head = _Head()

    def forward(self, input):
        input.update(self.backbone(input))
        input.update(self.head(input))
        return input


def _trained_dict_model(model, backend, x):
    from mqbench.prepare_by_platform import prepare_by_platform
    from mqbench.utils.state import enable_quantization
    model.train()
    prepared = prepare_by_platform(model, backend)
    enable_calibration(prepared)
    prepared({"x": x})
    enable_quantization(prepared)
    out = prepared({"x": x})
    loss = out["y"]["z"].sum() if isinstance(out["y"], dict) else out["z"].sum()
    loss.backward()
    return prepared.eval()


# The dict returned holds the input "x" too: that output is "x_out", so the input keeps "x".
DICT_CASES = [(DictModel, BackendType.PPLW8A16, ["x_out", "y.z"]),
              (TwoStageModel, BackendType.SNPE, ["x_out", "y", "z"])]


@pytest.mark.parametrize("form", ["dict", "tuple", "input_shape_dict"])
@pytest.mark.parametrize("net,backend,outputs", DICT_CASES, ids=["model1", "two_stage"])
def test_a_model_taking_one_dict_deploys(net, backend, outputs, form, tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 224, 224)
    prepared = _trained_dict_model(net(), backend, x)
    kwargs = {"dict": {"dummy_input": {"x": x}}, "tuple": {"dummy_input": ({"x": x},)},
              "input_shape_dict": {"input_shape_dict": {"x": [1, 3, 224, 224]}}}[form]
    written = convert_deploy(prepared, backend, output_path=str(tmp_path), model_name="det",
                             **kwargs)
    assert str(tmp_path / "det_deploy_model.onnx") in written
    fakeq = onnx.load(str(tmp_path / "det.onnx"))
    assert [i.name for i in fakeq.graph.input] == ["x"]
    assert [o.name for o in fakeq.graph.output] == outputs
    deployed = onnx.load(str(tmp_path / "det_deploy_model.onnx"))
    onnx.checker.check_model(deployed, full_check=True)
    assert not any(n.domain == "mqbench" for n in deployed.graph.node)
    # the deployed model runs on the dict's tensor and returns the nested outputs in order
    # (a translator renames an output that a fake quantizer wrote to the tensor it quantized,
    # as MQBench's does; its weights are clipped to their quantization range, so the values
    # are the float model's only up to that clipping)
    with torch.no_grad():
        want = [t for _, t in _flatten_names(prepared({"x": x}))]
    got = list(ort.run(deployed.SerializeToString(), {"x": x}).values())
    assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
    assert torch.equal(got[0], x)  # "x_out": the input passed through
    for name, g, w in zip(outputs[1:], got[1:], want[1:]):
        assert torch.allclose(g, w, atol=0.1 * w.abs().max().item()), name
    assert set(kwargs.get("dummy_input", ({},))[0] if form == "tuple"
               else kwargs.get("dummy_input", {})) <= {"x"}  # the caller's dict is not updated


def _flatten_names(value, prefix=""):
    if isinstance(value, torch.Tensor):
        return [(prefix, value)]
    return [kv for k, v in value.items() for kv in _flatten_names(v, f"{prefix}.{k}" if prefix else k)]


def test_input_shape_dict_names_still_name_a_plain_models_input(tmp_path):
    """A key that is not forward()'s parameter name names the ONNX input, as before (the dict
    form is only for a model that reads those keys from its one argument)."""
    q = calibrated(SmallNet().eval(), BackendType.Tensorrt, [2, 3, 16, 16])
    convert_deploy(q, BackendType.Tensorrt, {"data": [2, 3, 16, 16]}, output_path=str(tmp_path),
                   model_name="m")
    assert [i.name for i in onnx.load(str(tmp_path / "m.onnx")).graph.input] == ["data"]


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x, scale=None, shift=None):
        y = self.conv(x) * scale
        return y if shift is None else y + shift


@pytest.mark.parametrize("dynamo", [False, True])
def test_a_dict_dummy_input_gives_forwards_keyword_arguments(dynamo, tmp_path):
    """dummy_input={parameter: tensor} for a model that does not take one dict: the keyword
    arguments of forward(), the ONNX inputs in forward()'s order whatever the dict's order
    (before: a KeyError from torch's exporter, or the dict taken as the first argument)."""
    q = prepare_by_platform(TwoInputs().eval(), BackendType.Tensorrt)
    g = torch.Generator().manual_seed(0)
    x, shift = torch.randn(2, 3, 8, 8, generator=g), torch.randn(2, 4, 6, 6, generator=g)
    scale = torch.rand(1, generator=g) + 0.5
    enable_calibration(q)
    with torch.no_grad():
        q(x, scale, shift)
    enable_quantization(q)
    q.eval()
    with torch.no_grad():
        ref = q(x, scale, shift)
    convert_deploy(q, BackendType.Tensorrt, dummy_input={"shift": shift, "x": x, "scale": scale},
                   output_path=str(tmp_path), model_name="m", deploy_to_qlinear=True,
                   dynamo=dynamo)
    model = onnx.load(str(tmp_path / "m.onnx"))
    assert [i.name for i in model.graph.input] == ["x", "scale", "shift"]
    got = ort.run((tmp_path / "onnx_quantized_model.onnx").read_bytes(),
                  {"x": x, "scale": scale, "shift": shift}, optimize=False)
    # the same values up to a rounding boundary (x / s in onnxruntime, x * (1 / s) here);
    # inputs taken in another order would differ everywhere
    diff = (next(iter(got.values())) - ref).abs()
    assert (diff > 1e-5).float().mean() < 0.01 and diff.max() < 0.05 * ref.abs().max()
    with pytest.raises(ValueError, match=r"dummy_input names \['bias'\], which are not "
                                         r"parameters of .*\['x', 'scale', 'shift'\]"):
        convert_deploy(q, BackendType.Tensorrt, dummy_input={"x": x, "bias": shift},
                       output_path=str(tmp_path), model_name="m2", dynamo=dynamo)


# ---- one transaction: the intermediate export belongs to the deploy's set --------------------

def test_a_failed_deploy_leaves_the_whole_old_set(tmp_path):
    """The translator's files and <model_name>.onnx are committed together: when a final name is
    blocked (a directory where a file goes), the old set stays whole, the export included."""
    q = calibrated(SmallNet().eval(), BackendType.Tensorrt, [2, 3, 16, 16])
    convert_deploy(q, BackendType.Tensorrt, {"x": [2, 3, 16, 16]}, output_path=str(tmp_path),
                   model_name="m")
    old = {f: as_bytes(tmp_path / f) for f in os.listdir(tmp_path)}
    assert set(old) == {"m.onnx", "m_deploy_model.onnx", "m_clip_ranges.json", "m_calib.cache"}
    # another calibration: a half-written new set would show in the bytes
    q2 = calibrated(SmallNet().eval(), BackendType.Tensorrt, [2, 3, 16, 16], seed=3)
    (tmp_path / "m_clip_ranges.json").unlink()
    (tmp_path / "m_clip_ranges.json").mkdir()
    with pytest.raises(ValueError):
        convert_deploy(q2, BackendType.Tensorrt, {"x": [2, 3, 16, 16]}, output_path=str(tmp_path),
                       model_name="m")
    assert sorted(os.listdir(tmp_path)) == sorted(old)
    for f in ("m.onnx", "m_deploy_model.onnx", "m_calib.cache"):
        assert as_bytes(tmp_path / f) == old[f], f


def test_convert_onnx_alone_still_writes_its_file(tmp_path):
    """Outside convert_deploy (MQBench's step called by hand) the export is written at once."""
    from mqbench.convert_deploy import convert_onnx
    q = deploy_copy(calibrated(SmallNet().eval(), BackendType.Tensorrt, [2, 3, 16, 16]))
    convert_onnx(q, {"x": [2, 3, 16, 16]}, None, str(tmp_path / "alone.onnx"))
    assert os.listdir(tmp_path) == ["alone.onnx"]


# ---- after QAT: learned scales clip (calibration alone hides clipping bugs) --------------------

def _after_qat(backend, shape, steps=40):
    """SmallNet prepared for `backend`, calibrated, then `steps` Adam steps (lr 1e-2) that move
    the learned scales until weights and activations clip."""
    from mqbench.utils.state import enable_quantization
    torch.manual_seed(0)
    net = with_bn_statistics(SmallNet(), (8, 3, 16, 16))
    q = calibrated(net, backend, shape, prepare_custom_config_dict=config(backend))
    q.train()
    enable_quantization(q)
    opt = torch.optim.Adam(q.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(4)
    for _ in range(steps):
        x = torch.randn(*shape, generator=g)
        loss = (q(x) - x.mean((1, 2, 3))[:, None]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return q.eval()


@pytest.mark.parametrize("backend", ["QDQ", "Tensorrt", "Academic"])
def test_deployed_qdq_models_agree_after_qat(backend, tmp_path):
    """The QDQ artifacts (QDQ, Tensorrt's deploy_to_qlinear model, Academic) against the
    fake-quant model after QAT, where the learned scales make the artifact's clipping and
    rounding show. Run op by op as written (onnxruntime's graph optimizations off), the file
    computes the fake-quant model exactly: every quantized value identical. With them on,
    onnxruntime fuses QDQ + Conv into its integer kernels, whose int32 bias rounds to
    s_x * s_w: after QAT (s_x grew from 0.03 to 0.1 here) that flips up to a few percent of
    the values near a rounding tie by one step, the runtime's trade-off, checked loosely."""
    ort.require()
    shape = [2, 3, 16, 16]
    q = _after_qat(BackendType[backend], shape)
    merged = deploy_copy(q) if backend != "Academic" else export_copy_of(q)
    out = tmp_path / "out"
    convert_deploy(q, BackendType[backend], {"x": shape}, output_path=str(out), model_name="s",
                   deploy_to_qlinear=backend == "Tensorrt")
    deployed = as_bytes(out / ("onnx_quantized_model.onnx" if backend == "Tensorrt" else "s.onnx"))
    tensors = activation_tensors(export_fakeq(merged, shape, tmp_path))
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(9))
    stats, ours, theirs = lockstep(merged, x, deployed, tensors, optimize=False)
    assert all(differ == 0 for differ, _, _ in stats.values()), stats
    assert (ours - theirs).abs().max() <= 1e-5 * max(1.0, ours.abs().max().item())
    stats, _, _ = lockstep(merged, x, deployed, tensors)
    check_lockstep(stats, identical=0.95)


def export_copy_of(q):
    from mqbench.convert_deploy import export_copy
    return export_copy(q)


class ZeroHead(nn.Module):
    """A zero-initialised head (torchvision's ViT with weights=None): its weight quantizer and
    its output quantizer only ever see zeros."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Conv2d(4, 2, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)))


def test_nnie_deploys_a_quantizer_calibrated_on_zeros(tmp_path, caplog):
    """data_max 0 is a range of {0}: the quantizer warns once and outputs zeros, and the deploy
    writes it with a note instead of refusing it as uncalibrated."""
    import logging
    import warnings
    q = calibrated(ZeroHead().eval(), BackendType.NNIE, [2, 3, 8, 8])
    fq = q.head.weight_fake_quant
    assert float(fq.data_max) == 0.0
    x = torch.randn(2, 3, 8, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            out = q(x)
            q(x)
    assert torch.equal(out, torch.zeros_like(out))
    assert sum("data_max is 0" in str(w.message) for w in caught) >= 1
    with caplog.at_level(logging.INFO, logger="MQBENCH"):
        written = convert_deploy(q, BackendType.NNIE, {"x": [2, 3, 8, 8]},
                                 output_path=str(tmp_path), model_name="z")
    assert str(tmp_path / "z_gfpq_param_dict.json") in written
    assert any("quantizes to 0" in r.getMessage() for r in caplog.records)
    deployed = onnx.load(str(tmp_path / "z_deploy_model.onnx"))
    head_w = [i for i in deployed.graph.initializer if i.name == "head.weight"]
    assert head_w and not onnx.numpy_helper.to_array(head_w[0]).any()
