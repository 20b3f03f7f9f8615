"""``save_quantized``: a quantized transformers model as a checkpoint that vLLM, SGLang and
transformers load: compressed-tensors (the default) or GPTQ (docs/serving.md)."""
import contextlib
import warnings

import torch

from mqbench._base import is_fake_quantizer
from mqbench.llm import _experts, _layers, _prepared
from mqbench.llm.checkpoint import _encode, _files, _gptq_format, _kv_cache, _names, _schemes

__all__ = ["save_quantized"]

FORMATS = ("compressed-tensors",) + tuple(_gptq_format.FORMATS)


def _fq_kind(fq):
    if hasattr(fq, "amax"):
        return "nvfp4"
    fmt = getattr(fq, "format", None)
    if isinstance(fmt, str) and fmt != "int":
        return {"fp8_e4m3": "fp8", "mxfp4": "mxfp4"}.get(fmt, fmt)
    return "int"


def _check_fake_quantizer(name, mod, fmt):
    fq = mod.weight_fake_quant
    kind = _fq_kind(fq)
    if kind != fmt.kind:
        raise ValueError(f"save_quantized: {name!r}'s weight_fake_quant quantizes {kind} but "
                         f"w_qscheme is {fmt.describe()}: pass the w_qscheme the model was "
                         "prepared with")
    if kind == "int":
        _prepared.check_weight_quantizer(name, mod, _encode.fmt_as_wq(fmt), "save_quantized")
    elif kind == "fp8" and bool(getattr(fq, "is_per_channel", False)) != \
            (fmt.strategy == "channel"):
        raise ValueError(f"save_quantized: {name!r}'s FP8 weight_fake_quant and w_qscheme "
                         "disagree on per-channel scales")


def _input_quantizers(model, names):
    """name -> the fake quantizer feeding that layer's input in a prepared graph (None where
    there is none)."""
    graph = getattr(model, "graph", None)
    found = dict.fromkeys(names)
    if graph is None:
        return found
    mods = dict(model.named_modules())
    for node in graph.nodes:
        if node.op == "call_module" and node.target in found and node.args:
            src = node.args[0]
            if getattr(src, "op", None) == "call_module" and \
                    is_fake_quantizer(mods.get(src.target)):
                found[node.target] = mods[src.target]
    return found


def _act_tensors(name, fq, afmt):
    """A static input scheme's ``input_scale`` (and ``input_zero_point``) from the layer's input
    fake quantizer."""
    if fq is None:
        raise ValueError(f"save_quantized: a static a_qscheme takes each layer's input scale from "
                         f"the calibrated fake quantizer at its input, and {name!r} has none "
                         "(a float model, or a layer the backend leaves unquantized): calibrate a "
                         "prepare_by_platform model, or use a_qscheme dynamic='per_token'")
    kind = _fq_kind(fq)
    if kind != afmt.kind:
        raise ValueError(f"save_quantized: {name!r}'s input quantizer is {kind}, a_qscheme is "
                         f"{afmt.kind}")
    # a copy: one quantizer often feeds several Linears (q / k / v), and safetensors refuses
    # tensors that share memory
    scale = fq.scale.detach().float().cpu().reshape(-1).clone()
    if scale.numel() != 1:
        raise ValueError(f"save_quantized: {name!r}'s input quantizer has {scale.numel()} scales; "
                         "compressed-tensors' static activations have one per tensor")
    if getattr(fq, "pot_scale", False):
        raise ValueError(f"save_quantized: {name!r}'s input quantizer has power-of-two scales")
    out = {"input_scale": scale}
    if kind == "int":
        fmt = _schemes.WeightFormat("int", afmt.bits, "tensor", None, afmt.symmetric,
                                    int(fq.quant_min), int(fq.quant_max))
        _schemes.check_int_range(fmt, f"{name!r}'s input quantizer")
        if bool(fq.is_symmetric_quant) != afmt.symmetric:
            raise ValueError(f"save_quantized: {name!r}'s input quantizer and a_qscheme disagree "
                             "on symmetry")
        if not afmt.symmetric:
            zp = fq.zero_point.detach().float().cpu().reshape(-1) - fmt.shift
            out["input_zero_point"] = zp.to(torch.int8)
    return out


def _refuse_online_rotations(model):
    """A rotation applied at run time (``rotate(online=True)``) has no place in the format: the
    checkpoint would serve down_proj's rotated weights on unrotated inputs."""
    from mqbench.nn.modules.hadamard import HadamardRotation
    online = [n for n, m in model.named_modules() if isinstance(m, HadamardRotation)]
    graph = getattr(model, "graph", None)
    if graph is not None:
        online += [n.name for n in graph.nodes if n.op == "call_function" and
                   str(n.target).startswith("mqbench.hadamard_transform")]
    if online:
        raise ValueError(f"save_quantized: the model rotates activations at run time "
                         f"({online[0]!r}, {len(online)} in all), which a compressed-tensors "
                         "checkpoint cannot express; rotate with online=False for a checkpoint "
                         "serving engines load")


def _warn_half_scales(layers, quantized):
    """A bfloat16 / float16 model's grid has float32 scales; transformers' default load and
    vLLM cast them to the model's dtype, which moves the served weights where a scale is not a
    value of that dtype (docs/serving.md, "Half-precision models")."""
    dtype = layers[0][1].weight.dtype
    if dtype not in (torch.bfloat16, torch.float16):
        return
    moved = [n for n, enc in quantized.items() if "weight_scale" in enc and
             enc["weight_scale"].is_floating_point() and enc["weight_scale"].dtype == torch.float32
             and not torch.equal(enc["weight_scale"].to(dtype).float(), enc["weight_scale"])]
    if moved:
        warnings.warn(f"save_quantized: {len(moved)} of {len(quantized)} layers (first "
                      f"{moved[0]!r}) have float32 scales that are not {dtype} values; engines "
                      f"that cast the scales to the model's {dtype} (transformers' default load, "
                      "vLLM) serve weights that differ from these by up to one rounding of the "
                      "scale; transformers with CompressedTensorsConfig(dequantize=True) loads "
                      "them exactly")


def _model_class(model, config):
    """The transformers class of ``model``: its own, or for a prepared model the one its config's
    ``architectures`` names."""
    import transformers
    if isinstance(model, transformers.PreTrainedModel):
        return type(model)
    arch = (getattr(config, "architectures", None) or [None])[0]
    cls = getattr(transformers, arch or "", None)
    if cls is None:  # the captures name the prepared GraphModule after the model's class
        cls = getattr(transformers, type(model).__name__, None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise ValueError("save_quantized: cannot tell the prepared model's transformers class: "
                         f"its config's architectures is {arch!r}; set model.config.architectures "
                         "(e.g. ['LlamaForCausalLM'], as a checkpoint's config.json has it)")
    return cls


def _reference_keys(cls, config):
    """The state-dict keys a ``cls`` model of ``config`` has (built on the meta device, its
    fused experts one Linear per expert), each tensor once: a key that aliases an earlier one
    (tied embeddings) is left out, as transformers saves them. Returns (keys, {alias: the key it
    aliases}, the names on disk of the model's keys)."""
    with torch.device("meta"):
        skeleton = cls._from_config(config)
    names = _names.KeyNames(skeleton)
    seen, keys, aliases = {}, [], {}
    with _experts.ExpertView(skeleton):
        state = skeleton.state_dict(keep_vars=True)
    for k, v in state.items():
        if id(v) in seen:
            aliases[k] = seen[id(v)]
            continue
        seen[id(v)] = k
        keys.append(k)
    return keys, aliases, names


def save_quantized(model, save_dir, w_qscheme, qparams=None, a_qscheme=None, kv_cache_scheme=None,
                   format="compressed-tensors", ignore=("lm_head",), tokenizer=None,
                   max_shard_size="5GB", overwrite=False, config=None):
    """Writes ``model`` (a transformers causal LM, float or prepared by ``prepare_by_platform``)
    quantized on ``w_qscheme`` as a compressed-tensors checkpoint in ``save_dir``: config.json
    with its ``quantization_config``, safetensors shards, and the tokenizer when given. vLLM,
    SGLang and ``transformers.AutoModelForCausalLM.from_pretrained`` load it.

    Args:
        model: after ``gptq`` / ``signround`` / ``rtn`` (pass their ``qparams``: the weights must
            lie on that grid), after ``awq`` / ``smoothquant`` or any float model (each weight is
            written rounded to the nearest point of the MinMax grid of ``w_qscheme``; the model
            itself is not changed), or a prepared model (each ``weight_fake_quant`` gives its
            grid; tensors are written under the original names).
        w_qscheme: the weights' scheme: integer (``{"bit": 4, "per_channel": True,
            "group_size": 128}``, symmetric or affine, per group / channel / tensor), or
            ``{"dtype": "fp8_e4m3", "per_channel": True}``, ``{"dtype": "nvfp4"}``,
            ``{"dtype": "mxfp4"}``.
        a_qscheme: None (weight-only), or the input activations' scheme: ``{"bit": 8,
            "dynamic": "per_token"}`` / ``{"dtype": "fp8_e4m3", "dynamic": "per_token"}``
            (the engine computes the scales), or static per tensor (``{"bit": 8}``, with
            ``"symmetry"``), whose scales come from a calibrated prepared model.
        kv_cache_scheme: None, or the KV cache's scheme (the ``kv_cache_qscheme`` the model was
            prepared with: ``{"dtype": "fp8_e4m3"}``, ``{"bit": 8, "symmetry": False}``, with
            ``"per_channel": True`` for one scale per KV head): each attention module's
            calibrated ``k_fake_quant`` / ``v_fake_quant`` is written as its ``k_scale`` /
            ``v_scale`` (and zero points), compressed-tensors' ``kv_cache_scheme``.
        format: "compressed-tensors", or "gptq" / "gptq_v2" (GPTQ's v1 / v2 zero points;
            INT2 / 4 / 8 weight-only, every Linear but lm_head quantized).
        ignore: Linear names (or last name components) left float; ``lm_head`` by default.
        tokenizer: saved beside the weights when given.
        max_shard_size: bytes, or "5GB" / "500MB" as transformers takes it.
        overwrite: replace a ``save_dir`` that exists and is not empty.
        config: the transformers config to write (default ``model.config``; a prepared model
            does not carry one: pass the original model's).

    Returns the checkpoint's ``quantization_config`` (a dict). Nothing is written when a layer
    cannot be expressed: the ValueError names it.
    """
    if format not in FORMATS:
        raise ValueError(f"save_quantized: format {format!r} is not written; formats: "
                         f"{list(FORMATS)}")
    kvfmt = _kv_cache.kv_format(kv_cache_scheme)
    _refuse_online_rotations(model)
    if isinstance(ignore, str):
        ignore = (ignore,)
    save_dir = _files.check_target(save_dir, overwrite)
    limit = _files.shard_bytes(max_shard_size)
    afmt = _schemes.act_format(a_qscheme)
    wfmt = _schemes.weight_format(w_qscheme).with_activations(afmt)
    gptq_format = format in _gptq_format.FORMATS
    if gptq_format:
        _gptq_format.check(wfmt, format)
        if afmt is not None or kvfmt is not None:
            raise ValueError(f"save_quantized: format {format!r} is weight-only; a_qscheme and "
                             "kv_cache_scheme must be None")
    config = config if config is not None else getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise ValueError("save_quantized: the model has no transformers config (model.config); "
                         "pass a transformers model, or for a prepared model config= the "
                         "original model's config")
    cls = _model_class(model, config)
    prepared = any(is_fake_quantizer(m) for m in model.modules())

    # fused experts (transformers 5's MoE models) are read and written one Linear per expert;
    # in a prepared model each expert Linear reads its rows of the fused parameter's weight
    # fake quantizer (Note [Fused experts in a prepared model])
    view = _experts.ExpertView(model, names=_experts.expert_names(config))
    with view if view else contextlib.nullcontext():
        if view:
            ignore = tuple(ignore) + tuple(view.routers)
            _experts.refuse_fused_on_disk(config, [
                n for n in view.expert_layers() if (n in qparams if qparams is not None else
                                                    not (n in ignore or
                                                         n.rsplit(".", 1)[-1] in ignore))],
                "save_quantized")
        mods = dict(model.named_modules())
        if prepared:
            layers = [(n, m) for n, m in mods.items() if _layers.is_linear(m) and
                      getattr(m, "weight_fake_quant", None) is not None and
                      not (n in ignore or n.rsplit(".", 1)[-1] in ignore)]
            if qparams is not None:
                raise ValueError("save_quantized: a prepared model's weight_fake_quant holds the "
                                 "grid; pass qparams=None (load_weight_qparams sets an algorithm's "
                                 "qparams into it)")
        else:
            layers = _layers.find_linears(model, None, ignore)
            if qparams is not None:
                layers = [(n, m) for n, m in layers if n in qparams]
                missing = sorted(set(qparams) - {n for n, _ in layers})
                if missing:
                    raise ValueError(f"save_quantized: qparams name layers that are not "
                                     f"Linears of the model (or are in ignore): {missing[:5]}")
        if not layers:
            raise ValueError("save_quantized: no layer to quantize (every Linear is ignored or "
                             "left float)")
        conv1d = [n for n, m in layers if _layers.is_conv1d(m)]
        if conv1d:
            raise ValueError(f"save_quantized: {conv1d[0]!r} is a transformers Conv1D (GPT-2 "
                             "style); compressed-tensors quantizes nn.Linear layers only")
        in_fq = _input_quantizers(model, [n for n, _ in layers]) \
            if afmt and not afmt.dynamic else {}

        # Everything is encoded (and checked) before anything is written.
        tensors, quantized = {}, {}
        for name, mod in layers:
            fq = getattr(mod, "weight_fake_quant", None) if prepared else None
            if fq is not None:
                _check_fake_quantizer(name, mod, wfmt)
            qp = qparams.get(name) if qparams is not None else None
            if gptq_format:
                wt = _layers.weight_2d(mod)
                q, scale, zp, _ = _encode.int_grid(name, wt.detach().float().cpu(), wfmt, qp, fq,
                                                   wt.dtype)
                quantized[name] = _gptq_format.tensors(name, q, scale, zp, wfmt, format)
                _gptq_format.check_round_trip(name, quantized[name], q, scale, zp, wfmt, format)
                continue
            enc, deq = _encode.encode_weight(name, mod.weight, wfmt, qp=qp, fq=fq)
            _encode.check_round_trip(name, enc, wfmt, deq)
            if afmt is not None and not afmt.dynamic:
                enc.update(_act_tensors(name, in_fq.get(name), afmt))
            quantized[name] = enc

        _warn_half_scales(layers, quantized)
        state = {k: v for k, v in model.state_dict().items()}
        lost = []
        keys, aliases, names = _reference_keys(cls, config)
        tied = sorted(n for n in quantized if f"{n}.weight" in aliases)
        if tied:
            raise ValueError(f"save_quantized: {tied[0]!r} shares its weight with "
                             f"{aliases[tied[0] + '.weight']!r} (tied embeddings), which stays "
                             "float; keep it in ignore (the default), or untie the weights first")
        for key in keys:
            owner, _, leaf = key.rpartition(".")
            if owner in quantized and leaf == "weight":
                for local, t in quantized[owner].items():
                    tensors[f"{owner}.{local}"] = t.detach().cpu().contiguous()
                continue
            t = state.get(key)
            if t is None:
                lost.append(key)
                continue
            tensors[key] = t.detach().cpu().contiguous()
        if kvfmt is not None:
            tensors.update(_kv_cache.kv_tensors(model, kvfmt, config))
        if lost:
            raise ValueError(f"save_quantized: {len(lost)} tensors of the model's class are not "
                             f"in the model (first {lost[:3]}): the checkpoint would not load")
        unmatched = sorted(set(quantized) - {k.rpartition('.')[0] for k in tensors})
        if unmatched:
            raise ValueError(f"save_quantized: quantized layers {unmatched[:3]} are not in the "
                             "model's transformers class (renamed by a capture?)")

        float_linears = sorted(n for n, m in mods.items()
                               if isinstance(m, torch.nn.Linear) and n not in quantized)
    if gptq_format:
        left = [n for n in float_linears if n.rsplit(".", 1)[-1] != "lm_head"]
        if left:
            raise ValueError(f"save_quantized: format {format!r} quantizes every Linear but "
                             f"lm_head, and {left[0]!r} is left float; quantize it, or use "
                             "format='compressed-tensors' (its ignore list names float layers)")
        qconfig = _gptq_format.config(wfmt, format)
    else:
        qconfig = _schemes.quantization_config(wfmt, afmt, ["Linear"],
                                               [names.to_disk(n) for n in float_linears])
        if kvfmt is not None:
            qconfig["kv_cache_scheme"] = kvfmt.args()
    tensors = {names.to_disk(k): v for k, v in tensors.items()}
    cfg = config.to_diff_dict()  # as save_pretrained writes it, without the source's local path
    cfg.pop("_name_or_path", None)
    # as save_pretrained writes them: the class, and the dtype of the weights (the loaders
    # build the model in it; the scales stay float32)
    cfg["architectures"] = [cls.__name__]
    cfg["dtype"] = str(layers[0][1].weight.dtype).split(".")[-1]
    cfg["quantization_config"] = qconfig
    json_files = {"config.json": cfg}
    if gptq_format:  # AutoGPTQ and GPTQModel read this file too
        json_files["quantize_config.json"] = qconfig
    gen = getattr(model, "generation_config", None)
    if gen is not None and hasattr(gen, "to_diff_dict"):
        json_files["generation_config.json"] = gen.to_diff_dict()
    extra = (lambda folder: tokenizer.save_pretrained(folder)) if tokenizer is not None else None
    _files.write_checkpoint(save_dir, tensors, json_files, limit, extra, overwrite)
    return qconfig
