"""Mixture-of-experts models with fused experts (transformers 5: Qwen3-MoE, Mixtral, GPT-OSS,
Qwen2-MoE; tiny random models from their configs): every expert quantized one by one by each
algorithm, on its grid, the routers float; starved experts rounded to nearest; the checkpoint
written one Linear per expert under the names the engines read (docs/llm-scale.md, "Mixtures of
experts")."""
import copy
import json
import warnings

import pytest
import torch
from torch import nn

from mqbench.llm import (_experts, awq, gptq, load_quantized, quantize_checkpoint, rtn,
                         save_quantized, signround)
from mqbench.llm.checkpoint import _encode, _schemes
from hf_loader import transformers_logits

transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

W4G16 = {"bit": 4, "per_channel": True, "group_size": 16}
KINDS = ("qwen3_moe", "mixtral", "gpt_oss", "qwen2_moe")


def _config(kind, layers=2):
    common = dict(vocab_size=128, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)
    if kind == "qwen3_moe":
        return transformers.Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=32,
                                           num_experts=8, num_experts_per_tok=2, head_dim=16,
                                           **common)
    if kind == "mixtral":
        return transformers.MixtralConfig(intermediate_size=32, num_local_experts=8,
                                          num_experts_per_tok=2, **common)
    if kind == "gpt_oss":
        return transformers.GptOssConfig(intermediate_size=32, num_local_experts=8,
                                         num_experts_per_tok=2, head_dim=16,
                                         layer_types=["full_attention"] * layers, **common)
    return transformers.Qwen2MoeConfig(intermediate_size=128, moe_intermediate_size=32,
                                       shared_expert_intermediate_size=64, num_experts=4,
                                       num_experts_per_tok=2, **common)


def _model(kind, seed=0, layers=2):
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GPT-OSS's YaRN note about the tiny context
        return transformers.AutoModelForCausalLM.from_config(_config(kind, layers)).eval()


def _ids(n=8, seq=32, seed=1):
    return torch.randint(0, 128, (n, seq), generator=torch.Generator().manual_seed(seed))


def _calib(ids):
    return [ids[i:i + 1] for i in range(ids.shape[0])]


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _routers(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()
            if n.endswith(("mlp.gate.weight", "mlp.router.weight", "mlp.router.bias",
                           "shared_expert_gate.weight"))}


def _on_grid(model, qparams):
    """Every quantized Linear (experts one by one, through the view) holds the fake
    quantization of itself on its qparams: encoding it with them and decoding is exact."""
    fmt = _schemes.weight_format(W4G16)
    with _experts.ExpertView(model):
        mods = dict(model.named_modules())
        for name, qp in qparams.items():
            enc, deq = _encode.encode_weight(name, mods[name].weight, fmt, qp=qp)
            _encode.check_round_trip(name, enc, fmt, deq)
            assert torch.equal(deq, mods[name].weight.float()), name
            assert torch.isfinite(deq).all()
        return [n for n in mods if isinstance(mods[n], nn.Linear) and ".experts." in n]


@pytest.mark.parametrize("kind", KINDS)
def test_the_view_computes_the_fused_forward_and_writes_through(kind):
    model = _model(kind)
    ids = _ids()
    ref = _logits(model, ids)
    fused = dict(_experts.fused_experts(model))
    view = _experts.ExpertView(model)
    with view:
        assert torch.equal(_logits(model, ids), ref)
        layers = view.expert_layers()
        assert len(layers) == sum(m.down_proj.shape[0] for m in fused.values()) * 3
        first = dict(model.named_modules())[layers[0]]
        with torch.no_grad():
            first.weight.mul_(0.0)  # lands in the fused parameter
        view.all_tokens = True
        for split in view.split.values():
            split.all_tokens = True
        zeroed = _logits(model, ids)
    assert dict(_experts.fused_experts(model)) == fused  # the modules are back
    assert torch.equal(_logits(model, ids), zeroed)
    assert not torch.equal(zeroed, ref)
    if kind == "qwen2_moe":
        assert view.routers == [f"model.layers.{i}.mlp.shared_expert_gate" for i in range(2)]


@pytest.mark.parametrize("kind", KINDS)
def test_gptq_quantizes_every_expert_on_its_grid_and_beats_rtn(kind):
    model = _model(kind)
    routers = _routers(model)
    ids, held_out = _ids(n=16), _ids(n=4, seed=5)
    ref = _logits(model, held_out)
    base = copy.deepcopy(model)
    qp_rtn = rtn(base, W4G16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an expert may be starved on this tiny data
        qp = gptq(model, _calib(ids), W4G16)
    experts = _on_grid(model, qp)
    assert set(experts) <= set(qp) and set(qp) == set(qp_rtn)
    assert all(torch.equal(p, routers[n]) for n, p in _routers(model).items())
    err = float((_logits(model, held_out) - ref).pow(2).mean())
    err_rtn = float((_logits(base, held_out) - ref).pow(2).mean())
    assert err < err_rtn, (err, err_rtn)


@pytest.mark.parametrize("algorithm", ["awq", "signround", "rtn"])
def test_the_other_algorithms_quantize_every_expert(algorithm):
    model = _model("qwen3_moe")
    routers = _routers(model)
    ids = _ids()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if algorithm == "awq":
            awq(model, _calib(ids), W4G16)
            qp = rtn(model, W4G16)  # AWQ's weights are float: rounded by the weight quantizer
        elif algorithm == "signround":
            qp = signround(model, _calib(ids), W4G16, iters=4, batch_size=4)
        else:
            qp = rtn(model, W4G16)
    experts = _on_grid(model, qp)
    assert experts and set(experts) <= set(qp)
    assert all(torch.equal(p, routers[n]) for n, p in _routers(model).items())


def test_starved_experts_fall_back_to_rtn_and_calibrate_all_experts_feeds_them():
    model = _model("mixtral")
    ids = _ids(n=1, seq=8)
    reference = copy.deepcopy(model)
    with pytest.warns(UserWarning, match=r"experts got fewer calibration tokens .*"
                                         r"model\.layers\.0\.mlp\.experts\.\d+ \(\d+ tokens\)"):
        qp = gptq(model, _calib(ids), W4G16, min_expert_tokens=10 ** 6)
    expected = rtn(reference, W4G16)
    with _experts.ExpertView(model), _experts.ExpertView(reference):
        got = dict(model.named_modules())
        want = dict(reference.named_modules())
        for name in qp:
            if ".experts." in name:
                assert torch.equal(got[name].weight, want[name].weight), name
                assert torch.equal(qp[name]["scale"], expected[name]["scale"])
    assert all(torch.isfinite(p).all() for p in model.parameters())

    # every token through every expert: none is starved, the output stays the routed one
    model = _model("mixtral")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gptq(model, _calib(ids), W4G16, calibrate_all_experts=True, min_expert_tokens=8)
    view = _experts.ExpertView(_model("mixtral"), all_tokens=True)
    plain = _logits(view.model, _ids())
    with view:
        assert torch.allclose(_logits(view.model, _ids()), plain, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="calibrate_all_experts must be True or False"):
        gptq(_model("mixtral"), _calib(ids), W4G16, calibrate_all_experts="yes")


@pytest.mark.parametrize("kind,names", [
    ("qwen3_moe", ("mlp.experts.3.gate_proj", "mlp.experts.3.up_proj", "mlp.experts.3.down_proj")),
    ("mixtral", ("block_sparse_moe.experts.3.w1", "block_sparse_moe.experts.3.w3",
                 "block_sparse_moe.experts.3.w2"))])
def test_checkpoint_one_linear_per_expert_loads_in_transformers(kind, names, tmp_path):
    """The names the models' checkpoints (and vLLM) use; transformers fuses them back on load,
    with the logits of the quantized model in memory."""
    from safetensors import safe_open
    model = _model(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qp = gptq(model, _calib(_ids(n=16)), W4G16)
    save_quantized(model, tmp_path / "q", W4G16, qparams=qp)
    with safe_open(str(tmp_path / "q" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        router = next(k for k in keys if k.endswith("layers.0." + names[0].split(".")[0] +
                                                     ".gate.weight"))
        assert f.get_tensor(router).dtype == torch.float32
    for n in names:
        assert f"model.layers.0.{n}.weight_packed" in keys, n
    assert not any("gate_up_proj" in k for k in keys)
    held_out = _ids(n=2, seq=16, seed=5)
    ours = _logits(model, held_out)
    assert torch.equal(transformers_logits(tmp_path / "q", held_out, tmp_path,
                                           mode="dequantize"), ours)
    loaded, got_qp = load_quantized(tmp_path / "q")
    assert torch.equal(_logits(loaded, held_out), ours) and got_qp.keys() == qp.keys()


def test_gpt_oss_experts_are_not_written_per_expert(tmp_path):
    """GPT-OSS's checkpoints hold the experts fused: a per-expert file would not load."""
    model = _model("gpt_oss")
    with pytest.raises(ValueError, match="hold the experts fused"):
        save_quantized(model, tmp_path / "q", W4G16)
    save_quantized(model, tmp_path / "q", W4G16,
                   ignore=("lm_head", "gate_proj", "up_proj", "down_proj"))
    assert json.load(open(tmp_path / "q" / "config.json"))["model_type"] == "gpt_oss"
    model.save_pretrained(tmp_path / "src")
    with pytest.raises(ValueError, match="hold the experts fused"):
        quantize_checkpoint(tmp_path / "src", tmp_path / "out", "rtn", W4G16)


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_streamed_moe_equals_in_memory(kind, tmp_path):
    """Bit for bit, where the quantized blocks route the tokens as the float ones do: in memory
    the counting pass (which experts are reached, which layers share an input) and the routed
    token counts run on the float model before any layer changes; block by block they run on
    each block's inputs as the quantized blocks before it give them. Where quantization moves a
    token to another expert the two can differ (with 16 items, in block 1's experts)."""
    model = _model(kind, layers=3)
    model.save_pretrained(tmp_path / "src")
    ids = _ids(n=8)
    quantize_checkpoint(tmp_path / "src", tmp_path / "out", "gptq", W4G16, calib_data=ids,
                        min_expert_tokens=0)
    gptq(model, _calib(ids), W4G16, min_expert_tokens=0)
    loaded, _ = load_quantized(tmp_path / "out")
    got = dict(loaded.named_parameters())
    assert all(torch.equal(p, got[n]) for n, p in model.named_parameters())


def test_streamed_starved_experts_are_rounded_to_nearest(tmp_path):
    model = _model("qwen3_moe", layers=2)
    model.save_pretrained(tmp_path / "src")
    with pytest.warns(UserWarning, match=r"quantize_checkpoint: \d+ experts got fewer .*"
                                         r"model\.layers\.0\.mlp\.experts\.\d+"):
        quantize_checkpoint(tmp_path / "src", tmp_path / "out", "gptq", W4G16,
                            calib_data=_ids(n=1, seq=16), min_expert_tokens=10 ** 6)
    loaded, qp = load_quantized(tmp_path / "out")
    rtn(model, W4G16, layers=[n for n in qp if ".experts." in n])
    got = dict(loaded.named_parameters())
    for n, p in model.named_parameters():
        if ".experts." in n:
            assert torch.equal(p, got[n]), n


# ------------------------------------------------------------------ QAT: prepare_by_platform
def _prepared(kind, backend="Academic", exclude=("embed_tokens", "lm_head")):
    """A tiny MoE prepared on W4 g16 weights (8-bit activations), calibrated, with its float
    model and the calibration ids."""
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    from mqbench.utils.state import enable_calibration, enable_quantization
    model = _model(kind)
    model.config.use_cache = False  # no cache object in the captured outputs
    ids = _ids(n=1, seq=16)
    extra = {"w_qscheme": dict(W4G16, symmetry=True),
             "a_qscheme": {"bit": 8, "symmetry": False, "per_channel": False, "pot_scale": False}}
    if backend == "Academic":
        extra.update(w_observer="MinMaxObserver", a_observer="EMAMinMaxObserver",
                     w_fakequantize="FixedFakeQuantize", a_fakequantize="FixedFakeQuantize")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = prepare_by_platform(model, getattr(BackendType, backend), {
            "example_inputs": {"input_ids": ids}, "extra_qconfig_dict": extra,
            "extra_quantizer_dict": {"exclude_module_name": list(exclude)}})
    enable_calibration(q)
    with torch.no_grad():
        q(input_ids=ids)
    enable_quantization(q)
    return model, q, ids


def _weights_only(q):
    """The prepared model's activation quantizers off (a weight-only checkpoint's model)."""
    from mqbench._base import is_fake_quantizer
    for n, m in q.named_modules():
        if is_fake_quantizer(m) and not n.endswith("weight_fake_quant"):
            m.disable_fake_quant()
    return q


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_prepare_by_platform_puts_weight_quantizers_on_the_fused_experts(kind):
    """One weight fake quantizer per fused parameter, its rows each expert projection's grid
    (GPT-OSS's transposed, interleaved layout included), gradients reaching the fused
    parameters; the router float."""
    model, q, ids = _prepared(kind)
    fused = [n for n, _ in _experts.fused_experts(model)]
    names = {n for n, _ in q.named_modules() if n.endswith("weight_fake_quant")}
    for f in fused:
        up = "gate_up_proj" if hasattr(model.get_submodule(f), "gate_up_proj") else "up_proj"
        assert {f"{f}.{up}_weight_fake_quant", f"{f}.down_proj_weight_fake_quant"} <= names
    assert not any(".gate." in n or ".router." in n for n in names), sorted(names)
    # each expert Linear's rows of the grid (save_quantized's view) are the rows the graph's
    # quantizer gives that projection
    fmt = _schemes.weight_format(W4G16)
    # the fused quantizer -> the parameter it reads, seen as [E x out, in]
    seen = {}
    for f in fused:
        holder = q.get_submodule(f)
        transposed = bool(getattr(model.get_submodule(f), "is_transposed", False))
        for leaf in ("gate_up_proj", "up_proj", "down_proj"):
            if hasattr(holder, leaf + "_weight_fake_quant"):
                p = getattr(holder, leaf).detach()
                p = p.transpose(1, 2) if transposed else p
                seen[id(getattr(holder, leaf + "_weight_fake_quant"))] = p.reshape(-1, p.shape[-1])
    experts = 0
    with _experts.ExpertView(q, names=_experts.expert_names(model.config)) as view:
        mods = dict(q.named_modules())
        for name in view.expert_layers():
            lin = mods[name]
            fq = lin.weight_fake_quant
            with torch.no_grad():
                rows = fq._fq(seen[id(fq._fq)])[fq._rows]
            enc, deq = _encode.encode_weight(name, lin.weight, fmt, fq=fq)
            assert torch.equal(deq, rows), name
            experts += 1
    assert experts == 8 * 3 * len(fused)
    # the graph computes the model with each expert's dequantized weights (the transpose and
    # reshapes of the inserted nodes, checked against the float model's own forward)
    from mqbench._base import is_fake_quantizer
    switched = [m for n, m in q.named_modules() if is_fake_quantizer(m) and
                not (".experts." in n and n.endswith("weight_fake_quant"))]
    for m in switched:
        m.disable_fake_quant()
    ref = copy.deepcopy(model)
    with _experts.ExpertView(q, names=_experts.expert_names(model.config)) as view, \
            _experts.ExpertView(ref, names=_experts.expert_names(model.config)), torch.no_grad():
        mods, ref_mods = dict(q.named_modules()), dict(ref.named_modules())
        for name in view.expert_layers():
            _, deq = _encode.encode_weight(name, mods[name].weight, fmt,
                                           fq=mods[name].weight_fake_quant)
            ref_mods[name].weight.copy_(deq)
    torch.testing.assert_close(_logits(q, ids), _logits(ref, ids), rtol=0, atol=1e-5)
    for m in switched:
        m.enable_fake_quant()
    out = q(input_ids=ids).logits
    out.float().pow(2).mean().backward()
    for f in fused:
        for p in (model.get_submodule(f).down_proj,
                  getattr(model.get_submodule(f), "gate_up_proj", None)):
            if p is not None:
                assert p.grad is not None and p.grad.abs().sum() > 0, f


def test_learnable_expert_quantizers_are_sized_at_prepare_and_learn():
    """QDQ's learnable group quantizers: the scales of every expert row exist before the
    optimizer is built, and receive gradients."""
    model, q, ids = _prepared("qwen3_moe", backend="QDQ")
    fq = q.get_submodule("model.layers.0.mlp.experts.gate_up_proj_weight_fake_quant")
    e, rows, cols = model.model.layers[0].mlp.experts.gate_up_proj.shape
    assert fq.scale.shape[0] == e * rows and isinstance(fq.scale, nn.Parameter)
    q(input_ids=ids).logits.float().pow(2).mean().backward()
    assert fq.scale.grad is not None and fq.scale.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_a_prepared_moe_checkpoint_has_the_prepared_models_logits(kind, tmp_path):
    """save_quantized writes each expert's rows of the trained grid: the checkpoint, loaded by
    transformers (a fresh process) and by load_quantized, computes what the prepared model
    computes with its weights fake-quantized."""
    model, q, ids = _prepared(kind)
    _weights_only(q)
    want = _logits(q, ids)
    save_quantized(q, tmp_path / "q", W4G16, config=model.config)
    torch.testing.assert_close(transformers_logits(tmp_path / "q", ids, tmp_path,
                                                   mode="dequantize"), want, rtol=0, atol=1e-5)
    loaded, qp = load_quantized(tmp_path / "q")
    torch.testing.assert_close(_logits(loaded, ids), want, rtol=0, atol=1e-5)
    assert sum(".experts." in n for n in qp) == 8 * 3 * 2


def test_excluded_experts_stay_float_in_qat():
    model, q, _ = _prepared("qwen3_moe", exclude=("embed_tokens", "lm_head", "experts"))
    assert not any("experts" in n for n, _ in q.named_modules()
                   if n.endswith("weight_fake_quant"))


def test_expert_quantizers_take_the_backends_all_weights_range():
    """OPENVINO narrows every weight to 7 bits: the fused experts' quantizers too."""
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    model = _model("qwen3_moe")
    model.config.use_cache = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = prepare_by_platform(model, BackendType.OPENVINO, {
            "example_inputs": {"input_ids": _ids(n=1, seq=16)},
            "extra_quantizer_dict": {"exclude_module_name": ["embed_tokens", "lm_head"]}})
    ranges = {n: (m.quant_min, m.quant_max) for n, m in q.named_modules()
              if n.endswith("weight_fake_quant") and ".layers.0." in n}
    assert ranges["model.layers.0.mlp.experts.gate_up_proj_weight_fake_quant"] == \
        ranges["model.layers.0.mlp.experts.down_proj_weight_fake_quant"] == \
        ranges["model.layers.0.self_attn.q_proj.weight_fake_quant"] != (-128, 127)
