"""Mixture-of-experts layers whose experts are fused 3-D parameters (transformers 5's Qwen3-MoE,
Mixtral, GPT-OSS, ...: ``experts.gate_up_proj [E, 2I, H]``, ``experts.down_proj [E, H, I]``, or
transposed ``[E, H, 2I]`` / ``[E, I, H]`` with biases and interleaved gate / up columns), seen
as one ``nn.Linear`` per expert projection while an algorithm runs (docs/design/llm.md,
"Experts one by one").

``ExpertView`` swaps each fused experts module for a ``SplitExperts`` whose Linears' weights are
views into the fused parameters: an algorithm's in-place writes land in the model's own tensors,
and putting the fused module back is all the "fusing" there is. ``SplitExperts`` computes what
the fused module's eager forward computes (the router's choice of experts and weights), expert
by expert; with ``all_tokens`` every expert also runs on every token for the statistics only
(llm-compressor's ``calibrate_all_experts``), the output still the routed one (within float
rounding). It counts the tokens routed to each expert, so that an expert that gets too few is
rounded to nearest instead (never a statistic of nothing). The router (a module of its own,
not an ``nn.Linear``) and any ``nn.Linear`` gate beside the experts (Qwen2-MoE's
``shared_expert_gate``) stay float.
"""
import torch
from torch import nn

# nn.Linear siblings of an experts module that route or gate: left float
ROUTER_NAMES = ("gate", "router", "shared_expert_gate")
# the per-expert projection names where transformers' conversion mapping gives none
_DEFAULT_NAMES = ("gate_proj", "up_proj", "down_proj")
# tokens an expert must receive for its statistics; fewer and it is rounded to nearest
MIN_EXPERT_TOKENS = 32


def is_fused_experts(mod):
    """A transformers experts module with 3-D ``gate_up_proj`` (or ``up_proj``) and
    ``down_proj`` parameters."""
    if isinstance(mod, SplitExperts):
        return False
    up = getattr(mod, "gate_up_proj", None)
    if up is None:
        up = getattr(mod, "up_proj", None)
    down = getattr(mod, "down_proj", None)
    return isinstance(up, nn.Parameter) and isinstance(down, nn.Parameter) and \
        up.dim() == 3 and down.dim() == 3 and up.shape[0] == down.shape[0]


def fused_experts(model):
    return [(n, m) for n, m in model.named_modules() if is_fused_experts(m)]


def expert_names(config):
    """(gate, up, down) names of one expert's projections, as the model's checkpoints name them
    (transformers' conversion mapping: Mixtral's w1 / w3 / w2), else gate_proj / up_proj /
    down_proj."""
    model_type = getattr(config, "model_type", None)
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        mapping = get_checkpoint_conversion_mapping(model_type) or []
    except (ImportError, KeyError, ValueError):
        mapping = []
    found = {}
    for conv in mapping:
        targets = getattr(conv, "target_patterns", None) or []
        sources = getattr(conv, "source_patterns", None) or []
        leaves = [s.rsplit(".weight", 1)[0].rsplit(".", 1)[-1] for s in sources
                  if ".experts.*." in "." + s]
        if any(t.endswith("experts.gate_up_proj") for t in targets) and len(leaves) == 2:
            found["gate"], found["up"] = leaves
        elif any(t.endswith("experts.down_proj") for t in targets) and len(leaves) == 1:
            found["down"] = leaves[0]
    if len(found) == 3:
        return found["gate"], found["up"], found["down"]
    return _DEFAULT_NAMES


def per_expert_on_disk(config):
    """Whether the model's checkpoints hold its experts one Linear per expert (transformers
    fuses them on load: Qwen3-MoE, Mixtral), rather than fused as in memory (GPT-OSS)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        mapping = get_checkpoint_conversion_mapping(getattr(config, "model_type", None)) or []
    except (ImportError, KeyError, ValueError):
        return False
    return any(t.endswith("experts.gate_up_proj") or t.endswith("experts.down_proj")
               for conv in mapping for t in (getattr(conv, "target_patterns", None) or []))


class _Expert(nn.Module):
    """One expert: its projections as ``nn.Linear`` layers whose weights (and biases) are
    views into the fused parameters."""

    def __init__(self, fused, e, names):
        super().__init__()
        self._fused = [fused]  # a list: not a child module
        self._names = names
        gate_name, up_name, down_name = names
        has_gate = getattr(fused, "has_gate", hasattr(fused, "gate_up_proj"))
        transposed = bool(getattr(fused, "is_transposed", False))
        concat = bool(getattr(fused, "is_concatenated", True))
        # detached views: the Linears' parameters share the fused parameters' storage
        up_w = (fused.gate_up_proj if has_gate else fused.up_proj).detach()[e]
        up_b = getattr(fused, "gate_up_proj_bias" if has_gate else "up_proj_bias", None)
        up_b = up_b.detach()[e] if isinstance(up_b, torch.Tensor) else None
        down_w = fused.down_proj.detach()[e]
        down_b = getattr(fused, "down_proj_bias", None)
        down_b = down_b.detach()[e] if isinstance(down_b, torch.Tensor) else None
        if transposed:  # [H, 2I] -> [2I, H]; [I, H] -> [H, I]
            up_w, down_w = up_w.t(), down_w.t()
        self.has_gate, self.concat = has_gate, concat
        up_leaf = "gate_up_proj" if has_gate else "up_proj"
        if has_gate:
            n = up_w.shape[0] // 2
            rows = (slice(0, n), slice(n, 2 * n)) if concat else \
                (slice(0, 2 * n, 2), slice(1, 2 * n, 2))
            self.add_module(gate_name, _linear(up_w[rows[0]], up_b[rows[0]]
                                               if up_b is not None else None))
            self.add_module(up_name, _linear(up_w[rows[1]], up_b[rows[1]]
                                             if up_b is not None else None))
            _rows_of(fused, up_leaf, getattr(self, gate_name), e, up_w.shape[0], rows[0])
            _rows_of(fused, up_leaf, getattr(self, up_name), e, up_w.shape[0], rows[1])
        else:
            self.add_module(up_name, _linear(up_w, up_b))
            _rows_of(fused, up_leaf, getattr(self, up_name), e, up_w.shape[0], slice(None))
        self.add_module(down_name, _linear(down_w, down_b))
        _rows_of(fused, "down_proj", getattr(self, down_name), e, down_w.shape[0], slice(None))

    def forward(self, x):
        gate_name, up_name, down_name = self._names
        fused = self._fused[0]
        up = getattr(self, up_name)(x)
        if self.has_gate:
            gate = getattr(self, gate_name)(x)
            both = torch.cat([gate, up], -1) if self.concat else \
                torch.stack([gate, up], -1).reshape(gate.shape[0], -1)
            h = fused._apply_gate(both)
        else:
            h = fused.act_fn(up)
        return getattr(self, down_name)(h)


class ExpertRowsQuant(object):
    """An expert Linear's ``weight_fake_quant`` in a prepared model: its rows of the weight fake
    quantizer on the fused parameter (Note [Fused experts in a prepared model] in
    custom_quantizer/fused_experts.py), read-only. ``scale`` / ``zero_point`` are the rows'
    (one per output channel, with their groups), or the one scale of a per-tensor grid; every
    other attribute is the fused quantizer's."""

    def __init__(self, fq, rows, total_rows):
        object.__setattr__(self, "_fq", fq)
        object.__setattr__(self, "_rows", rows)
        object.__setattr__(self, "_total", total_rows)

    def _pick(self, t):
        if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == self._total and \
                self._total > 1:
            return t[self._rows]
        return t

    @property
    def scale(self):  # the rows' copy: set a grid on the fused quantizer
        return self._pick(self._fq.scale)

    @property
    def zero_point(self):
        return self._pick(self._fq.zero_point)

    def __getattr__(self, name):
        if name.startswith("_"):  # not set yet (a copy being built): not the quantizer's
            raise AttributeError(name)
        return getattr(self._fq, name)

    def __setattr__(self, name, value):
        raise AttributeError(f"the weight_fake_quant of one expert is a view of the fused "
                             f"experts' quantizer ({type(self._fq).__name__}); set {name!r} on "
                             "that quantizer")


def _rows_of(fused, leaf, linear, e, rows_per_expert, rows):
    """Gives ``linear`` (expert ``e``'s projection, ``rows`` of its block of the fused
    parameter ``leaf``) its rows of ``leaf``'s weight fake quantizer, where a prepared model has
    one."""
    fq = getattr(fused, leaf + "_weight_fake_quant", None)
    if fq is None:
        return
    experts = getattr(fused, leaf).shape[0]
    index = torch.arange(rows_per_expert)[rows] + e * rows_per_expert
    linear.weight_fake_quant = ExpertRowsQuant(fq, index, experts * rows_per_expert)


def _linear(weight, bias):
    """An ``nn.Linear`` whose parameters are the given views (shared storage)."""
    lin = nn.Linear(1, 1, bias=bias is not None, device="meta")
    lin.in_features, lin.out_features = weight.shape[1], weight.shape[0]
    lin.weight = nn.Parameter(weight)
    if bias is not None:
        lin.bias = nn.Parameter(bias)
    return lin


class SplitExperts(nn.Module):
    """A fused experts module as one ``_Expert`` per expert (children "0", "1", ...), computing
    the fused module's routed output (module docstring)."""

    def __init__(self, fused, names):
        super().__init__()
        self.fused = [fused]
        self.num_experts = fused.down_proj.shape[0]
        for e in range(self.num_experts):
            self.add_module(str(e), _Expert(fused, e, names))
        self.all_tokens = False
        self.tokens = torch.zeros(self.num_experts, dtype=torch.long)

    def forward(self, hidden_states, *args, **kwargs):
        # (top_k_index, top_k_weights), or GPT-OSS's router_indices= / routing_weights=
        index = args[0] if args else kwargs.get("top_k_index", kwargs.get("router_indices"))
        weights = args[1] if len(args) > 1 else kwargs.get("top_k_weights",
                                                            kwargs.get("routing_weights"))
        out = torch.zeros_like(hidden_states)
        for e in range(self.num_experts):
            token, slot = torch.where(index == e)
            # the tokens its statistics see: all of them with all_tokens
            self.tokens[e] += hidden_states.shape[0] if self.all_tokens else token.numel()
            expert = getattr(self, str(e))
            if self.all_tokens:
                y = expert(hidden_states)[token]
            elif token.numel():
                y = expert(hidden_states[token])
            else:
                continue
            w = weights[token, slot, None]
            out.index_add_(0, token, (y * w).to(out.dtype))
        return out


class ExpertView(object):
    """Within ``with``: every fused experts module of ``model`` replaced by its
    ``SplitExperts`` (module docstring). ``routers``: the ``nn.Linear`` gates beside the experts
    (left float); ``expert_layers``: the names of the experts' Linears. ``names``: the (gate,
    up, down) names of an expert's projections (default: ``expert_names`` of the model's
    config)."""

    def __init__(self, model, all_tokens=False, names=None):
        self.model = model
        self.all_tokens = bool(all_tokens)
        self.names = names or expert_names(getattr(model, "config", None))
        self.found = fused_experts(model)
        self.split = {}
        self.routers = []
        for name, _ in self.found:
            parent = name.rpartition(".")[0]
            owner = model.get_submodule(parent) if parent else model
            for r in ROUTER_NAMES:
                if isinstance(getattr(owner, r, None), nn.Linear):
                    self.routers.append(f"{parent}.{r}" if parent else r)

    def __bool__(self):
        return bool(self.found)

    def __enter__(self):
        for name, fused in self.found:
            if getattr(fused, "has_post_expert_norm", False):
                raise ValueError(f"{name}: experts with a norm after each expert are not handled")
            split = SplitExperts(fused, self.names)
            split.all_tokens = self.all_tokens
            self._set(name, split)
            self.split[name] = split
        return self

    def __exit__(self, *exc):
        for name, fused in self.found:
            self._set(name, fused)
        return False

    def _set(self, name, mod):
        parent, _, leaf = name.rpartition(".")
        owner = self.model.get_submodule(parent) if parent else self.model
        setattr(owner, leaf, mod)

    def expert_layers(self):
        return [f"{name}.{n}" for name, split in self.split.items()
                for n, m in split.named_modules() if isinstance(m, nn.Linear)]

    def starved(self, run, min_tokens):
        """Runs ``run()`` (the calibration data through the model) counting the tokens routed to
        each expert; returns {expert name: tokens} of those under ``min_tokens``."""
        for split in self.split.values():
            split.tokens.zero_()
        with torch.no_grad():
            run()
        return {f"{name}.{e}": int(n) for name, split in self.split.items()
                for e, n in enumerate(split.tokens.tolist()) if n < min_tokens}


def refuse_fused_on_disk(config, quantized, who):
    """Refuses ``quantized`` expert Linears of a model whose checkpoints hold the experts fused
    (GPT-OSS): compressed-tensors writes one Linear per expert, which its loaders would not
    read for that model."""
    if quantized and not per_expert_on_disk(config):
        raise ValueError(
            f"{who}: {quantized[0]!r} is an expert of a model whose checkpoints hold the experts "
            f"fused ({getattr(config, 'model_type', None)}: one 3-D tensor per projection), and "
            "compressed-tensors writes one Linear per expert, which its loaders would not read; "
            "leave the experts float (ignore their names: "
            f"{sorted({n.rsplit('.', 1)[-1] for n in quantized})})")
