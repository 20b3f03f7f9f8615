"""mqbench.deploy: MQBench's deploy steps one at a time, over the C++ translators.

Each step, run on the fake-quantized ONNX that convert_deploy exports, must write the files
convert_deploy writes for its backend, byte for byte; a subclass that overrides
post_process_clip_ranges, translate or write_files changes the output, one that overrides a
method the translator does inside is warned; bad input is a clear error; the ONNXGraph helpers
on small graphs built here."""
import importlib
import inspect
import json
import os
import shutil

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from deploy_helpers import as_bytes, calibrated, check_calibration_cache, float32_bits
from mqbench.convert_deploy import convert_deploy, convert_onnx, export_copy
from mqbench.fusion_method import convert_merge_bn
from mqbench.prepare_by_platform import BackendType
from test_prepare_by_platform import with_bn_statistics

import mqbench.deploy as deploy
from mqbench.deploy import common
from mqbench.deploy.deploy_linear import LinearQuantizer_process
from mqbench.deploy.deploy_stpu import STPU_process
from mqbench.deploy.deploy_tengine import Tengine_process

from test_convert_deploy import SmallNet  # noqa: E402

SHAPE = [2, 3, 16, 16]
NAME = "net"


# conv-bn-relu, a residual add, average pooling, a flatten (a range passed upstream by
# post_process_clip_ranges) and a classifier: test_convert_deploy's SmallNet.
Net = SmallNet


def linear(backend):
    return lambda path, name: deploy.remove_fakequantize_and_collect_params(path, name, backend)


# backend -> the step on (fake-quantized ONNX path, model name); None: see the QNN test.
STEPS = {
    "Tensorrt": linear("tensorrt"),
    "SNPE": linear("snpe"),
    "PPLW8A16": linear("ppl"),
    "Vitis": linear("vitis"),
    "PPLCUDA": linear("ppl-cuda"),
    "NNIE": deploy.remove_fakequantize_and_collect_params_nnie,
    "Tengine_u8": deploy.remove_fakequantize_and_collect_params_tengine,
    "STPU": deploy.remove_fakequantize_and_collect_params_stpu,
    "OPENVINO": deploy.replace_fakequantize_and_collect_params_openvino,
}


@pytest.fixture(scope="module")
def prepared():
    """{backend: the calibrated Net prepared for it}."""
    torch.manual_seed(0)
    net = with_bn_statistics(Net(), (8, 3, 16, 16))
    return {b: calibrated(net, BackendType[b], SHAPE) for b in list(STEPS) + ["ONNX_QNN"]}


@pytest.fixture(scope="module")
def deployed(prepared, tmp_path_factory):
    """{backend: (convert_deploy's folder, its listing)}; Tensorrt with deploy_to_qlinear."""
    out = {}
    for backend in STEPS:
        d = tmp_path_factory.mktemp(backend)
        convert_deploy(prepared[backend], BackendType[backend], {"x": SHAPE}, output_path=str(d),
                       model_name=NAME, deploy_to_qlinear=backend == "Tensorrt")
        out[backend] = (d, sorted(os.listdir(d)))
    return out


def fakeq_copy(deployed, backend, tmp_path):
    """convert_deploy's fake-quantized <name>.onnx, alone in a fresh folder."""
    d, _ = deployed[backend]
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / f"{NAME}.onnx"
    shutil.copyfile(d / f"{NAME}.onnx", path)
    return path


def same_files(a, b, skip=(f"{NAME}.onnx",)):
    names = sorted(n for n in os.listdir(a) if n not in skip)
    assert names == sorted(n for n in os.listdir(b) if n not in skip)
    for n in names:
        assert as_bytes(a / n) == as_bytes(b / n), n
    return names


# ---- module paths ---------------------------------------------------------------------------

def test_every_module_path_imports_with_mqbench_names():
    for mod in ("common", "deploy_linear", "deploy_nnie", "deploy_tengine", "deploy_stpu",
                "deploy_openvino", "deploy_onnx_qnn", "deploy_onnx_qlinear", "convert_xir"):
        importlib.import_module(f"mqbench.deploy.{mod}")
    assert sorted(deploy.__all__) == sorted([
        "remove_fakequantize_and_collect_params", "remove_fakequantize_and_collect_params_nnie",
        "ONNXQLinearPass", "ONNXQNNPass", "replace_fakequantize_and_collect_params_openvino",
        "remove_fakequantize_and_collect_params_tengine", "remove_fakequantize_and_collect_params_stpu",
        # mqbench's own: the check of a deployed file (not in MQBench)
        "check_deploy", "DeployCheckReport"])
    # Bound methods of module-level instances, as in MQBench.
    owners = {"remove_fakequantize_and_collect_params": "LinearQuantizer_process",
              "remove_fakequantize_and_collect_params_nnie": "NNIE_process",
              "remove_fakequantize_and_collect_params_tengine": "Tengine_process",
              "remove_fakequantize_and_collect_params_stpu": "STPU_process",
              "replace_fakequantize_and_collect_params_openvino": "OPENVINO_process"}
    for name, cls in owners.items():
        f = getattr(deploy, name)
        assert inspect.ismethod(f) and type(f.__self__).__name__ == cls, name
    assert issubclass(deploy.ONNXQLinearPass, deploy.ONNXQNNPass)
    assert issubclass(Tengine_process, LinearQuantizer_process)
    assert issubclass(STPU_process, LinearQuantizer_process)
    for name in ("ONNXGraph", "OnnxPreprocess", "update_inp2node_out2node", "prepare_data",
                 "prepare_initializer", "parse_attrs", "get_constant_inputs"):
        assert hasattr(common, name), name


# ---- each step writes convert_deploy's files ------------------------------------------------

@pytest.mark.parametrize("backend", list(STEPS))
def test_each_step_writes_the_files_of_convert_deploy(backend, deployed, tmp_path):
    path = fakeq_copy(deployed, backend, tmp_path)
    written = STEPS[backend](str(path), NAME)
    names = same_files(deployed[backend][0], tmp_path / "in",
                       skip=(f"{NAME}.onnx", "onnx_quantized_model.onnx"))
    assert sorted(written) == sorted(str(tmp_path / "in" / n) for n in names)
    assert as_bytes(path) == as_bytes(deployed[backend][0] / f"{NAME}.onnx")  # input untouched
    if backend == "Tensorrt":  # the clip ranges hold the Flatten input, found downstream
        ranges = json.load(open(tmp_path / "in" / f"{NAME}_clip_ranges.json"))["tensorrt"]["blob_range"]
        flatten = next(n for n in onnx.load(str(path)).graph.node if n.op_type == "Flatten")
        assert ranges[flatten.input[0]] == ranges[flatten.output[0]]
        # and TensorRT's calibration cache of the same ranges, the QDQ model's scales
        cache = check_calibration_cache(tmp_path / "in", NAME, as_bytes(
            deployed[backend][0] / "onnx_quantized_model.onnx"))
        assert flatten.input[0] in cache


def test_qlinear_pass_writes_the_qdq_model_of_deploy_to_qlinear(deployed, tmp_path):
    path = fakeq_copy(deployed, "Tensorrt", tmp_path)
    p = deploy.ONNXQLinearPass(str(path))
    assert p.onnx_model_path == str(path)
    written = p.run()
    assert written == [str(tmp_path / "in" / "onnx_quantized_model.onnx")]
    assert as_bytes(written[0]) == as_bytes(deployed["Tensorrt"][0] / "onnx_quantized_model.onnx")
    assert sorted(os.listdir(tmp_path / "in")) == ["net.onnx", "onnx_quantized_model.onnx"]


def test_qnn_pass_writes_the_model_of_convert_deploy(prepared, tmp_path):
    """convert_deploy's ONNX_QNN replaces its <name>.onnx with the QLinear model, so the input is
    exported here as convert_deploy exports it; run(name) writes next to the input (MQBench: in
    the current directory), and with the input's own name replaces it, as convert_deploy."""
    q = prepared["ONNX_QNN"]
    ref = tmp_path / "ref"
    convert_deploy(q, BackendType.ONNX_QNN, {"x": SHAPE}, output_path=str(ref), model_name=NAME)
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / f"{NAME}.onnx"
    convert_onnx(convert_merge_bn(export_copy(q)), {"x": SHAPE}, None, str(path))
    fakeq = as_bytes(path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert deploy.ONNXQNNPass(str(path)).run("other") == [str(tmp_path / "in" / "other.onnx")]
        assert not (tmp_path / "other.onnx").exists()  # not in the current directory
        assert as_bytes(path) == fakeq
        assert deploy.ONNXQNNPass(str(path)).run(NAME) == [str(path)]
    finally:
        os.chdir(cwd)
    assert as_bytes(path) == as_bytes(ref / f"{NAME}.onnx") == as_bytes(tmp_path / "in" / "other.onnx")
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"QLinearConv", "QLinearAdd"} <= ops


def test_qnn_pass_deploys_the_edits_made_to_its_onnx_model(tmp_path, prepared):
    """MQBench's passes work on self.onnx_model: edits to it before run() are deployed."""
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / f"{NAME}.onnx"
    convert_onnx(convert_merge_bn(export_copy(prepared["ONNX_QNN"])), {"x": SHAPE}, None, str(path))
    p = deploy.ONNXQNNPass(str(path))
    p.onnx_model.model.metadata_props.append(onnx.StringStringEntryProto(key="k", value="v"))
    p.run("edited")
    props = {e.key: e.value for e in onnx.load(str(tmp_path / "in" / "edited.onnx")).metadata_props}
    assert props.get("k") == "v"


def test_translate_runs_a_step_on_a_model_in_memory(deployed, tmp_path):
    """translate() takes bytes, an onnx.ModelProto or an ONNXGraph and writes nothing."""
    d, _ = deployed["SNPE"]
    proto = onnx.load(str(d / f"{NAME}.onnx"))
    process = LinearQuantizer_process()
    for model in (as_bytes(d / f"{NAME}.onnx"), proto, common.ONNXGraph(proto), str(d / f"{NAME}.onnx")):
        files = process.translate(model, "mem", "snpe")
        assert sorted(files) == ["mem_clip_ranges.json", "mem_deploy_model.onnx"]
        assert files["mem_clip_ranges.json"] == as_bytes(d / f"{NAME}_clip_ranges.json")
    assert sorted(os.listdir(d)) == deployed["SNPE"][1]


# ---- overriding one step --------------------------------------------------------------------

class Extra(LinearQuantizer_process):
    """Adds one range and renames the deploy graph."""

    def post_process_clip_ranges(self, clip_ranges, graph, inp2node):
        assert isinstance(graph, onnx.GraphProto) and isinstance(inp2node, dict)
        clip_ranges = super().post_process_clip_ranges(clip_ranges, graph, inp2node)
        clip_ranges["extra"] = np.float32(0.5)  # numpy values are written as numbers
        graph.name = "renamed"
        return clip_ranges


class Same(LinearQuantizer_process):
    """Overrides the step with the built-in rule: the round trip through Python changes nothing."""

    def post_process_clip_ranges(self, clip_ranges, graph, inp2node, out2node):
        assert isinstance(out2node, dict)  # MQBench main's signature gets out2node
        return super().post_process_clip_ranges(clip_ranges, graph, inp2node, out2node)


@pytest.mark.parametrize("backend,step", [("Tensorrt", "tensorrt"), ("PPLCUDA", "ppl-cuda")])
def test_overriding_post_process_clip_ranges_changes_the_output(backend, step, deployed, tmp_path):
    path = fakeq_copy(deployed, backend, tmp_path)
    Same().remove_fakequantize_and_collect_params(str(path), NAME, step)
    same_files(deployed[backend][0], tmp_path / "in", skip=(f"{NAME}.onnx", "onnx_quantized_model.onnx"))

    Extra().remove_fakequantize_and_collect_params(str(path), NAME, step)
    ref_dir = deployed[backend][0]
    text = open(tmp_path / "in" / f"{NAME}_clip_ranges.json").read()
    ref = open(ref_dir / f"{NAME}_clip_ranges.json").read()
    if step == "tensorrt":
        got = json.loads(text)["tensorrt"]["blob_range"]
        assert got == dict(json.loads(ref)["tensorrt"]["blob_range"], extra=0.5)
        # the calibration cache follows the table the override returned
        assert check_calibration_cache(tmp_path / "in", NAME)["extra"] == float32_bits(0.5 / 127)
    else:  # plain text lines
        assert text == ref + "extra: 0.5\n"
    model = onnx.load(str(tmp_path / "in" / f"{NAME}_deploy_model.onnx"))
    assert model.graph.name == "renamed"
    ref_model = onnx.load(str(ref_dir / f"{NAME}_deploy_model.onnx"))
    assert [n.op_type for n in model.graph.node] == [n.op_type for n in ref_model.graph.node]


@pytest.mark.parametrize("cls,backend", [(Tengine_process, "Tengine_u8"), (STPU_process, "STPU")])
def test_tengine_and_stpu_call_the_override_too(cls, backend, deployed, tmp_path):
    seen = []

    class Spy(cls):
        def post_process_clip_ranges(self, clip_ranges, graph, inp2node):
            seen.append(dict(clip_ranges))
            return super().post_process_clip_ranges(clip_ranges, graph, inp2node)

    path = fakeq_copy(deployed, backend, tmp_path)
    Spy().remove_fakequantize_and_collect_params(str(path), NAME)
    same_files(deployed[backend][0], tmp_path / "in")
    assert len(seen) == 1 and seen[0]
    if backend == "Tengine_u8":  # MQBench's quant_params: [scale, zero_point]
        assert all(isinstance(v, list) and len(v) == 2 for v in seen[0].values())


def test_overriding_write_files_or_translate(deployed, tmp_path):
    path = fakeq_copy(deployed, "SNPE", tmp_path)
    captured = {}

    class InMemory(LinearQuantizer_process):
        def write_files(self, output_dir, files):
            captured.update(files)
            return []

    class Annotated(LinearQuantizer_process):
        def translate(self, model, model_name, backend, qmin_max_dict=None):
            files = super().translate(model, model_name, backend, qmin_max_dict)
            files[f"{model_name}_notes.txt"] = b"deployed by a subclass\n"
            return files

    assert InMemory().remove_fakequantize_and_collect_params(str(path), NAME, "snpe") == []
    assert sorted(os.listdir(tmp_path / "in")) == [f"{NAME}.onnx"]
    assert captured[f"{NAME}_clip_ranges.json"] == as_bytes(deployed["SNPE"][0] / f"{NAME}_clip_ranges.json")
    Annotated().remove_fakequantize_and_collect_params(str(path), NAME, "snpe")
    assert (tmp_path / "in" / f"{NAME}_notes.txt").read_bytes() == b"deployed by a subclass\n"


def test_methods_the_translator_does_inside_are_named(deployed, tmp_path):
    """Calling one raises NotImplementedError naming the translator; overriding one warns that
    it is not called, and the output is the translator's."""
    with pytest.raises(NotImplementedError, match="clip_weight is done inside mqbench's C"):
        LinearQuantizer_process().clip_weight(None, {}, {}, {})
    with pytest.raises(NotImplementedError, match="'onnx_qnn' translator"):
        deploy.ONNXQNNPass.merge_relu_pass(deploy.ONNXQNNPass.__new__(deploy.ONNXQNNPass))
    with pytest.raises(NotImplementedError, match="'stpu' translator"):
        STPU_process().update_emin(None, {}, {})

    class NoClip(LinearQuantizer_process):
        def clip_weight(self, node, name2data, inp2node, named_initializer):
            pass

    path = fakeq_copy(deployed, "Tensorrt", tmp_path)
    with pytest.warns(UserWarning, match="NoClip.clip_weight is not called"):
        NoClip().remove_fakequantize_and_collect_params(str(path), NAME, "tensorrt")
    same_files(deployed["Tensorrt"][0], tmp_path / "in", skip=(f"{NAME}.onnx", "onnx_quantized_model.onnx"))


def test_a_failing_override_is_raised_and_writes_nothing(deployed, tmp_path):
    class Fails(LinearQuantizer_process):
        def post_process_clip_ranges(self, clip_ranges, graph, inp2node):
            raise KeyError("no such tensor")

    class NotADict(LinearQuantizer_process):
        def post_process_clip_ranges(self, clip_ranges, graph, inp2node):
            return list(clip_ranges)

    class NotFinite(LinearQuantizer_process):
        def post_process_clip_ranges(self, clip_ranges, graph, inp2node):
            return dict(clip_ranges, bad=float("nan"))

    class BadEntry(Tengine_process):
        def post_process_clip_ranges(self, clip_ranges, graph, inp2node):
            return dict(clip_ranges, bad="not [scale, zero_point]")

    path = fakeq_copy(deployed, "Tensorrt", tmp_path)
    with pytest.raises(KeyError, match="no such tensor"):
        Fails().remove_fakequantize_and_collect_params(str(path), NAME, "tensorrt")
    with pytest.raises(TypeError, match="must return a dict"):
        NotADict().remove_fakequantize_and_collect_params(str(path), NAME, "tensorrt")
    with pytest.raises(ValueError, match="not a finite number"):
        NotFinite().remove_fakequantize_and_collect_params(str(path), NAME, "tensorrt")
    with pytest.raises(ValueError, match=r"'bad' must be \[scale, zero_point\]"):
        BadEntry().remove_fakequantize_and_collect_params(str(path), NAME)
    assert sorted(os.listdir(tmp_path / "in")) == [f"{NAME}.onnx"]


# ---- bad input ------------------------------------------------------------------------------

ALL_STEPS = [lambda p, n: deploy.remove_fakequantize_and_collect_params(p, n, "tensorrt"),
             deploy.remove_fakequantize_and_collect_params_nnie,
             deploy.remove_fakequantize_and_collect_params_tengine,
             deploy.remove_fakequantize_and_collect_params_stpu,
             deploy.replace_fakequantize_and_collect_params_openvino,
             lambda p, n: deploy.ONNXQNNPass(p).run(n),
             lambda p, n: deploy.ONNXQLinearPass(p).run()]


@pytest.mark.parametrize("step", range(len(ALL_STEPS)))
def test_bad_inputs_are_clear_errors(step, deployed, tmp_path):
    run = ALL_STEPS[step]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run(str(tmp_path / "missing.onnx"), NAME)
    with pytest.raises(ValueError, match="not a regular file"):
        run(str(tmp_path), NAME)
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage")
    with pytest.raises(ValueError):
        run(str(corrupt), NAME)
    # A float model: no fake-quantize nodes.
    plain = tmp_path / "float.onnx"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    plain.write_bytes(helper.make_model(g).SerializeToString())
    with pytest.raises(ValueError, match="no fake-quantize nodes"):
        run(str(plain), NAME)
    if step != 6:  # ONNXQLinearPass.run takes no model name
        path = fakeq_copy(deployed, "Tensorrt", tmp_path)
        for name in ("../escape", "sub/name", "", ".."):
            with pytest.raises(ValueError, match="model_name"):
                run(str(path), name)
        with pytest.raises(TypeError, match="model_name must be a str"):
            run(str(path), None)
        assert sorted(os.listdir(tmp_path / "in")) == [f"{NAME}.onnx"]
    assert not (tmp_path.parent / "escape").exists()
    assert sorted(os.listdir(tmp_path)) == ["corrupt.onnx", "float.onnx"] + (["in"] if step != 6 else [])


def test_unknown_linear_backend_lists_the_valid_ones(deployed, tmp_path):
    path = fakeq_copy(deployed, "Tensorrt", tmp_path)
    with pytest.raises(ValueError, match="'tensorrt', 'snpe', 'ppl', 'vitis', 'ppl-cuda'"):
        deploy.remove_fakequantize_and_collect_params(str(path), NAME, "TensorRT")


def test_qmin_max_dict_of_mqbench_main_gives_stripped_ranges_back(tmp_path):
    """MQBench main strips quant_min / quant_max from its QuantizeLinear nodes into
    qmin_max_dict; given back, the range is [-127, 127] (clip 127 s), not the int8 zero
    point's [-128, 127] (clip 128 s)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq"),
             helper.make_node("Relu", ["xd"], ["y"], name="relu")]
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    deploy.remove_fakequantize_and_collect_params(str(path), "a", "tensorrt")
    deploy.remove_fakequantize_and_collect_params(str(path), "b", "tensorrt", {"q": (-127, 127)})
    blob = lambda n: json.load(open(tmp_path / f"{n}_clip_ranges.json"))["tensorrt"]["blob_range"]
    assert blob("a") == {"x": 64.0} and blob("b") == {"x": 63.5}
    with pytest.raises(ValueError, match=r"qmin_max_dict\['q'\]"):
        deploy.remove_fakequantize_and_collect_params(str(path), "c", "tensorrt", {"q": 5})


# ---- common: ONNXGraph and the helpers -----------------------------------------------------

def small_model():
    """relu listed before the conv feeding it; an unused initializer and an unused Constant."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])
    nodes = [helper.make_node("Relu", ["c"], ["y"], name="relu"),
             helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", kernel_shape=[1, 1]),
             helper.make_node("Constant", [], ["k"], name="const",
                              value=numpy_helper.from_array(np.array([1.5, 2.0], np.float32)))]
    inits = [numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "W"),
             numpy_helper.from_array(np.zeros(2, np.float32), "B"),
             numpy_helper.from_array(np.zeros(3, np.float32), "unused")]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                             opset_imports=[helper.make_opsetid("", 13)])


def test_onnx_graph_lookups_and_initializers(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(small_model().SerializeToString())
    g = common.ONNXGraph(str(path))
    assert g.graph is g.model.graph
    assert g.get_tensor_producer("c").name == "conv"
    assert g.get_tensor_producer("x") == "INPUT_TOKEN"
    assert [n.name for n in g.get_tensor_consumer("c")] == ["relu"]
    assert g.get_tensor_consumer("y") == ["OUTPUT_TOKEN"]
    assert g.get_constant("k") == [1.5, 2.0] and g.get_constant("nothing") is None
    assert set(g.initializer) == {"W", "B", "unused"} and g.initializer["B"][1] == 1
    # set / get round trip: replace in place (raw), add (typed, a scalar has dims [])
    w = np.arange(4, dtype=np.float32).reshape(2, 2, 1, 1)
    g.set_initializer("W", w)
    np.testing.assert_array_equal(g.get_initializer("W"), w)
    assert len(g.graph.initializer) == 3 and g.initializer["W"][1] == 0
    g.set_initializer("zp", np.array([3], np.uint8), raw=False)
    assert list(g.initializer["zp"][0].dims) == [] and g.initializer["zp"][0].raw_data == b""
    assert g.get_initializer("zp") == 3
    with pytest.raises(TypeError, match="float32, uint8 or int8"):
        g.set_initializer("bad", np.array([1.0]), raw=False)
    with pytest.raises(KeyError, match="no initializer named 'nothing'"):
        g.get_initializer("nothing")
    # insert a node; topologize_graph updates the maps
    g.insert_node_purely(helper.make_node("Identity", ["y"], ["z"], name="id"), idx=3)
    assert g.get_tensor_consumer("y") == ["OUTPUT_TOKEN"]
    g.topologize_graph()
    assert [n.name for n in g.get_tensor_consumer("y")] == ["id"]
    g.remove_node_purely(g.get_tensor_producer("z"))
    g.topologize_graph()
    # optimize_model: the unused Constant, initializers go; the nodes are sorted
    g.optimize_model()
    assert [n.name for n in g.graph.node] == ["conv", "relu"]
    assert [i.name for i in g.graph.initializer] == ["W", "B"] and set(g.initializer) == {"W", "B"}
    g.set_opset_version("", 13)
    g.set_opset_version("com.microsoft", 1)
    assert [(o.domain, o.version) for o in g.model.opset_import] == [("com.microsoft", 1), ("", 13)]
    out = tmp_path / "sub" / "saved.onnx"
    g.save_onnx_model(str(out))
    onnx.checker.check_model(onnx.load(str(out)))
    assert not [f for f in os.listdir(out.parent) if f.startswith(".")]  # no temporary left


def test_optimize_model_refuses_cycles_and_dangling_inputs():
    m = small_model()
    m.graph.node[0].input[0] = "y"  # relu reads its own output
    with pytest.raises(ValueError, match="cycle through node 'relu'"):
        common.ONNXGraph(m).optimize_model()
    m = small_model()
    m.graph.node[0].input[0] = "nowhere"
    with pytest.raises(ValueError, match="reads 'nowhere'"):
        common.ONNXGraph(m).optimize_model()


def test_graph_helpers_and_preprocess():
    m = small_model()
    out2node, inp2node = common.update_inp2node_out2node(m.graph)
    assert out2node["c"].name == "conv" and [[n.name, i] for n, i in inp2node["W"]] == [["conv", 1]]
    data = common.prepare_data(m.graph)
    assert data["k"].tolist() == [1.5, 2.0] and data["unused"].shape == (3,)
    assert set(common.prepare_initializer(m.graph)) == {"W", "B", "unused"}
    mul = helper.make_node("Mul", ["c", "k"], ["m"], name="mul")
    assert [n.name for n in common.get_constant_inputs(mul, out2node)] == ["const"]
    resize = helper.make_node("Resize", ["x", "", "sc"], ["r"], name="resize", mode="nearest",
                              coordinate_transformation_mode="asymmetric")
    attrs = common.parse_attrs(list(resize.attribute) + list(m.graph.node[1].attribute))
    assert attrs == {"mode": "b'nearest'", "coordinate_transformation_mode": "b'asymmetric'",
                     "kernel_shape": (1, 1)}
    # OnnxPreprocess: the translators' own passes, written back into the graph given
    pad = helper.make_node("Pad", ["x", "pads"], ["p"], name="pad")
    m.graph.node.insert(0, pad)
    m.graph.node[2].input[0] = "p"  # conv reads the zero Pad
    m.graph.initializer.append(numpy_helper.from_array(np.zeros(8, np.int64), "pads"))
    common.OnnxPreprocess().remove_fake_pad_op(m.graph, data, inp2node, out2node)
    assert "Pad" not in [n.op_type for n in m.graph.node]
    assert next(n for n in m.graph.node if n.op_type == "Conv").input[0] == "x"
    m.graph.node.append(resize)
    m.graph.initializer.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "sc"))
    m.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 2, 8, 8]))
    common.OnnxPreprocess().replace_resize_op_with_upsample(m.graph, out2node)
    up = next(n for n in m.graph.node if n.name == "resize")
    assert up.op_type == "Upsample" and list(up.input) == ["x", "sc"]


def test_parse_qparams_reads_inputs_or_attributes():
    name2data = {"s": np.array(0.1, np.float32), "z": np.array(0, np.int32),
                 "lo": np.array(-128), "hi": np.array(127)}
    n = helper.make_node("FixedPerTensorAffine", ["x", "s", "z", "lo", "hi"], ["y"], name="fq")
    t, s, z, lo, hi = LinearQuantizer_process().parse_qparams(n, name2data)
    assert (t, float(s), int(z), int(lo), int(hi)) == ("x", np.float32(0.1), 0, -128, 127)
    n = helper.make_node("FakeQuantizeLearnablePerchannelAffine", ["w", "s", "z"], ["y"], name="fw",
                         quant_min=-127, quant_max=127)
    assert LinearQuantizer_process().parse_qparams(n, name2data)[3:] == (-127, 127)
    n = helper.make_node("LearnablePerTensorAffine", ["x", "s", "z"], ["y"], name="none")
    with pytest.raises(ValueError, match="quant_min and quant_max are not found for <none>"):
        LinearQuantizer_process().parse_qparams(n, name2data)
    from mqbench.deploy.deploy_openvino import OPENVINO_process
    assert OPENVINO_process().parse_qparams(n, name2data)[3:] == (None, None)
    n = helper.make_node("LearnablePerTensorAffine", ["x", "s_id", "z"], ["y"], name="chain")
    with pytest.raises(KeyError, match="'s_id'"):
        LinearQuantizer_process().parse_qparams(n, name2data)


def test_qnn_helpers():
    attr = helper.make_attribute("kernel_shape", [3, 3])
    kwarg = deploy.ONNXQNNPass.attribute_to_kwarg(attr)
    assert list(kwarg) == ["kernel_shape"] and list(kwarg["kernel_shape"]) == [3, 3]
    p = deploy.ONNXQLinearPass.__new__(deploy.ONNXQLinearPass)
    assert p.wrap_onnx_constant(2.0).tolist() == [2.0] and p.wrap_onnx_constant([1, 2]).tolist() == [1, 2]
    assert p.node_without_qparams == ["Flatten"] and "QLinearConv" in p.qlinear_op_type


def test_convert_xir_keeps_the_command_line_and_says_what_to_run(capsys):
    """The Vitis-AI packages exist only in Xilinx's docker image: the tool names them and the
    command to run there."""
    from mqbench.deploy import convert_xir
    assert convert_xir.main(["-Q", "n.onnx", "-C", "n_deploy_model.onnx", "-N", "n"]) == 1
    err = capsys.readouterr().err
    assert "Vitis-AI" in err and "-Q n.onnx -C n_deploy_model.onnx -N n" in err
    with pytest.raises(SystemExit):
        convert_xir.main(["-Q", "n.onnx"])  # argparse: -C and -N are required


def test_the_override_example_of_the_docs_runs(deployed, tmp_path):
    """docs/deploy.md's subclass, run on convert_deploy's ONNX (no Reshape in this net: the
    files are convert_deploy's)."""
    import re
    docs = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "deploy.md")
    block = next(b for b in re.findall(r"```python\n(.*?)```", open(docs).read(), flags=re.S)
                 if "class RangesForReshape" in b)
    path = fakeq_copy(deployed, "Tensorrt", tmp_path)
    exec(compile(block.replace("out/r18.onnx", str(path)).replace('"r18"', f'"{NAME}"'),
                 "deploy.md", "exec"), {"__name__": "docs"})
    same_files(deployed["Tensorrt"][0], tmp_path / "in",
               skip=(f"{NAME}.onnx", "onnx_quantized_model.onnx"))
