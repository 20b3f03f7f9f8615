"""Per-token dynamic activations in prepare_by_platform, and the KV cache quantizers
(``kv_cache_qscheme``) written by save_quantized as compressed-tensors' kv_cache_scheme."""
import json
import operator

import pytest
import torch

from mqbench.fake_quantize import PerTokenFakeQuantize
from mqbench.llm import save_quantized
from mqbench.prepare_by_platform import (BackendType, get_qconfig_by_platform, prepare_by_platform,
                                         register_backend)
from mqbench.scheme import QuantizeScheme
from mqbench.utils.state import enable_calibration, enable_quantization
from hf_loader import tiny_llama

transformers = pytest.importorskip("transformers")
ct = pytest.importorskip("compressed_tensors")

W8 = {"bit": 8, "per_channel": True, "symmetric_range": True}


def _calib(n=4, seq=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 128, (1, seq), generator=g)} for _ in range(n)]


def _prepared(a_qscheme=None, kv=None, backend=BackendType.Tensorrt_NLP, model=None):
    model = model or tiny_llama()
    model.config.use_cache = False
    config = {"example_inputs": _calib()[0],
              "extra_quantizer_dict": {"exclude_function_type": [operator.add, torch.matmul],
                                       "exclude_module_name": ["lm_head", "embed_tokens"]}}
    if a_qscheme is not None:
        config["extra_qconfig_dict"] = {"a_qscheme": a_qscheme}
    if kv is not None:
        config["kv_cache_qscheme"] = kv
    q = prepare_by_platform(model, backend, config)
    enable_calibration(q)
    with torch.no_grad():
        for c in _calib():
            q(**c)
    enable_quantization(q)
    return model, q


def _per_token_reference(x, qmin, qmax, symmetric):
    """MQBench's qparams per row, written here with torch's ops."""
    xmin = x.amin(-1, keepdim=True).clamp(max=0)
    xmax = x.amax(-1, keepdim=True).clamp(min=0)
    eps = torch.finfo(torch.float32).eps
    if symmetric:
        scale = (torch.maximum(-xmin, xmax) / ((qmax - qmin) / 2)).clamp(min=eps)
        zp = torch.zeros_like(scale)
    else:
        scale = ((xmax - xmin) / (qmax - qmin)).clamp(min=eps)
        zp = (qmin - torch.round(xmin / scale)).clamp(qmin, qmax)
    return (torch.clamp(torch.round(x * (1.0 / scale)) + zp, qmin, qmax) - zp) * scale


# ------------------------------------------------------------------------------ per token
def test_per_token_scheme_validation():
    s = QuantizeScheme(bit=4, dynamic="per_token")
    assert s.to_observer_params()["dynamic"] == "per_token" and "Dynamic" in str(s)
    assert QuantizeScheme.from_dict(s.to_dict()) == s
    for bad, match in (({"dynamic": "per_row"}, "dynamic must be one of"),
                       ({"dynamic": "per_token", "per_channel": True}, "per_channel"),
                       ({"dynamic": "per_token", "dtype": "mxfp4"}, "integer or FP8"),
                       ({"dynamic": "per_token", "pot_scale": True}, "pot_scale")):
        with pytest.raises(ValueError, match=match):
            QuantizeScheme(**bad)
    with pytest.raises(ValueError, match="for activations"):
        get_qconfig_by_platform(BackendType.Tensorrt_NLP,
                                {"w_qscheme": {"bit": 4, "dynamic": "per_token"}})
    with pytest.raises(ValueError, match="give it at prepare time"):
        register_backend("PerTokenChip", w_qscheme=QuantizeScheme(per_channel=True),
                         a_qscheme=QuantizeScheme(bit=4, dynamic="per_token"))


@pytest.mark.parametrize("a_qscheme,qmin,qmax,symmetric", [
    ({"bit": 4, "symmetry": True, "dynamic": "per_token"}, -8, 7, True),
    ({"bit": 8, "symmetry": False, "dynamic": "per_token"}, 0, 255, False),
])
def test_prepared_linear_inputs_are_quantized_per_token(a_qscheme, qmin, qmax, symmetric):
    model, q = _prepared(a_qscheme)
    fqs = {n: m for n, m in q.named_modules() if isinstance(m, PerTokenFakeQuantize)}
    assert len(fqs) == 2 * 4  # q/k/v and o_proj, gate/up and down_proj inputs, per layer
    seen = {}
    for name, fq in fqs.items():
        fq.register_forward_pre_hook(lambda m, a, n=name: seen.update({n: a[0]}))
        fq.register_forward_hook(lambda m, a, out, n=name: seen.update({n + ".out": out}))
    with torch.no_grad():
        q(**_calib()[0])
    for name in fqs:
        x = seen[name]
        want = _per_token_reference(x, qmin, qmax, symmetric)
        assert torch.equal(seen[name + ".out"], want), name


def test_per_token_fp8_activations_and_their_checkpoint(tmp_path):
    model, q = _prepared({"dtype": "fp8_e4m3", "dynamic": "per_token"})
    fq = next(m for m in q.modules() if isinstance(m, PerTokenFakeQuantize))
    assert fq.format == "fp8_e4m3"
    x = torch.randn(3, 64) * torch.tensor([1.0, 100.0, 0.01]).view(3, 1)
    y = fq(x)
    s = x.abs().amax(-1, keepdim=True) / 448.0
    assert torch.equal(y, (x / s).to(torch.float8_e4m3fn).float() * s)
    qc = save_quantized(q, tmp_path / "ckpt", W8, a_qscheme={"bit": 8, "dynamic": "per_token"},
                        config=model.config)
    assert qc["config_groups"]["group_0"]["input_activations"]["strategy"] == "token"


def test_pt2e_quantizer_takes_the_per_token_scheme():
    pytest.importorskip("torchao")
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e
    from mqbench.pt2e import MQBenchQuantizer
    quantizer = MQBenchQuantizer(BackendType.Tensorrt_NLP, {
        "a_qscheme": {"bit": 4, "dynamic": "per_token"}})
    model = tiny_llama()
    model.config.use_cache = False
    ids = _calib()[0]
    exported = torch.export.export(model, (), ids, strict=False)
    prepared = prepare_pt2e(exported.module(), quantizer)
    fqs = [m for m in prepared.modules() if isinstance(m, PerTokenFakeQuantize)]
    assert len(fqs) >= 2 * 4 and all((f.quant_min, f.quant_max) == (-8, 7) for f in fqs)
    with torch.no_grad():
        ref = model(**ids).logits
        got = prepared(**ids).logits
    assert 0 < (got - ref).abs().max() < ref.abs().max()


# ------------------------------------------------------------------------------ KV cache
@pytest.mark.parametrize("kv,letters", [({"dtype": "fp8_e4m3"}, "fp8"),
                                        ({"bit": 4, "symmetry": False, "per_channel": True},
                                         "int4 per head"),
                                        ({"bit": 8, "symmetry": True}, "int8")])
def test_kv_cache_quantizers_are_calibrated_and_written(kv, letters, tmp_path):
    model, q = _prepared(kv=kv)
    mods = dict(q.named_modules())
    for i in range(2):
        for letter in "kv":
            fq = mods[f"model.layers.{i}.self_attn.{letter}_fake_quant"]
            assert torch.isfinite(fq.scale).all() and (fq.scale > 0).all()
    # the quantizers sit on the key and value inputs of the attention call
    sdpa = [n for n in q.graph.nodes if "scaled_dot_product_attention" in str(n.target)]
    assert len(sdpa) == 2
    for node in sdpa:
        assert node.args[1].target.endswith("k_fake_quant")
        assert node.args[2].target.endswith("v_fake_quant")
    # the keys the attention reads lie on the grid
    seen = {}
    q.get_submodule("model.layers.0.self_attn.k_fake_quant").register_forward_hook(
        lambda m, a, out: seen.update(k=(a[0], out)))
    with torch.no_grad():
        q(**_calib()[0])
    k_in, k_out = seen["k"]
    assert not torch.equal(k_in, k_out)
    path = tmp_path / "ckpt"
    qc = save_quantized(q, path, W8, kv_cache_scheme=kv, config=model.config)
    parsed = ct.quantization.QuantizationConfig.model_validate(qc)
    assert parsed.kv_cache_scheme is not None
    assert qc["kv_cache_scheme"]["strategy"] == ("attn_head" if "per head" in letters
                                                 else "tensor")
    from safetensors import safe_open
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        for i in range(2):
            for letter in "kv":
                owner = f"model.layers.{i}.self_attn"
                fq = mods[f"{owner}.{letter}_fake_quant"]
                s = f.get_tensor(f"{owner}.{letter}_scale")
                if "per head" in letters:  # 4 query heads read 2 KV heads, each repeated twice
                    assert s.shape == (2, 1, 1)
                    assert torch.equal(s.flatten(), fq.scale.view(2, 2)[:, 0])
                    zp = f.get_tensor(f"{owner}.{letter}_zero_point")
                    assert torch.equal(zp.flatten().float(),
                                       fq.zero_point.view(2, 2)[:, 0].float() - 8)
                else:
                    assert s.shape == (1,) and torch.equal(s, fq.scale.reshape(1))
                    assert f"{owner}.{letter}_zero_point" not in keys
    cfg = json.load(open(path / "config.json"))
    assert cfg["quantization_config"]["kv_cache_scheme"]["num_bits"] == (4 if "int4" in letters
                                                                        else 8)


def test_kv_cache_refusals(tmp_path):
    model, q = _prepared()
    with pytest.raises(ValueError, match="no KV cache quantizers"):
        save_quantized(q, tmp_path / "a", W8, kv_cache_scheme={"dtype": "fp8_e4m3"},
                       config=model.config)
    model, q = _prepared(kv={"dtype": "fp8_e4m3"})
    with pytest.raises(ValueError, match="quantizes FP8, kv_cache_scheme is INT8"):
        save_quantized(q, tmp_path / "b", W8, kv_cache_scheme={"bit": 8}, config=model.config)
    with pytest.raises(ValueError, match="E4M3"):
        save_quantized(q, tmp_path / "c", W8, kv_cache_scheme={"dtype": "fp8_e5m2"},
                       config=model.config)
    with pytest.raises(ValueError, match="weight-only"):
        save_quantized(q, tmp_path / "d", {"bit": 4, "per_channel": True},
                       kv_cache_scheme={"dtype": "fp8_e4m3"}, format="gptq", config=model.config)
    for path in "abcd":
        assert not (tmp_path / path).exists()
    with pytest.raises(ValueError, match="static scales"):
        _prepared(kv={"bit": 8, "dynamic": "per_token"})
    eager = tiny_llama()
    eager.config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        _prepared(kv={"dtype": "fp8_e4m3"}, model=eager)


def test_rotated_per_token_and_kv_cache_model_deploys_to_onnxruntime(tmp_path):
    # the online rotation (a MatMul with the constant matrix), the per-token quantizers
    # (standard operators) and the KV cache quantizers (QDQ) in one deployed file, run by
    # onnxruntime against the fake-quant model
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from mqbench.convert_deploy import convert_deploy
    from mqbench.llm import rotate
    model = tiny_llama()
    rotate(model)
    model, q = _prepared({"bit": 8, "dynamic": "per_token"}, kv={"bit": 8, "symmetry": True},
                         model=model)
    q.eval()
    ids = _calib()[2]["input_ids"]
    # per-token activations are standard operators, not Q/DQ: TensorRT would run the linear
    # layers in float (docs/deploy.md, "TensorRT: layers left in float"), so they are allowed
    written = convert_deploy(q, BackendType.Tensorrt_NLP, dummy_input=(ids,),
                             output_path=str(tmp_path), model_name="m", dynamo=True,
                             allow_float_layers=True)
    path = str(tmp_path / "m.onnx")
    assert path in written
    import onnx
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert {"ReduceMax", "Round", "QuantizeLinear", "MatMul"} <= ops
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    got = torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: ids.numpy()})[0])
    with torch.no_grad():
        ref = q(input_ids=ids)[0]
    cos = torch.nn.functional.cosine_similarity(got.flatten().double(), ref.flatten().double(),
                                                dim=0).item()
    assert cos > 0.9999, cos
