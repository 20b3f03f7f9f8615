"""mqbench-deploy, the C++ command-line tool, on mqbench's and MQBench-style ONNX files."""
import json
import os
import subprocess

import numpy
import onnx
import pytest
import torch

from deploy_helpers import (as_bytes, calibrated, check_calibration_cache, deploy_copy,
                            export_fakeq, without_quantizers)
from mqbench.custom_symbolic_opset import export_format, export_onnx
from mqbench.prepare_by_platform import BackendType
from test_convert_deploy import SmallNet

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CLI = os.environ.get("MQBENCH_DEPLOY_CLI", os.path.join(ROOT, "build", "mqbench-deploy"))
SHAPE = [2, 3, 16, 16]


def run(*args):
    if not os.path.isfile(CLI):
        pytest.fail(f"{CLI} is missing: build the project (scripts/build.sh)")
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return deploy_copy(calibrated(SmallNet().eval(), BackendType.Tensorrt, SHAPE))


@pytest.fixture(scope="module")
def fakeq(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("fakeq") / "small.onnx"
    path.write_bytes(export_fakeq(model, SHAPE, path.parent))
    return path


def ranges(directory, name):
    return json.load(open(directory / f"{name}_clip_ranges.json"))["tensorrt"]["blob_range"]


def test_cli_deploys_mqbench_onnx(fakeq, tmp_path):
    r = run("--backend", "Tensorrt", "--output-dir", tmp_path, "--deploy-to-qlinear", fakeq)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["onnx_quantized_model.onnx", "small_calib.cache",
                                            "small_clip_ranges.json", "small_deploy_model.onnx"]
    assert "wrote" in r.stdout and not r.stderr
    for f in ("onnx_quantized_model.onnx", "small_deploy_model.onnx"):
        onnx.checker.check_model(onnx.load(str(tmp_path / f)))
    assert ranges(tmp_path, "small")
    # TensorRT's calibration cache: the clip ranges as scales, those of the QDQ model bit for bit
    cache = check_calibration_cache(tmp_path, "small", as_bytes(tmp_path / "onnx_quantized_model.onnx"))
    assert set(cache) == set(ranges(tmp_path, "small"))


def test_cli_refuses_a_float_layer_unless_allowed(tmp_path):
    """A layer with a quantized weight whose input quantizer is gone (the fc's) runs in float in
    TensorRT: exit 1 naming it; with --allow-float-layers the files and a warning on stderr."""
    torch.manual_seed(0)
    q = calibrated(SmallNet().eval(), BackendType.Tensorrt, SHAPE)
    path = tmp_path / "nofc.onnx"
    path.write_bytes(export_fakeq(deploy_copy(without_quantizers(q, "flatten_post_act_fake_quantizer")),
                                  SHAPE, tmp_path))
    r = run("-b", "Tensorrt", "-o", tmp_path / "refused", path)
    assert r.returncode == 1
    assert "'/fc/Gemm' (Gemm, weight 'fc.weight')" in r.stderr and "--allow-float-layers" in r.stderr
    assert not os.listdir(tmp_path / "refused")
    r = run("-b", "Tensorrt", "-o", tmp_path / "allowed", "--allow-float-layers", path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("mqbench-deploy: warning: 1 layer has a quantized weight")
    assert "'/fc/Gemm'" in r.stderr
    assert sorted(os.listdir(tmp_path / "allowed")) == ["nofc_calib.cache", "nofc_clip_ranges.json",
                                                         "nofc_deploy_model.onnx"]
    assert "--allow-float-layers" in run("--help").stdout


def test_cli_reads_mqbench_1_10_files(fakeq, tmp_path):
    """MQBench 1.10 wrote its fake-quantize nodes in the default domain."""
    proto = onnx.load(str(fakeq))
    for n in proto.graph.node:
        if n.domain == "mqbench":
            n.domain = ""
    del proto.opset_import[:]
    proto.opset_import.append(onnx.helper.make_opsetid("", 13))
    legacy = tmp_path / "legacy.onnx"
    onnx.save(proto, str(legacy))
    ours = tmp_path / "ours"
    assert run("-b", "Tensorrt", "-o", ours, "-n", "m", fakeq).returncode == 0
    r = run("-b", "Tensorrt", "-o", tmp_path / "legacy", "-n", "m", legacy)
    assert r.returncode == 0, r.stderr
    assert ranges(tmp_path / "legacy", "m") == ranges(ours, "m")


def test_cli_reads_mqbench_main_qdq_files(model, fakeq, tmp_path):
    """MQBench main exports QuantizeLinear/DequantizeLinear pairs with quant_min / quant_max
    attributes, zero points cast to int8, and leaves Identity / Cast chains on the parameters."""
    with export_format("qdq"), torch.no_grad():
        path = tmp_path / "main.onnx"
        export_onnx(model, (torch.rand(*SHAPE),), str(path), input_names=["x"],
                    do_constant_folding=False)
    proto = onnx.load(str(path))
    q_nodes = [n for n in proto.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert q_nodes
    for n in q_nodes:  # as MQBench main's symbolics write them
        n.attribute.extend([onnx.helper.make_attribute("quant_min", -127),
                            onnx.helper.make_attribute("quant_max", 127)])
    onnx.save(proto, str(path))
    r = run("--inspect", path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("[-127, 127]") == len(q_nodes) // 2
    ours = tmp_path / "ours"
    assert run("-b", "Tensorrt", "-o", ours, "-n", "m", fakeq).returncode == 0
    r = run("-b", "Tensorrt", "-o", tmp_path / "main", "-n", "m", path)
    assert r.returncode == 0, r.stderr
    theirs, mine = ranges(tmp_path / "main", "m"), ranges(ours, "m")
    assert sorted(theirs.values()) == pytest.approx(sorted(mine.values()), rel=1e-6)


def test_cli_inspect_and_list(fakeq):
    r = run("--inspect", fakeq)
    assert r.returncode == 0 and "fake-quantize groups" in r.stdout and "weight" in r.stdout
    r = run("--list-backends")
    assert r.returncode == 0 and "Tensorrt\ttensorrt" in r.stdout


def _quantize_without(missing):
    """A QuantizeLinear without its outputs, or without its inputs but read by a
    DequantizeLinear."""
    h, tp = onnx.helper, onnx.TensorProto
    inits = [h.make_tensor("s", tp.FLOAT, [], [0.1]), h.make_tensor("z", tp.INT8, [], [0])]
    if missing == "outputs":
        nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], [], name="q")]
        inputs, outputs = [h.make_tensor_value_info("x", tp.FLOAT, [1])], []
    else:
        nodes = [h.make_node("QuantizeLinear", [], ["t"], name="q"),
                 h.make_node("DequantizeLinear", ["t", "s", "z"], ["y"], name="dq")]
        inputs, outputs = [], [h.make_tensor_value_info("y", tp.FLOAT, [1])]
    graph = h.make_graph(nodes, "g", inputs, outputs, inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]).SerializeToString()


@pytest.mark.parametrize("missing", ["outputs", "inputs"])
def test_inspect_refuses_nodes_without_their_tensors(missing, tmp_path):
    """--inspect and _C.deploy_fake_quant_params read a Q node's input and output before any
    check (a null protobuf list under UBSan, found by a review); now a clear error.
    (_C.deploy_post_process_clip_ranges guards its reads itself and takes any graph: a
    translator's own, or one a user's override edited.)"""
    from mqbench import _C
    path = tmp_path / "broken.onnx"
    path.write_bytes(_quantize_without(missing))
    r = run("--inspect", path)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "input model" in r.stderr and "'q' (QuantizeLinear)" in r.stderr, r.stderr
    assert "runtime error" not in r.stderr, r.stderr
    with pytest.raises(ValueError, match="'q' \\(QuantizeLinear\\)"):
        _C.deploy_fake_quant_params(path.read_bytes())


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "missing"])
def test_cli_corrupt_input_is_a_clear_error(damage, fakeq, tmp_path):
    good = as_bytes(fakeq)
    path = tmp_path / "bad.onnx"
    if damage != "missing":
        path.write_bytes({"empty": b"", "truncated": good[: len(good) // 3],
                          "garbage": os.urandom(4096)}[damage])
    out = tmp_path / "out"
    r = run("--backend", "Tensorrt", "--output-dir", out, path)
    assert r.returncode == 1
    assert r.stderr.startswith("mqbench-deploy: ")
    assert any(s in r.stderr for s in ("cannot open", "empty", "not a valid ONNX", "no graph",
                                        "truncated", "not a constant", "holds"))
    assert not os.path.exists(out) or os.listdir(out) == []


def test_cli_usage_errors(fakeq, tmp_path):
    assert run().returncode == 2
    assert run(fakeq).returncode == 2  # no backend
    assert run("--backend", fakeq).returncode == 2
    assert run("--frobnicate", fakeq).returncode == 2
    r = run("--backend", "NoSuchChip", "--output-dir", tmp_path, fakeq)
    assert r.returncode == 1 and "Tensorrt" in r.stderr  # lists the registered backends
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = run("--backend", "Tensorrt", "--output-dir", blocker, fakeq)
    assert r.returncode == 1 and "not a directory" in r.stderr


def test_cli_does_not_load_libtorch(fakeq, tmp_path):
    """The CLI links libmqbench_deploy only (docs/design/build-and-ci.md): no torch library
    among its dependencies, and none loaded while it deploys."""
    if not os.path.isfile(CLI):
        pytest.fail(f"{CLI} is missing: build the project (scripts/build.sh)")
    needed = subprocess.run(["ldd", CLI], capture_output=True, text=True, check=True).stdout
    assert "libtorch" not in needed and "libc10" not in needed, needed
    env = dict(os.environ, LD_DEBUG="libs")
    done = subprocess.run([CLI, "--backend", "Tensorrt", "--output-dir", tmp_path, fakeq],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = [l for l in done.stderr.splitlines() if "calling init:" in l]
    assert loaded and not any("torch" in l or "libc10" in l for l in loaded), loaded
    assert (tmp_path / "small_deploy_model.onnx").is_file()


def test_cli_never_overwrites_its_input_and_reads_only_regular_files(fakeq, tmp_path):
    """QDQ writes <name>.onnx; with the CLI's defaults (output folder ".", name = the input's
    stem) that is the input itself: refused, input untouched. /dev/zero: refused at once."""
    model = tmp_path / "small.onnx"
    model.write_bytes(fakeq.read_bytes())
    before = model.read_bytes()
    done = subprocess.run([CLI, "--backend", "QDQ", "small.onnx"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 1 and "would overwrite the input" in done.stderr, done.stderr
    assert model.read_bytes() == before
    done = subprocess.run([CLI, "--backend", "Tensorrt", "--output-dir", tmp_path, "/dev/zero"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "not a regular file" in done.stderr, done.stderr


CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


@pytest.mark.parametrize("backend", ["ONNX_QNN", "Tensorrt", "Academic"])
@pytest.mark.parametrize("finding", ["a", "b"])
def test_cli_refuses_malformed_models_naming_the_node(finding, backend, fakeq, tmp_path):
    """A fuzz campaign's mutants crashed ONNX_QNN (SIGSEGV) or deployed into
    models onnxruntime refuses. They are refused up front with a message naming the node."""
    path = os.path.join(CORPUS, f"regression__onnx_qnn_retyped_quantize_linear_{finding}.onnx")
    r = run("-b", backend, "-o", tmp_path / "out", "-n", "m", path)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "the mqbench domain has no op 'QuantizeLinear'" in r.stderr
    assert "/c2_post_act_fake_quantizer/" in r.stderr
    assert not os.path.exists(tmp_path / "out") or os.listdir(tmp_path / "out") == []
    # An Unsqueeze with axes -100 on a rank-1 constant, feeding an extra graph output.
    proto = onnx.load(str(fakeq))
    proto.graph.initializer.extend([
        onnx.numpy_helper.from_array(numpy.array([1.0, 2.0], dtype=numpy.float32), "c1"),
        onnx.numpy_helper.from_array(numpy.array([-100], dtype=numpy.int64), "far_axes")])
    proto.graph.node.append(onnx.helper.make_node("Unsqueeze", ["c1", "far_axes"], ["u"],
                                                  name="far_unsqueeze"))
    proto.graph.output.append(onnx.helper.make_tensor_value_info("u", onnx.TensorProto.FLOAT,
                                                                 [2, 1]))
    bad = tmp_path / "unsqueeze.onnx"
    onnx.save(proto, str(bad))
    r = run("-b", backend, "-o", tmp_path / "out", "-n", "m", bad)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "far_unsqueeze" in r.stderr and "shape inference" in r.stderr, r.stderr


@pytest.mark.parametrize("opset", [18, 20, 21, 23])
def test_cli_infers_shapes_through_the_ops_of_opsets_18_to_23(opset, tmp_path):
    """With Debian's libonnx 1.12 (schemas to opset 17) the ops whose schema
    changed after 17 (Resize, QuantizeLinear, ...) were left unchecked in a newer model and shapes
    were not inferred through them: a MatMul fed by a Resize, its inner dimension wrong, deployed
    with exit code 0 into a model onnx's checker refuses. onnx 1.23's checker, compiled in, knows
    every opset up to 23."""
    def with_matmul(k):
        proto = onnx.load(os.path.join(CORPUS, "tensorrt.onnx"))
        for op in proto.opset_import:
            if op.domain in ("", "ai.onnx"):
                op.version = opset
        resize = next(n for n in proto.graph.node if n.op_type == "Resize")  # [1, 4, 8, 8]
        proto.graph.initializer.append(
            onnx.numpy_helper.from_array(numpy.zeros((k, 3), numpy.float32), "w_extra"))
        proto.graph.node.append(onnx.helper.make_node(
            "MatMul", [resize.output[0], "w_extra"], ["extra"], name="extra_matmul"))
        proto.graph.output.append(onnx.helper.make_tensor_value_info(
            "extra", onnx.TensorProto.FLOAT, [1, 4, 8, 3]))
        path = tmp_path / f"k{k}.onnx"
        onnx.save(proto, str(path))
        return path
    r = run("-b", "Tensorrt", "-o", tmp_path / "bad", "-n", "m", with_matmul(5))
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "extra_matmul" in r.stderr and "shape inference" in r.stderr, r.stderr
    r = run("-b", "Tensorrt", "-o", tmp_path / "good", "-n", "m", with_matmul(8))
    assert r.returncode == 0, r.stderr
    deployed = onnx.load(str(tmp_path / "good" / "m_deploy_model.onnx"))
    assert {o.domain: o.version for o in deployed.opset_import}[""] == opset
    onnx.checker.check_model(deployed, full_check=True)


@pytest.mark.parametrize("opset", [13, 21])
def test_onnxruntime_qdq_propagation_fault_across_maxpool_is_pinned(opset):
    """onnxruntime 1.32's fault that the fuzz campaign tallies as runtime_optimizer_faults
    (tests/fuzz/campaign.py, ORT_QDQ_PROPAGATION_FAULT; docs/deploy.md): a valid QDQ model
    (int8 zero point, then MaxPool) at default opset >= 21 fails to load at the default
    optimization level, and loads at ORT_ENABLE_BASIC. When an onnxruntime release fixes it this
    test fails: then drop the campaign's allowance and the note."""
    ort = pytest.importorskip("onnxruntime")
    h, T = onnx.helper, onnx.TensorProto
    graph = h.make_graph(
        [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         h.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
         h.make_node("MaxPool", ["d"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
        "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 3, 4, 4])],
        [h.make_tensor("s", T.FLOAT, [], [0.1]), h.make_tensor("z", T.INT8, [], [0])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    data = model.SerializeToString()

    def load(level=None):
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        if level is not None:
            opts.graph_optimization_level = level
        return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    x = numpy.linspace(-5, 5, 192, dtype=numpy.float32).reshape(1, 3, 8, 8)
    basic = load(ort.GraphOptimizationLevel.ORT_ENABLE_BASIC).run(None, {"x": x})[0]
    want = torch.nn.functional.max_pool2d(
        torch.fake_quantize_per_tensor_affine(torch.from_numpy(x), 0.1, 0, -128, 127), 2)
    numpy.testing.assert_allclose(basic, want.numpy(), rtol=0, atol=1e-6)
    if opset < 21:
        load()
    else:
        with pytest.raises(Exception, match="does not match y_zero_point type UINT8"):
            load()


def test_deploy_lists_and_logs_its_passes_by_name(fakeq, tmp_path, caplog):
    """Each deploy pass is a named unit (src/deploy/passes/<name>.cpp); the CLI prints
    the passes it ran with --verbose, and Python logs them to the MQBENCH logger at DEBUG."""
    names = ["canonicalize_ops", "find_float_layers", "remove_zero_pads", "remove_fake_quant",
             "post_process_clip_ranges"]
    r = run("--verbose", "-b", "Tensorrt", "-o", tmp_path / "cli", "-n", "m", fakeq)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("pass ")]
    assert [line.split()[1].rstrip(":") for line in lines] == names
    assert " -> " in lines[3] and lines[3].endswith(" ms")
    r = run("--list-passes")
    assert r.returncode == 0
    assert [line.split("\t")[0] for line in r.stdout.splitlines()] == sorted(
        names + ["resize_to_upsample", "to_qdq"])
    from mqbench import _C
    from mqbench.convert_deploy import _translate
    from mqbench.utils.logger import set_log_level
    assert _C.deploy_pass_names() == sorted(names + ["resize_to_upsample", "to_qdq"])
    set_log_level("DEBUG")
    try:
        _translate("tensorrt", str(fakeq), "m", str(tmp_path / "py"))
    finally:
        set_log_level("INFO")
    logged = [r.getMessage() for r in caplog.records
              if r.name == "MQBENCH" and r.levelname == "DEBUG" and
              r.getMessage().startswith("deploy pass ")]
    assert [m.split()[2].rstrip(":") for m in logged] == names
