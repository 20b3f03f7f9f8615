"""Fake quantizers on attention's cached keys and values (Note [KV cache quantizers])."""
import torch

from mqbench.scheme import QuantizeScheme
from mqbench.utils.logger import logger

__all__ = ["FALLBACK", "KV_SUFFIXES", "insert_kv_cache_quantizers", "kv_cache_scheme_of"]

# Note [KV cache quantizers]
# A serving engine stores each layer's keys (after the rotary embedding) and values in its
# cache on a low-precision grid (FP8 E4M3 with one scale per tensor is vLLM's and modelopt's
# default; INT8 / INT4 asymmetric in research systems), and reads them back for every later
# token. With static scales, fake-quantizing the keys and values where attention reads them
# (the scaled_dot_product_attention call, which sees every cached position) gives what the
# engine computes: a value stored once and read many times is rounded once, and rounding twice
# on a fixed grid changes nothing. So ``prepare_by_platform`` with ``kv_cache_qscheme`` puts a
# fake quantizer on the key and the value inputs of each attention call of the captured graph,
# named ``<attention module>.k_fake_quant`` / ``.v_fake_quant``, calibrated like any activation
# quantizer (MinMax: the amax the engines' scales are); ``save_quantized`` writes their scales as
# compressed-tensors' ``k_scale`` / ``v_scale`` of that module. Per head (``per_channel=True``),
# the scale runs along axis 1 of [batch, heads, tokens, head_dim]. With grouped KV heads the
# attention call reads the keys repeated to every query head: each repeat holds the same values,
# so the per-head scales of one KV head's repeats are equal, and the checkpoint keeps one per KV
# head.

KV_SUFFIXES = ("k_fake_quant", "v_fake_quant")
_aten = torch.ops.aten
_SDPA = {_aten.scaled_dot_product_attention.default,
         torch.nn.functional.scaled_dot_product_attention}
_MATMULS = {_aten.matmul.default, _aten.bmm.default, torch.matmul, _aten.einsum.default}


def kv_cache_scheme_of(spec):
    """The QuantizeScheme of ``prepare_custom_config_dict["kv_cache_qscheme"]`` (a dict of
    QuantizeScheme arguments: ``{"dtype": "fp8_e4m3"}``, ``{"bit": 8, "symmetry": False}``,
    ``{"bit": 4, "symmetry": False, "per_channel": True}`` for one scale per head)."""
    if isinstance(spec, QuantizeScheme):
        scheme = spec
    elif isinstance(spec, dict):
        scheme = QuantizeScheme(**spec)
    else:
        raise TypeError(f"kv_cache_qscheme must be a dict of QuantizeScheme arguments, got "
                        f"{type(spec).__name__}")
    if scheme.dynamic is not None or scheme.group_size is not None or scheme.pot_scale:
        raise ValueError(f"kv_cache_qscheme: static scales per tensor or per head (per_channel) "
                         f"are written as k_scale / v_scale; got {scheme}")
    if scheme.dtype not in ("int", "fp8_e4m3", "fp8_e5m2"):
        raise ValueError(f"kv_cache_qscheme: dtype {scheme.dtype!r} is not a KV cache format "
                         "(int, fp8_e4m3, fp8_e5m2)")
    return scheme


FALLBACK = "attention_"


def _owner(node, i):
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path = list(stack.values())[-1][0]
        if isinstance(path, str) and path and all(p.isidentifier() or p.isdigit()
                                                 for p in path.split(".")):
            return path
    return f"{FALLBACK}{i}"  # no module path recorded: save_quantized refuses these


def insert_kv_cache_quantizers(gm, spec, fakequantize, observer):
    """Puts ``<attention>.k_fake_quant`` / ``.v_fake_quant`` on the key and value inputs of every
    scaled_dot_product_attention call of ``gm``'s graph (Note [KV cache quantizers]);
    ``fakequantize`` / ``observer``: the classes (the FP8 class for an FP8 scheme). Returns the
    names of the attention modules. Raises ValueError where the graph computes attention without
    that call (transformers' "eager" attention: load the model with attn_implementation="sdpa")."""
    scheme = kv_cache_scheme_of(spec)
    params = scheme.to_observer_params()
    if scheme.per_channel:
        params["ch_axis"] = 1
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _SDPA]
    if not calls:
        eager = any(n.op == "call_function" and n.target in _MATMULS and
                    "attn" in str(list((n.meta.get("nn_module_stack") or {None: ("",)}).values())
                                  [-1][0]) for n in gm.graph.nodes)
        raise ValueError("kv_cache_qscheme: the captured graph has no scaled_dot_product_attention "
                         "call to put the KV cache quantizers on" +
                         (" (its attention is written with matmuls: load the model with "
                          "attn_implementation='sdpa')" if eager else ""))
    owners = []
    for i, call in enumerate(calls):
        owner = _owner(call, i)
        if owner in owners:
            owner = f"{owner}_{i}"
        owners.append(owner)
        for index, key, suffix in ((1, "key", "k_fake_quant"), (2, "value", "v_fake_quant")):
            by_keyword = len(call.args) <= index
            src = call.kwargs.get(key) if by_keyword else call.args[index]
            if not isinstance(src, torch.fx.Node):
                raise ValueError(f"kv_cache_qscheme: the attention call {call.name} has no "
                                 f"{key} input to quantize")
            name = f"{owner}.{suffix}"
            if not gm.add_submodule(name, fakequantize(observer=observer, **params)):
                raise ValueError(f"kv_cache_qscheme: cannot add {name!r} to the prepared model")
            with gm.graph.inserting_before(call):
                q = gm.graph.call_module(name, (src,))
            if by_keyword:
                call.update_kwarg(key, q)
            else:
                call.update_arg(index, q)
        logger.info(f"Insert KV cache quant {owner}.k_fake_quant, {owner}.v_fake_quant")
    gm.graph.lint()
    gm.recompile()
    return owners
