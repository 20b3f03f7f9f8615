"""``load_quantized``: a compressed-tensors checkpoint (ours, or llm-compressor's) back into a float
transformers model on its grid, plus the grid (docs/llm.md, "Serving")."""
import os
import re

import torch

from mqbench.llm import _experts
from mqbench.llm.checkpoint import _encode, _files, _gptq_format, _names, _schemes
from mqbench.utils.logger import logger

__all__ = ["load_quantized"]

_WEIGHT_NAMES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_global_scale",
                 "weight_shape", "weight_g_idx")


def _weight_format(args, fmt_name, group):
    """compressed-tensors ``weights`` args -> WeightFormat (in MQBench's ranges)."""
    def bad(why):
        return ValueError(f"load_quantized: config group {group!r}: {why}; this reads integer "
                          "(1-8 bits, per tensor / channel / group, symmetric or affine), FP8 "
                          "E4M3 (per tensor / channel), NVFP4 and MXFP4 weights")
    if not isinstance(args, dict):
        raise bad("no weights scheme")
    kind, bits = args.get("type", "int"), args.get("num_bits", 8)
    strategy, group_size = args.get("strategy"), args.get("group_size")
    symmetric = bool(args.get("symmetric", True))
    if args.get("actorder") in ("group", "dynamic"):
        raise bad("actorder 'group' (a g_idx permutation) is not read")
    if args.get("dynamic"):
        raise bad("dynamic weights")
    if not isinstance(bits, int) or isinstance(bits, bool):
        raise bad(f"num_bits {bits!r}")
    if kind == "int":
        if not 1 <= bits <= 8 or strategy not in ("tensor", "channel", "group"):
            raise bad(f"{bits}-bit integers with strategy {strategy!r}")
        if strategy == "group" and (not isinstance(group_size, int) or group_size < 1):
            raise bad(f"group_size {group_size!r}")
        half = 1 << (bits - 1)
        lo, hi = (-half, half - 1) if symmetric else (0, 2 * half - 1)
        fmt = _schemes.WeightFormat("int", bits, strategy, group_size if strategy == "group"
                                    else None, symmetric, lo, hi)
        allowed = (_schemes.INT_PACKED, _schemes.INT_PLAIN, _schemes.NAIVE)
        fmt.packed = fmt_name == _schemes.INT_PACKED
    elif kind == "float" and bits == 8 and strategy in ("tensor", "channel") and symmetric:
        fmt, allowed = _schemes.WeightFormat("fp8", 8, strategy), (_schemes.FLOAT_PLAIN,
                                                                    _schemes.NAIVE)
    elif kind == "float" and bits == 4 and group_size == _schemes.NVFP4_BLOCK and symmetric:
        fmt, allowed = _schemes.WeightFormat("nvfp4", 4, "tensor_group", 16), \
            (_schemes.NVFP4_PACKED,)
    elif kind == "float" and bits == 4 and group_size == _schemes.MX_BLOCK and symmetric:
        fmt, allowed = _schemes.WeightFormat("mxfp4", 4, "group", 32), (_schemes.MXFP4_PACKED,)
    else:
        raise bad(f"{kind} weights of {bits} bits, strategy {strategy!r}, group_size "
                  f"{group_size!r}, symmetric={symmetric}")
    if fmt_name not in allowed:
        raise bad(f"format {fmt_name!r} for {fmt.describe()} (expected one of {list(allowed)})")
    return fmt


def _name_matches(target, name):
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name


def _class_matches(target, mod):
    return any(c.__name__ == target for c in type(mod).__mro__)


def _matches(patterns, name, mod):
    return any(isinstance(p, str) and (_name_matches(p, name) or _class_matches(p, mod))
               for p in patterns or ())


def _scheme_of(target_to_fmt, name, mod):
    """The scheme of layer ``name`` as compressed-tensors (and vLLM) pick it: the most specific
    matching target (an exact name, then a ``re:`` pattern, then a class name, each in sorted
    order), a later group overriding an earlier one's same target."""
    targets = sorted(target_to_fmt, key=lambda t: ("re:" in t, t))
    matched = [t for t in targets if _name_matches(t, name)]
    matched += [t for t in targets if t not in matched and _class_matches(t, mod)]
    return target_to_fmt[matched[0]] if matched else None


def _groups(qc):
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError("load_quantized: quantization_config has no config_groups")
    top = qc.get("format")
    out = {}  # target -> scheme, in file order (a later group's target overrides)
    for gname, g in groups.items():
        if not isinstance(g, dict):
            raise ValueError(f"load_quantized: config group {gname!r} is not an object")
        fmt_name = g.get("format") or top
        if fmt_name not in _schemes.READ_FORMATS:
            raise ValueError(f"load_quantized: config group {gname!r} has format {fmt_name!r}; "
                             f"this reads {list(_schemes.READ_FORMATS)}")
        acts = g.get("input_activations") if isinstance(g.get("input_activations"), dict) else {}
        wfmt = _weight_format(g.get("weights"), fmt_name, gname)
        # a static affine INT input's zero point is signed in the file; ours is unsigned
        bits = acts.get("num_bits", 8)
        wfmt.input_zero_shift = (1 << (bits - 1)) if acts.get("type", "int") == "int" and \
            isinstance(bits, int) and 1 <= bits <= 8 and not acts.get("symmetric", True) else 0
        targets = g.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise ValueError(f"load_quantized: config group {gname!r} has targets {targets!r}, "
                             "not a list of names")
        for t in targets:
            out[t] = wfmt
    return out


_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_ACT_NAMES = ("input_scale", "input_zero_point")


def _check_tensors(name, t, fmt, shape):
    """Every tensor of a quantized layer read from the file, checked against the model's layer
    and the scheme before decoding: present, of the expected shape and dtype, and nothing
    unexpected (a zero point under a symmetric scheme would be dropped silently)."""
    out_f, in_f = shape
    if fmt.group_size and (fmt.group_size > in_f or in_f % fmt.group_size):
        raise ValueError(f"load_quantized: {name} has {in_f} input channels, not a multiple of "
                         f"the scheme's group of {fmt.group_size}")
    groups = in_f // fmt.group_size if fmt.group_size else 1
    rows = 1 if fmt.strategy == "tensor" else out_f
    int32, int8 = (torch.int32,), (torch.int8,)
    want = {}  # local name -> (shape, dtypes)
    if fmt.kind == "int":
        if "weight_packed" in t:
            want["weight_packed"] = ((out_f, -(-in_f * fmt.bits // 32)), int32)
            want["weight_shape"] = ((2,), (torch.int64, torch.int32))
        else:
            want["weight"] = ((out_f, in_f), int8)
        want["weight_scale"] = ((rows, groups) if fmt.strategy != "tensor" else (1,), _FLOATS)
        if not fmt.symmetric:
            if fmt.strategy != "tensor" and "weight_packed" in t:
                want["weight_zero_point"] = ((-(-out_f * fmt.bits // 32), groups), int32)
            else:
                want["weight_zero_point"] = (want["weight_scale"][0], int8 + int32)
    elif fmt.kind == "fp8":
        want["weight"] = ((out_f, in_f), (torch.float8_e4m3fn,))
        want["weight_scale"] = ((out_f, 1) if fmt.strategy == "channel" else (1,), _FLOATS)
    else:
        want["weight_packed"] = ((out_f, in_f // 2), (torch.uint8,))
        if fmt.kind == "nvfp4":
            want["weight_scale"] = ((out_f, groups), (torch.float8_e4m3fn,))
            want["weight_global_scale"] = ((1,), _FLOATS)
        else:
            want["weight_scale"] = ((out_f, groups), (torch.uint8,))
    for local, (shp, dtypes) in want.items():
        if local not in t:
            if local == "weight_shape":
                continue  # optional: the layer gives it
            raise ValueError(f"load_quantized: {name}.{local} is missing ({fmt.describe()})")
        got = tuple(t[local].shape)
        if got != shp and not (len(shp) == 1 and t[local].numel() == shp[0]):
            raise ValueError(f"load_quantized: {name}.{local} has shape {list(got)}, "
                             f"{fmt.describe()} of a {[out_f, in_f]} layer needs {list(shp)}")
        if t[local].dtype not in dtypes:
            raise ValueError(f"load_quantized: {name}.{local} is {t[local].dtype}, "
                             f"{fmt.describe()} stores it as {' or '.join(map(str, dtypes))}")
    if "weight_shape" in t and t["weight_shape"].tolist() != [out_f, in_f]:
        raise ValueError(f"load_quantized: {name}.weight_shape is {t['weight_shape'].tolist()}, "
                         f"the model's layer is {[out_f, in_f]}")
    for local in _ACT_NAMES:
        if local in t and (t[local].numel() != 1 or
                           (local == "input_scale" and t[local].dtype not in _FLOATS)):
            raise ValueError(f"load_quantized: {name}.{local} has {t[local].numel()} values of "
                             f"{t[local].dtype}; a static input scheme has one per tensor")
    unexpected = sorted(set(t) - set(want) - {"bias", "weight_shape"} - set(_ACT_NAMES))
    if unexpected:
        raise ValueError(f"load_quantized: {name} has {unexpected}, which {fmt.describe()} does "
                         "not have (a checkpoint of another scheme than its config says?)")


def _narrow_range(name, deq, grid, fmt, want):
    """The integer range of ``want`` (the w_qscheme the model was quantized with) for a layer
    the file stores at ``fmt``'s full range: the file does not record a narrower range such as
    ``symmetric_range``'s [-127, 127], so the user names it, and every stored integer must fit."""
    if want is None or fmt.kind != "int":
        return
    if (want.kind, want.bits, want.strategy, want.group_size, want.symmetric) != \
            (fmt.kind, fmt.bits, fmt.strategy, fmt.group_size, fmt.symmetric):
        raise ValueError(f"load_quantized: {name!r} is stored at {fmt.describe()}, w_qscheme is "
                         f"{want.describe()}")
    out_f, in_f = deq.shape
    s = _encode.expand_groups(grid["scale"], out_f, in_f)
    z = _encode.expand_groups(grid["zero_point"], out_f, in_f)
    q = torch.round(deq / s) + z
    if q.numel() and (float(q.min()) < want.quant_min or float(q.max()) > want.quant_max):
        raise ValueError(f"load_quantized: {name!r} stores integers in [{int(q.min())}, "
                         f"{int(q.max())}], outside w_qscheme's [{want.quant_min}, "
                         f"{want.quant_max}]")
    grid.update(quant_min=want.quant_min, quant_max=want.quant_max)


def load_quantized(path, dtype=torch.float32, w_qscheme=None):
    """Reads a compressed-tensors checkpoint folder into ``(model, qparams)``.

    ``model`` is the float transformers model (``AutoModelForCausalLM``) whose quantized
    Linears hold the dequantized weights, exactly as the format defines them; ``qparams`` maps
    each integer or FP8 layer to its grid in MQBench's layout (``scale``, ``zero_point``,
    ``quant_min``, ``quant_max``; a static input scheme adds ``input_scale``), which
    ``load_weight_qparams`` sets into a model prepared with the same scheme. NVFP4 and MXFP4
    layers have no entry: their block scales come from the data in our fake quantizers.

    ``w_qscheme`` (optional): the scheme the model was quantized with, for a range the file does
    not record (``symmetric_range``'s [-127, 127] is stored as 8-bit [-128, 127]): the qparams
    then carry its range, after a check that every stored integer fits.

    Raises ValueError, naming what it found and what it reads, for another ``quant_method``, an
    unknown format or scheme, and any tensor whose size does not match the model's layer.
    """
    want = _schemes.weight_format(w_qscheme) if w_qscheme is not None else None
    if not os.path.isdir(path):
        raise ValueError(f"load_quantized: {path} is not a folder")
    cfg = _files.read_json(os.path.join(path, "config.json"), "config.json")
    qc = cfg.get("quantization_config")
    if not isinstance(qc, dict):
        raise ValueError(f"load_quantized: {path}/config.json has no quantization_config (a float "
                         "checkpoint: load it with transformers)")
    method = qc.get("quant_method")
    if method not in ("compressed-tensors", "gptq"):
        raise ValueError(f"load_quantized: quant_method {method!r}; this reads "
                         "'compressed-tensors' and 'gptq' checkpoints")
    if method == "gptq":
        return _load_gptq(path, qc, dtype, want)
    if qc.get("sparsity_config"):
        raise ValueError("load_quantized: the checkpoint is sparse (sparsity_config); this reads "
                         "dense quantized checkpoints")
    groups = _groups(qc)
    ignore = qc.get("ignore") or []
    if not isinstance(ignore, list):
        raise ValueError(f"load_quantized: quantization_config ignore is {ignore!r}, not a list")
    if qc.get("kv_cache_scheme"):
        logger.warning("load_quantized: the checkpoint's kv_cache_scheme (k_scale / v_scale) is "
                       "not read")

    model, config, tensors = _float_model(path, dtype)
    # fused experts (transformers 5's MoE models) are read one Linear per expert, their
    # weights written through into the fused parameters
    with _experts.ExpertView(model):
        mods = dict(model.named_modules())
        by_owner = _by_owner(tensors)
        prefixes = sorted(n for n, local in by_owner.items()
                          if "weight_scale" in local or "weight_packed" in local)
        state, qparams = {}, {}
        for name in prefixes:
            mod = _linear_of(mods, name, model)
            fmt = _scheme_of(groups, name, mod)
            if fmt is None or _matches(ignore, name, mod):
                raise ValueError(f"load_quantized: {name!r} has quantized tensors but no config "
                                 "group targets it")
            local = by_owner[name]
            _check_tensors(name, local, fmt, tuple(mod.weight.shape))
            deq, grid = _encode.decode_weight(local, fmt, tuple(mod.weight.shape))
            state[f"{name}.weight"] = deq.to(dtype)
            if grid is not None:
                grid.update(quant_min=fmt.quant_min if fmt.kind == "int" else -_schemes.FP8_MAX,
                            quant_max=fmt.quant_max if fmt.kind == "int" else _schemes.FP8_MAX,
                            conv1d=False)
                _narrow_range(name, deq, grid, fmt, want)
                if fmt.kind == "fp8":
                    grid["zero_point"] = torch.zeros_like(grid["scale"])
                if "input_scale" in local:
                    grid["input_scale"] = local["input_scale"].float().reshape(-1)
                if "input_zero_point" in local:
                    grid["input_zero_point"] = local["input_zero_point"].float().reshape(-1) + \
                        fmt.input_zero_shift
                qparams[name] = grid
            if f"{name}.bias" in tensors:
                state[f"{name}.bias"] = tensors[f"{name}.bias"].to(dtype)
        return _finish(model, config, tensors, state, qparams, dtype, _WEIGHT_NAMES)


def _linear_of(mods, name, model):
    mod = mods.get(name)
    if not isinstance(mod, torch.nn.Linear):
        raise ValueError(f"load_quantized: the checkpoint quantizes {name!r}, which is not a "
                         f"Linear of {type(model).__name__}")
    return mod


def _by_owner(tensors):
    """module name -> {local tensor name -> tensor}."""
    out = {}
    for k, v in tensors.items():
        owner, _, leaf = k.rpartition(".")
        out.setdefault(owner, {})[leaf] = v
    return out


def _float_model(path, dtype):
    """The float model of the checkpoint's config, and its tensors under the model's names."""
    import transformers
    config = transformers.AutoConfig.from_pretrained(path)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    names = _names.KeyNames(model)
    tensors = {}
    for k, v in _files.read_tensors(path).items():
        name = names.to_model(k)
        if name in tensors:
            raise ValueError(f"load_quantized: {path} holds two tensors that are both the "
                             f"model's {name!r} (one of them {k!r})")
        tensors[name] = v
    return model, config, tensors


def _load_gptq(path, qc, dtype, want):
    """A GPTQ checkpoint (``quant_method: gptq``, v1 or v2 zero points)."""
    fmt, fmt_name = _gptq_format.read_config(qc)
    model, config, tensors = _float_model(path, dtype)
    with _experts.ExpertView(model):
        mods = dict(model.named_modules())
        by_owner = _by_owner(tensors)
        state, qparams = {}, {}
        for name in sorted(n for n, local in by_owner.items() if "qweight" in local):
            mod = _linear_of(mods, name, model)
            local = by_owner[name]
            deq, grid = _gptq_format.decode(name, local, fmt, fmt_name, tuple(mod.weight.shape))
            state[f"{name}.weight"] = deq.to(dtype)
            grid.update(quant_min=fmt.quant_min, quant_max=fmt.quant_max, conv1d=False)
            _narrow_range(name, deq, grid, fmt, want)
            qparams[name] = grid
            if f"{name}.bias" in tensors:
                state[f"{name}.bias"] = tensors[f"{name}.bias"].to(dtype)
        return _finish(model, config, tensors, state, qparams, dtype,
                       ("qweight", "qzeros", "scales", "g_idx"))


def _finish(model, config, tensors, state, qparams, dtype, quantized_names):
    """The float tensors into ``state``, then the model loaded from it (tied weights tied)."""
    for k, v in tensors.items():
        owner, leaf = k.rsplit(".", 1) if "." in k else ("", k)
        if owner in qparams or f"{owner}.weight" in state:
            continue
        if leaf in quantized_names or leaf.startswith("input_") or leaf in ("k_scale", "v_scale"):
            continue
        state[k] = v.to(dtype) if v.is_floating_point() else v
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set()
    if getattr(config, "tie_word_embeddings", False):
        tied = {k for k in missing if k.endswith("lm_head.weight")}
    if set(missing) - tied or unexpected:
        raise ValueError(f"load_quantized: the checkpoint does not fit "
                         f"{type(model).__name__}: missing {sorted(set(missing) - tied)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    model.tie_weights()
    model.eval()
    return model, qparams
