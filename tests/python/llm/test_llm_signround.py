"""mqbench.llm.signround (docs/llm.md): round to nearest at its start, its objective against a
hand computation from the float and the RTN model, below RTN after its steps, on its own grid,
batched block runs equal to runs item by item, and what it refuses."""
import copy

import pytest
import torch
from torch import nn

from mqbench.llm import load_weight_qparams, rtn, signround
from mqbench.llm import _layers, _weights
from mqbench.llm.signround import _SCALE_GROWTH, _Items, _Optimizer, _Rounding

from test_llm import (W4G32, _correlated_inputs, _llama_calib, _logits, _prepare_academic, _rel,
                      _tiny_gpt2, _tiny_llama)

A4G32 = {"bit": 4, "symmetry": False, "per_channel": True, "group_size": 32}
SCHEMES = [A4G32, W4G32, {"bit": 3, "symmetry": False, "per_channel": True},
           {"bit": 4, "per_channel": False}]


def _linears(model):
    return {n: m.weight.detach().clone() for n, m in _layers.find_linears(model)}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_no_steps_is_round_to_nearest(scheme):
    model = _tiny_llama()
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    qa = signround(a, _llama_calib(n=2), scheme, iters=0)
    qb = rtn(b, scheme)
    wa, wb = _linears(a), _linears(b)
    assert wa.keys() == wb.keys() == qa.keys()
    for n in wa:
        assert torch.equal(wa[n], wb[n]), n
        assert torch.equal(qa[n]["scale"], qb[n]["scale"]), n
        assert torch.equal(qa[n]["zero_point"], qb[n]["zero_point"]), n
        assert qa[n]["loss"] == qa[n]["loss_rtn"]


def _block_outputs(model, calib):
    """Per decoder layer: its outputs over the items, concatenated."""
    outs = {i: [] for i in range(len(model.model.layers))}
    hooks = [layer.register_forward_hook(
        lambda _m, _a, out, i=i: outs[i].append((out[0] if isinstance(out, tuple) else out)
                                                .detach().clone()))
        for i, layer in enumerate(model.model.layers)]
    try:
        _logits(model, calib)
    finally:
        for h in hooks:
            h.remove()
    return {i: torch.cat(v) for i, v in outs.items()}


def test_objective_is_the_block_output_against_the_float_model():
    """The loss of block 1 with round to nearest is its output in the RTN model (its inputs from
    the quantized block 0) against its output in the float model (inputs from the float block 0),
    as AutoRound scores a block."""
    model = _tiny_llama()
    calib = _llama_calib(n=3)
    float_out = _block_outputs(model, calib)
    m_rtn = copy.deepcopy(model)
    rtn(m_rtn, A4G32)
    rtn_out = _block_outputs(m_rtn, calib)
    qp = signround(copy.deepcopy(model), calib, A4G32, iters=0)
    for i in range(2):
        want = (rtn_out[i] - float_out[i]).pow(2).mean().item()
        got = qp[f"model.layers.{i}.mlp.down_proj"]["loss_rtn"]
        assert got == pytest.approx(want, rel=1e-4), i


def _tiny_bert(seed=0, layers=2):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
        intermediate_size=128), add_pooling_layer=True).eval()


def _padded_calib(n=6, seed=3):
    """Items of one sentence each, every other one padded after its 11th token."""
    g = torch.Generator().manual_seed(seed)
    calib = []
    for i in range(n):
        mask = torch.ones(1, 16, dtype=torch.long)
        if i % 2:
            mask[0, 11:] = 0
        calib.append({"input_ids": torch.randint(0, 100, (1, 16), generator=g),
                      "attention_mask": mask})
    return calib


@pytest.mark.parametrize("container", ["dict", "BatchEncoding"])
def test_padded_positions_do_not_count_in_the_objective(container):
    """On an encoder with padded items, the loss of round to nearest is the layers' output error
    over the real tokens only (the item's attention_mask), items given as dicts or as a
    tokenizer's output (BatchEncoding, a UserDict)."""
    model = _tiny_bert()
    calib = _padded_calib()
    if container == "BatchEncoding":
        transformers = pytest.importorskip("transformers")
        calib = [transformers.BatchEncoding(c) for c in calib]
    outs = {}

    def record(m, key):
        hooks = [layer.register_forward_hook(
            lambda _m, _a, out, i=i: outs.setdefault((key, i), []).append(
                out[0] if isinstance(out, tuple) else out))
            for i, layer in enumerate(m.encoder.layer)]
        with torch.no_grad():
            for c in calib:
                m(**c)
        for h in hooks:
            h.remove()
    record(model, "float")
    m_rtn = copy.deepcopy(model)
    rtn(m_rtn, A4G32)
    record(m_rtn, "rtn")
    mask = torch.cat([c["attention_mask"] for c in calib]).float().unsqueeze(-1)
    qp = signround(copy.deepcopy(model), calib, A4G32, iters=0)
    for i in range(2):
        d = torch.cat(outs[("rtn", i)]) - torch.cat(outs[("float", i)])
        want = ((d.pow(2) * mask).sum() / (mask.sum() * d.shape[-1])).item()
        unmasked = d.pow(2).mean().item()
        got = qp[f"encoder.layer.{i}.output.dense"]["loss_rtn"]
        assert got == pytest.approx(want, rel=1e-4) and got != pytest.approx(unmasked, rel=1e-3)


def test_each_pass_over_the_items_draws_every_item_once():
    layer = nn.Linear(8, 4)
    r = _Rounding("l", layer, _weights.resolve_w_qscheme(A4G32 | {"group_size": 8}, "test"))
    drawn = []

    def loss(idx, with_grad):
        if with_grad:
            drawn.append(idx.tolist())
        with torch.set_grad_enabled(with_grad):
            return r.weight().pow(2).sum()
    _Optimizer([r], loss, 7, 6, 0.01, 3, torch.Generator().manual_seed(0)).run()
    assert [len(b) for b in drawn] == [3] * 6
    for p in range(3):  # passes of two batches: 6 of the 7 items, none twice
        both = drawn[2 * p] + drawn[2 * p + 1]
        assert len(set(both)) == 6 and set(both) <= set(range(7))


@pytest.mark.parametrize("scheme", [A4G32, W4G32])
def test_steps_bring_the_model_closer_to_float_than_rtn(scheme):
    model = _tiny_llama()
    calib = _llama_calib(n=8)
    ref = _logits(model, calib)
    m_rtn, m_sr = copy.deepcopy(model), copy.deepcopy(model)
    rtn(m_rtn, scheme)
    qp = signround(m_sr, calib, scheme, iters=60, batch_size=4)
    for name, entry in qp.items():
        assert entry["loss"] < 0.9 * entry["loss_rtn"], (name, entry["loss"], entry["loss_rtn"])
    assert torch.equal(m_sr.lm_head.weight, model.lm_head.weight)  # lm_head left float
    e_rtn, e_sr = _rel(_logits(m_rtn, calib), ref), _rel(_logits(m_sr, calib), ref)
    assert e_sr < 0.85 * e_rtn, (e_sr, e_rtn)


@pytest.mark.parametrize("scheme", [A4G32, W4G32, {"bit": 3, "per_channel": True}])
def test_weights_lie_on_the_returned_grid_within_the_rtn_range(scheme):
    model = _tiny_llama()
    ref = copy.deepcopy(model)
    qp = signround(model, _llama_calib(n=4), scheme, iters=30, batch_size=2)
    wq = _weights.resolve_w_qscheme(scheme, "test")
    floats = _linears(ref)
    for name, w in _linears(model).items():
        g = wq.group_size or w.shape[1]
        s, z = qp[name]["scale"], qp[name]["zero_point"]
        rows = w.reshape(w.shape[0], -1, g)
        again = _weights.fake_quant(rows, s.unsqueeze(-1), z.unsqueeze(-1), wq.quant_min,
                                    wq.quant_max)
        torch.testing.assert_close(again, rows, rtol=0, atol=1e-6)
        _, s_rtn, _ = _weights.rtn_weight(floats[name], wq)
        # the learned range lies between half and all of the min/max range
        assert bool((s <= s_rtn * (1 + 1e-6)).all()) and bool((s >= 0.5 * s_rtn - 1e-9).all())
        # a weight inside the grid's range moves by at most one level (|V| <= 0.5, then
        # rounding); outside it, it is clamped to the range's end
        s3, z3 = s.unsqueeze(-1), z.unsqueeze(-1)
        f = floats[name].reshape_as(rows)
        lo, hi = (wq.quant_min - z3) * s3, (wq.quant_max - z3) * s3
        inside = (f >= lo) & (f <= hi)
        moved = (rows - f).abs()
        assert bool((moved <= s3 * (1 + 1e-5))[inside].all()), name
        assert torch.equal(rows[f > hi], hi.expand_as(rows)[f > hi]), name


def test_same_seed_same_weights_and_the_global_random_state_untouched():
    model = _tiny_llama()
    calib = _llama_calib(n=4)
    a, b, c = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model)
    state = torch.random.get_rng_state()
    signround(a, calib, A4G32, iters=10, batch_size=2, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    signround(b, calib, A4G32, iters=10, batch_size=2, seed=3)
    signround(c, calib, A4G32, iters=10, batch_size=2, seed=4)
    wa, wb, wc = _linears(a), _linears(b), _linears(c)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)
    assert any(not torch.equal(wa[n], wc[n]) for n in wa)


class _BatchMean(nn.Module):
    """A block whose output depends on the other items of its batch."""

    def forward(self, h, mask):
        return h - h.mean(0, keepdim=True) + mask


def test_batched_runs_equal_runs_item_by_item_or_are_not_batched():
    g = torch.Generator().manual_seed(0)
    shared = torch.randn(1, 4, 8, generator=g)
    # per item: its own mask-like tensor and (cos, sin)-like pair: concatenated when stacked
    items = [(torch.randn(1, 4, 8, generator=g), "arg",
              ((torch.randn(1, 4, 8, generator=g),),
               {"pe": (torch.randn(1, 4, 8, generator=g), shared)})) for _ in range(3)]
    items.append((torch.randn(1, 4, 8, generator=g), "arg", ((None,), {"pe": (shared, shared)})))
    items.append((torch.randn(1, 5, 8, generator=g), "arg", ((shared,), {"pe": (shared, shared)})))
    hidden = [h for h, _, _ in items]
    st = _Items(items, 2)  # a stack of 3 runs in parts of 2
    assert sorted(len(m) for m, spec in st.stacks if spec is not None) == [3]

    def lin(args, kwargs):
        h, extra = args
        cos, sin = kwargs["pe"]
        out = h * 2.0 + cos.sum(1, keepdim=True) * sin.mean()
        return out if extra is None else out + extra.sum(1, keepdim=True)
    single = {i: lin((h,) + r[0], r[1]) for i, (h, _, r) in enumerate(items)}
    st.check(lin, hidden, single)
    assert any(spec is not None for _, spec in st.stacks)  # the stack stays batched
    for idx in ([0, 2], [2, 1], [1, 3, 4], [0, 1, 2, 3, 4]):
        outs = st.run(lin, hidden, idx)
        assert sorted(i for which, _ in outs for i in which) == sorted(idx)
        for which, out in outs:
            torch.testing.assert_close(out, torch.cat([single[i] for i in which]))
    same = [(torch.randn(1, 4, 8, generator=g), "arg", ((torch.zeros(1, 4, 8),), {}))
            for _ in range(3)]
    st = _Items(same, 8)
    block = _BatchMean()
    hidden = [h for h, _, _ in same]
    single = {i: block(h, r[0][0]) for i, (h, _, r) in enumerate(same)}
    st.check(lambda a, k: block(*a, **k), hidden, single)
    assert all(spec is None for _, spec in st.stacks)  # differs batched: item by item
    for which, out in st.run(lambda a, k: block(*a, **k), hidden, [0, 1, 2]):
        torch.testing.assert_close(out, torch.cat([single[i] for i in which]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_block_is_batched_within_rounding_and_not_when_it_depends_on_the_batch(dtype):
    """In float16 / bfloat16 a stack stays batched where its outputs differ from the items'
    by rounding (a relative norm of epsilons), and runs item by item where the block depends
    on the rest of its batch."""
    g = torch.Generator().manual_seed(0)
    items = [(torch.randn(1, 16, 64, generator=g).to(dtype) * 100, "arg",
              ((torch.zeros(1, 16, 64, dtype=dtype),), {})) for _ in range(3)]
    hidden = [h for h, _, _ in items]
    # the items' own outputs an ulp or so off each value: rounding of another order
    rounded = {i: h.float() * (1 + torch.finfo(dtype).eps * torch.randn(h.shape, generator=g))
               for i, h in enumerate(hidden)}
    st = _Items(items, 8)
    st.check(lambda a, k: a[0] + a[1], hidden, rounded)
    assert all(spec is not None for _, spec in st.stacks)
    block = _BatchMean()  # h - the batch's mean: 0 for an item alone, not batched
    single = {i: block(h, r[0][0]).float() for i, (h, _, r) in enumerate(items)}
    st = _Items(items, 8)
    st.check(lambda a, k: block(*a, **k), hidden, single)
    assert all(spec is None for _, spec in st.stacks)


def test_bert_items_of_two_kinds_and_a_pooler_outside_the_blocks():
    """A padded and an unpadded item give the encoder's layers a mask and None: two stacks; the
    pooler after the blocks is reconstructed alone."""
    model = _tiny_bert()
    calib = _padded_calib()
    ref = copy.deepcopy(model)
    m_rtn = copy.deepcopy(model)
    rtn(m_rtn, A4G32, ignore=())
    qp = signround(model, calib, A4G32, iters=40, batch_size=4, ignore=())
    assert "pooler.dense" in qp and qp["pooler.dense"]["loss"] <= qp["pooler.dense"]["loss_rtn"]
    with torch.no_grad():
        want = torch.cat([ref(**c).last_hidden_state for c in calib])
        got = torch.cat([model(**c).last_hidden_state for c in calib])
        base = torch.cat([m_rtn(**c).last_hidden_state for c in calib])
    assert _rel(got, want) < 0.9 * _rel(base, want)


def test_a_model_without_blocks_reconstructs_each_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
    calib = [_correlated_inputs(32, 64, seed=i) for i in range(4)]
    m_rtn = copy.deepcopy(model)
    rtn(m_rtn, A4G32)
    qp = signround(model, calib, A4G32, iters=80, batch_size=2)
    assert set(qp) == {"0", "2"}
    for entry in qp.values():
        assert entry["loss"] < entry["loss_rtn"]
    x = torch.cat(calib)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
    with torch.no_grad():
        assert _rel(model(x), ref(x)) < _rel(m_rtn(x), ref(x))


def test_gpt2_conv1d_in_its_layout():
    model = _tiny_gpt2()
    calib = _llama_calib(n=4)
    ref = copy.deepcopy(model)
    qp = signround(model, calib, A4G32, iters=30, batch_size=2)
    wq = _weights.resolve_w_qscheme(A4G32, "test")
    for name, mod in _layers.find_linears(model):
        assert qp[name]["conv1d"]
        assert mod.weight.shape == dict(ref.named_modules())[name].weight.shape
        w = _layers.weight_2d(mod).detach()
        rows = w.reshape(w.shape[0], -1, 32)
        s, z = qp[name]["scale"], qp[name]["zero_point"]
        again = _weights.fake_quant(rows, s.unsqueeze(-1), z.unsqueeze(-1), wq.quant_min,
                                    wq.quant_max)
        torch.testing.assert_close(again, rows, rtol=0, atol=1e-6)
        assert qp[name]["loss"] < qp[name]["loss_rtn"], name


def test_then_prepare_by_platform_and_load_weight_qparams_keeps_its_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
    calib = [_correlated_inputs(32, 64, seed=i) for i in range(4)]
    qp = signround(model, calib, W4G32, iters=20, batch_size=2)
    weights = _linears(model)
    prepared = _prepare_academic(model)
    mods = dict(prepared.named_modules())
    load_weight_qparams(prepared, {n: qp[n] for n in ("2", "4")})
    for name in ("2", "4"):
        fq = mods[name].weight_fake_quant
        fq.enable_fake_quant()
        with torch.no_grad():
            assert torch.equal(fq(mods[name].weight), weights[name]), name


@pytest.mark.parametrize("kwargs, match", [
    ({"iters": -1}, "iters must be an integer >= 0"),
    ({"iters": 2.5}, "iters must be an integer >= 0"),
    ({"lr": 0.0}, "lr must be a finite number > 0"),
    ({"lr": float("nan")}, "lr must be a finite number > 0"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"seed": "a"}, "seed must be an integer"),
    ({"w_qscheme": {"bit": 12, "per_channel": True}}, "bit must be in"),
    ({"w_qscheme": {"bit": 4, "per_channel": True, "group_size": 48}}, "does not divide"),
])
def test_bad_arguments_refused_before_any_change(kwargs, match):
    model = nn.Sequential(nn.Linear(64, 8))
    before = model[0].weight.clone()
    kwargs = dict({"w_qscheme": A4G32}, **kwargs)
    with pytest.raises(ValueError, match=match):
        signround(model, [torch.randn(2, 64)], **kwargs)
    assert torch.equal(model[0].weight, before)


def test_a_prepared_model_and_an_unreached_layer_are_refused():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
    prepared = _prepare_academic(copy.deepcopy(model))
    with pytest.raises(ValueError, match="run signround on the float model"):
        signround(prepared, [torch.randn(2, 64)], W4G32)

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.dead = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            return self.a(x)
    with pytest.raises(ValueError, match="never reached layer\\(s\\) \\['dead'\\]"):
        signround(Branchy(), [torch.randn(4, 16)], {"bit": 4, "per_channel": True})


def test_a_bfloat16_model_keeps_its_dtype_and_gets_closer_to_its_float_output():
    model = _tiny_llama().to(torch.bfloat16)
    calib = _llama_calib(n=4)
    ref = _logits(model, calib).float()
    m_rtn = copy.deepcopy(model)
    rtn(m_rtn, A4G32)
    qp = signround(model, calib, A4G32, iters=30, batch_size=2)
    assert all(m.weight.dtype == torch.bfloat16 for _, m in _layers.find_linears(model))
    assert all(e["loss"] < e["loss_rtn"] for e in qp.values())
    assert _rel(_logits(model, calib).float(), ref) < _rel(_logits(m_rtn, calib).float(), ref)


def test_token_weights_count_exactly_past_bfloat16s_integers():
    """The targets of a half block stay in its dtype; the token weights, whose sum is the loss's
    count, are float32: bfloat16 holds integers exactly only to 256."""
    from mqbench.llm.signround import _token_weights
    out = torch.zeros(2, 300, 8, dtype=torch.bfloat16)
    mask = torch.ones(2, 300, dtype=torch.long)
    mask[1, 257:] = 0
    for sample in ({"attention_mask": mask}, torch.zeros(2, 300, dtype=torch.long)):
        w = _token_weights(sample, out)
        assert w.dtype == torch.float32 and w.shape == (2, 300, 1)
        assert w.sum().item() == (557 if isinstance(sample, dict) else 600)
    assert torch.tensor(557.0).to(torch.bfloat16).item() != 557  # what a bfloat16 sum would lose


# ------------------------------------------------ the fused C++ quantizer against the reference
needs_op = pytest.mark.skipif(not hasattr(torch.ops.mqbench, "signround_quantize"),
                              reason="mqbench built without the SignRound op")


def _random_rounding(scheme, use_cpp, seed=0, shape=(24, 64)):
    g = torch.Generator().manual_seed(seed)
    layer = nn.Linear(shape[1], shape[0])
    with torch.no_grad():
        layer.weight.copy_(torch.randn(shape, generator=g))
        layer.weight[3, :] = layer.weight[3, :].abs()          # a row of one sign: mn clamps
        layer.weight[5, :] = -layer.weight[5, :].abs()
    r = _Rounding("l", layer, _weights.resolve_w_qscheme(scheme, "test"), use_cpp)
    with torch.no_grad():  # inside the bounds, a few on them
        r.v.copy_(torch.rand(r.v.shape, generator=g) - 0.5)
        r.v[0, :4] = 0.5
        r.lo.copy_(0.5 + 0.5 * torch.rand(r.lo.shape, generator=g))
        r.hi.copy_(0.5 + 0.5 * torch.rand(r.hi.shape, generator=g))
        r.lo.view(-1)[0] = 0.5
        r.hi.view(-1)[0] = 1.0
    return r


OP_SCHEMES = [A4G32, W4G32, {"bit": 3, "symmetry": False, "per_channel": True},
              {"bit": 4, "per_channel": False}, {"bit": 8, "per_channel": True,
                                                 "symmetric_range": True}]


@needs_op
@pytest.mark.parametrize("scheme", OP_SCHEMES)
def test_fused_quantizer_equals_the_reference(scheme):
    """Forward: the same bits; backward: autograd's gradient through the ATen reference (Note
    [SignRound's backward]), up to float summation order."""
    ref, op = _random_rounding(scheme, False), _random_rounding(scheme, True)
    q_ref, q_op = ref.weight(), op.weight()
    assert torch.equal(q_ref, q_op)
    g = torch.Generator().manual_seed(1)
    upstream = torch.randn(q_ref.shape, generator=g)
    d_ref = torch.autograd.grad((q_ref * upstream).sum(), ref.leaves)
    d_op = torch.autograd.grad((q_op * upstream).sum(), op.leaves)
    for name, a, b in zip(("v", "lo", "hi"), d_ref, d_op):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * a.abs().max().item(),
                                   msg=lambda m, n=name: f"{n}: {m}")
    assert bool((d_op[1] != 0).any()) or bool((d_op[2] != 0).any())  # the ranges learn


@needs_op
def test_fused_quantizer_splits_a_symmetric_tie_as_torch_maximum():
    layer = nn.Linear(8, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[-1.0, 0.3, 0.2, 1.0, -0.1, 0.4, 0.7, -0.6]] * 2))
    refs = [_Rounding("l", layer, _weights.resolve_w_qscheme(
        {"bit": 4, "per_channel": True}, "test"), use_cpp) for use_cpp in (False, True)]
    grads = []
    for r in refs:
        grads.append(torch.autograd.grad(r.weight().pow(2).sum(), r.leaves))
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@needs_op
def test_fused_quantizer_refuses_mismatched_inputs():
    w = torch.randn(4, 2, 8)
    v, lo = torch.zeros_like(w), torch.ones(4, 2)
    mn, mx = w.amin(-1), w.amax(-1)
    with pytest.raises(RuntimeError, match="v must have w's shape"):
        torch.ops.mqbench.signround_quantize(w, v[:, :1], lo, lo, mn, mx, 0, 15, False)
    with pytest.raises(RuntimeError, match="must be \\[rows, groups\\]"):
        torch.ops.mqbench.signround_quantize(w, v, lo[:1], lo, mn, mx, 0, 15, False)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.mqbench.signround_quantize(w.double(), v.double(), lo, lo, mn, mx, 0, 15, False)
    with pytest.raises(RuntimeError, match="quant_min \\(15\\) must be < quant_max"):
        torch.ops.mqbench.signround_quantize(w, v, lo, lo, mn, mx, 15, 0, False)


@needs_op
def test_fused_and_reference_runs_reach_the_same_objective():
    model = _tiny_llama()
    calib = _llama_calib(n=4)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    qa = signround(a, calib, A4G32, iters=20, batch_size=2, impl="cpp")
    qb = signround(b, calib, A4G32, iters=20, batch_size=2, impl="python")
    for name in qa:
        assert qa[name]["loss_rtn"] == pytest.approx(qb[name]["loss_rtn"], rel=1e-6)
        assert qa[name]["loss"] == pytest.approx(qb[name]["loss"], rel=0.05), name


def test_a_float16_block_keeps_its_gradients(monkeypatch):
    """A float16 block's backward starts from the loss times the loss scale (Note [Loss scale
    of a float16 block]): its first steps see as many non-zero gradients as the float32 block's.
    Without the scale (the mean over 4 x 512 tokens x 128 channels, W8) every one was 0."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)).eval()
    g = torch.Generator().manual_seed(2)
    calib = [{"input_ids": torch.randint(0, 128, (1, 512), generator=g)} for _ in range(4)]
    shares = {}
    real = _Optimizer._grads

    def spy(self, idx, loss, leaves):
        grads = real(self, idx, loss, leaves)
        nonzero = sum(int((t != 0).sum()) for t in grads if t is not None)
        shares.setdefault(key, []).append(nonzero / sum(t.numel() for t in leaves))
        return grads

    monkeypatch.setattr(_Optimizer, "_grads", spy)
    w8 = {"bit": 8, "per_channel": True, "group_size": 32}
    for key in (torch.float32, torch.float16):
        signround(copy.deepcopy(model).to(key), calib, w8, iters=1, batch_size=4)
    assert len(shares[torch.float16]) == len(shares[torch.float32]) >= 2
    assert min(shares[torch.float32]) > 0.5
    for half, full in zip(shares[torch.float16], shares[torch.float32]):
        assert half > 0.95 * full, (shares)


def test_the_loss_scale_halves_where_a_gradient_overflows_and_grows_back():
    """The dynamic loss scale: an overflowing step is computed again at half the scale; after
    _SCALE_GROWTH clean steps the scale doubles, never above its start."""
    x = torch.ones(3, requires_grad=True)
    calls = []

    def loss(idx, with_grad):  # a float16 backward: scale * 1e4 overflows above 2^2
        calls.append(idx)
        return (x.half() * 1e4).float().sum()

    opt = _Optimizer([], loss, 1, 1, 0.1, 1, None, scale=2.0 ** 16)
    (g,) = opt._grads("i", loss("i", True), [x])
    assert opt.scale == 2.0 ** 2 and torch.equal(g, torch.full((3,), 4e4))
    assert calls == ["i"] * 15  # the first loss, then the same items once per halving
    for _ in range(_SCALE_GROWTH):
        opt._grads("i", (x * 1.0).sum(), [x])
    assert opt.scale == 2.0 ** 3
    opt.scale = opt.max_scale
    for _ in range(_SCALE_GROWTH):
        opt._grads("i", (x * 1.0).sum(), [x])
    assert opt.scale == opt.max_scale


# ---------------------------------------------------------------- on a GPU (skipped without one)
from cuda_harness import needs_gpu  # noqa: E402


@needs_op
@needs_gpu
@pytest.mark.parametrize("scheme", [A4G32, W4G32])
def test_quantizer_on_cuda_equals_the_cpu_op(scheme):
    """The ATen path of the op (every device but the CPU) against the ATen reference on the same
    device: the same forward bits and dL/dv, the range gradients up to the order of float sums.
    Against the CPU op: close (ATen's CUDA division by a scalar multiplies by its reciprocal, so
    a scale may differ in its last bit and move a tie to the next level)."""
    def on_cuda(use_cpp):
        r = _random_rounding(scheme, use_cpp)
        for name in ("w", "w_min", "w_max"):
            setattr(r, name, getattr(r, name).cuda())
        for name in ("v", "lo", "hi"):
            setattr(r, name, getattr(r, name).detach().cuda().requires_grad_())
        return r
    upstream = torch.randn((24, 64), generator=torch.Generator().manual_seed(1)).cuda()
    op, ref = on_cuda(True), on_cuda(False)
    q_op, q_ref = op.weight(), ref.weight()
    assert torch.equal(q_op, q_ref)
    d_op = torch.autograd.grad((q_op * upstream).sum(), op.leaves)
    d_ref = torch.autograd.grad((q_ref * upstream).sum(), ref.leaves)
    assert torch.equal(d_op[0], d_ref[0])
    for a, b in zip(d_ref[1:], d_op[1:]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * a.abs().max().item())
    q_cpu = _random_rounding(scheme, True).weight()
    moved = (q_op.detach().cpu() - q_cpu).abs() > 1e-5 * q_cpu.abs().max()
    assert moved.float().mean().item() < 0.01


@needs_gpu
def test_signround_of_a_model_on_cuda():
    model = _tiny_llama()
    calib = _llama_calib(n=4)
    m_cpu, m_gpu = copy.deepcopy(model), copy.deepcopy(model).cuda()
    q_cpu = signround(m_cpu, calib, A4G32, iters=20, batch_size=2)
    q_gpu = signround(m_gpu, [{k: v.cuda() for k, v in c.items()} for c in calib], A4G32,
                      iters=20, batch_size=2)
    for name in q_cpu:
        assert q_gpu[name]["loss_rtn"] == pytest.approx(q_cpu[name]["loss_rtn"], rel=1e-3)
        assert q_gpu[name]["loss"] < q_gpu[name]["loss_rtn"], name
