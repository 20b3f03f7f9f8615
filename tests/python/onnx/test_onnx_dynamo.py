"""ONNX export through torch's dynamo exporter (``export_onnx(..., dynamo=True)``).

Per op and format, the node the onnxscript translation writes equals the TorchScript symbolic's
(op_type, domain, attributes, constant inputs); the QDQ exports run in onnxruntime and agree
with eager. Every backend deploys from a dynamo export with the same files, the same JSON values
and the same deployed graphs as from a TorchScript export; names differ (docs/deploy.md lists
how), so the two are matched through the values each tensor takes in onnxruntime.

Skipped, with the reason printed, when onnxscript is not installed (requirements-dev.txt
installs it).
"""
import io
import json
import os

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torchvision
from onnx import numpy_helper

import ort

onnxscript = pytest.importorskip(
    "onnxscript", reason="onnxscript is not installed: the dynamo exporter needs it "
    "(scripts/setup.sh installs requirements-dev.txt)")

from deploy_helpers import calibrated, read_calibration_cache  # noqa: E402
from mqbench import _C  # noqa: E402
from mqbench.onnx import symbolic as cso  # noqa: E402
from mqbench.onnx.dynamo import translation_table  # noqa: E402
from mqbench.convert_deploy import convert_deploy  # noqa: E402
from mqbench.custom_symbolic_opset import export_format, export_onnx  # noqa: E402
from mqbench.prepare_by_platform import BackendType  # noqa: E402
from test_convert_deploy import FILES, SmallNet  # noqa: E402
from test_onnx_export import ALPHA, CASES, DATA_MAX, N_ALPHA, S1, SC, Z1, ZC, Quant  # noqa: E402
from test_prepare_by_platform import config, with_bn_statistics  # noqa: E402

ops = torch.ops.mqbench

# ---- per op: the dynamo node equals the TorchScript node -----------------------------------

OP_CASES = dict(CASES)
OP_CASES.update({
    "pact": lambda m, y: ops.fake_quantize_pact(y, ALPHA, N_ALPHA, S1, Z1, -128, 127),
    "dorefa_qdrop_pot": lambda m, y: ops.fake_quantize_qdrop_per_tensor(
        ops.dorefa_normalize(y), ops.pot_quantization(S1), Z1, -128, 127, 0.5),
    "qdrop_per_channel": lambda m, y: ops.fake_quantize_qdrop_per_channel(y, SC, ZC.float(), 1, -8, 7, 0.3),
    "adaround_per_tensor": lambda m, y: ops.fake_quantize_adaround_per_tensor(
        y, S1, Z1, torch.linspace(-1, 1, 144).reshape(1, 4, 6, 6), -8, 7, False),
    "adaround_per_channel": lambda m, y: ops.fake_quantize_adaround_per_channel(
        y, SC, ZC, torch.linspace(-1, 1, 144).reshape(1, 4, 6, 6), 1, -8, 7, False),
    "negative_ch_axis": lambda m, y: ops.fake_quantize_per_channel_affine(y, SC, ZC, -3, -128, 127),
    "tqt_4bit": lambda m, y: ops.fake_quantize_tqt(y, S1, Z1.float(), -8, 7, 2),
    "dsq_uint8": lambda m, y: ops.fake_quantize_dsq_per_tensor(y, S1, Z1 + 3, 0, 255, 0.4),
})
QDQ_REFUSED = {"NNIEQuantize"}
# What the exported graph computes, where eager differs on purpose: QDrop drops at random in
# eager (the export always quantizes), soft AdaRound rounds by alpha (the export hard-rounds).
EAGER = {
    "dorefa_qdrop_pot": lambda m, y: ops.fake_quantize_qdrop_per_tensor(
        ops.dorefa_normalize(y), ops.pot_quantization(S1), Z1, -128, 127, 1.0),
    "qdrop_per_channel": lambda m, y: ops.fake_quantize_qdrop_per_channel(y, SC, ZC.float(), 1, -8, 7, 1.0),
    "adaround_per_tensor": lambda m, y: ops.fake_quantize_adaround_per_tensor(
        y, S1, Z1, torch.linspace(-1, 1, 144).reshape(1, 4, 6, 6), -8, 7, True),
    "adaround_per_channel": lambda m, y: ops.fake_quantize_adaround_per_channel(
        y, SC, ZC, torch.linspace(-1, 1, 144).reshape(1, 4, 6, 6), 1, -8, 7, True),
}


def quant(fn):
    """Quant(fn) with the same conv weights every time."""
    torch.manual_seed(0)
    return Quant(fn).eval()


def export(fn, fmt, dynamo, x=None):
    model = quant(fn)
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0)) if x is None else x
    buf = io.BytesIO()
    with export_format(fmt):
        export_onnx(model, (x,), buf, input_names=["x"], output_names=["y"], dynamo=dynamo)
    m = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(m, full_check=True)
    return m


def constant_values(m):
    """{tensor name: numpy value} of every initializer and Constant node output."""
    values = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "Constant":
            values[n.output[0]] = numpy_helper.to_array(onnx.helper.make_tensor(
                "v", *_attr_tensor(n.attribute[0])))
    return values


def _attr_tensor(a):
    if a.name == "value":
        t = a.t
        return t.data_type, list(t.dims), numpy_helper.to_array(t).flatten().tolist()
    if a.name == "value_int":
        return onnx.TensorProto.INT64, [], [a.i]
    if a.name == "value_float":
        return onnx.TensorProto.FLOAT, [], [a.f]
    if a.name == "value_ints":
        return onnx.TensorProto.INT64, [len(a.ints)], list(a.ints)
    raise AssertionError(f"unexpected Constant attribute {a.name}")


def fold(m, name, values):
    """The value of `name` when it is a constant or a chain of Cast / Reshape / Round / Clip
    over constants (what the TorchScript exporter leaves and the dynamo exporter folds)."""
    if name in values:
        return values[name]
    producer = {o: n for n in m.graph.node for o in n.output}.get(name)
    if producer is None:
        return None
    args = [fold(m, i, values) if i else None for i in producer.input]
    if any(a is None for a, i in zip(args, producer.input) if i):
        return None
    a = {x.name: onnx.helper.get_attribute_value(x) for x in producer.attribute}
    op = producer.op_type
    if op == "Cast":
        return args[0].astype(onnx.helper.tensor_dtype_to_np_dtype(a["to"]))
    if op == "Reshape":
        return args[0].reshape(args[1])
    if op == "Clip":
        return np.clip(args[0], args[1], args[2]).astype(args[0].dtype)
    unary = {"Identity": lambda v: v, "Round": np.round, "Floor": np.floor, "Neg": np.negative,
             "Reciprocal": np.reciprocal, "Log": np.log, "Not": np.logical_not}
    binary = {"Div": np.divide, "Mul": np.multiply, "Add": np.add, "Pow": np.power,
              "Less": np.less}
    if op in unary:
        return np.asarray(unary[op](args[0]))
    if op in binary:
        return np.asarray(binary[op](args[0], args[1]))
    return None


def signature(m):
    """The graph without names: per non-constant node, (domain, op_type, attributes, each input
    as a folded constant value or as the position of the node producing it)."""
    values = constant_values(m)
    order = {}
    out = []
    for n in m.graph.node:
        if n.op_type in ("Constant", "Identity"):
            continue
        if fold(m, n.output[0], values) is not None:
            continue  # a constant chain: the dynamo exporter folds it into an initializer
        inputs = []
        for i in n.input:
            v = fold(m, i, values)
            if v is not None:
                inputs.append(("const", str(v.dtype), v.shape, v.flatten().tolist()))
            else:
                inputs.append(("node", order.get(i, i)))
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "Conv":  # dynamo spells out Conv's defaults (auto_pad, dilations...)
            attrs = {k: v for k, v in attrs.items() if k in ("group", "kernel_shape", "strides")}
            # and writes no bias for conv(x, w, None), where TorchScript writes zeros
            if len(inputs) == 3 and inputs[2][0] == "const" and not any(inputs[2][3]):
                inputs = inputs[:2]
        out.append((n.domain, n.op_type, sorted(attrs.items()), inputs))
        for k, o in enumerate(n.output):
            order[o] = (len(out) - 1, k)
    return out


@pytest.mark.parametrize("fmt", ["mqbench", "qdq"])
@pytest.mark.parametrize("case", list(OP_CASES))
def test_dynamo_node_equals_the_torchscript_node(case, fmt):
    if fmt == "qdq" and case in QDQ_REFUSED:
        pytest.skip("no QDQ form (test_dynamo_refusals_are_the_torchscript_ones)")
    ts, dyn = export(OP_CASES[case], fmt, False), export(OP_CASES[case], fmt, True)
    assert {o.domain: o.version for o in dyn.opset_import}[""] == 18
    if fmt == "mqbench" and any(n.domain == "mqbench" for n in ts.graph.node):
        assert {o.domain: o.version for o in dyn.opset_import}["mqbench"] == 1
    assert signature(dyn) == signature(ts)


@pytest.mark.parametrize("case", [c for c in OP_CASES if c not in QDQ_REFUSED])
def test_dynamo_qdq_export_agrees_with_eager_in_onnxruntime(case):
    ort.require()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(4)) * 3
    with torch.no_grad():
        expected = quant(EAGER.get(case, OP_CASES[case]))(x)
    m = export(OP_CASES[case], "qdq", True, x)
    got = ort.run(m.SerializeToString(), {"x": x})["y"]
    # The same numbers as the TorchScript export (the same ops; the dynamo exporter folds the
    # constant ones).
    assert torch.equal(got, ort.run(export(OP_CASES[case], "qdq", False, x).SerializeToString(),
                                    {"x": x})["y"])
    # As test_onnxruntime_qdq: onnxruntime divides by the scale where the op multiplies by
    # its reciprocal, so a value within an ulp of a rounding tie may land one level away.
    if case == "FakeQuantizeLearnablePerchannelAffine":  # a conv of the quantized weight
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
        return
    step = 0.0625 if case in ("tqt_4bit", "FakeQuantizeTqtAffine") else max(S1.item(), SC.max().item())
    assert (got - expected).abs().max().item() <= step * 1.0001
    assert (got == expected).float().mean().item() >= 0.99


def test_dynamo_refusals_are_the_torchscript_ones():
    for dynamo in (False, True):
        with pytest.raises(ValueError, match=r"^fake_quantize_per_tensor_affine: the range "
                           r"\[0, 65535\] fits neither int8 nor uint8"):
            export(lambda m, y: ops.fake_quantize_per_tensor_affine(y, S1, Z1, 0, 65535), "qdq", dynamo)
        with pytest.raises(ValueError, match="^fake_quantize_nnie: NNIE's logarithmic "
                           "quantization has no QuantizeLinear form"):
            export(CASES["NNIEQuantize"], "qdq", dynamo)
    with pytest.raises(ValueError, match=r"writes opset 18 or later \(got opset_version=13\)"):
        export_onnx(Quant(CASES["FixedPerTensorAffine"]), (torch.randn(1, 3, 8, 8),),
                    io.BytesIO(), opset_version=13, dynamo=True)
    with pytest.raises(TypeError, match="dynamo must be True, False or None, got 'yes'"):
        export_onnx(Quant(CASES["FixedPerTensorAffine"]), (torch.randn(1, 3, 8, 8),),
                    io.BytesIO(), dynamo="yes")


def test_translation_table_covers_every_symbolic():
    from mqbench.onnx import formats as _onnx_formats, llm_ops as _onnx_llm, mx as _onnx_mx
    table = translation_table("mqbench")
    # the FP8, group-wise and MX / NVFP4 ops too (docs/formats.md); the group-wise ops are
    # composites, which torch.export keeps whole and the exporter translates when it has a
    # translation (blocked Q/DQ), so they need one; and the LLM activation ops (standard ONNX)
    names = set(cso.SYMBOLICS) | set(_onnx_mx.SYMBOLICS) | set(_onnx_formats.SYMBOLICS) | \
        set(_onnx_llm.SYMBOLICS)
    assert set(table) == {getattr(ops, name).default for name in names}
    assert set(_onnx_mx.SYMBOLICS) == set(_onnx_mx.DYNAMO_TRANSLATIONS)
    assert set(_onnx_llm.SYMBOLICS) == set(_onnx_llm.dynamo_translations(lambda: 18))
    with pytest.raises(ValueError, match=r"unknown ONNX export format 'tflite'"):
        translation_table("tflite")


def test_dynamo_none_picks_the_torchscript_exporter_while_torch_has_it():
    assert cso.use_dynamo(None) is (not cso.HAS_TORCHSCRIPT_EXPORTER)
    m = export(CASES["FixedPerTensorAffine"], "mqbench", None)
    assert {o.domain: o.version for o in m.opset_import}[""] == 13


def test_dynamo_export_writes_one_self_contained_file_to_a_path(tmp_path):
    model = Quant(CASES["FixedPerChannelAffine"]).eval()
    path = tmp_path / "m.onnx"
    program = export_onnx(model, (torch.randn(1, 3, 8, 8),), str(path), dynamo=True,
                          opset_version=20, input_names=["x"])
    assert type(program).__name__ == "ONNXProgram"
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]  # no external data file beside it
    m = onnx.load(str(path))
    assert {o.domain: o.version for o in m.opset_import}[""] == 20
    assert {i.name for i in m.graph.initializer} >= {"conv.weight", "conv.bias"}
    assert not any(i.data_location == onnx.TensorProto.EXTERNAL for i in m.graph.initializer)
    assert len(m.functions) == 0  # the exporter inlines its functions


def test_dynamo_dynamic_axes_become_dynamic_shapes(recwarn):
    buf = io.BytesIO()
    model = Quant(CASES["LearnablePerTensorAffine"]).eval()
    with export_format("qdq"):
        export_onnx(model, (torch.randn(2, 3, 8, 8),), buf, dynamo=True, input_names=["x"],
                    output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    assert not [w for w in recwarn if "dynamic_axes" in str(w.message)]  # not torch's conversion
    m = onnx.load_from_string(buf.getvalue())
    dims = m.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and [d.dim_value for d in dims[1:]] == [3, 8, 8]
    with pytest.raises(ValueError, match=r"dynamic_axes names \['z'\], which are neither"):
        export_onnx(model, (torch.randn(2, 3, 8, 8),), io.BytesIO(), dynamo=True,
                    input_names=["x"], dynamic_axes={"z": [0]})
    x = torch.randn(5, 3, 8, 8)
    got = ort.run(buf.getvalue(), {"x": x})
    assert list(got.values())[0].shape[0] == 5


# ---- every backend deploys from a dynamo export ---------------------------------------------
#
# Names differ between the exporters (docs/deploy.md, "Exporters"): tensors are named after
# torch.export's fx nodes (relu_1, conv2d_1, ...) instead of the TorchScript scopes
# (/relu_dup1/Relu_output_0), nodes "node_<fx name>" instead of "/conv2/Conv". Graph inputs and
# weights keep their names (outputs too when output_names is given). So the comparison runs both deployed models in
# onnxruntime with every tensor exposed and pairs each TorchScript tensor with the dynamo tensor
# that holds the same values (shape and numbers), and each node with the node producing the
# paired tensor; JSON keys are translated through those pairs.

RUNTIME_DOMAINS = {"", "ai.onnx", "com.microsoft"}


def deploy_both(q, backend, shape, tmp_path, name="m"):
    """convert_deploy from each exporter into its own folder; returns (ts folder, dynamo folder)."""
    be = BackendType[backend]
    dirs = []
    for dynamo in (False, True):
        d = tmp_path / f"{backend}_{'dynamo' if dynamo else 'torchscript'}"
        convert_deploy(q, be, {"x": shape}, output_path=str(d), model_name=name, dynamo=dynamo)
        dirs.append(d)
    return dirs


def all_tensors(model_bytes, x):
    """{tensor: value} of every typed node output of the model run in onnxruntime on x."""
    m = onnx.shape_inference.infer_shapes(onnx.load_from_string(model_bytes))
    typed = {v.name: v for v in list(m.graph.value_info) + list(m.graph.output)}
    outputs = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in outputs and o in typed and typed[o].type.tensor_type.elem_type:
                m.graph.output.append(typed[o])
                outputs.add(o)
    import onnxruntime
    sess = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    values = dict(zip(names, sess.run(names, {"x": x.numpy()})))
    values["x"] = x.numpy()
    return values


def pair_tensors(ts_values, dyn_values):
    """{TorchScript tensor: [dynamo tensors holding the same values]}."""
    pairs = {}
    for a, va in ts_values.items():
        scale = max(1.0, float(np.abs(va).max())) if va.size else 1.0
        pairs[a] = [b for b, vb in dyn_values.items()
                    if vb.shape == va.shape and vb.dtype == va.dtype and
                    np.allclose(va.astype(np.float64), vb.astype(np.float64), rtol=0, atol=1e-5 * scale)]
    return pairs


class NameMap:
    """Translates TorchScript tensor and node names to the dynamo export's: by the values the
    tensors take in onnxruntime (`ts_values`, `dyn_values`), or, for a model onnxruntime cannot
    run (NNIE's Upsample), by position in the two graphs, whose ops are the same."""

    def __init__(self, ts_model, dyn_model, ts_values=None, dyn_values=None):
        if ts_values is not None:
            self.tensors = pair_tensors(ts_values, dyn_values)
        else:
            a = [n for n in ts_model.graph.node if n.op_type not in ("Constant", "Identity")]
            b = [n for n in dyn_model.graph.node if n.op_type not in ("Constant", "Identity")]
            assert [n.op_type for n in a] == [n.op_type for n in b]
            self.tensors = {ta: [tb] for na, nb in zip(a, b) for ta, tb in zip(na.output, nb.output)}
        inits = {i.name for i in ts_model.graph.initializer} & {i.name for i in dyn_model.graph.initializer}
        for name in inits | {i.name for i in ts_model.graph.input}:
            self.tensors[name] = [name]
        # Tensors with equal values (a 1x1 feature map before and after global pooling) are
        # told apart by the op producing them.
        ts_op = {o: n.op_type for n in ts_model.graph.node for o in n.output}
        dyn_op = {o: n.op_type for n in dyn_model.graph.node for o in n.output}
        for a, found in self.tensors.items():
            same_op = [b for b in found if dyn_op.get(b) == ts_op.get(a)]
            if same_op:
                self.tensors[a] = same_op
        producer = {o: n.name for n in dyn_model.graph.node for o in n.output}
        self.nodes = {n.name: sorted({producer[t] for t in self.tensors.get(n.output[0], []) if t in producer})
                      for n in ts_model.graph.node}

    def candidates(self, key):
        # the key itself: layout keys ("tensorrt", "min"), graph inputs, weights
        out = [key] + list(self.tensors.get(key, [])) + list(self.nodes.get(key, []))
        # STPU "<node>_weights", NNIE "<node>_permute_<i>": a node name with a suffix
        for cut in range(len(key) - 1, 0, -1):
            if key[cut] == "_" and key[:cut] in self.nodes:
                out += [b + key[cut:] for b in self.nodes[key[:cut]]]
        return out

    def translate(self, key, available):
        found = [c for c in dict.fromkeys(self.candidates(key)) if c in available]
        assert len(found) == 1, f"{key!r}: dynamo candidates {self.candidates(key)} present {found}"
        return found[0]


def compare_json(a, b, names, where):
    """Same structure, same values; dict keys translated (order kept)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and len(a) == len(b), (where, list(a), list(b))
        keys = [names.translate(k, b) for k in a]
        assert keys == list(b), (where, keys, list(b))
        for k, kb in zip(a, keys):
            compare_json(a[k], b[kb], names, f"{where}/{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for k, (va, vb) in enumerate(zip(a, b)):
            compare_json(va, vb, names, f"{where}[{k}]")
    else:
        assert a == b, (where, a, b)


def parse_text(path):
    """PPLCUDA's "<tensor>: <clip>" lines and Tengine's "<tensor> <scale> <zero point>" rows as
    {tensor: [values]} (in file order)."""
    out = {}
    for line in open(path).read().splitlines():
        name, rest = (line.rsplit(": ", 1) if ": " in line else line.split(" ", 1))
        out[name] = [float(v) for v in rest.split()]
    return out


def quantized_weights(m):
    """The initializers QuantizeLinear nodes quantize, in node order."""
    init = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    return [init[n.input[0]] for n in m.graph.node
            if n.op_type == "QuantizeLinear" and n.input[0] in init]


def ops_of(m):
    return [(n.domain, n.op_type) for n in m.graph.node if n.op_type not in ("Constant", "Identity")]


def compare_deploys(ts_dir, dyn_dir, x, folded_weights=False):
    """Every file of the two deploys: the same names; ONNX files pass the checker and compute the
    same outputs (onnxruntime, where it has every op), with the same ops in the same order,
    the same weights, and the same constant inputs of each custom node; JSON and text files
    (the calibration cache too) hold the same values under paired names. Returns the name map of the last runnable model.

    `folded_weights`: QAT conv-bn weights times their BN scale, folded by each exporter with its
    own arithmetic (no BN merge), may differ by a few ulps; then the quantized weights are
    compared within 4 ulps and the outputs by a quantized net's metric (cosine, top-1)."""
    files = sorted(os.listdir(ts_dir))
    assert sorted(os.listdir(dyn_dir)) == files
    names = None
    models = {}
    for f in files:
        if not f.endswith(".onnx"):
            continue
        ts, dyn = onnx.load(str(ts_dir / f)), onnx.load(str(dyn_dir / f))
        # onnx.checker refuses NNIE's Upsample (deprecated since opset 10), as MQBench writes it
        upsample = any(n.op_type == "Upsample" for n in ts.graph.node)
        if not upsample:
            onnx.checker.check_model(ts), onnx.checker.check_model(dyn)
        models[f] = (ts, dyn)
        if any(n.domain == "mqbench" for n in ts.graph.node):
            # the fake-quantized export: same quantizers, in order (the C++ reader's view)
            pa = _C.deploy_fake_quant_params(ts.SerializeToString())
            pb = _C.deploy_fake_quant_params(dyn.SerializeToString())
            strip = lambda p: {k: v for k, v in p.items() if k not in ("name", "input", "output")}
            assert [strip(p) for p in pa] == [strip(p) for p in pb], f
            continue
        assert ops_of(ts) == ops_of(dyn), f
        wa = {i.name: numpy_helper.to_array(i) for i in ts.graph.initializer}
        wb = {i.name: numpy_helper.to_array(i) for i in dyn.graph.initializer}
        for k in wa.keys() & wb.keys():
            assert np.array_equal(wa[k], wb[k]), (f, k)
        custom = [n for n in ts.graph.node if n.domain not in RUNTIME_DOMAINS]
        if custom:  # OPENVINO's FakeQuantize: same constants and attributes, in order
            ca = [(n.op_type, sorted((a.name, onnx.helper.get_attribute_value(a)) for a in n.attribute),
                   [fold(ts, i, constant_values(ts)).tolist() if fold(ts, i, constant_values(ts)) is not None else None
                    for i in n.input]) for n in custom]
            cb = [(n.op_type, sorted((a.name, onnx.helper.get_attribute_value(a)) for a in n.attribute),
                   [fold(dyn, i, constant_values(dyn)).tolist() if fold(dyn, i, constant_values(dyn)) is not None else None
                    for i in n.input]) for n in dyn.graph.node if n.domain not in RUNTIME_DOMAINS]
            assert ca == cb, f
            continue
        if upsample:  # nor can onnxruntime run it at opset 13 / 18
            names = NameMap(ts, dyn)
            continue
        va, vb = all_tensors(ts.SerializeToString(), x), all_tensors(dyn.SerializeToString(), x)
        assert len(ts.graph.output) == len(dyn.graph.output)
        for o_ts, o_dyn in zip(ts.graph.output, dyn.graph.output):  # names differ without output_names
            a, b = va[o_ts.name], vb[o_dyn.name]
            if not folded_weights:
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
                continue
            cosine = float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))
            assert cosine >= 0.9995 and np.abs(a - b).max() <= 0.02 * np.abs(a).max(), cosine
            assert np.array_equal(a.argmax(-1), b.argmax(-1))
        if folded_weights:
            qa, qb = quantized_weights(ts), quantized_weights(dyn)
            assert len(qa) == len(qb)
            for u, v in zip(qa, qb):
                assert u.shape == v.shape and np.all(np.abs(u - v) <= 4 * np.spacing(np.abs(u))), f
        names = NameMap(ts, dyn, va, vb)
    for f in files:
        if f.endswith(".json"):
            try:
                a, b = json.load(open(ts_dir / f)), json.load(open(dyn_dir / f))
            except json.JSONDecodeError:  # PPLCUDA writes text under a .json name
                a, b = parse_text(ts_dir / f), parse_text(dyn_dir / f)
        elif f.endswith(".scale"):
            a, b = parse_text(ts_dir / f), parse_text(dyn_dir / f)
        elif f.endswith(".cache"):  # Tensorrt's calibration cache: {tensor: float32 scale bits}
            a, b = (read_calibration_cache(open(d / f).read()) for d in (ts_dir, dyn_dir))
        else:
            continue
        assert names is not None, f"{f}: no deployed model to pair names with"
        compare_json(a, b, names, f)
    return names


@pytest.fixture(scope="module")
def small_net():
    torch.manual_seed(0)
    return with_bn_statistics(SmallNet(), (8, 3, 16, 16))


@pytest.mark.parametrize("backend", list(FILES))
def test_every_backend_deploys_the_same_from_both_exporters(backend, small_net, tmp_path):
    shape = [2, 3, 16, 16]
    q = calibrated(small_net, BackendType[backend], shape,
                   prepare_custom_config_dict=config(BackendType[backend]))
    ts_dir, dyn_dir = deploy_both(q, backend, shape, tmp_path)
    compare_deploys(ts_dir, dyn_dir, torch.randn(*shape, generator=torch.Generator().manual_seed(7)))


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    return with_bn_statistics(torchvision.models.resnet18(), (4, 3, 32, 32))


# resnet18 takes about 40 s a backend: CI runs a representative three (the small net above covers
# every backend); the full sweep passed once by hand (MQBENCH_RESNET18_SWEEP=1 runs it).
RESNET18_BACKENDS = list(FILES) if os.environ.get("MQBENCH_RESNET18_SWEEP") else [
    b for b in ("Tensorrt", "ONNX_QNN", "QDQ") if b in FILES]


@pytest.mark.parametrize("backend", RESNET18_BACKENDS)
def test_every_backend_deploys_resnet18_the_same_from_both_exporters(backend, resnet18, tmp_path):
    shape = [2, 3, 32, 32]
    q = calibrated(resnet18, BackendType[backend], shape,
                   prepare_custom_config_dict=config(BackendType[backend]))
    ts_dir, dyn_dir = deploy_both(q, backend, shape, tmp_path, name="r18")
    compare_deploys(ts_dir, dyn_dir, torch.randn(*shape, generator=torch.Generator().manual_seed(7)),
                    folded_weights=backend.endswith("_NLP"))


def test_nnie_deploys_from_the_dynamo_exporter_unpatched(small_net, tmp_path):
    shape = [2, 3, 16, 16]
    q = calibrated(small_net, BackendType.NNIE, shape)
    convert_deploy(q, BackendType.NNIE, {"x": shape}, output_path=str(tmp_path), dynamo=True)


@pytest.mark.parametrize("backend", ["Tensorrt", "ONNX_QNN", "QDQ"])
def test_torch_default_opset_20_deploys_as_opset_18(backend, small_net, tmp_path):
    """torch.onnx.export's own default opset is 20: the passes read it as they read 18."""
    from deploy_helpers import deploy_copy
    shape = [2, 3, 16, 16]
    q = deploy_copy(calibrated(small_net, BackendType[backend], shape))
    translator = _C.get_backend(backend)["deploy_translator"]
    files = {}
    for opset in (18, 20):
        buf = io.BytesIO()
        with torch.no_grad():
            export_onnx(q, (torch.rand(*shape),), buf, dynamo=True, opset_version=opset,
                        input_names=["x"])
        assert {o.domain: o.version for o in onnx.load_from_string(buf.getvalue()).opset_import}[""] == opset
        files[opset], _ = _C.deploy_translate(buf.getvalue(), translator, "m")
    assert sorted(files[18]) == sorted(files[20])
    for name in files[18]:
        if name.endswith(".json"):
            assert json.loads(files[18][name]) == json.loads(files[20][name])
        elif name.endswith(".cache"):  # Tensorrt's calibration cache: the same scales
            assert files[18][name] == files[20][name]
        else:
            a, b = onnx.load_from_string(files[18][name]), onnx.load_from_string(files[20][name])
            onnx.checker.check_model(b)
            assert ops_of(a) == ops_of(b)
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
            ra, rb = ort.run(files[18][name], {"x": x}), ort.run(files[20][name], {"x": x})
            for k in ra:
                assert torch.equal(ra[k], rb[k])
