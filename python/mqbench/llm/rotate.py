"""Rotations of a decoder's activations (QuaRot, Ashkboos et al. 2024): orthogonal matrices folded
into the weights so that the float function is unchanged while the activations the quantizers
see lose their outlier channels, which 4-bit activations (W4A4) cannot hold otherwise.

``rotate(model)`` edits a transformers pre-norm decoder (Llama, Mistral, Qwen2, Qwen3, ...) in
place, in this order (Note [The rotations of a decoder]):
  1. each RMSNorm's weight is multiplied into the Linears reading it (the norm keeps weight 1);
  2. R1: a random Hadamard rotation of the residual stream (hidden size), folded into the
     embedding, every Linear reading the stream (q / k / v, gate / up, the head) and every Linear
     writing it (o_proj, down_proj);
  3. R2: a Hadamard rotation of each attention head's values (head_dim), folded into v_proj's
     output rows and o_proj's input columns;
  4. ``online=True``: R4, a Hadamard rotation of down_proj's input, and a Hadamard rotation of
     the attention output across its heads (with R2, a full Hadamard of o_proj's input, as
     QuaRot has it), each folded into the Linear's columns and applied at run time by a
     ``HadamardRotation`` module (``mlp.down_proj_rotation``, ``self_attn.o_proj_rotation``)
     called by a forward pre-hook of the Linear: a quantizer at that input (the one
     ``prepare_by_platform`` places, or a user's pre-hook registered later) sees the rotated
     values.
The model's output is compared before and after (Note [Rotations checked on the output]); a
rotation that moves it is undone and refused.
"""
import numbers

import torch
from torch import nn

from mqbench.llm import _calibration, _spinquant
from mqbench.llm._mappings import _get
from mqbench.llm._rotations import _Rotation
from mqbench.nn.modules.hadamard import HadamardRotation, InputRotationHook, hadamard_factor
from mqbench.utils.logger import logger

__all__ = ["rotate", "RotationResult"]

# Note [The rotations of a decoder]
# Row vectors throughout: a Linear computes y = x W^T, a rotation Q (orthogonal) maps x to x Q.
#   * A Linear reading a rotated input x Q keeps its output with W' = W Q; one whose output
#     must come out rotated (y Q) has W' = Q^T W and b' = b Q.
#   * RMSNorm(x) = x / rms(x) * g: with g moved into the Linears after it (W' = W diag(g)) the
#     norm is x / rms(x), and rms(x Q) = rms(x), so it commutes with Q. A LayerNorm (mean
#     subtracted) or Gemma's (1 + weight) norm does not, as the check would show: refused.
#   * The residual stream h_{i+1} = h_i + o_proj(attn) + down_proj(mlp) stays rotated (h Q)
#     when the embedding (rows E Q) and every Linear writing the stream output y Q; the final
#     norm commutes and the head reads h Q (W' = W Q).
#   * Attention is linear in the values: rotating each head's values by R2 (v_proj's output rows
#     per head: Q2^T W_h) rotates each head's output, which o_proj's columns undo (W_h Q2). The
#     same R2 for every head keeps grouped KV heads valid. Queries and keys are not rotated
#     (RoPE acts on them), so Qwen3's q_norm / k_norm stay as they are.
#   * R4: down_proj(x) = (x H) (W H)^T for the orthogonal H = Hadamard / sqrt(n): the weight
#     takes H, the input takes H at run time (the SiLU between gate / up and down_proj stops a
#     fold there). The same for o_proj with H_heads kron I_head_dim (across the heads), which
#     commutes with R2's I_heads kron Q2: together a full rotation of o_proj's input.
# R1 and R2 are "random Hadamard" matrices Q = diag(s) H^T / sqrt(n) (s random signs, seeded):
# random signs spread an outlier over every channel as a random orthogonal matrix does, at the
# cost of one transform. Every fold runs in float64 and is cast back to the weight's dtype.
#
# Note [Rotations checked on the output]
# A module that reads or writes the residual stream which the rules above do not know of (an
# added position embedding, a norm after a sublayer as Gemma 2 / 3 have, a scaled residual)
# would make the rotated model compute another function. So the model's output on the probe
# inputs (the first calibration items, or random token ids) is compared before and after: the
# relative error ||out - ref|| / ||ref|| of every output tensor must stay below 1e-3 for
# float32 / float64 weights (measured: about 1e-6 on the benchmark decoder) or 2e-2 for 16-bit
# ones (rounding the rotated weights to bfloat16). Beyond that, every weight is restored, the
# online modules removed, and rotate raises.

MODES = ("hadamard", "spinquant")
# the attribute a rotated model carries (its RotationResult): rotating twice is refused
ROTATED = "mqbench_rotation"
_NORM_OK = "RMSNorm"


class RotationResult(dict):
    """What ``rotate`` returns: ``{"R1": hidden size, "R2": head_dim, "R4": intermediate size or
    None, "heads": the heads the attention output is rotated across (None without online
    rotations or with one head), "online": [names of the HadamardRotation modules], "dense": [the rotations with no
    Hadamard construction, applied as random orthogonal matrices], "max_error": the check's
    largest relative error}``, and with mode "spinquant" ``"learned"``: the loss of each
    step."""


# ---- the model's layout ------------------------------------------------------------------------

def _check_norm(name, norm):
    kind = type(norm).__name__
    if norm is None:
        raise ValueError(f"rotate: {name} is missing: rotate maps pre-norm decoder layers "
                         "(input_layernorm, self_attn, post_attention_layernorm, mlp)")
    if "Gemma" in kind:
        raise ValueError(f"rotate: {name} is {kind}, which scales by (1 + weight): its weight "
                         "cannot move into the next Linears as rotate folds it")
    if not kind.endswith(_NORM_OK):
        raise ValueError(f"rotate: {name} is {kind}; rotate folds RMSNorm weights (a norm that "
                         "subtracts the mean, LayerNorm, does not commute with a rotation)")
    w = getattr(norm, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1:
        raise ValueError(f"rotate: {name} ({kind}) has no 1-D weight to fold")
    if getattr(norm, "bias", None) is not None:
        raise ValueError(f"rotate: {name} ({kind}) has a bias, which rotate cannot fold")


def _linear(model, name):
    mod = _get(model, name)
    if type(mod) is not nn.Linear:
        raise ValueError(f"rotate: {name} is {type(mod).__name__ if mod is not None else 'missing'}"
                         "; rotate folds into nn.Linear layers (a float model, before "
                         "prepare_by_platform)")
    return mod


_LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")


def _layout(model):
    """{"base": prefix of the decoder, "embed": name, "layers": [prefixes], "norm": name,
    "head": name or None}, every module checked."""
    base = ""
    if _get(model, "model.layers") is not None:
        base = "model."
    elif _get(model, "layers") is None:
        raise ValueError(f"rotate: {type(model).__name__} has no decoder layers (model.layers): "
                         "rotate maps transformers' pre-norm decoders (Llama, Mistral, Qwen2, "
                         "Qwen3)")
    embed = base + "embed_tokens"
    if not isinstance(_get(model, embed), nn.Embedding):
        raise ValueError(f"rotate: {embed} is not an nn.Embedding")
    layers = [f"{base}layers.{i}" for i in range(len(_get(model, base + "layers")))]
    for prefix in layers:
        layer = _get(model, prefix)
        for part in _LAYER_PARTS:
            if getattr(layer, part, None) is None:
                raise ValueError(f"rotate: {prefix} has no {part}: rotate maps pre-norm decoder "
                                 f"layers ({', '.join(_LAYER_PARTS)})")
        for child, mod in layer.named_children():
            if child not in _LAYER_PARTS and type(mod).__name__.endswith(("Norm", "RMSNorm")):
                raise ValueError(f"rotate: {prefix}.{child} ({type(mod).__name__}) normalizes "
                                 "inside the residual stream, which a rotation does not commute "
                                 "with")
        _check_norm(prefix + ".input_layernorm", layer.input_layernorm)
        _check_norm(prefix + ".post_attention_layernorm", layer.post_attention_layernorm)
        if getattr(layer.mlp, "experts", None) is not None:
            raise ValueError(f"rotate: {prefix}.mlp is a mixture of experts; rotate maps dense "
                             "MLPs (gate_proj, up_proj, down_proj)")
        for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            _linear(model, f"{prefix}.{p}")
    norm = base + "norm"
    _check_norm(norm, _get(model, norm))
    if not isinstance(getattr(model, "lm_head", None), nn.Module):
        raise ValueError(f"rotate: {type(model).__name__} has no lm_head: rotate a causal LM "
                         "(its head takes the final norm's weight and R1; a base model's "
                         "output would come out rotated)")
    head = "lm_head"
    _linear(model, head)
    return {"embed": embed, "layers": layers, "norm": norm, "head": head}


def _head_dim(attn, prefix):
    d = getattr(attn, "head_dim", None)
    if not isinstance(d, numbers.Integral):
        cfg = getattr(attn, "config", None)
        heads = getattr(cfg, "num_attention_heads", None)
        d = attn.o_proj.in_features // heads if heads else None
    if not d or attn.v_proj.out_features % d or attn.o_proj.in_features % d:
        raise ValueError(f"rotate: {prefix}.self_attn: head_dim {d} does not divide v_proj's "
                         f"outputs ({attn.v_proj.out_features}) and o_proj's inputs "
                         f"({attn.o_proj.in_features})")
    return int(d)


# ---- folds -------------------------------------------------------------------------------------

def _set(t, value):
    with torch.no_grad():
        t.copy_(value.to(t.dtype))


def _reads(linear, rot):
    """The Linear reads x Q: W' = W Q."""
    _set(linear.weight, rot.right(linear.weight))


def _writes(linear, rot):
    """The Linear outputs y Q: W' = Q^T W, b' = b Q."""
    _set(linear.weight, rot.right(linear.weight.t()).t())
    if linear.bias is not None:
        _set(linear.bias, rot.right(linear.bias))


def _fuse_norm(norm, linears):
    g = norm.weight.detach().double()
    for lin in linears:
        _set(lin.weight, lin.weight.double() * g.to(lin.weight.device))
    with torch.no_grad():
        norm.weight.fill_(1.0)


def _tie_flags(model):
    """[(config, its tie_word_embeddings)] of the model's config and its text config."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return []
    configs = [cfg]
    text = getattr(cfg, "get_text_config", lambda: None)()
    if text is not None and text is not cfg:
        configs.append(text)
    return [(c, getattr(c, "tie_word_embeddings", None)) for c in configs]


def _untie(model, layout):
    head = _get(model, layout["head"]) if layout["head"] else None
    embed = _get(model, layout["embed"])
    if head is not None and head.weight is embed.weight:
        head.weight = nn.Parameter(embed.weight.detach().clone(),
                                   requires_grad=embed.weight.requires_grad)
        for cfg, _ in _tie_flags(model):
            cfg.tie_word_embeddings = False
        logger.info("rotate: lm_head shared the embedding's weight; it now holds its own (the "
                    "norm before it folds into the head alone)")


def _fuse_norms(model, layout):
    _fuse_norm(_get(model, layout["norm"]), [_get(model, layout["head"])])
    for prefix in layout["layers"]:
        layer = _get(model, prefix)
        attn, mlp = layer.self_attn, layer.mlp
        _fuse_norm(layer.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj])
        _fuse_norm(layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj])


def _online(owner, name, linear, n, block, generator, what, shared):
    """A HadamardRotation of ``linear``'s input (``owner.<name>``, called by a pre-hook), its
    weight W Q on the same rotation (n values across ``block``-long positions). ``shared``:
    {(n, what): _Rotation}, one rotation per size and role for all layers (a width with no
    Hadamard draws its random orthogonal matrix once)."""
    r = shared.get((n, what))
    if r is None:
        r = shared[(n, what)] = _Rotation(n, generator, what, randomize=False)
    rotation = HadamardRotation(n, matrix=r.dense, block=block).to(linear.weight.device)
    w = linear.weight.detach().double()
    if block > 1:
        w = w.view(w.shape[0], n, block).transpose(1, 2)
        _set(linear.weight, r.right(w).transpose(1, 2).reshape(linear.weight.shape))
    else:
        _set(linear.weight, r.right(w))
    setattr(owner, name, rotation)
    linear.register_forward_pre_hook(InputRotationHook(rotation))
    return rotation


def _add_online(model, layout, generator, result):
    """R4: down_proj's input rotated at run time (intermediate size), and the attention output
    rotated across its heads before o_proj (QuaRot's online half of o_proj's Hadamard: R2 folds
    the per-head half into v_proj); each Linear's weight takes the same rotation."""
    shared = {}
    for prefix in layout["layers"]:
        layer = _get(model, prefix)
        attn, mlp = layer.self_attn, layer.mlp
        n = mlp.down_proj.in_features
        _online(mlp, "down_proj_rotation", mlp.down_proj, n, 1, generator, "R4", shared)
        result["R4"] = n
        result["online"].append(prefix + ".mlp.down_proj_rotation")
        if hadamard_factor(n) is None:
            result["dense"].append(prefix + ".mlp.down_proj_rotation")
        d = _head_dim(attn, prefix)
        heads = attn.o_proj.in_features // d
        if heads > 1:
            _online(attn, "o_proj_rotation", attn.o_proj, heads, d, generator, "heads", shared)
            result["heads"] = heads
            result["online"].append(prefix + ".self_attn.o_proj_rotation")
            if hadamard_factor(heads) is None:
                result["dense"].append(prefix + ".self_attn.o_proj_rotation")


def _fold(model, layout, r1, r2s):
    """R1 into the embedding, the head and every Linear reading or writing the stream; layer i's
    R2 (``r2s[i]``) into its v_proj and o_proj."""
    _reads(_get(model, layout["head"]), r1)
    embed = _get(model, layout["embed"])
    _set(embed.weight, r1.right(embed.weight))
    for prefix, r2 in zip(layout["layers"], r2s):
        layer = _get(model, prefix)
        attn, mlp = layer.self_attn, layer.mlp
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
            _reads(lin, r1)
        _writes(attn.o_proj, r1)
        _writes(mlp.down_proj, r1)
        _rotate_heads(attn, r2, r2.n)


def _apply(model, layout, generator, online, result, learn=None):
    _fuse_norms(model, layout)
    hidden = _get(model, layout["embed"]).embedding_dim
    r1 = _Rotation(hidden, generator, "R1")
    result["R1"] = hidden
    r2s, by_dim = [], {}
    for prefix in layout["layers"]:
        d = _head_dim(_get(model, prefix).self_attn, prefix)
        if d not in by_dim:
            by_dim[d] = _Rotation(d, generator, "R2")
        r2s.append(by_dim[d])
        result["R2"] = d
    for r in [r1] + list(by_dim.values()):
        if r.dense is not None:
            result["dense"].append(r.name)
    if online:
        _add_online(model, layout, generator, result)
    if learn is not None:  # SpinQuant: R1 and each layer's R2 learned from these starts
        r1, r2s = _spinquant.learn(model, layout, r1, r2s, **learn)
        result["learned"] = r1.history
    _fold(model, layout, r1, r2s)


def _rotate_heads(attn, r2, d):
    v, o = attn.v_proj, attn.o_proj
    w = v.weight.detach().double().view(-1, d, v.in_features)
    _set(v.weight, r2.right(w.transpose(1, 2)).transpose(1, 2).reshape(v.weight.shape))
    if v.bias is not None:
        _set(v.bias, r2.right(v.bias.detach().view(-1, d)).reshape(-1))
    w = o.weight.detach().view(o.out_features, -1, d)
    _set(o.weight, r2.right(w).reshape(o.weight.shape))


# ---- the check ---------------------------------------------------------------------------------

def _probe_inputs(model, calib_data, n=2):
    if calib_data is not None:
        items = list(calib_data[:n]) if isinstance(calib_data, (list, tuple)) else []
        if not items:
            for i, item in enumerate(calib_data):
                if i >= n:
                    break
                items.append(item)
        if items:
            return items
    vocab = _get(model, "model.embed_tokens") or _get(model, "embed_tokens")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab.num_embeddings, (n, 16), generator=g)
    device = _calibration.input_device(model)
    return [{"input_ids": ids.to(device) if device is not None else ids}]


def _outputs(model, items):
    outs = []
    with torch.no_grad():
        for item in items:
            out = _calibration.run_model(model, item)
            logits = getattr(out, "logits", None)
            if logits is None:
                logits = out[0] if isinstance(out, (tuple, list)) else \
                    getattr(out, "last_hidden_state", out)
            outs.append(logits.detach().double().cpu())
    return outs


def _relative_error(outs, refs):
    worst = 0.0
    for a, b in zip(outs, refs):
        worst = max(worst, ((a - b).norm() / b.norm().clamp(min=1e-30)).item())
    return worst


_HALF = (torch.float16, torch.bfloat16)


class _in_float32(object):
    """16-bit parameters held in float32 while the folds run, rounded back once at the end:
    each weight takes several folds (norm, R1, R2, an online rotation), and rounding after
    each would add their errors."""

    def __init__(self, params):
        self.params = [(p, p.dtype) for p in params]

    def __enter__(self):
        for p, _ in self.params:
            p.data = p.data.float()

    def __exit__(self, *exc):
        for p, dtype in self.params:
            p.data = p.data.to(dtype)
        return False


def _tolerance(model):
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return 2e-2 if dtypes & {torch.float16, torch.bfloat16} else 1e-3


def rotate(model, calib_data=None, mode="hadamard", online=True, seed=0, w_qscheme=None,
           a_qscheme=None, steps=100, lr=0.02):
    """Rotates a transformers decoder's activations in place (QuaRot's R1, R2 and the online R4),
    leaving its float function unchanged; then W4A4 (``prepare_by_platform`` with per-token
    activations, after ``gptq``) loses far less to 4-bit activations.

    Args:
        model: a float transformers causal LM of pre-norm decoder layers with RMSNorm (Llama,
            Mistral, Qwen2, Qwen3; dense MLPs), before ``prepare_by_platform`` and before the
            weight algorithms (``gptq``, ``rtn``).
        calib_data: items the model is called on (as the other algorithms take) to check the
            rotated model's output; None checks on random token ids.
        mode: "hadamard" (random Hadamard R1 / R2, seeded by ``seed``), or "spinquant": R1
            and each layer's R2 learned from that start on ``calib_data`` (Cayley SGD on the
            next-token loss of the model quantized on ``w_qscheme`` / ``a_qscheme``,
            ``steps`` steps of size ``lr``; Note [Learning the rotations]).
        online: add the rotations applied at run time: R4 on down_proj's input and one across
            the attention heads on o_proj's input (``HadamardRotation`` modules,
            ``mlp.down_proj_rotation`` and ``self_attn.o_proj_rotation`` of each layer).
            Without them every rotation is in the weights, and the checkpoint serving engines
            load (``save_quantized``) is an ordinary one.
        seed: the random signs of R1 and R2.
        w_qscheme, a_qscheme, steps, lr: "spinquant" only: the weight grid (default None:
            float weights, as SpinQuant learns them before GPTQ), the per-token activation grid
            (default INT4 symmetric) the rotations are learned for, the number of steps
            (default 100, one calibration item each, cycling) and the first step's length
            (default 0.02: the norm of the skew-symmetric generator, decayed to 0 on a cosine).

    Returns a :class:`RotationResult`. Refuses (ValueError naming the module, the model
    unchanged) a layer it cannot map, and undoes and refuses a rotation that changes the
    output.

    Example::

        from mqbench.llm import rotate, gptq
        rotate(model, calib)
        gptq(model, calib, {"bit": 4, "per_channel": True})
    """
    if mode not in MODES:
        raise ValueError(f"rotate: mode must be one of {list(MODES)}, got {mode!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"rotate: seed must be an integer, got {seed!r}")
    learn = None
    if mode == "spinquant":
        if calib_data is None:
            raise ValueError("rotate(mode='spinquant') learns the rotations on calib_data: give "
                             "calibration items")
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
            raise ValueError(f"rotate: steps must be an integer >= 0, got {steps!r}")
        if not isinstance(lr, numbers.Real) or not lr > 0:
            raise ValueError(f"rotate: lr must be a positive number, got {lr!r}")
        learn = {"calib_data": calib_data, "w_qscheme": w_qscheme, "a_qscheme": a_qscheme,
                 "steps": int(steps), "lr": float(lr)}
    if getattr(model, ROTATED, None) is not None or \
            any(isinstance(m, HadamardRotation) for m in model.modules()):
        raise ValueError("rotate: the model is rotated already (model.mqbench_rotation, or "
                         "HadamardRotation modules)")
    layout = _layout(model)
    items = _probe_inputs(model, calib_data)
    refs = _outputs(model, items)
    saved = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    tied = _get(model, layout["head"]).weight is _get(model, layout["embed"]).weight
    ties = _tie_flags(model)
    result = RotationResult(R1=None, R2=None, R4=None, heads=None, online=[], dense=[],
                            max_error=None)
    generator = torch.Generator().manual_seed(int(seed))
    try:
        _untie(model, layout)
        half = [p for p in model.parameters() if p.dtype in _HALF]  # the untied head too
        with _in_float32(half):
            _apply(model, layout, generator, online, result, learn)
        err = _relative_error(_outputs(model, items), refs)
        tol = _tolerance(model)
        if not err <= tol:
            raise ValueError(f"rotate: the rotated model's output moved by {err:.3g} (relative; "
                             f"tolerance {tol:g}): a module reads or writes the residual stream "
                             "which rotate does not map. The model is unchanged")
    except BaseException:
        _undo(model, layout, saved, tied, ties, result)
        raise
    result["max_error"] = err
    setattr(model, ROTATED, result)
    logger.info(f"rotate: R1 {result['R1']}, R2 {result['R2']}, R4 {result['R4']}; output moved "
                f"by {err:.2e} (relative)")
    return result


def _undo(model, layout, saved, tied, ties, result):
    with torch.no_grad():
        for k, v in model.state_dict(keep_vars=True).items():
            if k in saved:
                v.copy_(saved[k])
    rotations = []
    for name in result["online"]:
        owner, _, attr = name.rpartition(".")
        holder = _get(model, owner)
        rotations.append(getattr(holder, attr, None))
        delattr(holder, attr)
    for mod in model.modules():
        for key, hook in list(mod._forward_pre_hooks.items()):
            if isinstance(hook, InputRotationHook) and any(hook.rotation is r for r in rotations):
                del mod._forward_pre_hooks[key]
    if tied:
        head, embed = _get(model, layout["head"]), _get(model, layout["embed"])
        head.weight = embed.weight
        for cfg, value in ties:
            cfg.tie_word_embeddings = value
