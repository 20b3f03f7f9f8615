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
     v_proj -> o_proj when they have the same width (no grouped KV heads); the last two also
     in layers whose norms are not producers (Gemma's (1 + weight) RMSNorm); GPT-2's blocks
     (transformers Conv1D layers): ln_1 -> attn.c_attn, ln_2 -> mlp.c_fc, and the value third
     of c_attn's outputs ("attn.c_attn[2E:3E]") -> attn.c_proj; BERT-style post-norm
     encoder layers: attention.self.value -> attention.output.dense only (their LayerNorms also
     feed a residual, so no scale can hide in them);
  2. any other module torch.fx can trace: the graph rule above.
A Linear with no producer keeps its input scale (it is still quantized by the later steps).

On a model ``prepare_by_platform`` prepared (``prepared=True``) the same rules run on what the
prepared graph kept: a norm it inlined is a bare module holding the weight its graph reads
(``model.layers.0.input_layernorm.weight`` read by ``mul(weight, x)`` or ``layer_norm``, maybe
through a weight fake quantizer), its fake quantizers pass a scale through (they are off while
the algorithms run), and the graph rule reads the prepared graph itself. On any model, every
mapping found is then checked on the model's output (Note [Folds checked on the output]).
"""
import operator

import torch
from torch import nn

from mqbench._base import is_fake_quantizer
from mqbench.llm import _blocks, _layers
from mqbench.utils.logger import logger

_HOMOGENEOUS_MODULES = (nn.ReLU, nn.LeakyReLU, nn.Dropout, nn.Identity)
_aten = torch.ops.aten
_HOMOGENEOUS_FUNCTIONS = {torch.relu, torch.nn.functional.relu, torch.nn.functional.leaky_relu,
                          torch.nn.functional.dropout, _aten.relu.default,
                          _aten.leaky_relu.default, _aten.dropout.default, _aten.clone.default,
                          _aten.alias.default, _aten.to.dtype, _aten._to_copy.default}
# users that read a tensor's metadata and produce nothing (torch.export's dtype assertions)
_METADATA_FUNCTIONS = {_aten._assert_tensor_metadata.default}
# a norm's last step, inlined into a graph: x * weight, layer_norm(x, shape, weight, bias)
_WEIGHT_MULS = {operator.mul, torch.mul, _aten.mul.Tensor}
_LAYER_NORMS = {torch.nn.functional.layer_norm, _aten.layer_norm.default}


def _is_norm(mod, inlined=False):
    """A LayerNorm / RMSNorm module; with ``inlined``, also the bare module a prepared graph
    keeps for a norm it inlined (its 1-D ``weight``; checked on the output afterwards)."""
    w = getattr(mod, "weight", None)
    name = type(mod).__name__
    if not (isinstance(w, torch.Tensor) and w.dim() == 1):
        return False
    if inlined and type(mod) is nn.Module:
        return True
    # Gemma's RMSNorm scales by (1 + weight): dividing weight by s would be wrong
    return (isinstance(mod, nn.LayerNorm) or name.endswith("RMSNorm") or name == "RMSNorm") and \
        "Gemma" not in name


def _get(root, path):
    mod = root
    for part in path.split("."):
        mod = getattr(mod, part, None)
        if mod is None:
            return None
    return mod


def _decoder_rules(model, inlined=False):
    """Mappings of transformers-style layers, by attribute names (``inlined``: a norm may be
    the bare module of a prepared graph, ``_is_norm``)."""
    maps = []
    for name, layer in model.named_modules():
        prefix = name + "." if name else ""
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is not None and _is_norm(getattr(layer, "input_layernorm", None) or nn.Module(),
                                          inlined):
            qkv = [_get(attn, p) for p in ("q_proj", "k_proj", "v_proj")]
            if all(isinstance(m, nn.Linear) for m in qkv):
                maps.append((prefix + "input_layernorm",
                             [prefix + "self_attn." + p for p in ("q_proj", "k_proj", "v_proj")]))
        if attn is not None and getattr(layer, "input_layernorm", None) is not None:
            v, o = _get(attn, "v_proj"), _get(attn, "o_proj")
            if isinstance(v, nn.Linear) and isinstance(o, nn.Linear) and \
                    v.out_features == o.in_features:
                maps.append((prefix + "self_attn.v_proj", [prefix + "self_attn.o_proj"]))
        if mlp is not None and _is_norm(getattr(layer, "post_attention_layernorm", None) or
                                        nn.Module(), inlined):
            gu = [_get(mlp, p) for p in ("gate_proj", "up_proj")]
            if all(isinstance(m, nn.Linear) for m in gu):
                maps.append((prefix + "post_attention_layernorm",
                             [prefix + "mlp.gate_proj", prefix + "mlp.up_proj"]))
        if mlp is not None and getattr(layer, "post_attention_layernorm", None) is not None:
            # down_proj(act(gate_proj(x)) * up_proj(x)): homogeneous in up_proj's output
            up, down = _get(mlp, "up_proj"), _get(mlp, "down_proj")
            if isinstance(up, nn.Linear) and isinstance(down, nn.Linear):
                maps.append((prefix + "mlp.up_proj", [prefix + "mlp.down_proj"]))
        # GPT-2-style pre-norm blocks (transformers Conv1D layers): ln_1 -> attn.c_attn (the fused
        # q/k/v projection), ln_2 -> mlp.c_fc; the GELU between c_fc and c_proj is not homogeneous
        c_attn, c_fc = _get(layer, "attn.c_attn"), _get(layer, "mlp.c_fc")
        if c_attn is not None and _layers.is_linear(c_attn) and \
                not getattr(_get(layer, "attn"), "is_cross_attention", False) and \
                _is_norm(getattr(layer, "ln_1", None) or nn.Module(), inlined):
            maps.append((prefix + "ln_1", [prefix + "attn.c_attn"]))
        c_proj = _get(layer, "attn.c_proj")
        if c_attn is not None and c_proj is not None and _layers.is_linear(c_attn) and \
                _layers.is_linear(c_proj) and \
                not getattr(_get(layer, "attn"), "is_cross_attention", False):
            # the value third of c_attn's outputs -> c_proj: channel j of the values is channel
            # j of the merged heads c_proj reads (attention is linear in the values)
            e = _layers.in_features(c_proj)
            if _layers.weight_2d(c_attn).shape[0] == 3 * e:
                maps.append((f"{prefix}attn.c_attn[{2 * e}:{3 * e}]", [prefix + "attn.c_proj"]))
        if c_fc is not None and _layers.is_linear(c_fc) and \
                _is_norm(getattr(layer, "ln_2", None) or nn.Module(), inlined):
            maps.append((prefix + "ln_2", [prefix + "mlp.c_fc"]))
        v, o = _get(layer, "attention.self.value"), _get(layer, "attention.output.dense")
        if isinstance(v, nn.Linear) and isinstance(o, nn.Linear) and \
                v.out_features == o.in_features:
            maps.append((prefix + "attention.self.value", [prefix + "attention.output.dense"]))
    return maps


class _Tracer(torch.fx.Tracer):
    """fx's tracer, with transformers' Conv1D kept as one call (a Linear to the rules)."""

    def is_leaf_module(self, m, module_qualified_name):
        return _layers.is_conv1d(m) or super().is_leaf_module(m, module_qualified_name)


def _first_input(node):
    """The node's first argument, positional or keyword (``lin(input=x)``), or None."""
    if node.args:
        return node.args[0]
    return next(iter(node.kwargs.values()), None)


def _fx_rules(model, prepared=False):
    """Mappings from an fx trace of a plain module (empty when it does not trace); with
    ``prepared``, from the prepared GraphModule's own graph (module docstring)."""
    if prepared and isinstance(model, torch.fx.GraphModule):
        gm = model
    else:
        try:
            gm = torch.fx.GraphModule(model, _Tracer().trace(model))
        except Exception as e:  # noqa: BLE001  (transformers models do not fx-trace: rule 1)
            logger.info("llm: no fx trace of %s (%s); only the named-layer rules apply",
                        type(model).__name__, type(e).__name__)
            return []
    mods = dict(gm.named_modules())
    calls, reads = {}, {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
        elif node.op == "get_attr":
            reads[node.target] = reads.get(node.target, 0) + 1

    def is_homogeneous(node):
        if node.op == "call_module":
            mod = mods[node.target]
            return isinstance(mod, _HOMOGENEOUS_MODULES) or (prepared and is_fake_quantizer(mod))
        if node.op == "call_function":
            return node.target in _HOMOGENEOUS_FUNCTIONS
        return node.op == "call_method" and node.target in ("relu", "relu_")

    def is_linear(node):
        return node.op == "call_module" and _layers.is_linear(mods[node.target]) and \
            calls[node.target] == 1

    def consumers(node):
        """The Linears node's output reaches through homogeneous ops, or None if it also reaches
        something else."""
        found = []
        for user in node.users:
            if user.op == "call_function" and user.target in _METADATA_FUNCTIONS:
                continue
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

    def norm_param(arg, kind):
        """The norm name X when ``arg`` reads X.<kind>, a 1-D tensor read nowhere else (on a
        prepared graph maybe through a fake quantizer of its own, off while the algorithms
        run)."""
        if prepared and isinstance(arg, torch.fx.Node) and arg.op == "call_module" and \
                is_fake_quantizer(mods[arg.target]) and calls[arg.target] == 1 and \
                len(arg.users) == 1 and arg.args:
            arg = arg.args[0]
        if not isinstance(arg, torch.fx.Node) or arg.op != "get_attr" or \
                not arg.target.endswith("." + kind) or reads[arg.target] != 1 or \
                len(arg.users) != 1:
            return None
        name = arg.target[:-len(kind) - 1]
        owner = _get(gm, name)
        t = getattr(owner, kind, None) if owner is not None else None
        return name if isinstance(t, torch.Tensor) and t.dim() == 1 else None

    def inlined_norm(node):
        """(norm name, the node giving its output) where ``node`` applies an inlined norm's
        weight (and bias), else None."""
        if node.op != "call_function":
            return None
        if node.target in _LAYER_NORMS:
            args = list(node.args) + [None] * 4
            weight = node.kwargs.get("weight", args[2])
            bias = node.kwargs.get("bias", args[3])
            name = norm_param(weight, "weight")
            if name is not None and (bias is None or norm_param(bias, "bias") == name):
                return name, node
            return None
        if node.target not in _WEIGHT_MULS or len(node.args) != 2 or node.kwargs:
            return None
        for w, x in (node.args, node.args[::-1]):
            name = norm_param(w, "weight")
            if name is None or not isinstance(x, torch.fx.Node):
                continue
            if getattr(_get(gm, name), "bias", None) is None:
                return name, node
            # x * weight + bias: the bias must be this norm's, added right after
            add = next(iter(node.users)) if len(node.users) == 1 else None
            if add is not None and add.op == "call_function" and \
                    add.target in (operator.add, torch.add, _aten.add.Tensor) and \
                    len(add.args) == 2 and not add.kwargs and node in add.args and \
                    norm_param(add.args[1] if add.args[0] is node else add.args[0],
                               "bias") == name:
                return name, add
        return None

    maps = []
    for node in gm.graph.nodes:
        if node.op == "call_module" and calls[node.target] == 1:
            mod = mods[node.target]
            if _layers.is_linear(mod) or _is_norm(mod):
                found = consumers(node)
                if found:
                    maps.append((node.target, found))
        elif prepared:
            norm = inlined_norm(node)
            found = consumers(norm[1]) if norm is not None else None
            if found:
                maps.append((norm[0], found))
    return maps


def find_mappings(model, linear_names, prepared=False):
    """[(producer name, [consumer Linear names])] for the consumers among ``linear_names``
    (``prepared``: a model prepare_by_platform prepared, module docstring)."""
    maps = _decoder_rules(model, prepared) or _fx_rules(model, prepared)
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
    with torch.no_grad():  # s as each tensor's dtype, on its device (a model over several GPUs)
        if _layers.is_linear(p):  # output rows of the [out, in] view (Note [Conv1D weights])
            _layers.weight_2d(p)[sl].div_(s.to(p.weight).view(-1, 1))
        else:
            p.weight[sl].div_(s.to(p.weight))
        if getattr(p, "bias", None) is not None:
            p.bias[sl].div_(s.to(p.bias))
        for c in consumers:
            lin = _get(model, c)
            _layers.weight_2d(lin).mul_(s.to(lin.weight).view(1, -1))


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
    return _layers.common_module([_producer_name(producer)] + list(consumers))


def _producer_name(producer):
    return producer[:-1].rsplit("[", 1)[0] if producer.endswith("]") and "[" in producer \
        else producer


def mappings_of_live(model, live, algorithm, unmapped, run_one=None, prepared=False):
    """``find_mappings`` for the layers in ``live`` ([(name, module)]), each checked on the
    output of ``run_one()`` (the model on one calibration item, its fake quantizers off) when
    given (``checked_folds``); the layers no producer covers are logged with what happens to
    them (``unmapped``). ``prepared``: a model prepare_by_platform prepared (module
    docstring)."""
    maps = find_mappings(model, [n for n, _ in live], prepared=prepared)
    if run_one is not None:
        maps = checked_folds(model, maps, run_one, algorithm)
    covered = {c for _, cons in maps for c in cons}
    lonely = [n for n, _ in live if n not in covered]
    if lonely:
        logger.info("%s: no producer to fold a scale into for %s (%s)", algorithm, lonely, unmapped)
    return maps


# Note [Folds checked on the output]
# The rules decide by names and module types; a model can break them. A prepared graph has lost
# what they read (an inlined norm is a bare module holding the weight its graph reads: Gemma's
# (1 + weight) norm looks the same as Llama's; the rules by name cannot see what lies between
# v_proj and o_proj), and a float model can hold a LayerNorm subclass that scales by (1 + weight)
# (Nemotron's LayerNorm1P) or an MLP that is not homogeneous in up_proj (Nemotron's relu^2). So
# each mapping is tried before any real scale is computed: random scales s_j in {1/2, 2} are
# folded in, the model runs on one calibration item (fake quantizers off; the random generators
# seeded alike for the reference and the trial, so that dropout draws the same masks), and the
# fold is kept when every output tensor (a key/value cache left out: it holds the scaled
# values) is the same (within 1e-4 of its largest magnitude: a wrong fold halves or doubles
# whole channels). Powers of two make the trial exact: each product the model forms,
# (x_j / s_j)(w_ij s_j), is the same float, so a right fold gives the same output to the bit,
# and x / 2 * 2 is x, except near the ends of the normal range: a tensor scaled k times (a
# Llama v_proj consumes one fold and produces another) keeps its entries below 2^k times the
# smallest normal float or above the largest over 2^k only if they are saved and written back.
# The reference runs twice: a difference between its runs (a nondeterministic kernel) widens
# the tolerance to 8 times that noise. All mappings are tried together first;
# a group whose trial fails is split in two and each half tried (the single failing mappings
# are logged and left unscaled). The cost: three forwards of one item where every fold is
# right; about 2 f log2(n) more for f wrong folds among n (n + 2 at worst).


_CACHE_KEYS = ("past_key_values", "past_key_value", "presents", "present", "cache")


def _output_tensors(out):
    """The tensors of a model's output the check compares, as float on the CPU: of a dict
    (transformers' ModelOutput) every entry but a key/value cache, which holds the values the
    folds scale (a legacy tuple cache); of a tuple or list its first item (a cache may follow);
    else the output."""
    if isinstance(out, dict) or hasattr(out, "keys"):
        picked = [out[k] for k in out.keys() if k not in _CACHE_KEYS]
    elif isinstance(out, (tuple, list)):
        picked = list(out[:1])
    else:
        picked = [out]
    return [t.detach().float().cpu() for t in _blocks._tensors(picked)]


def _same_outputs(out, ref, noise):
    """Whether ``out`` equals ``ref`` within 1e-4 of each tensor's largest finite magnitude, or
    within 8 times the ``noise`` of two reference runs (nondeterministic kernels)."""
    if len(out) != len(ref):
        return False
    for a, b, n in zip(out, ref, noise):
        if a.shape != b.shape:
            return False
        finite = b[torch.isfinite(b)]
        tol = max(1e-4 * (finite.abs().max().item() if finite.numel() else 0.0), 8 * n)
        if not torch.allclose(a, b, rtol=0.0, atol=tol, equal_nan=True):
            return False
    return True


def _seeded(model, run):
    """``run()``'s compared outputs (``_output_tensors``), with the CPU generator and those of
    the GPUs holding the model forked and seeded alike on every call (dropout draws the same
    masks); no other generator is touched."""
    tensors = list(model.parameters()) + list(model.buffers())
    devices = sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        torch.default_generator.manual_seed(0)
        for d in devices:
            torch.cuda.default_generators[d].manual_seed(0)
        with torch.no_grad():
            return _output_tensors(run())


def _scaled_tensors(model, maps):
    """{id: (tensor, how many times a trial of ``maps`` scales it)} of the producers' and
    consumers' floating-point parameters."""
    found = {}
    for producer, cons in maps:
        p, _ = _producer(model, producer)
        for t in [p.weight, getattr(p, "bias", None)] + [_get(model, c).weight for c in cons]:
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                found[id(t)] = (t, found.get(id(t), (t, 0))[1] + 1)
    return found


def _inexact_entries(model, maps):
    """[(tensor, index, values)] of the entries a trial of ``maps`` and its undoing could
    change: a tensor scaled k times (a Llama v_proj consumes one fold and produces another) by
    factors of 1/2 or 2 can leave the normal range below 2^k times the smallest normal float
    (subnormals lose their last bits) or above the largest float over 2^k (overflow)."""
    saved = []
    with torch.no_grad():
        for t, k in _scaled_tensors(model, maps).values():
            if t.device.type == "meta":
                raise ValueError("the model's weights are on the meta device (offloaded): the "
                                 "scale-folding algorithms need them in memory")
            info = torch.finfo(t.dtype)
            mag = t.abs()
            risky = ((mag < info.tiny * 2.0 ** k) & (mag > 0)) | (mag > info.max / 2.0 ** k)
            idx = risky.nonzero(as_tuple=True)
            if idx[0].numel():
                saved.append((t, idx, t[idx].clone()))
    return saved


def _fold_keeps_output(model, maps, run, ref, noise):
    g = torch.Generator().manual_seed(0)
    trial = []
    for producer, cons in maps:
        w = _layers.weight_2d(_get(model, cons[0]))
        halve = torch.rand(w.shape[1], generator=g) < 0.5
        s = torch.where(halve, 0.5, 2.0).to(w.device)
        trial.append((producer, cons, s))
    saved = _inexact_entries(model, maps)
    done = []
    try:
        for t in trial:
            apply_scale(model, *t)
            done.append(t)
        out = _seeded(model, run)
    finally:
        for producer, cons, s in reversed(done):
            apply_scale(model, producer, cons, 1.0 / s)
        with torch.no_grad():
            for t, idx, values in saved:
                t[idx] = values
    return _same_outputs(out, ref, noise)


def checked_folds(model, maps, run, algorithm):
    """The mappings of ``maps`` whose fold leaves the output of ``run()`` unchanged (Note [Folds
    checked on the output]); the others are logged and dropped."""
    if not maps:
        return maps
    ref = _seeded(model, run)
    again = _seeded(model, run)
    noise = [(a - b).abs().nan_to_num(0.0).max().item() if a.shape == b.shape and a.numel()
             else 0.0 for a, b in zip(again, ref)]
    # bisection: a group whose trial keeps the output is kept whole, else split in two
    kept, pending = [], [list(maps)]
    while pending:
        group = pending.pop()
        if _fold_keeps_output(model, group, run, ref, noise):
            kept += group
        elif len(group) > 1:
            pending += [group[len(group) // 2:], group[:len(group) // 2]]
    kept = [m for m in maps if m in kept]
    dropped = [m for m in maps if m not in kept]
    if dropped:
        logger.warning("%s: a scale folded into %s would change the model's output (the model "
                       "computes something else there than the rules assume); left unscaled",
                       algorithm, [f"{p} -> {c}" for p, c in dropped])
    return kept
