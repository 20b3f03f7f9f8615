"""SignRound: weight rounding and ranges learned by signed gradient descent on each block's output
(Cheng et al., "Optimize Weight Rounding via Signed Gradient Descent for the Quantization of
LLMs", 2023; the algorithm of Intel's AutoRound). Design note:
docs/design/llm.md.

For every weight W of a block, three tensors are learned: an offset V in [-0.5, 0.5] added
before rounding (one per weight), and factors lo, hi in [0.5, 1] on the minimum and maximum of
each group (one per row and group). The block's quantized weights are

    Q = (clamp(round(W / s + V) + z, qmin, qmax) - z) * s,   s, z: the min/max observer's qparams
                                                             of (lo * min(W_g), hi * max(W_g)),

rounding passed straight through in the backward. With V = 0, lo = hi = 1, Q is round to nearest
(``rtn``). The objective is the mean squared error between the block's output with Q, on the
inputs the blocks before it (already quantized) give, and the float block's output on the float
model's own inputs, as AutoRound scores it. Each step takes ``batch_size`` calibration items at
random, and moves every tensor by ``lr`` times the sign of its gradient; ``lr`` falls linearly to
zero over ``iters`` steps. The tensors of the step with the lowest loss are kept, then checked on
all items against round to nearest: the better one is written.

Layers outside a chain of blocks (``_blocks``: a model without one, ``cache_blocks=False``, or
a layer between the blocks such as BERT's pooler) are reconstructed alone: the loss is their own
output error on the inputs they receive.
"""
import collections.abc
import math
import numbers

import torch

from mqbench.llm import (_blocks, _calibration, _checks, _expert_runs, _experts, _layers,
                         _prepared, _weights)

__all__ = ["signround"]

# Bounds of the learned tensors (AutoRound's): the offset may move a weight to either neighbour
# level; a range shrinks to at most half its width.
_V_BOUND = 0.5
_RANGE_MIN = 0.5
# Batched block runs must match the per-item runs (``_Items``): to this tolerance relative to the
# largest output, or, in a half-precision block's dtype, where batched matrix products may round
# otherwise, to _BATCH_EPS epsilons of that dtype relative to the outputs' norm.
_BATCH_RTOL = 1e-4
_BATCH_EPS = 4
# Loss scale of a float16 block (Note [Loss scale of a float16 block]): doubled after this many
# steps without an overflow, never above its start.
_SCALE_GROWTH = 20


def _round_ste(x):
    """round(x) forward, identity backward."""
    return x + (torch.round(x) - x).detach()


def _clamp(x, lo=None, hi=None):
    """torch.clamp's value; its gradient passes where lo <= x <= hi, bounds included (torch's
    fake_quantize convention). torch.clamp's own backward leaves the bounds out in torch 2.14
    and in them in older releases: spelled out, the objective's gradient is one on every torch."""
    y = torch.clamp(x, min=lo, max=hi)
    inside = torch.ones_like(x, dtype=torch.bool)
    if lo is not None:
        inside = inside & (x >= lo)
    if hi is not None:
        inside = inside & (x <= hi)
    return torch.where(inside, x, y.detach())


class _QuantizeFn(torch.autograd.Function):
    """``_Rounding.weight`` as the fused C++ op and its backward (src/ops/llm_signround.cpp):
    one pass over the weight each way instead of a dozen ATen ops."""

    @staticmethod
    def forward(ctx, w, v, lo, hi, w_min, w_max, quant_min, quant_max, symmetric):
        ctx.save_for_backward(w, v, lo, hi, w_min, w_max)
        ctx.grid = (quant_min, quant_max, symmetric)
        return torch.ops.mqbench.signround_quantize(w, v, lo, hi, w_min, w_max, *ctx.grid)

    @staticmethod
    def backward(ctx, grad):
        w, v, lo, hi, w_min, w_max = ctx.saved_tensors
        gv, glo, ghi = torch.ops.mqbench.signround_quantize_backward(
            grad.float().contiguous(), w, v, lo, hi, w_min, w_max, *ctx.grid)
        return None, gv, glo, ghi, None, None, None, None, None


class _Rounding(object):
    """The learned tensors of one layer (module docstring) and its quantized weight: through the
    fused C++ op when ``use_cpp``, else the ATen ops below (the reference the tests hold the op
    to)."""

    def __init__(self, name, mod, wq, use_cpp=False):
        self.name, self.mod, self.wq, self.use_cpp = name, mod, wq, use_cpp
        self.w = _layers.weight_2d(mod).detach().float().clone()  # the float weight, [out, in]
        out_f, in_f = self.w.shape
        if wq.group_size:
            self.shape = (out_f, in_f // wq.group_size, wq.group_size)
        elif wq.per_channel:
            self.shape = (out_f, 1, in_f)
        else:
            self.shape = (1, 1, out_f * in_f)
        g = self.w.reshape(self.shape)
        self.w_min, self.w_max = g.amin(-1), g.amax(-1)
        self.v = torch.zeros_like(self.w, requires_grad=True)
        self.lo = torch.ones_like(self.w_min, requires_grad=True)
        self.hi = torch.ones_like(self.w_max, requires_grad=True)

    @property
    def leaves(self):
        return [self.v, self.lo, self.hi]

    def _qparams(self, ste):
        """(scale, zero_point) [rows, groups] of the learned range; the zero point's rounding
        passed through in the backward when ``ste``. The same op sequence as
        ``_weights.minmax_qparams``: equal to it at lo = hi = 1."""
        wq = self.wq
        mn = _clamp(self.w_min * self.lo, hi=0.0)
        mx = _clamp(self.w_max * self.hi, lo=0.0)
        if wq.symmetric:
            scale = _clamp(torch.maximum(-mn, mx) / ((wq.quant_max - wq.quant_min) / 2.0),
                           lo=_weights._EPS)
            return scale, torch.zeros_like(scale)
        scale = _clamp((mx - mn) / float(wq.quant_max - wq.quant_min), lo=_weights._EPS)
        r = _round_ste(mn / scale) if ste else torch.round(mn / scale)
        return scale, _clamp(wq.quant_min - r, wq.quant_min, wq.quant_max)

    def weight(self):
        """The quantized weight [out, in], differentiable in v, lo and hi."""
        if self.use_cpp:
            wq = self.wq
            return _QuantizeFn.apply(self.w.reshape(self.shape), self.v.reshape(self.shape),
                                     self.lo, self.hi, self.w_min, self.w_max, wq.quant_min,
                                     wq.quant_max, bool(wq.symmetric)).reshape(self.w.shape)
        scale, zero = self._qparams(ste=True)
        s, z = scale.unsqueeze(-1), zero.unsqueeze(-1)
        g = self.w.reshape(self.shape)
        q = _clamp(_round_ste(g * (1.0 / s) + self.v.reshape(self.shape)) + z,
                   self.wq.quant_min, self.wq.quant_max)
        return ((q - z) * s).reshape(self.w.shape)

    def step(self, grads, lr):
        """One signed-gradient step, then the bounds."""
        with torch.no_grad():
            for t, g in zip(self.leaves, grads):
                t.add_(g.sign(), alpha=-lr)
            self.v.clamp_(-_V_BOUND, _V_BOUND)
            self.lo.clamp_(_RANGE_MIN, 1.0)
            self.hi.clamp_(_RANGE_MIN, 1.0)

    def snapshot(self):
        return [t.detach().clone() for t in self.leaves]

    def load(self, values):
        with torch.no_grad():
            for t, v in zip(self.leaves, values):
                t.copy_(v)

    def reset(self):
        self.load([torch.zeros_like(self.v), torch.ones_like(self.lo), torch.ones_like(self.hi)])

    def write(self):
        """Writes the quantized weight into the layer; returns its qparams entry."""
        with torch.no_grad():
            scale, zero = self._qparams(ste=False)
            q = self.weight()
            if not torch.isfinite(q).all():  # never write a NaN weight
                raise RuntimeError(f"signround: non-finite quantized weight for {self.name}")
            weight = _layers.weight_2d(self.mod)  # a view (Note [Conv1D weights])
            weight.copy_(q.to(weight.dtype))
        return {"scale": scale, "zero_point": zero, "quant_min": self.wq.quant_min,
                "quant_max": self.wq.quant_max, "conv1d": _layers.is_conv1d(self.mod)}


# Note [Loss scale of a float16 block]
# The objective is a mean over every element of a batch's block outputs (AutoRound's), so the
# gradient reaching a block output is 2 * error / count, count = items x tokens x hidden. With a
# float16 block the backward carries it in float16, whose smallest subnormal is 6e-8: at 8 items
# of 2048 tokens and hidden 4096 (count 6.7e7) it is 0 nearly everywhere, every sign is 0 and
# nothing is learned (measured on the CPU: at W8 with count 5e5, no gradient was left; at W4,
# a third to two thirds). A step only reads the gradients' signs, which a positive factor keeps,
# so the backward of a float16 block starts from the loss times a power of two near the count
# of a batch: the block output then receives 2 * error, as an unnormalised sum would give. Where
# a gradient is not finite (a weight gradient, a sum over every token, overflowed float16's
# 65504), the step is computed again at half the scale; after _SCALE_GROWTH steps without one,
# the scale doubles again, to its start at most (the dynamic loss scale of mixed-precision
# training). Float32 and bfloat16 blocks (bfloat16 has float32's range) take the loss as is.

# Note [SignRound over several ranks]
# Under torchrun (``quantize_checkpoint``) each rank holds every N-th calibration row and draws its
# steps' batches from them (``Comm.share`` of ``batch_size``, rounded up: the ranks' batches
# together about as large as one process's). A step's objective is the mean over every rank's batch:
# each rank's loss (a mean over its batch's weighted elements) times its batch's weight, summed over
# the ranks, over the summed weights. The gradients are summed the same way: each rank's times its
# batch's weight. That is the objective's gradient times the total weight, a positive factor the
# signed step does not see. The sum reaches every rank with the same bits, so every rank takes the
# same step and holds the same roundings; the step kept (the lowest objective) and the final check
# against round to nearest read the reduced objective too. The loss scale of a float16 block (a
# retry decided per rank) is not used there: the block-by-block run computes in float32.


class _Optimizer(object):
    """The search of one unit (a block or a lone layer): ``loss(idx, with_grad)`` gives the
    objective over the items ``idx`` (a LongTensor) with the current tensors of ``roundings``.
    ``scale``: the start of the loss scale of a float16 block (Note [Loss scale of a float16
    block]); None for none."""

    def __init__(self, roundings, loss, n_items, iters, lr, batch_size, generator, scale=None,
                 comm=None, weight_of=None):
        self.roundings, self.loss, self.n_items = roundings, loss, n_items
        self.iters, self.lr, self.batch_size = iters, lr, batch_size
        self.generator = generator
        self.max_scale = self.scale = scale
        self.good = 0
        # Note [SignRound over several ranks]: the collectives and each batch's weight
        if comm is not None and (scale is not None or weight_of is None):
            raise ValueError("signround: on several ranks a step needs each batch's weight, and "
                             "the block runs without a loss scale (float32)")
        self.comm, self.weight_of = comm, weight_of

    def _value(self, loss, idx):
        """The objective over every rank's items of the step (this rank's: ``idx``)."""
        if self.comm is None:
            return loss.item()
        w = float(self.weight_of(idx))
        total = self.comm.sum(torch.tensor([loss.item() * w, w], dtype=torch.float64))
        return float(total[0] / total[1]) if total[1] > 0 else 0.0

    def _reduced(self, grads, leaves, idx):
        """The gradients of the objective over every rank's items of the step, up to a
        positive factor (the step reads their signs): each rank's weighed by its items' weight,
        summed."""
        if self.comm is None:
            return grads
        full = [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, leaves)]
        flat = torch.cat([g.reshape(-1).float() for g in full]) * float(self.weight_of(idx))
        flat = self.comm.sum(flat)
        out, k = [], 0
        for g in full:
            out.append(flat[k:k + g.numel()].view_as(g).to(g.dtype))
            k += g.numel()
        return out

    def _grads(self, idx, loss, leaves):
        """The gradients of ``loss`` (over the items ``idx``) in ``leaves``, through the loss
        scale where there is one."""
        if self.scale is None:
            return torch.autograd.grad(loss, leaves, allow_unused=True)
        while True:
            grads = torch.autograd.grad(loss * self.scale, leaves, allow_unused=True)
            given = [g for g in grads if g is not None]
            if self.scale <= 1.0 or not given or \
                    bool(torch.stack([torch.isfinite(g).all() for g in given]).all()):
                break
            self.scale, self.good = self.scale / 2.0, 0
            loss = self.loss(idx, True)  # the graph is spent: the same step again
        self.good += 1
        if self.good >= _SCALE_GROWTH and self.scale < self.max_scale:
            self.scale, self.good = self.scale * 2.0, 0
        return grads

    def run(self):
        """Returns (loss with round to nearest, loss written) over all items."""
        leaves = [t for r in self.roundings for t in r.leaves]
        every = torch.arange(self.n_items)
        best, best_loss = None, float("inf")
        order, pos = None, self.n_items
        batch = min(self.batch_size, self.n_items)
        for it in range(self.iters):
            # every item once per pass over a shuffled order (AutoRound's sampler); a pass ends
            # where fewer than a batch are left
            if pos + batch > self.n_items:
                order, pos = torch.randperm(self.n_items, generator=self.generator), 0
            idx, pos = order[pos:pos + batch], pos + batch
            loss = self.loss(idx, True)
            value = self._value(loss, idx)
            if value < best_loss:
                best_loss, best = value, [r.snapshot() for r in self.roundings]
            grads = self._reduced(self._grads(idx, loss, leaves), leaves, idx)
            lr = self.lr * (1.0 - it / self.iters)
            k = 0
            for r in self.roundings:
                n = len(r.leaves)
                r.step([g if g is not None else torch.zeros_like(t)
                        for g, t in zip(grads[k:k + n], r.leaves)], lr)
                k += n
        for r in self.roundings:
            r.reset()
        base = self._value(self.loss(every, False), every)
        if best is None:
            return base, base
        for r, values in zip(self.roundings, best):
            r.load(values)
        learned = self._value(self.loss(every, False), every)
        if not learned < base:  # never worse than round to nearest on the objective
            for r in self.roundings:
                r.reset()
            return base, base
        return base, learned


def _signature(obj, depth=0):
    """What must agree between items for their argument ``obj`` to be stacked."""
    if obj is None:
        return None
    if isinstance(obj, torch.Tensor):
        return ("tensor", tuple(obj.shape), obj.dtype, obj.device)
    if isinstance(obj, tuple) and depth < _blocks.MAX_DEPTH:  # (cos, sin) position embeddings
        return ("tuple", tuple(_signature(v, depth + 1) for v in obj))
    return ("object", id(obj))


_NO_STACK = object()


def _stack_values(values, batch, depth=0):
    """One argument of a stack of items, as a spec: ("same", v), the object all items share (or
    a tensor equal in all); ("cat", t), their tensors concatenated along the batch dimension;
    ("tuple", [specs]); _NO_STACK where none of these holds."""
    first = values[0]
    if all(v is first for v in values):
        return ("same", first)
    if isinstance(first, tuple) and depth < _blocks.MAX_DEPTH:
        parts = [_stack_values([v[j] for v in values], batch, depth + 1)
                 for j in range(len(first))]
        return _NO_STACK if any(p is _NO_STACK for p in parts) else ("tuple", parts)
    if not all(isinstance(v, torch.Tensor) for v in values):
        return _NO_STACK
    if first.dim() > 0 and first.shape[0] == batch:
        return ("cat", torch.cat(values))
    if all(torch.equal(v, first) for v in values):
        return ("same", first)
    return _NO_STACK


def _select(spec, sel, batch, n):
    """The value of a stacked argument for the members ``sel`` (positions) of a stack of n."""
    kind, v = spec
    if kind == "same":
        return v
    if kind == "tuple":
        return tuple(_select(p, sel, batch, n) for p in v)
    if len(sel) == n:
        return v
    rows = v.reshape((n, batch) + tuple(v.shape[1:]))
    return rows[sel].reshape((-1,) + tuple(v.shape[1:]))


class _Items(object):
    """The cached inputs of one block for all items, per item (hidden, where, rest)
    (``_blocks``). Items whose hidden states have one shape and whose other arguments are the
    same objects, or tensors of one shape, run batched (a stack): those tensors concatenated
    along the batch dimension. ``check`` compares each stack with its items run one by one on the
    float block; a stack whose output differs runs item by item from then on."""

    def __init__(self, items, chunk):
        self.items = items
        self.chunk = chunk  # items per batched run at most: memory of a step's batch
        groups = {}
        for i, (hidden, where, rest) in enumerate(items):
            args, kwargs = rest
            key = (tuple(hidden.shape), hidden.dtype, where,
                   tuple(_signature(a) for a in args),
                   tuple(sorted((k, _signature(v)) for k, v in kwargs.items())))
            groups.setdefault(key, []).append(i)
        # (item indices, None or (where, [spec of each arg], {key: spec}): ``_stack_values``)
        self.stacks = [(idx, self._stack(idx)) for idx in groups.values()]
        self.row_of = {}  # item -> (stack number, position in it)
        for s, (idx, _) in enumerate(self.stacks):
            for p, i in enumerate(idx):
                self.row_of[i] = (s, p)

    def _stack(self, idx):
        if len(idx) < 2:
            return None
        hidden, where, (args, kwargs) = self.items[idx[0]]
        rests = [self.items[i][2] for i in idx]
        new_args, new_kwargs = [], {}
        for j in range(len(args)):
            v = _stack_values([r[0][j] for r in rests], hidden.shape[0])
            if v is _NO_STACK:
                return None
            new_args.append(v)
        for k in kwargs:
            v = _stack_values([r[1][k] for r in rests], hidden.shape[0])
            if v is _NO_STACK:
                return None
            new_kwargs[k] = v
        return where, new_args, new_kwargs

    def run(self, block_fn, hiddens, idx):
        """``block_fn(args, kwargs)`` on the items ``idx`` (an iterable of item numbers), item i
        with ``hiddens[i]`` as its hidden states: [(item numbers, output of their run)]."""
        by_stack = {}
        for i in idx:
            s, p = self.row_of[int(i)]
            by_stack.setdefault(s, []).append(p)
        outs = []
        for s in sorted(by_stack):
            members, spec = self.stacks[s]
            positions = sorted(by_stack[s])
            if spec is None:
                for p in positions:
                    _, where, rest = self.items[members[p]]
                    args, kwargs = _blocks.join_call(hiddens[members[p]], where, rest)
                    outs.append(((members[p],), block_fn(args, kwargs)))
                continue
            where, s_args, s_kwargs = spec
            batch = self.items[members[0]][0].shape[0]
            n = len(members)
            for c in range(0, len(positions), self.chunk):
                part = positions[c:c + self.chunk]
                sel = torch.tensor(part)
                rest = (tuple(_select(spec, sel, batch, n) for spec in s_args),
                        {k: _select(spec, sel, batch, n) for k, spec in s_kwargs.items()})
                h = torch.cat([hiddens[members[p]] for p in part])
                args, kwargs = _blocks.join_call(h, where, rest)
                outs.append((tuple(members[p] for p in part), block_fn(args, kwargs)))
        return outs

    def check(self, block_fn, hiddens, single):
        """Runs every stack batched and compares with ``single`` (item -> its output run alone);
        a stack that differs by more than the bound (_BATCH_RTOL, _BATCH_EPS) runs item by
        item."""
        for s, (members, spec) in enumerate(self.stacks):
            if spec is None:
                continue
            for which, out in self.run(block_fn, hiddens, members):
                ref = torch.cat([single[i] for i in which]).float()
                if out.shape != ref.shape:
                    same = False
                elif out.dtype in (torch.float16, torch.bfloat16):
                    bound = _BATCH_EPS * torch.finfo(out.dtype).eps * ref.norm()
                    same = bool((out.float() - ref).norm() <= bound)
                else:
                    tol = _BATCH_RTOL * max(1.0, ref.abs().max().item())
                    same = (out - ref).abs().max().item() <= tol
                if not same:
                    self.stacks[s] = (members, None)
                    break


def _units(cal):
    """The steps of ``signround`` in module order: ("block", b, [(name, module)]) for the layers
    of block b of the chain (all of them in one step), ("layer", None, [(name, module)]) for a
    layer reconstructed alone."""
    units, of_block = [], {}
    for name, mod in cal.live:
        b = cal.cache.block_of([name]) if cal.cache is not None else None
        if b is None:
            units.append(("layer", None, [(name, mod)]))
        elif b in of_block:
            of_block[b][2].append((name, mod))
        else:
            of_block[b] = ("block", b, [(name, mod)])
            units.append(of_block[b])
    return units


class _FloatStream(object):
    """The float model's hidden states at the input of block ``k``, per item: the targets are the
    float blocks' outputs on them (module docstring)."""

    def __init__(self, blocks):
        self.blocks, self.k, self.hidden = blocks, None, None

    def start(self, b, items):
        self.k, self.hidden = b, [h for h, _, _ in items]

    def at(self, b, items):
        """The float inputs of block b (``items``: its cached inputs, whose other arguments the
        chain shares between blocks). A stream already past b (a block reached twice) restarts
        from the cached inputs."""
        if self.k is None or self.k > b:
            self.start(b, items)
        with torch.no_grad():
            while self.k < b:
                block = self.blocks[self.k][1]
                hidden = []
                for h, (_, where, rest) in zip(self.hidden, items):
                    args, kwargs = _blocks.join_call(h, where, rest)
                    hidden.append(_blocks.first_tensor(block(*args, **kwargs)))
                self.hidden = hidden
                self.k += 1
        return self.hidden

    def moved(self, b, outputs):
        self.k, self.hidden = b + 1, outputs


def _token_weights(sample, out):
    """Per position of a block output [batch, tokens, ...]: 1, or 0 where the calibration item's
    ``attention_mask`` ([batch, tokens]) marks padding, whose outputs no later computation reads.
    Shape [batch, tokens, 1, ...] (ones where the item has no such mask), in float32 whatever
    the output's dtype: the count of tokens is summed from it (bfloat16 counts exactly only to
    256)."""
    shape = tuple(out.shape[:2]) + (1,) * (out.dim() - 2)
    # a tokenizer's BatchEncoding is a UserDict, not a dict
    mask = sample.get("attention_mask") if isinstance(sample, collections.abc.Mapping) else None
    if isinstance(mask, torch.Tensor) and out.dim() >= 3 and tuple(mask.shape) == shape[:2] \
            and bool((mask != 0).any()):
        return (mask != 0).to(device=out.device, dtype=torch.float32).reshape(shape)
    return torch.ones(shape, dtype=torch.float32, device=out.device)


def _run_block(cal, b, members, wq, opts, stream, use_cpp):
    """SignRound of the layers ``members`` of block b: writes their weights, returns
    ({name: qparams}, (loss with round to nearest, loss written))."""
    bname, block = cal.blocks[b]
    cached = cal.cache.inputs_of(b)
    h_f = stream.at(b, cached)
    qparams, losses, float_out = learn_block(bname, block, members, cached, h_f, cal.calib, wq,
                                             opts, use_cpp)
    stream.moved(b, float_out)
    return qparams, losses


def learn_block(bname, block, members, cached, h_f, samples, wq, opts, use_cpp, comm=None):
    """SignRound of the layers ``members`` of the block ``block`` (named ``bname``) from its
    inputs: ``cached`` per item (hidden, where, rest) as the quantized blocks before it give
    them (``_blocks``), ``h_f`` the float model's hidden states there, ``samples`` the
    calibration items (their padding masks weigh the loss). Writes the weights; returns
    ({name: qparams}, (loss with round to nearest, loss written), the float block's outputs on
    ``h_f``). ``opts``: (iters, lr, batch_size, generator). ``comm`` (``stream._dist.Comm``):
    ``cached`` is this rank's share of the items, and every step's objective is every rank's
    (Note [SignRound over several ranks])."""
    items = _Items(cached, opts[2])
    n = len(items.items)
    h_q = [h for h, _, _ in items.items]
    roundings = [_Rounding(name, mod, wq, use_cpp) for name, mod in members]
    rel = {r.name: r.name[len(bname) + 1:] + ".weight" for r in roundings}

    def float_fn(args, kwargs):
        return _blocks.first_tensor(block(*args, **kwargs))

    def quantized_weights():
        subs = {}
        for r in roundings:
            q = r.weight()
            subs[rel[r.name]] = (q.t() if _layers.is_conv1d(r.mod) else q).to(r.mod.weight.dtype)
        return subs

    with torch.no_grad():
        target, weight, counted, float_out = {}, {}, {}, []
        for i in range(n):
            (_, out), = items.run(float_fn, h_f, [i])
            float_out.append(out)  # the next block's float input
            # In the model's dtype, the same tensor: a half model's targets take half the memory
            # of float32 copies, and each step widens only its batch (the same float values).
            target[i] = out
            weight[i] = _token_weights(samples[i], out)
            counted[i] = weight[i].sum().item() * target[i].shape[-1]  # once, not per step
        items.check(float_fn, h_f, target)

    def loss(idx, with_grad):
        sse, count = 0.0, 0
        with torch.set_grad_enabled(with_grad):
            subs = quantized_weights()  # once per step, whatever the number of stacks

            def quant_fn(args, kwargs):
                return _blocks.first_tensor(torch.func.functional_call(block, subs, args, kwargs))
            for which, out in items.run(quant_fn, h_q, idx.tolist()):
                ref = torch.cat([target[i] for i in which]).float()
                w = torch.cat([weight[i] for i in which])
                sse = sse + ((out.float() - ref).pow(2) * w).sum()
                count += sum(counted[i] for i in which)
        return sse / max(count, 1.0)

    scale = None
    if any(p.dtype == torch.float16 for p in block.parameters()):
        per_batch = min(opts[2], n) * sum(counted.values()) / max(n, 1)
        scale = 2.0 ** max(0, round(math.log2(max(per_batch, 1.0))))
    losses = _Optimizer(roundings, loss, n, *opts, scale=scale, comm=comm,
                        weight_of=lambda idx: sum(counted[i] for i in idx.tolist())).run()
    return {r.name: r.write() for r in roundings}, losses, float_out


def _run_layer(cal, name, mod, wq, opts, use_cpp):
    """SignRound of one layer alone, on the inputs it receives (module docstring)."""
    xs = []
    cal.capture([(name, mod)], lambda _n, x: xs.append(x.float().clone()))
    r = _Rounding(name, mod, wq, use_cpp)
    targets = [x @ r.w.t() for x in xs]

    def loss(idx, with_grad):
        idx = idx.tolist()
        sse, count = 0.0, 0
        with torch.set_grad_enabled(with_grad):
            q = r.weight()
            for c in range(0, len(idx), opts[2]):  # batch_size items at a time
                part = idx[c:c + opts[2]]
                x = torch.cat([xs[i] for i in part])
                ref = torch.cat([targets[i] for i in part])
                sse = sse + (x @ q.t() - ref).pow(2).sum()
                count += ref.numel()
        return sse / count

    losses = _Optimizer([r], loss, len(xs), *opts).run()
    return {name: r.write()}, losses


def options(iters, lr, batch_size, seed, impl):
    """The checked arguments as ``learn_block`` takes them: ((iters, lr, batch_size, generator
    seeded with ``seed``), whether the C++ quantizer runs)."""
    if isinstance(iters, bool) or not isinstance(iters, numbers.Integral) or iters < 0:
        raise ValueError(f"signround: iters must be an integer >= 0, got {iters!r}")
    iters = int(iters)
    batch_size = _checks.check_positive_int(batch_size, "batch_size", "signround")
    if lr is None:
        lr = 1.0 / max(iters, 1)
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not 0 < lr < float("inf"):
        raise ValueError(f"signround: lr must be a finite number > 0, got {lr!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"signround: seed must be an integer, got {seed!r}")
    use_cpp = _checks.want_cpp(impl, "signround_quantize")
    generator = torch.Generator().manual_seed(int(seed))
    return (iters, float(lr), batch_size, generator), use_cpp


@_expert_runs.per_expert
def signround(model, calib_data, w_qscheme, iters=200, lr=None, batch_size=8, layers=None,
              ignore=("lm_head",), skip_unreached=False, cache_blocks=True, seed=0,
              impl="auto", calibrate_all_experts=False,
              min_expert_tokens=_experts.MIN_EXPERT_TOKENS):
    """Quantizes the weights of ``model``'s Linear layers with SignRound (AutoRound's algorithm),
    in place, block by block: each weight's rounding and each group's range are learned by
    signed gradient descent on the block's output error (module docstring; docs/llm.md).

    Run it before ``prepare_by_platform`` with the same scheme as weight scheme, then
    ``load_weight_qparams`` with what it returns, as for ``gptq``.

    Args:
        model: an nn.Module (a transformers decoder or encoder, or any module of Linears).
        calib_data: iterable of model inputs: tensors, tuples of positional inputs, or dicts of
            keyword inputs (a tokenizer's output).
        w_qscheme: a QuantizeScheme or its dict, integer, bit in [2, 8], e.g.
            ``{"bit": 4, "per_channel": True, "group_size": 128}``.
        iters: signed-gradient steps per block (AutoRound: 200). 0: round to nearest.
        lr: step size, falling linearly to 0 over the steps (default ``1 / iters``, AutoRound's).
        batch_size: calibration items per step (AutoRound: 8).
        layers / ignore / skip_unreached / cache_blocks: as in ``gptq``. Without the block cache
            (``cache_blocks=False``, or a model whose layers do not sit in a chain of blocks)
            every layer is reconstructed alone, on its own output.
        seed: of the items drawn for each step (a generator of its own: torch's global random
            state is left alone).
        impl: "auto" (the fused C++ quantizer when built), "cpp" or "python" (its ATen
            reference, the test oracle).

    Returns:
        dict name -> {"scale", "zero_point", "quant_min", "quant_max", "conv1d", "loss_rtn",
        "loss"} of every quantized layer (``load_weight_qparams`` takes it); ``loss_rtn`` and
        ``loss`` are the objective of its block (or of itself) over all calibration items with
        round to nearest and as written.

    Raises:
        ValueError: bad arguments, an unreached layer (unless ``skip_unreached``), or a model
            that holds fake quantizers (run it before ``prepare_by_platform``).

    Example::

        from mqbench.llm import signround
        qparams = signround(model, [tok(t, return_tensors="pt") for t in texts],
                            {"bit": 4, "per_channel": True, "group_size": 128})
    """
    wq = _weights.resolve_w_qscheme(w_qscheme, "signround")
    opts, use_cpp = options(iters, lr, batch_size, seed, impl)
    found = _prepared.fake_quantizers(model)
    if found:
        raise ValueError(
            f"signround: the model holds fake quantizers ({found[0][0]!r} and {len(found) - 1} "
            "more): run signround on the float model, before prepare_by_platform, then hand its "
            "grids to the prepared model with load_weight_qparams (docs/llm.md). The prepared "
            "graph calls no block module, so the blocks' outputs it learns from are not there")
    cal = _calibration.select_and_calibrate(model, layers, ignore, calib_data, skip_unreached,
                                            "signround", wq, cache_blocks)
    units = _units(cal)
    stream = _FloatStream(cal.blocks)
    firsts = [b for kind, b, _ in units if kind == "block"]
    if firsts:  # the float inputs of the first block, before any layer changes
        stream.start(firsts[0], cal.cache.inputs_of(firsts[0]))
    results = {}
    for kind, b, members in _checks.progress(units, "signround"):
        if kind == "block":
            qparams, (base, learned) = _run_block(cal, b, members, wq, opts, stream, use_cpp)
        else:
            qparams, (base, learned) = _run_layer(cal, members[0][0], members[0][1], wq, opts,
                                                  use_cpp)
        for name, qp in qparams.items():
            qp["loss_rtn"], qp["loss"] = base, learned
            results[name] = qp
    return results
