"""Where a per-input-channel scale of a Linear can be folded (SmoothQuant, AWQ): the "producer"
whose output channel j can be divided by s_j while the consumers' input column j is multiplied
by s_j, leaving the float function unchanged.

A producer qualifies when its output feeds only those consumers, through nothing but positively
homogeneous elementwise ops (f(x / s) = f(x) / s for s > 0: ReLU, LeakyReLU, Dropout, Identity):
  * a norm (LayerNorm, RMSNorm: the module's 1-D ``weight``, and ``bias``),
  * a Linear (its output rows and bias).
Found by two rules, in this order:
  1. transformers' pre-norm decoder layers (Llama, Mistral, Qwen2, ...): input_layernorm ->
     q/k/v_proj, post_attention_layernorm -> gate/up_proj, up_proj -> down_proj, and
     v_proj -> o_proj when they have the same width (no grouped KV heads); GPT-2's blocks
     (transformers Conv1D layers): ln_1 -> attn.c_attn, ln_2 -> mlp.c_fc, and the value third
     of c_attn's outputs ("attn.c_attn[2E:3E]") -> attn.c_proj; BERT-style post-norm
     encoder layers: attention.self.value -> attention.output.dense only (their LayerNorms also
     feed a residual, so no scale can hide in them);
  2. any other module torch.fx can trace: the graph rule above.
A Linear with no producer keeps its input scale (it is still quantized by the later steps).
"""
import torch
from torch import nn

from mqbench.llm import _common
from mqbench.utils.logger import logger

_HOMOGENEOUS_MODULES = (nn.ReLU, nn.LeakyReLU, nn.Dropout, nn.Identity)
_HOMOGENEOUS_FUNCTIONS = {torch.relu, torch.nn.functional.relu, torch.nn.functional.leaky_relu,
                          torch.nn.functional.dropout}


def _is_norm(mod):
    w = getattr(mod, "weight", None)
    name = type(mod).__name__
    # Gemma's RMSNorm scales by (1 + weight): dividing weight by s would be wrong
    return (isinstance(mod, nn.LayerNorm) or name.endswith("RMSNorm") or name == "RMSNorm") and \
        isinstance(w, torch.Tensor) and w.dim() == 1 and "Gemma" not in name


def _get(root, path):
    mod = root
    for part in path.split("."):
        mod = getattr(mod, part, None)
        if mod is None:
            return None
    return mod


def _decoder_rules(model):
    """Mappings of transformers-style layers, by attribute names."""
    maps = []
    for name, layer in model.named_modules():
        prefix = name + "." if name else ""
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is not None and _is_norm(getattr(layer, "input_layernorm", None) or nn.Module()):
            qkv = [_get(attn, p) for p in ("q_proj", "k_proj", "v_proj")]
            if all(isinstance(m, nn.Linear) for m in qkv):
                maps.append((prefix + "input_layernorm",
                             [prefix + "self_attn." + p for p in ("q_proj", "k_proj", "v_proj")]))
            v, o = _get(attn, "v_proj"), _get(attn, "o_proj")
            if isinstance(v, nn.Linear) and isinstance(o, nn.Linear) and \
                    v.out_features == o.in_features:
                maps.append((prefix + "self_attn.v_proj", [prefix + "self_attn.o_proj"]))
        if mlp is not None and _is_norm(getattr(layer, "post_attention_layernorm", None) or
                                        nn.Module()):
            gu = [_get(mlp, p) for p in ("gate_proj", "up_proj")]
            if all(isinstance(m, nn.Linear) for m in gu):
                maps.append((prefix + "post_attention_layernorm",
                             [prefix + "mlp.gate_proj", prefix + "mlp.up_proj"]))
            up, down = _get(mlp, "up_proj"), _get(mlp, "down_proj")
            if isinstance(up, nn.Linear) and isinstance(down, nn.Linear):
                maps.append((prefix + "mlp.up_proj", [prefix + "mlp.down_proj"]))
        # GPT-2-style pre-norm blocks (transformers Conv1D layers): ln_1 -> attn.c_attn (the fused
        # q/k/v projection), ln_2 -> mlp.c_fc; the GELU between c_fc and c_proj is not homogeneous
        c_attn, c_fc = _get(layer, "attn.c_attn"), _get(layer, "mlp.c_fc")
        if c_attn is not None and _common.is_linear(c_attn) and \
                not getattr(_get(layer, "attn"), "is_cross_attention", False) and \
                _is_norm(getattr(layer, "ln_1", None) or nn.Module()):
            maps.append((prefix + "ln_1", [prefix + "attn.c_attn"]))
        c_proj = _get(layer, "attn.c_proj")
        if c_attn is not None and c_proj is not None and _common.is_linear(c_attn) and \
                _common.is_linear(c_proj) and \
                not getattr(_get(layer, "attn"), "is_cross_attention", False):
            # the value third of c_attn's outputs -> c_proj: channel j of the values is channel
            # j of the merged heads c_proj reads (attention is linear in the values)
            e = _common.in_features(c_proj)
            if _common.weight_2d(c_attn).shape[0] == 3 * e:
                maps.append((f"{prefix}attn.c_attn[{2 * e}:{3 * e}]", [prefix + "attn.c_proj"]))
        if c_fc is not None and _common.is_linear(c_fc) and \
                _is_norm(getattr(layer, "ln_2", None) or nn.Module()):
            maps.append((prefix + "ln_2", [prefix + "mlp.c_fc"]))
        v, o = _get(layer, "attention.self.value"), _get(layer, "attention.output.dense")
        if isinstance(v, nn.Linear) and isinstance(o, nn.Linear) and \
                v.out_features == o.in_features:
            maps.append((prefix + "attention.self.value", [prefix + "attention.output.dense"]))
    return maps


class _Tracer(torch.fx.Tracer):
    """fx's tracer, with transformers' Conv1D kept as one call (a Linear to the rules)."""

    def is_leaf_module(self, m, module_qualified_name):
        return _common.is_conv1d(m) or super().is_leaf_module(m, module_qualified_name)


def _first_input(node):
    """The node's first argument, positional or keyword (``lin(input=x)``), or None."""
    if node.args:
        return node.args[0]
    return next(iter(node.kwargs.values()), None)


def _fx_rules(model):
    """Mappings from an fx trace of a plain module (empty when it does not trace)."""
    try:
        gm = torch.fx.GraphModule(model, _Tracer().trace(model))
    except Exception as e:  # noqa: BLE001  (transformers models do not fx-trace: rule 1 covers)
        logger.info("llm: no fx trace of %s (%s); only the named-layer rules apply",
                    type(model).__name__, type(e).__name__)
        return []
    mods = dict(gm.named_modules())
    calls = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1

    def is_homogeneous(node):
        if node.op == "call_module":
            return isinstance(mods[node.target], _HOMOGENEOUS_MODULES)
        if node.op == "call_function":
            return node.target in _HOMOGENEOUS_FUNCTIONS
        return node.op == "call_method" and node.target in ("relu", "relu_")

    def is_linear(node):
        return node.op == "call_module" and _common.is_linear(mods[node.target]) and \
            calls[node.target] == 1

    def consumers(node):
        """The Linears node's output reaches through homogeneous ops, or None if it also reaches
        something else."""
        found = []
        for user in node.users:
            if is_linear(user) and _first_input(user) is node:
                found.append(user.target)
            elif is_homogeneous(user) and _first_input(user) is node:
                sub = consumers(user)
                if sub is None:
                    return None
                found.extend(sub)
            else:
                return None
        return found or None

    maps = []
    for node in gm.graph.nodes:
        if node.op != "call_module" or calls[node.target] != 1:
            continue
        mod = mods[node.target]
        if _common.is_linear(mod) or _is_norm(mod):
            found = consumers(node)
            if found:
                maps.append((node.target, found))
    return maps


def find_mappings(model, linear_names):
    """[(producer name, [consumer Linear names])] for the consumers among ``linear_names``."""
    maps = _decoder_rules(model) or _fx_rules(model)
    wanted = set(linear_names)
    out = []
    for producer, cons in maps:
        # all consumers of a producer share its scale: take the group only if all are wanted
        if all(c in wanted for c in cons):
            out.append((producer, cons))
    return out


def _producer(model, producer):
    """A producer name -> (module, slice of its outputs): ``name[a:b]`` names outputs a to b of
    a Linear (GPT-2's value third of ``c_attn``), a plain name all of them."""
    sl = slice(None)
    if producer.endswith("]") and "[" in producer:
        producer, rng = producer[:-1].rsplit("[", 1)
        a, b = rng.split(":")
        sl = slice(int(a), int(b))
    return _get(model, producer), sl


def apply_scale(model, producer, consumers, s):
    """Divides the producer's output channels by s and multiplies the consumers' input columns
    by s (float function unchanged)."""
    p, sl = _producer(model, producer)
    with torch.no_grad():
        if _common.is_linear(p):  # output rows of the [out, in] view (Note [Conv1D weights])
            _common.weight_2d(p)[sl].div_(s.to(p.weight.dtype).view(-1, 1))
        else:
            p.weight[sl].div_(s.to(p.weight.dtype))
        if getattr(p, "bias", None) is not None:
            p.bias[sl].div_(s.to(p.bias.dtype))
        for c in consumers:
            lin = _get(model, c)
            _common.weight_2d(lin).mul_(s.to(lin.weight.dtype).view(1, -1))


def block_of(model, consumers):
    """The block AWQ scores a group on: the module directly holding several consumers of one
    producer in a transformers layer (``self_attn`` for q/k/v, ``mlp`` for gate/up), or None."""
    if len(consumers) < 2:
        return None
    parents = {c.rsplit(".", 1)[0] if "." in c else "" for c in consumers}
    if len(parents) != 1:
        return None
    parent = parents.pop()
    if parent.rsplit(".", 1)[-1] not in ("self_attn", "mlp"):
        return None
    return parent


def scope_of(producer, consumers):
    """The name of the deepest module holding the producer and all the consumers ("" the model):
    the decoder layer for a norm -> q/k/v, ``self_attn`` for v_proj -> o_proj, BERT's
    ``attention`` (with its output LayerNorm) for value -> output.dense."""
    return _common.common_module([_producer_name(producer)] + list(consumers))


def _producer_name(producer):
    return producer[:-1].rsplit("[", 1)[0] if producer.endswith("]") and "[" in producer \
        else producer


def mappings_of_live(model, live, algorithm, unmapped):
    """``find_mappings`` for the layers in ``live`` ([(name, module)]); the layers no producer
    covers are logged with what happens to them (``unmapped``)."""
    maps = find_mappings(model, [n for n, _ in live])
    covered = {c for _, cons in maps for c in cons}
    lonely = [n for n, _ in live if n not in covered]
    if lonely:
        logger.info("%s: no producer to fold a scale into for %s (%s)", algorithm, lonely, unmapped)
    return maps
