"""mqbench.llm.save_quantized / load_quantized (docs/llm.md, "Serving"): compressed-tensors
checkpoints, checked in the real loaders. Each saved folder is loaded in a fresh process by plain
transformers (no mqbench imported), and its logits are held against the quantized model in
memory; compressed-tensors' own compressors decode our tensors, and its QuantizationConfig parses
our config."""
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from mqbench.llm import gptq, load_quantized, load_weight_qparams, rtn, save_quantized
from mqbench.llm.checkpoint import _codec
from hf_loader import tiny_llama, transformers_logits

transformers = pytest.importorskip("transformers")
ct = pytest.importorskip("compressed_tensors")

W4G32 = {"bit": 4, "per_channel": True, "group_size": 32}
A4G32 = {"bit": 4, "symmetry": False, "per_channel": True, "group_size": 32}
DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


_llama = tiny_llama


def _calib(n=4, seq=16, vocab=128, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, vocab, (1, seq), generator=g)} for _ in range(n)]


def _ids(vocab=128):
    return torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(7))


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def _linear_names(model):
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]


def _check_config(path):
    from compressed_tensors.quantization import QuantizationConfig
    cfg = json.load(open(os.path.join(path, "config.json")))
    return QuantizationConfig.model_validate(cfg["quantization_config"])


def _dequantized_copy(model, fmt_weights):
    """The in-memory quantized model: ``model`` with each quantized Linear's weight replaced by
    the values ``fmt_weights(name, weight)`` gives."""
    import copy
    q = copy.deepcopy(model)
    with torch.no_grad():
        for name, m in q.named_modules():
            if isinstance(m, nn.Linear) and name != "lm_head":
                m.weight.copy_(fmt_weights(name, m.weight))
    return q


# ------------------------------------------------------------------------------ the bit layouts
@pytest.mark.parametrize("bits", range(1, 9))
def test_int_packing_is_compressed_tensors(bits):
    from compressed_tensors.compressors.pack_quantized.helpers import (pack_to_int32,
                                                                       unpack_from_int32)
    g = torch.Generator().manual_seed(bits)
    for cols in (1, 7, 32, 33, 100):
        q = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (5, cols), generator=g,
                          dtype=torch.int8)
        ours = _codec.pack_int(q, bits)
        assert torch.equal(ours, pack_to_int32(q, bits)), cols
        assert torch.equal(_codec.unpack_int(ours, bits, cols), q)
        assert torch.equal(unpack_from_int32(ours, bits, torch.Size(q.shape)), q)
        zp = _codec.pack_int(q.t().contiguous(), bits, dim=0)
        assert torch.equal(zp, pack_to_int32(q.t().contiguous(), bits, packed_dim=0))
        assert torch.equal(_codec.unpack_int(zp, bits, cols, dim=0), q.t())
    with pytest.raises(ValueError, match="do not fit"):
        _codec.pack_int(torch.tensor([[1 << (bits - 1)]]), bits)


def test_fp4_and_e8m0_are_compressed_tensors():
    from compressed_tensors.compressors.mx_utils import compress_mx_scale, decompress_mx_scale
    from compressed_tensors.compressors.nvfp4.helpers import (pack_fp4_to_uint8,
                                                              unpack_fp4_from_uint8)
    g = torch.Generator().manual_seed(0)
    x = _codec.E2M1_VALUES[torch.randint(0, 8, (4, 32), generator=g)]
    x = x * torch.where(torch.rand(4, 32, generator=g) < 0.5, -1.0, 1.0)
    packed = _codec.pack_fp4(_codec.e2m1_codes(x))
    assert torch.equal(packed, pack_fp4_to_uint8(x))
    assert torch.equal(_codec.e2m1_values(_codec.unpack_fp4(packed)),
                       unpack_fp4_from_uint8(packed, 4, 32, dtype=torch.float32))
    scales = torch.ldexp(torch.ones(10), torch.arange(-127, 128, 28))
    assert torch.equal(_codec.e8m0_encode(scales), compress_mx_scale(scales, torch.uint8))
    assert torch.equal(_codec.e8m0_decode(_codec.e8m0_encode(scales)),
                       decompress_mx_scale(_codec.e8m0_encode(scales)).float())
    with pytest.raises(ValueError, match="off the FP4 E2M1 grid"):
        _codec.e2m1_codes(torch.tensor([0.75]))
    with pytest.raises(ValueError, match="powers of two"):
        _codec.e8m0_encode(torch.tensor([0.3]))
    with pytest.raises(ValueError, match="NaN code"):
        _codec.e8m0_decode(torch.tensor([255], dtype=torch.uint8))


# ------------------------------------------------------- weight-only: saved, loaded, same logits
def _gptq_model(scheme):
    model = _llama()
    qp = gptq(model, _calib(), scheme)
    return model, qp


@pytest.mark.parametrize("scheme,fmt", [
    (W4G32, "pack-quantized"),
    ({"bit": 4, "per_channel": True}, "pack-quantized"),
    # weight-only INT8 is packed too, as llm-compressor writes it and vLLM's W8A16 reads it
    ({"bit": 8, "per_channel": True}, "pack-quantized"),
])
def test_gptq_checkpoint_loads_in_plain_transformers(scheme, fmt, tmp_path):
    model, qp = _gptq_model(scheme)
    path = tmp_path / "ckpt"
    qc = save_quantized(model, path, scheme, qparams=qp)
    assert qc["format"] == fmt
    parsed = _check_config(path)
    assert parsed.config_groups["group_0"].weights.num_bits == scheme["bit"]
    assert "lm_head" in parsed.ignore
    ids = _ids()
    ref = _logits(model, ids)  # GPTQ's weights lie on the grid: the model is the quantized one
    got = transformers_logits(path, ids, tmp_path)
    assert _rel(got, ref) <= 1e-5, _rel(got, ref)
    # the way back, bit for bit: weights and grid
    loaded, qp2 = load_quantized(path)
    for name in _linear_names(model):
        assert torch.equal(loaded.get_submodule(name).weight, model.get_submodule(name).weight)
        assert torch.equal(qp2[name]["scale"], qp[name]["scale"].reshape(qp2[name]["scale"].shape))
        assert torch.equal(qp2[name]["zero_point"],
                           qp[name]["zero_point"].reshape(qp2[name]["zero_point"].shape).float())
    assert torch.equal(_logits(loaded, ids), ref)


def test_a_bfloat16_model(tmp_path):
    # the grid's scales are float32: transformers' dequantize=True load gives the bfloat16
    # weights in memory bit for bit; its default load (and vLLM) casts the scales to bfloat16,
    # which save_quantized warns about
    model = _llama()
    inv_freq = model.model.rotary_emb.inv_freq.clone()  # transformers keeps it float32
    model.to(torch.bfloat16)
    model.model.rotary_emb.inv_freq = inv_freq
    qp = gptq(model, _calib(), W4G32)
    path = tmp_path / "ckpt"
    with pytest.warns(UserWarning, match="not torch.bfloat16 values"):
        save_quantized(model, path, W4G32, qparams=qp)
    assert json.load(open(path / "config.json"))["dtype"] == "bfloat16"
    ids = _ids()
    ref = _logits(model, ids)
    assert _rel(transformers_logits(path, ids, tmp_path, mode="dequantize"), ref) == 0.0
    assert _rel(transformers_logits(path, ids, tmp_path), ref) < 0.05
    loaded, _ = load_quantized(path, dtype=torch.bfloat16)
    for name in _linear_names(model):
        assert torch.equal(loaded.get_submodule(name).weight, model.get_submodule(name).weight)


def test_asymmetric_int4_layout_and_transformers(tmp_path):
    # compressed-tensors packs an affine scheme's zero points along the output axis
    # ([out * 4 / 32, groups]); vLLM reads that. transformers' default load builds the
    # compressed layout on the meta device, where compressed-tensors 0.20 leaves the zero point
    # unpacked ([out, groups]): a size mismatch. Its dequantize=True load runs the compressor on
    # the file's tensors and loads it (docs/llm.md, "Serving").
    model = _llama()
    qp = rtn(model, A4G32)
    path = tmp_path / "ckpt"
    save_quantized(model, path, A4G32, qparams=qp)
    from safetensors import safe_open
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        zp = f.get_tensor("model.layers.0.self_attn.q_proj.weight_zero_point")
    assert zp.dtype == torch.int32 and tuple(zp.shape) == (64 * 4 // 32, 64 // 32)
    ids = _ids()
    ref = _logits(model, ids)
    got = transformers_logits(path, ids, tmp_path, mode="dequantize")
    assert _rel(got, ref) <= 1e-5
    with pytest.raises(RuntimeError, match="size mismatch|shape"):
        transformers_logits(path, ids, tmp_path)
    loaded, qp2 = load_quantized(path)
    for name in _linear_names(model):
        assert torch.equal(loaded.get_submodule(name).weight, model.get_submodule(name).weight)
        assert torch.equal(qp2[name]["zero_point"], qp[name]["zero_point"].float())
    # compressed-tensors' own compressor reads our tensors to the same weights
    from compressed_tensors.compressors import PackedQuantizationCompressor
    scheme = _check_config(path).config_groups["group_0"]
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        sd = {k.rsplit(".", 1)[1]: f.get_tensor(k) for k in f.keys()
              if k.startswith("model.layers.1.mlp.down_proj.")}
    w = PackedQuantizationCompressor.decompress(sd, scheme)["weight"]
    assert torch.equal(w, model.model.layers[1].mlp.down_proj.weight.detach())


def test_rtn_of_a_float_model_and_the_prepared_round_trip(tmp_path):
    # qparams=None: each weight written rounded as the MinMax observer rounds it; the model is
    # not changed. load_quantized -> prepare_by_platform -> load_weight_qparams computes the
    # same model as RTN's weights in a prepared model.
    import copy
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    model = _llama()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    save_quantized(model, tmp_path / "ckpt", W4G32)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    rounded = copy.deepcopy(model)
    qp = rtn(rounded, W4G32)
    loaded, qp2 = load_quantized(tmp_path / "ckpt")
    for name in _linear_names(model):
        assert torch.equal(loaded.get_submodule(name).weight, rounded.get_submodule(name).weight)
    calib = _calib()
    config = {"example_inputs": calib[0], "extra_qconfig_dict": {"w_qscheme": W4G32},
              "extra_quantizer_dict": {"exclude_module_name": ["embed_tokens", "lm_head"]}}
    outs = []
    for m, grid in ((rounded, qp), (loaded, qp2)):
        m.config.use_cache = False
        prepared = prepare_by_platform(m, BackendType.QDQ, config)
        load_weight_qparams(prepared, grid)
        from mqbench.utils.state import enable_calibration_quantization
        enable_calibration_quantization(prepared, "weight_fake_quant")
        with torch.no_grad():
            outs.append(prepared(**calib[1]).logits)
    assert torch.equal(outs[0], outs[1])


def test_prepared_model_is_written_from_its_fake_quantizers(tmp_path):
    # a model prepared by the torch.export capture: the grids come from its weight fake
    # quantizers, the tensors go under the original module names
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    from mqbench.utils.state import enable_calibration_quantization
    model = _llama()
    model.config.use_cache = False
    calib = _calib()
    prepared = prepare_by_platform(model, BackendType.QDQ, {
        "example_inputs": calib[0], "extra_qconfig_dict": {"w_qscheme": W4G32},
        "extra_quantizer_dict": {"exclude_module_name": ["embed_tokens", "lm_head"]}})
    enable_calibration_quantization(prepared, "weight_fake_quant")
    with torch.no_grad():
        ref = prepared(**calib[0]).logits
    with pytest.raises(ValueError, match="config= the original model's config"):
        save_quantized(prepared, tmp_path / "ckpt", W4G32)
    save_quantized(prepared, tmp_path / "ckpt", W4G32, config=model.config)
    got = transformers_logits(tmp_path / "ckpt", calib[0]["input_ids"], tmp_path)
    assert _rel(got, ref) <= 1e-5


# ------------------------------------------------------------------------- the float formats
def _fq_weights(kind):
    ops = torch.ops.mqbench

    def f(name, w):
        w = w.detach().float()
        if kind == "fp8":
            s = w.abs().amax(1, keepdim=True).clamp(min=torch.finfo(torch.float32).eps) / 448.0
            return ops.fake_quantize_fp8(w, s.reshape(-1), 0, "fp8_e4m3")
        if kind == "nvfp4":
            return ops.fake_quantize_nvfp4(w, w.abs().amax(), 16, -1)
        return ops.fake_quantize_mx(w, "mxfp4", 32, -1)
    return f


@pytest.mark.parametrize("kind,scheme,fmt,tol", [
    ("fp8", {"dtype": "fp8_e4m3", "per_channel": True}, "float-quantized", 1e-5),
    # MXFP4's values are exact in bfloat16, which compressed-tensors decompresses into
    ("mxfp4", {"dtype": "mxfp4"}, "mxfp4-pack-quantized", 1e-5),
    # compressed-tensors decompresses NVFP4 in bfloat16: e * (s / G) rounds there
    ("nvfp4", {"dtype": "nvfp4"}, "nvfp4-pack-quantized", 1e-2),
])
def test_float_formats_load_in_plain_transformers(kind, scheme, fmt, tol, tmp_path):
    model = _llama()
    qc = save_quantized(model, tmp_path / "ckpt", scheme)
    assert qc["format"] == fmt
    _check_config(tmp_path / "ckpt")
    quantized = _dequantized_copy(model, _fq_weights(kind))
    ids = _ids()
    ref = _logits(quantized, ids)
    if kind == "fp8":
        got = transformers_logits(tmp_path / "ckpt", ids, tmp_path)
    else:
        # the default route decompresses FP4 at the first forward, into bfloat16, which a
        # float32 model cannot multiply; dequantize=True casts at load (docs/serving.md)
        with pytest.raises(RuntimeError, match="same dtype"):
            transformers_logits(tmp_path / "ckpt", ids, tmp_path)
        got = transformers_logits(tmp_path / "ckpt", ids, tmp_path, mode="dequantize")
    assert _rel(got, ref) <= tol, _rel(got, ref)
    loaded, qp = load_quantized(tmp_path / "ckpt")
    for name in _linear_names(model):
        w = loaded.get_submodule(name).weight
        want = quantized.get_submodule(name).weight
        if kind == "nvfp4":  # the format's scale / global scale against our g * s: one rounding
            assert torch.allclose(w, want, rtol=2 ** -21, atol=0)
        else:
            assert torch.equal(w, want), name
    assert (kind == "fp8") == bool(qp)


# ------------------------------------------------------------------------ activation schemes
def _per_token(x, bits=8, fp8=False):
    """Dynamic per-token symmetric quantization as compressed-tensors computes it (the test's
    reference): scale = amax / 127.5 (INT8's [-128, 127]) or amax / 448 (FP8), x / scale."""
    amax = x.abs().amax(-1, keepdim=True)
    if fp8:
        s = amax / 448.0
        return torch.clamp(x / s, -448, 448).to(torch.float8_e4m3fn).float() * s
    half = (1 << (bits - 1))
    s = amax / ((2 * half - 1) / 2.0)
    return torch.clamp(torch.round(x / s), -half, half - 1) * s


@pytest.mark.parametrize("kind,wscheme,ascheme", [
    ("int8", {"bit": 8, "per_channel": True}, {"bit": 8, "dynamic": "per_token"}),
    ("fp8", {"dtype": "fp8_e4m3", "per_channel": True},
     {"dtype": "fp8_e4m3", "dynamic": "per_token"}),
])
def test_w8a8_dynamic_per_token_loads_in_plain_transformers(kind, wscheme, ascheme, tmp_path):
    model = _llama()
    qc = save_quantized(model, tmp_path / "ckpt", wscheme, a_qscheme=ascheme)
    acts = _check_config(tmp_path / "ckpt").config_groups["group_0"].input_activations
    assert acts.dynamic is True and acts.strategy == "token"
    assert qc["format"] == ("int-quantized" if kind == "int8" else "float-quantized")
    if kind == "int8":
        quantized = copy_rtn(model, wscheme)
    else:
        quantized = _dequantized_copy(model, _fq_weights("fp8"))
    for name in _linear_names(quantized):
        quantized.get_submodule(name).register_forward_pre_hook(
            lambda m, a: (_per_token(a[0], fp8=(kind == "fp8")),))
    ids = _ids()
    ref = _logits(quantized, ids)
    got = transformers_logits(tmp_path / "ckpt", ids, tmp_path)
    # both sides compute the same formula; a token whose amax ties differently can move one
    # step, so the logits agree to float rounding, not bit for bit
    assert _rel(got, ref) <= 1e-4, _rel(got, ref)


def _static_input(x, s, fp8):
    if fp8:
        return torch.clamp(x / s, -448, 448).to(torch.float8_e4m3fn).float() * s
    return torch.clamp(torch.round(x / s), -128, 127) * s


@pytest.mark.parametrize("fp8", [False, True])
def test_w8a8_static_scales_come_from_the_prepared_model(fp8, tmp_path):
    # Tensorrt_NLP (INT8 [-127, 127] weights per channel and inputs per tensor, or FP8 E4M3),
    # calibrated: each Linear's input_scale is its input quantizer's; compressed-tensors
    # quantizes the Linear inputs with it (INT8 on [-128, 127]) and the weights are the fake
    # quantizers'
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    from mqbench.utils.state import enable_calibration, enable_quantization
    model = _llama()
    model.config.use_cache = False
    calib = _calib()
    config = {"example_inputs": calib[0],
              "extra_quantizer_dict": {"exclude_module_name": ["embed_tokens", "lm_head"]}}
    if fp8:
        config["extra_qconfig_dict"] = {"w_qscheme": {"dtype": "fp8_e4m3", "per_channel": True},
                                        "a_qscheme": {"dtype": "fp8_e4m3"}}
    prepared = prepare_by_platform(model, BackendType.Tensorrt_NLP, config)
    enable_calibration(prepared)
    with torch.no_grad():
        for c in calib:
            prepared(**c)
    enable_quantization(prepared)
    wscheme = {"dtype": "fp8_e4m3", "per_channel": True} if fp8 else \
        {"bit": 8, "per_channel": True, "symmetric_range": True}
    ascheme = {"dtype": "fp8_e4m3"} if fp8 else {"bit": 8}
    path = tmp_path / "ckpt"
    save_quantized(prepared, path, wscheme, a_qscheme=ascheme, config=model.config)
    acts = _check_config(path).config_groups["group_0"].input_activations
    assert acts.dynamic is False and acts.strategy == "tensor"
    from safetensors import safe_open
    reference = _llama()
    mods = dict(prepared.named_modules())
    with safe_open(str(path / "model.safetensors"), "pt") as f, torch.no_grad():
        for name in _linear_names(reference):
            layer = reference.get_submodule(name)
            layer.weight.copy_(mods[name].weight_fake_quant(mods[name].weight))
            s = f.get_tensor(f"{name}.input_scale")
            assert torch.equal(s, f_scale(prepared, name))
            layer.register_forward_pre_hook(lambda m, a, s=s: (_static_input(a[0], s, fp8),))
    # independently of how save_quantized found each Linear's input quantizer: the prepared
    # model's inputs to that Linear lie on the grid of the scale written for it
    seen = {}
    hooks = [mods[n].register_forward_pre_hook(lambda m, a, n=n: seen.setdefault(n, a[0]))
             for n in _linear_names(reference)]
    with torch.no_grad():
        prepared(**calib[1])
    for h in hooks:
        h.remove()
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        for name, x in seen.items():
            s = f.get_tensor(f"{name}.input_scale")
            v = x / s  # grid values, up to the division's rounding
            nearest = v.to(torch.float8_e4m3fn).float() if fp8 else v.round()
            assert torch.allclose(v, nearest, rtol=1e-5, atol=1e-4), name
    ids = _ids()
    ref = _logits(reference, ids)
    got = transformers_logits(path, ids, tmp_path)
    assert _rel(got, ref) <= 1e-5, _rel(got, ref)
    loaded, qp = load_quantized(path)
    for name in _linear_names(reference):
        assert torch.equal(qp[name]["input_scale"], f_scale(prepared, name))
        assert torch.equal(loaded.get_submodule(name).weight, reference.get_submodule(name).weight)


def f_scale(prepared, name):
    from mqbench.llm.checkpoint.save import _input_quantizers
    return _input_quantizers(prepared, [name])[name].scale.detach().float().reshape(-1)


def copy_rtn(model, scheme):
    import copy
    q = copy.deepcopy(model)
    rtn(q, scheme)
    return q


# --------------------------------------------------------------------------- the GPTQ format
_GPTQMODEL_CHECK = r"""
import json, sys, torch
from safetensors import safe_open
from gptqmodel.nn_modules.qlinear.torch import TorchLinear
from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module
path, ref_file = sys.argv[1:3]
qc = json.load(open(path + "/quantize_config.json"))
ref = torch.load(ref_file)
with safe_open(path + "/model.safetensors", "pt") as f:
    for name, w in ref.items():
        sd = {k.rsplit(".", 1)[1]: f.get_tensor(k) for k in f.keys() if k.rsplit(".", 1)[0] == name}
        out_f, in_f = w.shape
        lin = TorchLinear(bits=qc["bits"], group_size=qc["group_size"] if qc["group_size"] > 0
                          else in_f, sym=qc["sym"], desc_act=False, in_features=in_f,
                          out_features=out_f, bias=False)
        lin.load_state_dict(sd, strict=False)
        if qc["checkpoint_format"] == "gptq":
            convert_gptq_v1_to_v2_format_module(lin, bits=qc["bits"], pack_dtype=torch.int32)
        lin.post_init()
        lin.eval()
        # the kernel computes in float16: our weights (on float16 scales) rounded to float16
        assert torch.equal(lin.dequantize_weight().t(), w.half()), name
        x = torch.randn(4, in_f, dtype=torch.float16)
        y = lin(x).float()
        ref_y = x.float() @ w.t()
        assert float((y - ref_y).abs().max() / ref_y.abs().max()) < 5e-3, name
print("checked", len(ref))
"""


@pytest.mark.parametrize("scheme,fmt", [
    (W4G32, "gptq"),
    ({"bit": 8, "per_channel": True}, "gptq"),
    ({"bit": 2, "per_channel": True, "group_size": 32}, "gptq"),
    (A4G32, "gptq_v2"),
])
def test_gptq_format_in_gptqmodels_cpu_kernel(scheme, fmt, tmp_path):
    import importlib.util
    model, qp = _gptq_model(scheme)
    path = tmp_path / "ckpt"
    qc = save_quantized(model, path, scheme, qparams=qp, format=fmt)
    assert qc["quant_method"] == "gptq" and qc["checkpoint_format"] == fmt
    assert json.load(open(path / "quantize_config.json")) == qc
    # the way back: GPTQ's scales are float16, so each weight is its grid point on the
    # float16 scale, exactly
    loaded, qp2 = load_quantized(path)
    for name in _linear_names(model):
        s16 = qp[name]["scale"].half().float()
        z = qp[name]["zero_point"].float()
        w = model.get_submodule(name).weight.detach()
        out_f, in_f = w.shape
        rep = in_f // s16.shape[1]
        s_full, z_full = s16.repeat_interleave(rep, 1), z.repeat_interleave(rep, 1)
        q = torch.round(w / qp[name]["scale"].repeat_interleave(rep, 1)) + z_full
        assert torch.equal(loaded.get_submodule(name).weight, (q - z_full) * s_full), name
        assert torch.equal(qp2[name]["scale"], s16) and torch.equal(qp2[name]["zero_point"], z)
    if importlib.util.find_spec("gptqmodel") is None:
        pytest.skip("GPTQModel is not installed (requirements-peers.txt)")
    ref_file = tmp_path / "weights.pt"
    torch.save({n: loaded.get_submodule(n).weight.detach() for n in _linear_names(model)},
               ref_file)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", _GPTQMODEL_CHECK, str(path), str(ref_file)],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "checked 14" in r.stdout


def test_gptq_format_refusals(tmp_path):
    model = _llama()
    target = tmp_path / "out"
    with pytest.raises(ValueError, match="no per-tensor scale"):
        save_quantized(model, target, {"bit": 4}, format="gptq")
    with pytest.raises(ValueError, match="integer weights of \\(2, 4, 8\\) bits"):
        save_quantized(model, target, {"bit": 3, "per_channel": True}, format="gptq")
    with pytest.raises(ValueError, match="weight-only"):
        save_quantized(model, target, {"bit": 8, "per_channel": True}, format="gptq",
                       a_qscheme={"bit": 8, "dynamic": "per_token"})
    with pytest.raises(ValueError, match="'model.layers.0.mlp.down_proj' is left float"):
        save_quantized(model, target, W4G32, format="gptq", ignore=("lm_head", "down_proj"))
    # an affine group whose zero point is 0 does not fit v1's "zero - 1"
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight[0, :32] = torch.rand(32) + 0.1
    with pytest.raises(ValueError, match="zero point of 0.*format='gptq_v2'"):
        save_quantized(model, target, A4G32, format="gptq")
    assert not target.exists()


# ---------------------------------------------------------------------------- sizes and shards
def test_w4_is_under_045x_the_float_checkpoint_and_shards(tmp_path):
    model = _llama(hidden=256, inter=512, vocab=128, tie=True)
    model.save_pretrained(tmp_path / "float")
    qp = rtn(model, {"bit": 4, "per_channel": True, "group_size": 128})
    save_quantized(model, tmp_path / "w4", {"bit": 4, "per_channel": True, "group_size": 128},
                   qparams=qp)

    def size(d):
        return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
                   if f.endswith(".safetensors"))
    ratio = size(tmp_path / "w4") / size(tmp_path / "float")
    assert ratio <= 0.45, ratio
    save_quantized(model, tmp_path / "sharded", {"bit": 4, "per_channel": True,
                                                 "group_size": 128}, qparams=qp,
                   max_shard_size="200KB")
    files = sorted(os.listdir(tmp_path / "sharded"))
    assert "model.safetensors.index.json" in files
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) > 2
    assert all(os.path.getsize(tmp_path / "sharded" / f) < 400_000 for f in shards)
    ids = _ids()
    ref = _logits(model, ids)
    assert _rel(transformers_logits(tmp_path / "sharded", ids, tmp_path), ref) <= 1e-5
    loaded, _ = load_quantized(tmp_path / "sharded")
    assert torch.equal(_logits(loaded, ids), ref)


# ------------------------------------------------------------------------------- bad input
def test_refusals_before_anything_is_written(tmp_path):
    model = _llama()
    qp = rtn(model, W4G32)
    target = tmp_path / "out"
    # a scheme other than the qparams'
    with pytest.raises(ValueError, match="'model.layers.0.self_attn.q_proj''s grid has 128 "
                                         "scales, but w_qscheme .* wants 64"):
        save_quantized(model, target, {"bit": 4, "per_channel": True}, qparams=qp)
    # weights moved off their grid
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] += 1e-3
    with pytest.raises(ValueError, match="'model.layers.0.mlp.up_proj'.*not on the grid"):
        save_quantized(model, target, W4G32, qparams=qp)
    with pytest.raises(ValueError, match="fp8_e5m2"):
        save_quantized(model, target, {"dtype": "fp8_e5m2"})
    with pytest.raises(ValueError, match="kv_cache_scheme"):
        save_quantized(model, target, W4G32, kv_cache_scheme={"num_bits": 8})
    with pytest.raises(ValueError, match="format 'gguf'"):
        save_quantized(model, target, W4G32, format="gguf")
    with pytest.raises(ValueError, match="static a_qscheme.*has none"):
        save_quantized(model, target, {"bit": 8, "per_channel": True}, a_qscheme={"bit": 8})
    with pytest.raises(ValueError, match="'model.layers.0.self_attn.q_proj' has 64 input "
                                         "channels, not a multiple of the block of 48"):
        save_quantized(model, target, {"bit": 4, "per_channel": True, "group_size": 48})
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary left either
    # an existing, non-empty folder
    target.mkdir()
    (target / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="not empty; pass overwrite=True"):
        save_quantized(model, target, W4G32)
    assert (target / "keep.txt").read_text() == "x"
    save_quantized(model, target, W4G32, overwrite=True)
    assert not (target / "keep.txt").exists() and (target / "config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_scheme_pairs_no_engine_runs_are_refused(tmp_path):
    model = _llama()
    per_token = {"bit": 8, "dynamic": "per_token"}
    for w, a, msg in [
            ({"dtype": "fp8_e4m3", "per_channel": True}, per_token, "FP8 weights take FP8"),
            ({"dtype": "nvfp4"}, per_token, "weight-only"),
            ({"dtype": "mxfp4"}, {"dtype": "fp8_e4m3", "dynamic": "per_token"}, "weight-only"),
            (W4G32, per_token, "symmetric INT8 per channel or per tensor"),
            ({"bit": 8, "per_channel": True, "group_size": 32}, per_token, "symmetric INT8"),
            ({"bit": 8, "per_channel": True, "symmetry": False}, per_token, "symmetric INT8"),
            ({"bit": 8, "per_channel": True}, {"dtype": "fp8_e4m3", "dynamic": "per_token"},
             "FP8 activations have no")]:
        with pytest.raises(ValueError, match=msg):
            save_quantized(model, tmp_path / "out", w, a_qscheme=a)
    assert not (tmp_path / "out").exists()


def test_a_tied_lm_head_is_refused_by_name(tmp_path):
    model = _llama(tie=True)
    with pytest.raises(ValueError, match="'lm_head' shares its weight with "
                                         "'model.embed_tokens.weight'"):
        save_quantized(model, tmp_path / "out", W4G32, ignore=())
    save_quantized(model, tmp_path / "out", W4G32)  # lm_head ignored: fine
    cfg = json.load(open(tmp_path / "out" / "config.json"))
    assert cfg["tie_word_embeddings"] is True and "_name_or_path" not in cfg


def test_folders_permissions_and_an_empty_target(tmp_path):
    model = _llama()
    umask = os.umask(0o022)
    try:
        save_quantized(model, tmp_path / "new", W4G32)
        assert (os.stat(tmp_path / "new").st_mode & 0o777) == 0o755
        # an existing empty folder (a mount point cannot be renamed) is filled in place and
        # keeps its mode
        (tmp_path / "empty").mkdir(mode=0o750)
        os.chmod(tmp_path / "empty", 0o750)
        inode = os.stat(tmp_path / "empty").st_ino
        save_quantized(model, tmp_path / "empty", W4G32)
        assert os.stat(tmp_path / "empty").st_ino == inode
        assert (tmp_path / "empty" / "config.json").exists()
        assert (os.stat(tmp_path / "empty").st_mode & 0o777) == 0o750
    finally:
        os.umask(umask)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "new"]


def test_a_failed_swap_puts_the_old_folder_back(tmp_path, monkeypatch):
    from mqbench.llm.checkpoint import _files
    model = _llama()
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    real_rename = os.rename

    def flaky(src, dst):
        if str(src).endswith(".partial"):
            raise OSError("disk full")
        return real_rename(src, dst)
    monkeypatch.setattr(_files.os, "rename", flaky)
    with pytest.raises(OSError, match="disk full"):
        save_quantized(model, target, W4G32, overwrite=True)
    assert (target / "keep.txt").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_load_quantized_picks_the_most_specific_group(tmp_path):
    # llm-compressor's mixed precision: group_0 targets Linear (INT4 groups of 32), group_1 a
    # regex (INT8 per channel for down_proj). The regex is more specific, wherever it is in the
    # file: compressed-tensors' and vLLM's rule.
    from safetensors.torch import load_file, save_file
    from mqbench.llm.checkpoint import _encode, _schemes
    model = _llama()
    w8 = {"bit": 8, "per_channel": True}
    path = tmp_path / "ckpt"
    save_quantized(model, path, W4G32)
    tensors = load_file(str(path / "model.safetensors"))
    fmt8 = _schemes.weight_format(w8)
    expected = {}
    for name in _linear_names(model):
        w = model.get_submodule(name).weight
        fmt = fmt8 if name.endswith("down_proj") else _schemes.weight_format(W4G32)
        enc, deq = _encode.encode_weight(name, w, fmt)
        expected[name] = deq
        if fmt is fmt8:
            for k in [k for k in tensors if k.startswith(name + ".")]:
                del tensors[k]
            tensors.update({f"{name}.{k}": v for k, v in enc.items()})
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(path / "config.json"))
    groups = cfg["quantization_config"]["config_groups"]
    g8 = json.loads(json.dumps(groups["group_0"]))
    g8["targets"] = ["re:.*down_proj$"]
    g8["weights"].update(num_bits=8, strategy="channel", group_size=None)
    cfg["quantization_config"]["config_groups"] = {"group_0": g8, "group_1": groups["group_0"]}
    (path / "config.json").write_text(json.dumps(cfg))
    loaded, qp = load_quantized(path)
    for name in _linear_names(model):
        assert torch.equal(loaded.get_submodule(name).weight, expected[name]), name
    assert qp["model.layers.0.mlp.down_proj"]["quant_max"] == 127
    ids = _ids()
    assert _rel(transformers_logits(path, ids, tmp_path), _logits(loaded, ids)) <= 1e-5
    # a zero point under a symmetric scheme is a file that is not what its config says
    save_quantized(model, tmp_path / "affine", A4G32)
    cfg = json.load(open(tmp_path / "affine" / "config.json"))
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"] = True
    (tmp_path / "affine" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="has \\['weight_zero_point'\\], which INT4 symmetric"):
        load_quantized(tmp_path / "affine")


def test_symmetric_range_round_trip_through_load_weight_qparams(tmp_path):
    # the file stores INT8 as [-128, 127]; w_qscheme names the narrower range the model had
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    model = _llama()
    model.config.use_cache = False
    scheme = {"bit": 8, "per_channel": True, "symmetric_range": True}
    qp = rtn(model, scheme)
    save_quantized(model, tmp_path / "ckpt", scheme, qparams=qp)
    loaded, qp2 = load_quantized(tmp_path / "ckpt")
    assert qp2["model.layers.0.mlp.up_proj"]["quant_min"] == -128
    loaded, qp2 = load_quantized(tmp_path / "ckpt", w_qscheme=scheme)
    assert qp2["model.layers.0.mlp.up_proj"]["quant_min"] == -127
    with pytest.raises(ValueError, match="stored at INT8 symmetric per channel.*w_qscheme is "
                                         "INT4"):
        load_quantized(tmp_path / "ckpt", w_qscheme={"bit": 4, "per_channel": True})
    calib = _calib()
    prepared = prepare_by_platform(loaded, BackendType.Tensorrt_NLP, {
        "example_inputs": calib[0],
        "extra_quantizer_dict": {"exclude_module_name": ["embed_tokens", "lm_head"]}})
    load_weight_qparams(prepared, qp2)
    mods = dict(prepared.named_modules())
    with torch.no_grad():
        for name in _linear_names(model):
            fq = mods[name].weight_fake_quant
            assert torch.equal(fq(mods[name].weight), model.get_submodule(name).weight), name


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device (CI has none; the GPU machine runs these)")
def test_a_model_on_cuda_is_saved_as_on_the_cpu(tmp_path):
    model = _llama()
    qp = gptq(model, _calib(), W4G32)
    save_quantized(model, tmp_path / "cpu", W4G32, qparams=qp)
    qp_cuda = {n: {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in g.items()}
               for n, g in qp.items()}
    save_quantized(model.cuda(), tmp_path / "cuda", W4G32, qparams=qp_cuda)
    from safetensors.torch import load_file
    a, b = load_file(str(tmp_path / "cpu" / "model.safetensors")), \
        load_file(str(tmp_path / "cuda" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_interrupted_save_leaves_no_checkpoint(tmp_path):
    from mqbench.llm.checkpoint import _files

    def boom(folder):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        _files.write_checkpoint(str(tmp_path / "out"), {"a": torch.zeros(2)},
                                {"config.json": {}}, 1 << 20, boom)
    assert list(tmp_path.iterdir()) == []


def test_load_quantized_names_what_it_cannot_read(tmp_path):
    model = _llama()
    save_quantized(model, tmp_path / "ckpt", W4G32)
    cfg_path = tmp_path / "ckpt" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for field, value, message in [
            ("quant_method", "awq", "quant_method 'awq'; this reads 'compressed-tensors' and "
                                    "'gptq'"),
            ("format", "marlin-24", "format 'marlin-24'")]:
        broken = json.loads(json.dumps(cfg))
        broken["quantization_config"][field] = value
        if field == "format":
            broken["quantization_config"]["config_groups"]["group_0"]["format"] = value
        cfg_path.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=message):
            load_quantized(tmp_path / "ckpt")
    broken = json.loads(json.dumps(cfg))
    broken["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 16
    cfg_path.write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="down_proj.weight_scale has shape "
                                         "\\[64, 4\\].*needs \\[64, 8\\]"):
        load_quantized(tmp_path / "ckpt")
    cfg_path.write_text(json.dumps(cfg))
    index = {"weight_map": {"x": "../model.safetensors"}}
    (tmp_path / "ckpt" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="not a safetensors file in the checkpoint's folder"):
        load_quantized(tmp_path / "ckpt")


# ----------------------------------------------------------------- llm-compressor's own output
_LLMC = os.path.join(DATA, "llmcompressor")


@pytest.mark.parametrize("name", sorted(d for d in os.listdir(_LLMC)
                                        if os.path.isdir(os.path.join(_LLMC, d))))
def test_llmcompressor_checkpoints_load(name, tmp_path):
    # made by llm-compressor 0.14 (tests/python/data/llmcompressor/README.md); its metadata pins
    # compressed-tensors 0.19 and transformers <= 5.17, so it is not installed beside ours
    path = os.path.join(_LLMC, name)
    ids = _ids(256)
    ref = transformers_logits(path, ids, tmp_path, mode="dequantize")
    loaded, qp = load_quantized(path)
    assert _rel(_logits(loaded, ids), ref) <= 1e-5
