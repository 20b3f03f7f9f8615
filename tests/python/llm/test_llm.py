"""mqbench.llm: GPTQ, AWQ, SmoothQuant and RTN (docs/llm.md), against round-to-nearest and the
float model, and the C++ ops against the torch references."""
import warnings

import pytest
import torch
from torch import nn

from mqbench.llm import awq, gptq, rtn, smoothquant
from mqbench.llm import _calibration, _checks, _layers, _weights
from mqbench.llm.awq import awq_weight_mean
from reference import (awq_search_scale_reference, gptq_quantize_weight_reference,
                       hessian_update_reference)

HAS_CPP = hasattr(torch.ops.mqbench, "gptq_quantize_weight")
needs_cpp = pytest.mark.skipif(not HAS_CPP, reason="mqbench built without the LLM ops")
W4G32 = {"bit": 4, "per_channel": True, "group_size": 32}
# AWQ's usual target (AutoAWQ's zero_point=True): asymmetric INT4 groups
A4G32 = {"bit": 4, "symmetry": False, "per_channel": True, "group_size": 32}


def _correlated_inputs(n, d, seed=0, outliers=()):
    """Tokens with correlated channels (a random mixing of a few latent factors) and optional
    outlier channels, like LLM hidden states."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d // 4, generator=g)
    x = z @ torch.randn(d // 4, d, generator=g) + 0.1 * torch.randn(n, d, generator=g)
    for c in outliers:
        x[:, c] *= 20.0
    return x


def _layer_error(w, q, x):
    return ((x @ w.t() - x @ q.t()).norm() / (x @ w.t()).norm()).item()


def _tiny_llama(seed=0, layers=2):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=4, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    # LLM-like activation outliers: a few hidden channels carry large values
    with torch.no_grad():
        model.model.embed_tokens.weight[:, [3, 17]] *= 30.0
    return model


def _llama_calib(n=4, seq=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 128, (1, seq), generator=g)} for _ in range(n)]


def _logits(model, calib):
    with torch.no_grad():
        return torch.cat([model(**c).logits for c in calib])


def _mlp_salient(seed=0):
    """Linear -> ReLU -> Linear -> ReLU -> Linear whose hidden activations have a few salient
    channels (rows of the first layers scaled up), as AWQ assumes of LLM activations."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 64)).eval()
    with torch.no_grad():
        model[0].weight[[5, 40, 77]] *= 25.0
        model[2].weight[[9, 100]] *= 25.0
    return model


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


# ---------------------------------------------------------------- GPTQ


@pytest.mark.parametrize("scheme", [
    W4G32,
    {"bit": 3, "symmetry": False, "per_channel": True},
    {"bit": 4, "per_channel": False},
    {"bit": 4, "per_channel": True, "group_size": 32, "symmetric_range": True},
])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_layer_error_below_rtn(scheme, act_order):
    wq = _weights.resolve_w_qscheme(scheme, "test")
    x = _correlated_inputs(512, 128)
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(3))
    H = hessian_update_reference(torch.zeros(128, 128), x, 0)
    Q, scale, zero, used = gptq_quantize_weight_reference(w, H, wq, 32, 0.01, act_order)
    assert used == 0.01
    err_gptq, err_rtn = _layer_error(w, Q, x), _layer_error(w, _weights.rtn_weight(w, wq)[0], x)
    assert err_gptq < 0.6 * err_rtn, (err_gptq, err_rtn)
    # Q lies on the grid its returned qparams describe
    gs = wq.group_size or (128 if scheme["per_channel"] else None)
    if gs:
        s = scale.repeat_interleave(gs, 1)
        z = zero.repeat_interleave(gs, 1)
    else:
        s, z = scale, zero
    assert torch.equal(_weights.fake_quant(Q, s, z, wq.quant_min, wq.quant_max), Q)
    levels = torch.round(Q / s) + z
    assert levels.min() >= wq.quant_min and levels.max() <= wq.quant_max


def _gptq_as_in_the_paper(w, H, wq, damp):
    """The paper's GPTQ in float64, one column at a time (no lazy blocks), through U, the upper
    Cholesky factor of H^-1, on a per-channel grid from the float weight: the oracle of the
    route through H's own factor (Note [GPTQ from the factor of H] in src/ops/llm_gptq.cpp)."""
    W, H = w.double().clone(), H.double()
    n = W.shape[1]
    Hd = H + torch.eye(n, dtype=H.dtype) * (damp * torch.diag(H).mean())
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(Hd)), upper=True)
    scale, zero = _weights.minmax_qparams(W.amin(1), W.amax(1), wq.quant_min, wq.quant_max,
                                          wq.symmetric)
    Q = torch.zeros_like(W)
    for j in range(n):
        Q[:, j] = _weights.fake_quant(W[:, j], scale, zero, wq.quant_min, wq.quant_max)
        err = (W[:, j] - Q[:, j]) / U[j, j]
        W[:, j:] -= err.unsqueeze(1) * U[j, j:].unsqueeze(0)
    return Q.float()


@pytest.mark.parametrize("impl", ["python", "cpp"])
@pytest.mark.parametrize("symmetry", [True, False])
def test_gptq_from_the_factor_of_h_matches_the_paper(impl, symmetry):
    """Our column updates come from H = R R^T with no inverse; the paper's from chol(H^-1).
    Equal in exact arithmetic: the same rounding choices but for float ties, and the same
    layer error, across lazy-block boundaries (block 32 of 128 columns)."""
    if impl == "cpp" and not _checks.want_cpp("auto", "gptq_quantize_weight"):
        pytest.skip("this build of mqbench has no LLM ops")
    wq = _weights.resolve_w_qscheme({"bit": 4, "per_channel": True, "symmetry": symmetry},
                                    "test")
    x = _correlated_inputs(512, 128, seed=5)
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(6))
    H = hessian_update_reference(torch.zeros(128, 128), x, 0)
    if impl == "cpp":
        Q, scale = torch.ops.mqbench.gptq_quantize_weight(w, H, *wq.as_args(), 32, 0.01, False,
                                                          "l")[:2]
    else:
        Q, scale = gptq_quantize_weight_reference(w, H, wq, 32, 0.01, False)[:2]
    paper = _gptq_as_in_the_paper(w, H, wq, 0.01)  # float64: compare levels, not bits
    same = ((Q - paper).abs() < 0.5 * scale).float().mean().item()
    assert same > 0.99, same
    e, e_paper = _layer_error(w, Q, x), _layer_error(w, paper, x)
    assert abs(e - e_paper) < 0.01 * e_paper, (e, e_paper)


def test_hessian_update_accumulates_the_mean_of_2xxt():
    x = _correlated_inputs(300, 32)
    H = torch.zeros(32, 32)
    n = 0
    for chunk in x.split([100, 50, 150]):
        H = hessian_update_reference(H, chunk, n)
        n += chunk.shape[0]
    torch.testing.assert_close(H, 2.0 / 300 * x.t() @ x, rtol=1e-5, atol=1e-5)


def test_gptq_model_closer_to_float_than_rtn():
    import copy
    model = _tiny_llama()
    calib = _llama_calib()
    ref = _logits(model, calib)
    m_rtn, m_gptq = copy.deepcopy(model), copy.deepcopy(model)
    rtn(m_rtn, W4G32)
    out = gptq(m_gptq, calib, W4G32, block_size=32)
    assert set(out) == {n for n, m in model.named_modules()
                        if isinstance(m, nn.Linear) and n != "lm_head"}
    assert torch.equal(m_gptq.lm_head.weight, model.lm_head.weight)  # lm_head left float
    e_rtn, e_gptq = _rel(_logits(m_rtn, calib), ref), _rel(_logits(m_gptq, calib), ref)
    assert e_gptq < 0.8 * e_rtn, (e_gptq, e_rtn)


def test_shared_input_groups_of_a_llama_block():
    model = _tiny_llama(layers=1)
    linears = _layers.find_linears(model)
    _, counts, dead, same = _calibration.check_calibration(model, linears, _llama_calib(n=2))
    groups = [[n.rsplit(".", 1)[-1] for n, _ in g]
              for g in _calibration.shared_input_groups(linears, counts, same)]
    assert not dead
    assert groups == [["q_proj", "k_proj", "v_proj"], ["o_proj"], ["gate_proj", "up_proj"],
                      ["down_proj"]]


def test_shared_input_groups_need_the_same_tensor_unchanged():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            y = self.a(x)
            x.mul_(2)
            z = self.b(x)           # the tensor a saw, changed in place since: not shared
            return y + z + self.c(x.clone())  # equal values, another tensor: not shared

    m = M()
    linears = _layers.find_linears(m)
    _, counts, _, same = _calibration.check_calibration(m, linears, [torch.randn(2, 4)])
    assert [len(g) for g in _calibration.shared_input_groups(linears, counts, same)] == [1, 1, 1]


def test_gptq_shared_input_groups_equal_one_layer_at_a_time():
    import copy
    model, calib = _tiny_llama(), _llama_calib()
    grouped, single = copy.deepcopy(model), copy.deepcopy(model)
    out = gptq(grouped, calib, W4G32, block_size=32)
    for name in out:  # one call per layer, in the same order: no groups
        gptq(single, calib, W4G32, block_size=32, layers=[name])
    for (n, a), (_, b) in zip(grouped.named_parameters(), single.named_parameters()):
        assert torch.equal(a, b), n


def test_gptq_not_true_sequential_takes_each_block_from_its_float_pass():
    """true_sequential=False: every layer of a block gets its Hessian from the block before any
    of its layers was quantized (the blocks before it quantized), as llm-compressor does. The
    oracle: one layer at a time, each on a copy whose later block layers are still float."""
    import copy
    model, calib = _tiny_llama(layers=2), _llama_calib()
    fast = copy.deepcopy(model)
    out = gptq(fast, calib, W4G32, block_size=32, true_sequential=False)
    ref = copy.deepcopy(model)
    for j in range(2):
        names = [n for n in out if n.startswith(f"model.layers.{j}.")]
        assert len(names) == 7
        quantized = {}
        for name in names:  # each from the same state: the blocks before j quantized
            one = copy.deepcopy(ref)
            gptq(one, calib, W4G32, block_size=32, layers=[name])
            quantized[name] = one.get_submodule(name).weight.detach().clone()
        with torch.no_grad():
            for name, w in quantized.items():
                ref.get_submodule(name).weight.copy_(w)
    assert not _differing_params(fast, ref)
    # it is another order than the default's: the layers after q/k/v in a block differ
    seq = copy.deepcopy(model)
    gptq(seq, calib, W4G32, block_size=32)
    differ = _differing_params(fast, seq)
    assert "model.layers.0.self_attn.o_proj.weight" in differ
    assert not any(".q_proj." in n or ".k_proj." in n for n in differ if ".layers.0." in n)
    # and as good a quantizer: closer to float than RTN
    rtn_m = copy.deepcopy(model)
    rtn(rtn_m, W4G32)
    ref_logits = _logits(model, calib)

    def err(m):
        return ((_logits(m, calib) - ref_logits).norm() / ref_logits.norm()).item()
    assert err(fast) < 0.7 * err(rtn_m), (err(fast), err(rtn_m))


def _differing_params(a, b):
    return [n for (n, x), (_, y) in zip(a.named_parameters(), b.named_parameters())
            if not torch.equal(x, y)]


@pytest.mark.parametrize("use_cache", [False, True])
@pytest.mark.parametrize("algo", ["gptq", "awq"])
def test_block_cache_gives_the_results_of_forwards_from_the_input(algo, use_cache):
    """Captures from cached block inputs see the very tensors a forward from the model's input
    gives; with use_cache=True the blocks get a key/value cache, which their re-runs must not
    append to a second time."""
    import copy
    model = _tiny_llama(layers=3)
    calib = [dict(c, use_cache=use_cache) for c in _llama_calib()]
    cal = _calibration.select_and_calibrate(model, None, ("lm_head",), calib, False, "test")
    assert cal.cache is not None and len(cal.cache.blocks) == 3
    cached, plain = copy.deepcopy(model), copy.deepcopy(model)
    if algo == "gptq":
        gptq(cached, calib, W4G32, block_size=32)
        gptq(plain, calib, W4G32, block_size=32, cache_blocks=False)
    else:
        a = awq(cached, calib, A4G32)
        b = awq(plain, calib, A4G32, cache_blocks=False)
        for k in a:
            assert torch.equal(a[k]["losses"], b[k]["losses"]), k
        assert {k: v["loss"] for k, v in a.clip.items()} == \
            {k: v["loss"] for k, v in b.clip.items()}
    assert not _differing_params(cached, plain)


def test_block_cache_on_a_bert_encoder():
    """An encoder's layers (``encoder.layer``, padding mask as an argument) form a chain too; the
    pooler after them is captured from the model's input."""
    import copy
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=128)).eval()
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0
    calib = [{"input_ids": torch.randint(0, 100, (2, 16), generator=g), "attention_mask": mask}
             for _ in range(3)]
    cal = _calibration.select_and_calibrate(model, None, (), calib, False, "test")
    assert cal.cache is not None and [n for n, _ in cal.cache.blocks] == \
        [f"encoder.layer.{i}" for i in range(3)]
    assert cal.cache.block_of(["pooler.dense"]) is None
    cached, plain = copy.deepcopy(model), copy.deepcopy(model)
    gptq(cached, calib, W4G32, block_size=32, ignore=())
    gptq(plain, calib, W4G32, block_size=32, ignore=(), cache_blocks=False)
    assert not _differing_params(cached, plain)


@pytest.mark.parametrize("use_cache", [False, True])
def test_gptq_runs_the_module_holding_two_steps_alone(use_cache, monkeypatch):
    """True-sequential GPTQ captures o_proj by running self_attn alone and down_proj by running
    mlp alone, on their inputs recorded during the step before (Note [Captures from a
    sub-module's inputs]): fewer calls of the decoder layers, the same weights bit for bit as
    running the layers (and as forwards from the model's input)."""
    import copy
    model = _tiny_llama(layers=2)
    calib = [dict(c, use_cache=use_cache) for c in _llama_calib()]
    calls = {}

    def run(m, scoped):
        if not scoped:
            monkeypatch.setattr(_calibration.Calibration, "scope_between", lambda *a: None)
        handles = [mod.register_forward_pre_hook(
            lambda *_a, name=name: calls.__setitem__(name, calls.get(name, 0) + 1))
            for name, mod in m.named_modules() if name.endswith(("layers.0", "layers.0.mlp"))]
        gptq(m, calib, W4G32, block_size=32)
        for h in handles:
            h.remove()
        monkeypatch.undo()
        got = dict(calls)
        calls.clear()
        return got

    scoped, unscoped, plain = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model)
    with_scope, without = run(scoped, True), run(unscoped, False)
    gptq(plain, calib, W4G32, block_size=32, cache_blocks=False)
    assert not _differing_params(scoped, unscoped)
    assert not _differing_params(scoped, plain)
    # with the scopes, the captures of o_proj and down_proj run self_attn and mlp alone: two
    # calls of layer 0 fewer per item, and mlp as often as before (down_proj's capture runs it)
    assert without["model.layers.0"] - with_scope["model.layers.0"] == 2 * len(calib)
    assert with_scope["model.layers.0.mlp"] == without["model.layers.0.mlp"]


@pytest.mark.parametrize("in_place", [False, True])
def test_a_layer_also_called_outside_its_scope_runs_the_block(in_place):
    """A step's layer called inside the scope and again outside it (by the block): the replay of
    the scope alone misses a call, so the item runs its block, the replayed inputs dropped; the
    weights equal those of running the block for every capture. The same where the replay
    changes the layer's first input in place before its second call (``in_place``)."""
    import copy

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 32)

        def forward(self, x):
            h = torch.relu(self.a(x))
            if not in_place:
                return self.b(h)
            y = self.b(h)
            h[:, :8].add_(1.0)  # b's first input changed in place before its second call
            return y + self.b(h)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            if in_place:
                return x + self.inner(x)
            return x + self.inner.b(self.inner(x))  # inner.b once more, outside inner

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block(), Block()])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(0)
    model = Net()
    calib = [torch.randn(8, 32) for _ in range(3)]
    scope = _calibration.select_and_calibrate(model, None, (), calib, False, "test").scope_between(
        [("layers.0.inner.a", model.layers[0].inner.a)],
        [("layers.0.inner.b", model.layers[0].inner.b)])
    assert scope is not None and scope.name == "layers.0.inner"
    scoped, plain = copy.deepcopy(model), copy.deepcopy(model)
    gptq(scoped, calib, W4G32, block_size=16)
    gptq(plain, calib, W4G32, block_size=16, cache_blocks=False)
    assert not _differing_params(scoped, plain)


@pytest.mark.parametrize("algo", ["awq", "smoothquant"])
def test_block_objectives_record_from_the_block_cache(algo, monkeypatch):
    """AWQ's and SmoothQuant's ``objective="block"`` record the scoring module's calls by running
    its block on the cached inputs, not the model from its input: the same losses and scales
    bit for bit, and the embedding runs no more per group."""
    import copy
    model, calib = _tiny_llama(layers=2), _llama_calib()
    embed_calls = [0]

    def run(m, cached):
        if not cached:
            monkeypatch.setattr(_calibration.Calibration, "record_block_io",
                                lambda self, _name, module, n_calls: _calibration.record_block_io(
                                    self.model, self.calib, n_calls, module))
        h = m.model.embed_tokens.register_forward_pre_hook(
            lambda *_a: embed_calls.__setitem__(0, embed_calls[0] + 1))
        try:
            if algo == "awq":
                return awq(m, calib, A4G32, objective="block", clip=False)
            return smoothquant(m, calib, alpha="auto", objective="block", grid=4)
        finally:
            h.remove()
            monkeypatch.undo()

    cached_model, plain_model = copy.deepcopy(model), copy.deepcopy(model)
    a = run(cached_model, True)
    cached_embeds, embed_calls[0] = embed_calls[0], 0
    b = run(plain_model, False)
    assert set(a) == set(b) and a
    for k in a:
        assert torch.equal(a[k]["losses"], b[k]["losses"]), k
        assert torch.equal(a[k]["scale"], b[k]["scale"]), k
    assert not _differing_params(cached_model, plain_model)
    assert cached_embeds < embed_calls[0]


def test_scope_inputs_are_used_only_when_whole_and_unchanged():
    """A recorded scope is refused where an item misses, where a recorded tensor changed in
    place, and where a layer of the step ran before the scope was entered."""
    from mqbench.llm._blocks import ScopeInputs
    inner = nn.Linear(4, 4)
    scope = nn.Sequential(inner)
    rec = ScopeInputs("s", scope, [("s.0", inner)])
    rec.install()
    x = [torch.randn(2, 4), torch.randn(2, 4)]
    with torch.no_grad():
        for i in range(2):
            rec.begin_item(i)
            scope(x[i])
    rec.remove()
    assert rec.usable([0, 1]) and not rec.usable([0, 1, 2])
    x[1].add_(1.0)
    assert rec.usable([0]) and not rec.usable([1])
    early = ScopeInputs("s", scope, [("s.0", inner)])
    early.install()
    early.begin_item(0)
    with torch.no_grad():
        inner(x[0])  # the step's layer, called outside the scope first
        scope(x[0])
    early.remove()
    assert not early.ok and not early.usable([0])


def test_awq_block_objective_never_appends_to_the_kv_cache_twice():
    """objective="block" runs the attention again per candidate: with use_cache=True it must
    score what use_cache=False scores (transformers 5.2x passes the cache as ``cache=``)."""
    import copy
    model = _tiny_llama(layers=2)
    res = [awq(copy.deepcopy(model), [dict(c, use_cache=u) for c in _llama_calib()], A4G32,
               objective="block", clip=False) for u in (False, True)]
    for k in res[0]:
        torch.testing.assert_close(res[1][k]["losses"], res[0][k]["losses"], rtol=1e-5,
                                   atol=1e-9)


def test_block_cache_inputs_equal_a_forward_after_earlier_blocks_change():
    """A capture in block 2 after block 0's weights changed (behind the cache's back) sees the
    inputs a forward from the model's input gives: the cache records them again."""
    model, calib = _tiny_llama(layers=3), _llama_calib(n=2)
    cal = _calibration.select_and_calibrate(model, None, ("lm_head",), calib, False, "test")
    layer = [(n, m) for n, m in cal.linears if n.startswith("model.layers.2.")][:1]

    def inputs(use_cache):
        xs = []
        if use_cache:
            cal.capture(layer, lambda _n, x: xs.append(x.clone()))
        else:
            _calibration.capture(model, cal.calib, cal.counts, layer, lambda _n, x: xs.append(x))
        return torch.cat(xs)

    assert torch.equal(inputs(True), inputs(False))
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(0.5)
    assert torch.equal(inputs(True), inputs(False))


class _Chain(nn.Module):
    """Blocks in a ModuleList, each Linear -> ReLU; ``mode`` breaks the chain in one way."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU())
                                    for _ in range(3))
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            if self.mode == "norm between" and i:
                x = self.norm(x)          # block i + 1 does not read block i's output
            if self.mode == "twice" and i == 1:
                x = block(x)              # a block called twice
            x = block(x)
            if self.mode == "in place":
                x.mul_(1.0)               # the output changed in place before the next block
        return x


@pytest.mark.parametrize("mode", ["chain", "norm between", "twice", "in place"])
def test_block_cache_only_where_the_blocks_form_a_chain(mode):
    import copy
    model = _Chain(mode).eval()
    calib = [torch.randn(4, 16, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    cal = _calibration.select_and_calibrate(model, None, (), calib, False, "test")
    assert (cal.cache is not None) == (mode == "chain")
    cached, plain = copy.deepcopy(model), copy.deepcopy(model)
    gptq(cached, calib, {"bit": 4, "per_channel": True})
    gptq(plain, calib, {"bit": 4, "per_channel": True}, cache_blocks=False)
    assert not _differing_params(cached, plain)


def test_counting_pass_runs_one_item_of_each_kind():
    """Note [Counting pass on one item of each kind]: with the block cache, a dense decoder whose
    items have one shape is counted on its first item only (the final norm, run by full forwards
    alone, runs once), the other items get its counts and shared inputs, and GPTQ gives what
    counting every item gives. Items of another length are another kind: counted too."""
    import copy
    model, calib = _tiny_llama(layers=3), _llama_calib(n=4)
    calls = []
    model.model.norm.register_forward_pre_hook(lambda *_: calls.append(1))
    cal = _calibration.select_and_calibrate(model, None, ("lm_head",), calib, False, "test")
    assert len(calls) == 1 and cal.cache is not None
    exact = _calibration.check_calibration(model, cal.linears, calib)  # every item counted
    assert len(calls) == 1 + len(calib)
    assert (cal.counts, cal.same_input) == (exact[1], exact[3])
    cached, plain = copy.deepcopy(model), copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every item takes its kind's path: no warning
        gptq(cached, calib, W4G32, block_size=32, true_sequential=False)
    gptq(plain, calib, W4G32, block_size=32, true_sequential=False, cache_blocks=False)
    assert not _differing_params(cached, plain)
    calls.clear()
    shorter = calib[:2] + [{k: v[:, :16] for k, v in c.items()} for c in calib[2:]]
    _calibration.select_and_calibrate(model, None, ("lm_head",), shorter, False, "test")
    assert len(calls) == 2  # items 0 and 2


def test_sliding_window_layers_of_items_of_other_lengths_are_counted():
    """Layers of two attention types get one mask (None) while an item is shorter than the
    window and two masks past it: the chain holds on a short item and not on a long one. Items
    of another length are another kind, counted: no cache, the results of counting every
    item."""
    import copy
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        use_sliding_window=True, sliding_window=4,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"])
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    calib = [{"input_ids": torch.randint(0, 128, (1, n), generator=g)} for n in (3, 16, 16)]
    cached, plain = copy.deepcopy(model), copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gptq(cached, calib, W4G32, block_size=32)
    gptq(plain, calib, W4G32, block_size=32, cache_blocks=False)
    assert not _differing_params(cached, plain)


class _Routed(nn.Module):
    """Blocks in a chain; block j calls its ``extra`` Linear ``route`` times, ``route`` read
    from a float input's value (a data path that the input's kind does not show)."""

    def __init__(self, shared=False):
        super().__init__()
        self.blocks = nn.ModuleList(_RoutedBlock(shared) for _ in range(3))

    def forward(self, x, route):
        for block in self.blocks:
            x = block(x, route)
        return x


class _RoutedBlock(nn.Module):
    def __init__(self, shared):
        super().__init__()
        self.a, self.extra = nn.Linear(16, 16), nn.Linear(16, 16)
        self.twin = nn.Linear(16, 16) if shared else None  # on extra's input: one group

    def forward(self, x, route):
        y = torch.relu(self.a(x))
        for _ in range(int(route.item())):
            y = y + self.extra(y) + (self.twin(y) if self.twin is not None else 0)
        return y


def _routed(routes, shared=False):
    torch.manual_seed(0)
    calib = [(torch.randn(4, 16, generator=torch.Generator().manual_seed(i)),
              torch.tensor(float(r))) for i, r in enumerate(routes)]
    return _Routed(shared).eval(), calib


@pytest.mark.parametrize("routes,shared", [((0, 1, 1), False), ((1, 0, 1), False),
                                           ((1, 0, 1), True)])
def test_items_that_leave_layers_out_give_exact_results(routes, shared):
    """A first item that leaves ``extra`` unreached is not trusted: every item is counted. A
    first item that reaches it while later ones skip it is trusted; the skips cost nothing (the
    captures run on), also for a whole group on one input (extra and twin), and draw no
    warning. All equal counting every item."""
    import copy
    model, calib = _routed(routes, shared)
    cal = _calibration.select_and_calibrate(model, None, (), calib, False, "test")
    assert cal.cache is not None
    # every item counted where the first leaves extra out, else the first item's count for all
    assert cal.counts["blocks.0.extra"] == ([1, 1, 1] if routes[0] else list(routes))
    if shared:
        assert cal.same_input["blocks.0.twin"] == ["blocks.0.extra"] * 3
    cached, plain = copy.deepcopy(model), copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gptq(cached, calib, {"bit": 4, "per_channel": True})
    gptq(plain, calib, {"bit": 4, "per_channel": True}, cache_blocks=False)
    assert not _differing_params(cached, plain)


def test_an_item_calling_a_layer_more_often_than_its_kind_is_named():
    """The first item calls every layer once; a later one of the same kind calls ``extra``
    twice, which captures stopped after one call cannot see: the cache, running each block over
    every item, names it."""
    model, calib = _routed((1, 2, 1))
    with pytest.warns(UserWarning, match=r"blocks\.0.*\['blocks\.0\.extra'\].*cache_blocks=False"):
        gptq(model, calib, {"bit": 4, "per_channel": True})


def test_gptq_singular_hessian_raises_damping_and_stays_finite():
    wq = _weights.resolve_w_qscheme(W4G32, "test")
    # rank one inputs (every column the same) and one dead input: with damp=0, H is singular
    x = torch.randn(64, 1).repeat(1, 64)
    x[:, 7] = 0.0
    H = hessian_update_reference(torch.zeros(64, 64), x, 0)
    w = torch.randn(16, 64)
    with pytest.warns(UserWarning, match="not positive definite"):
        Q, _, _, used = gptq_quantize_weight_reference(w, H, wq, 32, 0.0, False, name="lyr")
    assert used > 0 and torch.isfinite(Q).all()
    assert torch.all(Q[:, 7] == 0)  # a dead input's column is zeroed
    if HAS_CPP:  # the op says so in its result (its TORCH_WARN goes to C++'s warning handler)
        Qc, _, _, used_c = torch.ops.mqbench.gptq_quantize_weight(w, H, *wq.as_args(), 32, 0.0,
                                                                  False, "lyr")
        assert used_c == used and torch.equal(Qc, Q)
    model = nn.Sequential(nn.Linear(64, 16))
    with pytest.warns(UserWarning, match="Hessian of 0 is not positive definite"):
        gptq(model, [x], W4G32, damp=0.0)
    assert torch.isfinite(model[0].weight).all()


def test_gptq_model_with_zero_input_channel_gives_finite_weights():
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    with torch.no_grad():
        model[0].weight[4] = 0.0
        model[0].bias[4] = 0.0  # channel 4 of layer 2's input is always 0
    calib = [_correlated_inputs(16, 32, seed=i) for i in range(3)]
    gptq(model, calib, {"bit": 4, "per_channel": True, "group_size": 16}, damp=0.0)
    assert all(torch.isfinite(m.weight).all() for m in model if isinstance(m, nn.Linear))


# ---------------------------------------------------------------- AWQ


@pytest.mark.parametrize("seed", [0, 1])
def test_awq_beats_rtn_on_salient_channels(seed):
    import copy
    model = _mlp_salient(seed)
    calib = [_correlated_inputs(64, 64, seed=i + 10 * seed) for i in range(4)]
    x = torch.cat(calib)
    with torch.no_grad():
        ref = model(x)
    m_rtn, m_awq = copy.deepcopy(model), copy.deepcopy(model)
    out = awq(m_awq, calib, A4G32, clip=False)  # the scales alone keep the float function
    assert set(out) == {"0", "2"}  # the Linears behind ReLU; layer 0 reads the input
    with torch.no_grad():
        torch.testing.assert_close(m_awq(x), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    # round the layers AWQ scaled (layer 0 has no producer: the same in both)
    rtn(m_rtn, A4G32, layers=["2", "4"])
    rtn(m_awq, A4G32, layers=["2", "4"])
    with torch.no_grad():
        e_rtn, e_awq = _rel(m_rtn(x), ref), _rel(m_awq(x), ref)
    assert e_awq < 0.75 * e_rtn, (e_awq, e_rtn)


@pytest.mark.parametrize("objective", ["layer", "block"])
def test_awq_beats_rtn_on_llama(objective):
    import copy
    model = _tiny_llama()
    calib = _llama_calib()
    ref = _logits(model, calib)
    m_rtn, m_awq = copy.deepcopy(model), copy.deepcopy(model)
    rtn(m_rtn, A4G32)
    out = awq(m_awq, calib, A4G32, objective=objective, clip=False)
    blocks = {v["block"] for v in out.values()}
    if objective == "block":
        assert blocks == {None, "model.layers.0.self_attn", "model.layers.0.mlp",
                          "model.layers.1.self_attn", "model.layers.1.mlp"}
    else:
        assert blocks == {None}
    assert _rel(_logits(m_awq, calib), ref) < 1e-4  # float function kept
    rtn(m_awq, A4G32)
    e_rtn, e_awq = _rel(_logits(m_rtn, calib), ref), _rel(_logits(m_awq, calib), ref)
    assert e_awq < 0.9 * e_rtn, (e_awq, e_rtn)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_awq_keeps_only_the_rows_it_searches_on(dtype):
    """AWQ's subsampled rows of its captures, without their concatenation: the rows of
    torch.cat(xs)[idx] in float32, for evenly spaced and strided indices, chunks of any size
    (empty too)."""
    from mqbench.llm.awq import _rows
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(k, 6, generator=g).to(dtype) for k in (5, 0, 17, 1, 9)]
    whole = torch.cat(xs).float()
    for idx in (None, torch.linspace(0, 31, 7).long(), torch.arange(0, 32, 3),
                torch.tensor([0, 31]), torch.tensor([5, 6, 22])):
        got = _rows(xs, idx)
        assert got.dtype == torch.float32
        assert torch.equal(got, whole if idx is None else whole[idx]), idx


def test_awq_search_never_worse_than_no_scaling():
    wq = _weights.resolve_w_qscheme(W4G32, "test")
    x = _correlated_inputs(256, 64, outliers=(3, 9))
    ws = [torch.randn(32, 64), torch.randn(16, 64)]
    s, losses = awq_search_scale_reference(x, ws, x.abs().mean(0), awq_weight_mean(ws, wq), 10,
                                           wq)
    assert losses.shape == (11,)
    assert losses.min() <= losses[-1] and losses.argmin() < 10  # outliers: scaling helps
    assert torch.isfinite(s).all() and (s > 0).all()


def test_awq_keeps_llama_float_output():
    import copy
    model = _tiny_llama()
    calib = _llama_calib()
    ref = _logits(model, calib)
    m = copy.deepcopy(model)
    out = awq(m, calib, W4G32, grid=5, clip=False)
    assert "model.layers.0.input_layernorm" in out and "model.layers.1.mlp.up_proj" in out
    assert _rel(_logits(m, calib), ref) < 1e-4


# ---------------------------------------------------------------- SmoothQuant


def _w8a8(model, x):
    """W8A8 simulation: per-channel INT8 weights (rtn), per-tensor symmetric INT8 inputs of every
    Linear (max-abs scale)."""
    import copy
    m = copy.deepcopy(model)
    rtn(m, {"bit": 8, "per_channel": True})

    def hook(_m, inp):
        a = inp[0]
        s = a.abs().max() / 127.0
        return (torch.clamp(torch.round(a / s), -128, 127) * s,)
    for mod in m.modules():
        if isinstance(mod, nn.Linear):
            mod.register_forward_pre_hook(hook)
    with torch.no_grad():
        return m(x)


def test_smoothquant_keeps_float_and_reduces_w8a8_error():
    import copy
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 128), nn.ReLU(),
                          nn.Linear(128, 64)).eval()
    with torch.no_grad():
        model[0].weight[[3, 17, 40]] = 40.0  # activation outlier channels
        model[1].weight[[7, 90]] *= 30.0
    calib = [torch.randn(32, 64) for _ in range(4)]
    x = torch.cat(calib)
    with torch.no_grad():
        ref = model(x)
    m = copy.deepcopy(model)
    out = smoothquant(m, calib, alpha=0.5)
    assert set(out) == {"0", "1"}
    with torch.no_grad():
        assert _rel(m(x), ref) < 1e-4
    e_plain, e_smooth = _rel(_w8a8(model, x), ref), _rel(_w8a8(m, x), ref)
    assert e_smooth < 0.7 * e_plain, (e_smooth, e_plain)


def test_smoothquant_llama_keeps_float_output():
    import copy
    model = _tiny_llama()
    calib = _llama_calib()
    ref = _logits(model, calib)
    m = copy.deepcopy(model)
    out = smoothquant(m, calib, alpha=0.5)
    assert len(out) == 8  # per layer: input_layernorm, v_proj, post_attention_layernorm, up_proj
    assert _rel(_logits(m, calib), ref) < 1e-4


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("scheme, match", [
    ({"bit": 1, "per_channel": True}, "bit must be in"),
    ({"bit": 12, "per_channel": True}, "bit must be in"),
    ({"dtype": "fp8_e4m3", "per_channel": True}, "not supported yet"),
    ({"bit": 4, "per_channel": True, "pot_scale": True}, "pot_scale"),
    ({"bit": 4, "per_channel": True, "group_size": 48}, "does not divide layer '0'"),
])
@pytest.mark.parametrize("algo", ["gptq", "awq", "rtn"])
def test_bad_schemes_refused_up_front(scheme, match, algo):
    model = nn.Sequential(nn.Linear(64, 8))
    before = model[0].weight.clone()
    fn = {"gptq": lambda: gptq(model, [torch.randn(2, 64)], scheme),
          "awq": lambda: awq(model, [torch.randn(2, 64)], scheme),
          "rtn": lambda: rtn(model, scheme)}[algo]
    with pytest.raises(ValueError, match=match):
        fn()
    assert torch.equal(model[0].weight, before)


@pytest.mark.parametrize("algo", ["gptq", "awq", "rtn", "smoothquant", "signround"])
def test_offloaded_weights_are_refused_with_their_reason(algo):
    """Weights on the meta device (accelerate's device_map offloading to 'cpu' or 'disk') are
    refused up front, naming the layer, rather than failing deep inside or (rtn) returning
    scales of nothing."""
    from mqbench.llm import signround
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    calib = [torch.randn(2, 64)]
    fn = {"gptq": lambda: gptq(model, calib, W4G32), "awq": lambda: awq(model, calib, W4G32),
          "rtn": lambda: rtn(model, W4G32), "smoothquant": lambda: smoothquant(model, calib),
          "signround": lambda: signround(model, calib, W4G32, iters=2)}[algo]
    with pytest.raises(ValueError, match=r"meta device \(offloaded.*first '0'"):
        fn()


def test_calibration_items_are_moved_to_the_model_inputs_device():
    """The items go where the model takes its inputs (a tokenizer's CPU tensors for a model on a
    GPU; the meta device stands in for the GPU here) through ``to_device``: tensors inside
    mappings (a tokenizer's BatchEncoding, which it used to leave unmoved), lists, tuples and
    named tuples; a container holding itself is refused, not recursed into without end."""
    from collections import namedtuple
    from mqbench.utils.utils import to_device
    transformers = pytest.importorskip("transformers")
    pair = namedtuple("pair", "a b")
    item = transformers.BatchEncoding({"input_ids": torch.ones(1, 4, dtype=torch.long),
                                       "extra": [torch.zeros(2), pair(torch.ones(1), 3), "s"]})
    meta = torch.device("meta")
    moved = to_device(item, meta)
    assert moved["input_ids"].device == meta and moved["input_ids"].dtype == torch.long
    inner = moved["extra"][1]
    assert moved["extra"][0].device == meta and isinstance(inner, pair)
    assert inner.a.device == meta and inner.b == 3 and moved["extra"][2] == "s"
    assert item["input_ids"].device.type == "cpu"  # the caller's item is left alone
    loop = []
    loop.append(loop)
    with pytest.raises(ValueError, match="deeper than 32 levels"):
        to_device(loop, meta)
    model = _tiny_llama()
    assert _calibration.input_device(model) == torch.device("cpu")
    model._hf_hook = object()  # accelerate's dispatch moves the inputs itself
    assert _calibration.input_device(model) is None
    with torch.device("meta"):
        assert _calibration.input_device(nn.Linear(2, 2)) is None


class _Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.dead = nn.Linear(16, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x, use_dead=False):
        h = self.a(x)
        if use_dead:
            h = self.dead(h)
        return self.b(h)


@pytest.mark.parametrize("algo", ["gptq", "awq", "smoothquant"])
def test_unreached_layer_is_named(algo):
    scheme = {"bit": 4, "per_channel": True}
    model = _Branchy()
    calib = [torch.randn(4, 16) for _ in range(2)]
    call = {"gptq": lambda **kw: gptq(model, calib, scheme, **kw),
            "awq": lambda **kw: awq(model, calib, scheme, **kw),
            "smoothquant": lambda **kw: smoothquant(model, calib, **kw)}[algo]
    with pytest.raises(ValueError, match="never reached layer\\(s\\) \\['dead'\\]"):
        call()
    before = model.dead.weight.clone()
    with pytest.warns(UserWarning, match="never reached \\['dead'\\]"):
        call(skip_unreached=True)
    assert torch.equal(model.dead.weight, before)


def test_calibration_items_tensor_tuple_dict():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(32, 8)

        def forward(self, x, y=None):
            return self.l(x if y is None else x + y)

    for calib in ([torch.randn(4, 32)], [(torch.randn(4, 32), torch.randn(4, 32))],
                  [{"x": torch.randn(4, 32), "y": torch.randn(4, 32)}]):
        model = Two()
        out = gptq(model, calib, {"bit": 4, "per_channel": True})
        assert set(out) == {"l"}
    with pytest.raises(ValueError, match="calib_data is empty"):
        gptq(Two(), [], {"bit": 4, "per_channel": True})


# ---------------------------------------------------------------- C++ == Python


@needs_cpp
@pytest.mark.parametrize("scheme", [W4G32, {"bit": 3, "symmetry": False, "per_channel": True},
                                    {"bit": 4, "per_channel": False}])
@pytest.mark.parametrize("act_order", [False, True])
def test_cpp_gptq_equals_reference(scheme, act_order):
    wq = _weights.resolve_w_qscheme(scheme, "test")
    x = _correlated_inputs(256, 96)
    H_py, H_cpp = torch.zeros(96, 96), torch.zeros(96, 96)
    for n, chunk in zip((0, 100), x.split([100, 156])):
        H_py = hessian_update_reference(H_py, chunk, n)
        H_cpp = torch.ops.mqbench.gptq_hessian_update(H_cpp, chunk, n)
    # the same ATen ops in the same order: equal bit for bit on one machine
    assert torch.equal(H_cpp, H_py)
    w = torch.randn(40, 96)
    ref = gptq_quantize_weight_reference(w, H_py, wq, 32, 0.01, act_order)
    got = torch.ops.mqbench.gptq_quantize_weight(w, H_py, *wq.as_args(), 32, 0.01, act_order,
                                                 "l")
    for g, r in zip(got[:3], ref[:3]):
        assert torch.equal(g, r)
    assert got[3] == ref[3]


@pytest.mark.parametrize("impl", ["cpp", "python"])
def test_hessian_of_wide_inputs_from_upper_blocks(impl):
    """Inputs wider than one band (300 = 128 + 128 + 44): H from its upper blocks, mirrored, is
    exactly symmetric and equals 2/N X^T X to float rounding; C++ and reference give one H."""
    if impl == "cpp" and not _checks.want_cpp("auto", "gptq_quantize_weight"):
        pytest.skip("this build of mqbench has no LLM ops")
    x = _correlated_inputs(400, 300)
    update = (torch.ops.mqbench.gptq_hessian_update if impl == "cpp"
              else hessian_update_reference)
    H = torch.zeros(300, 300)
    for n, chunk in zip((0, 150), x.split([150, 250])):
        H = update(H, chunk, n)
    assert torch.equal(H, H.t())
    torch.testing.assert_close(H, 2.0 / 400 * x.t() @ x, rtol=1e-5, atol=1e-4)
    if impl == "cpp":
        H_ref = torch.zeros(300, 300)
        for n, chunk in zip((0, 150), x.split([150, 250])):
            H_ref = hessian_update_reference(H_ref, chunk, n)
        assert torch.equal(H, H_ref)


@needs_cpp
def test_hessian_update_in_place_equals_the_functional_update():
    """gptq_hessian_update_ writes each band into H itself (no second [in, in] matrix): the
    bits of the functional op, over several updates and wide inputs; an H in another dtype or
    layout gets the result copied in."""
    x = _correlated_inputs(400, 300)
    H_new, H_own = torch.zeros(300, 300), torch.zeros(300, 300)
    for n, chunk in zip((0, 150, 260), x.split([150, 110, 140])):
        H_new = torch.ops.mqbench.gptq_hessian_update(H_new, chunk, n)
        ptr = H_own.data_ptr()
        out = torch.ops.mqbench.gptq_hessian_update_(H_own, chunk, n)
        assert out.data_ptr() == ptr == H_own.data_ptr()
        assert torch.equal(H_own, H_new)
    other = torch.zeros(300, 300, dtype=torch.float64)
    torch.ops.mqbench.gptq_hessian_update_(other, x, 0)
    torch.testing.assert_close(other, torch.ops.mqbench.gptq_hessian_update(
        torch.zeros(300, 300), x, 0).double())


def test_hessian_batches_short_items_and_copies_them():
    """Short captured items are added in batches of at least _HESSIAN_ROWS rows (Note [Hessian
    updates in batches of rows]): H is 2/N X^T X of all rows, whatever later becomes of the
    captured tensors; a long item goes through alone."""
    import importlib
    gptq_mod = importlib.import_module("mqbench.llm.gptq")  # the module, not the function
    x = _correlated_inputs(3000, 40)
    h = gptq_mod._Hessian(40, torch.device("cpu"))
    chunks = list(x.split(30))              # 100 items of 30 rows: 69 in one batch, 31 left
    for c in chunks:
        c = c.clone()
        h.add(c)
        c.mul_(7.0)                         # the model reuses its buffer: H must not see it
    assert h.n == 69 * 30 and len(h._pending) == 31   # the first batch of >= 2048 rows
    H = h.finish()
    assert h.n == 3000
    torch.testing.assert_close(H, 2.0 / 3000 * x.t() @ x, rtol=1e-5, atol=1e-5)
    long_item = _correlated_inputs(gptq_mod._HESSIAN_ROWS, 40, seed=1)
    h2 = gptq_mod._Hessian(40, torch.device("cpu"))
    h2.add(long_item)
    assert h2.n == gptq_mod._HESSIAN_ROWS and not h2._pending


@needs_cpp
def test_cpp_awq_search_equals_reference():
    wq = _weights.resolve_w_qscheme({"bit": 4, "symmetry": False, "per_channel": True,
                                    "group_size": 16}, "test")
    x = _correlated_inputs(200, 64, outliers=(3, 9))
    ws = [torch.randn(32, 64), torch.randn(16, 64)]
    args = (x, ws, x.abs().mean(0), awq_weight_mean(ws, wq), 8)
    s_ref, l_ref = awq_search_scale_reference(*args, wq)
    s_cpp, l_cpp = torch.ops.mqbench.awq_search_scale(*args, *wq.as_args())
    assert torch.equal(l_cpp, l_ref) and torch.equal(s_cpp, s_ref)


@needs_cpp
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_awq_candidate_from_losses_is_the_search_ops_choice(seed):
    """Several ranks pick the scale from the reduced losses (``_best_candidate``, then
    ``candidate_scale``): the scale the op itself returns from those losses, ties included (no
    scaling wins them); a NaN never wins, and with none finite the pick fails as the op's
    does."""
    from mqbench.llm.awq import _best_candidate, candidate_scale
    wq = _weights.resolve_w_qscheme({"bit": 4, "per_channel": True, "group_size": 16}, "test")
    x = _correlated_inputs(200, 64, outliers=(3, 9), seed=seed)
    ws = [torch.randn(32, 64, generator=torch.Generator().manual_seed(seed))]
    x_mean, w_mean = x.abs().mean(0), awq_weight_mean(ws, wq)
    s, losses = torch.ops.mqbench.awq_search_scale(x, ws, x_mean, w_mean, 8, *wq.as_args())
    assert torch.equal(candidate_scale(x_mean, w_mean, _best_candidate(losses, 8), 8), s)
    nan = float("nan")
    assert _best_candidate(torch.tensor([3.0, 1.0, 1.0, 2.0, 1.0]), 4) == 4
    assert _best_candidate(torch.tensor([3.0, 1.0, 1.0, 2.0, 5.0]), 4) == 1
    assert _best_candidate(torch.tensor([nan, 2.0, nan, 1.0, nan]), 4) == 3
    with pytest.raises(RuntimeError, match="non-finite"):
        _best_candidate(torch.full((5,), nan), 4)


@needs_cpp
@pytest.mark.parametrize("algo", ["gptq", "awq"])
def test_cpp_ops_and_the_torch_oracles_give_the_same_model(algo, monkeypatch):
    """The whole algorithm with its C++ ops, then with them replaced by the torch formulations of
    tests/python/reference.py: the same weights, bit for bit."""
    import copy
    import importlib

    model = _tiny_llama(layers=1)
    calib = _llama_calib(n=2)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    fn = gptq if algo == "gptq" else awq
    fn(a, calib, W4G32)
    module = importlib.import_module(f"mqbench.llm.{algo}")
    calls = {}

    def counted(name, oracle):
        def run(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return oracle(*args, **kwargs)
        monkeypatch.setattr(module, name, run)

    if algo == "gptq":
        counted("_hessian_update", hessian_update_reference)
        # the reference copies H: the caller's last use (last_use) changes nothing for it
        counted("_quantize_weight",
                lambda *a, last_use=False: gptq_quantize_weight_reference(*a))
    else:
        counted("_search_scale", awq_search_scale_reference)
    fn(b, calib, W4G32)
    # the oracles ran in place of the ops (a path around them would make this test vacuous)
    assert calls and all(n > 0 for n in calls.values()), calls
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), n


@pytest.mark.parametrize("algo", ["gptq", "awq"])
def test_impl_python_is_refused_where_only_the_cpp_ops_run(algo):
    fn = gptq if algo == "gptq" else awq
    with pytest.raises(ValueError, match=f"{algo}: impl must be 'auto' or 'cpp'"):
        fn(_tiny_llama(layers=1), _llama_calib(n=1), W4G32, impl="python")


# ---------------------------------------------------------------- with prepare_by_platform


@pytest.mark.parametrize("scheme", [W4G32, {"bit": 4, "per_channel": True}])
def test_gptq_then_prepare_by_platform_keeps_gptq_weights(scheme):
    from mqbench.llm import load_weight_qparams
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
    calib = [_correlated_inputs(32, 64, seed=i) for i in range(4)]
    qp = gptq(model, calib, scheme)
    gptq_w = {n: m.weight.detach().clone() for n, m in model.named_modules()
              if isinstance(m, nn.Linear)}
    extra = {"extra_qconfig_dict": {
        "w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver",
        "w_fakequantize": "FixedFakeQuantize", "a_fakequantize": "FixedFakeQuantize",
        "w_qscheme": scheme,
        "a_qscheme": {"bit": 8, "symmetry": False, "per_channel": False, "pot_scale": False}}}
    prepared = prepare_by_platform(model, BackendType.Academic, extra)
    mods = dict(prepared.named_modules())
    middle = ["2", "4"]  # Academic keeps the first and last layers at 8 bits (MQBench's rule)
    with pytest.raises(ValueError, match="has range \\[-128, 127\\] but the qparams were made "
                                         "for \\[-8, 7\\]"):
        load_weight_qparams(prepared, {"0": qp["0"]})
    # the observer's own grid moves GPTQ's weights (MQBench's [-8, 7] range: scale amax / 7.5)
    fq = mods["2"].weight_fake_quant
    with torch.no_grad():
        moved = fq(mods["2"].weight)
    assert not torch.equal(moved, gptq_w["2"])
    load_weight_qparams(prepared, {n: qp[n] for n in middle})
    for name in middle:
        fq = mods[name].weight_fake_quant
        assert int(fq.observer_enabled[0]) == 0
        fq.enable_fake_quant()
        with torch.no_grad():
            assert torch.equal(fq(mods[name].weight), gptq_w[name]), name


def test_load_weight_qparams_refuses_another_scheme():
    from mqbench.llm import load_weight_qparams
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 32)).eval()
    qp = {"2": gptq(model, [torch.randn(16, 64)], W4G32)["2"]}
    prepared = prepare_by_platform(model, BackendType.Academic, {"extra_qconfig_dict": {
        "w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver",
        "w_fakequantize": "FixedFakeQuantize", "a_fakequantize": "FixedFakeQuantize",
        "w_qscheme": {"bit": 4, "per_channel": True},
        "a_qscheme": {"bit": 8, "symmetry": False, "per_channel": False, "pot_scale": False}}})
    with pytest.raises(ValueError, match="prepare with the w_qscheme the algorithm used"):
        load_weight_qparams(prepared, qp)
    with pytest.raises(ValueError, match="has no weight_fake_quant"):
        load_weight_qparams(model, qp)


# ------------------------------------------- on a model prepare_by_platform already prepared
_MIDDLE = ["2", "4"]  # Academic keeps the first and last layers at 8 bits (MQBench's rule)


def _prepare_academic(model, scheme=W4G32):
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    return prepare_by_platform(model, BackendType.Academic, {"extra_qconfig_dict": {
        "w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver",
        "w_fakequantize": "FixedFakeQuantize", "a_fakequantize": "FixedFakeQuantize",
        "w_qscheme": scheme,
        "a_qscheme": {"bit": 8, "symmetry": False, "per_channel": False, "pot_scale": False}}})


def _prepared_mlp(scheme=W4G32, seed=0):
    """(float MLP, a copy prepared for Academic with MinMax observers, calibration items)."""
    import copy
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
    calib = [_correlated_inputs(32, 64, seed=i) for i in range(4)]
    return model, _prepare_academic(copy.deepcopy(model), scheme), calib


def _switches(model):
    from mqbench.llm._prepared import fake_quantizers
    return {n: (int(fq.fake_quant_enabled[0]), int(fq.observer_enabled[0]))
            for n, fq in fake_quantizers(model)}


def _observer_state(model):
    from mqbench.llm._prepared import fake_quantizers
    return {f"{n}.{k}": v.clone() for n, fq in fake_quantizers(model)
            for k, v in fq.activation_post_process.state_dict().items()}


def test_gptq_on_a_prepared_model_equals_gptq_then_load_weight_qparams():
    from mqbench.llm import load_weight_qparams
    from mqbench.utils.state import enable_calibration_quantization
    model, prepared, calib = _prepared_mlp()
    enable_calibration_quantization(prepared, "weight_fake_quant")  # weight-only, observers on
    before, observed = _switches(prepared), _observer_state(prepared)
    qp = gptq(prepared, calib, W4G32, layers=_MIDDLE)
    expected = gptq(model, calib, W4G32, layers=_MIDDLE)
    mods, float_mods = dict(prepared.named_modules()), dict(model.named_modules())
    for name in _MIDDLE:
        assert torch.equal(mods[name].weight, float_mods[name].weight), name
        assert torch.equal(qp[name]["scale"], expected[name]["scale"]), name
    # the grids are loaded, those observers off; every other switch and observer as it was
    after = _switches(prepared)
    for name in _MIDDLE:
        fq = f"{name}.weight_fake_quant"
        assert after.pop(fq) == (before.pop(fq)[0], 0), fq
        with torch.no_grad():
            assert torch.equal(mods[name].weight_fake_quant(mods[name].weight),
                               mods[name].weight), name
    assert after == before
    for key, value in _observer_state(prepared).items():
        assert torch.equal(value, observed[key]), key
    # the prepared model computes what the documented two-step flow gives
    two_step = _prepare_academic(model)  # the float model, GPTQ's weights in it
    enable_calibration_quantization(two_step, "weight_fake_quant")
    load_weight_qparams(two_step, expected)
    with torch.no_grad():
        assert torch.equal(prepared(calib[0]), two_step(calib[0]))


def test_gptq_on_a_prepared_model_sees_the_float_model_whatever_its_switches():
    # calibrated and quantizing (activations and weights): GPTQ still sees the float model, as
    # on the float model itself, and no observer moves
    from mqbench.utils.state import enable_calibration, enable_quantization
    model, prepared, calib = _prepared_mlp()
    enable_calibration(prepared)
    with torch.no_grad():
        for x in calib:
            prepared(x)
    enable_quantization(prepared)
    before, observed = _switches(prepared), _observer_state(prepared)
    gptq(prepared, calib, W4G32, layers=_MIDDLE)
    gptq(model, calib, W4G32, layers=_MIDDLE)
    mods, float_mods = dict(prepared.named_modules()), dict(model.named_modules())
    for name in _MIDDLE:
        assert torch.equal(mods[name].weight, float_mods[name].weight), name
    assert _switches(prepared) == before  # those grids' observers were off already
    for key, value in _observer_state(prepared).items():
        assert torch.equal(value, observed[key]), key


def test_rtn_on_a_prepared_model_loads_its_grid():
    from mqbench.utils.state import enable_calibration_quantization
    model, prepared, _ = _prepared_mlp()
    enable_calibration_quantization(prepared, "weight_fake_quant")
    qp = rtn(prepared, W4G32, layers=_MIDDLE)
    assert torch.equal(qp["2"]["scale"], rtn(model, W4G32, layers=_MIDDLE)["2"]["scale"])
    mods = dict(prepared.named_modules())
    for name in _MIDDLE:
        fq = mods[name].weight_fake_quant
        assert int(fq.observer_enabled[0]) == 0
        with torch.no_grad():  # not rounded a second time on an observer's grid
            assert torch.equal(fq(mods[name].weight), mods[name].weight), name


def test_a_prepared_model_with_another_scheme_is_refused_before_any_change():
    _, prepared, calib = _prepared_mlp({"bit": 4, "per_channel": True})
    weights = {n: p.detach().clone() for n, p in prepared.named_parameters()}
    before = _switches(prepared)
    for algo in (gptq, awq):  # AWQ's search scores the weight observer's grid
        with pytest.raises(ValueError, match=f"{algo.__name__}: '2'.s weight_fake_quant "
                                             "quantizes per channel along axis 0 but w_qscheme "
                                             "asks for groups of 32"):
            algo(prepared, calib, W4G32, layers=_MIDDLE)
    with pytest.raises(ValueError, match="'0'.s weight_fake_quant has range \\[-128, 127\\] "
                                         "but w_qscheme gives \\[-8, 7\\]"):
        rtn(prepared, {"bit": 4, "per_channel": True})
    for n, p in prepared.named_parameters():
        assert torch.equal(p, weights[n]), n
    assert _switches(prepared) == before


def test_a_prepared_layer_without_a_weight_quantizer_or_with_pot_scales_is_refused():
    import copy
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    model, _, calib = _prepared_mlp()
    # left float by prepare_by_platform: not rounded behind the user's back
    excluded = prepare_by_platform(copy.deepcopy(model), BackendType.QDQ, {
        "extra_qconfig_dict": {"w_qscheme": W4G32},
        "extra_quantizer_dict": {"exclude_module_name": ["2"]}})
    weights = {n: p.detach().clone() for n, p in excluded.named_parameters()}
    (left,) = [n for n, m in excluded.named_modules()
               if isinstance(m, nn.Linear) and not hasattr(m, "weight_fake_quant")]
    for algo in (rtn, gptq):
        args = (excluded, W4G32) if algo is rtn else (excluded, calib, W4G32)
        with pytest.raises(ValueError, match=f"'{left}' has no weight_fake_quant in this "
                                             "prepared model .* leave it out with ignore= or "
                                             "layers="):
            algo(*args)
    for n, p in excluded.named_parameters():
        assert torch.equal(p, weights[n]), n
    assert set(rtn(excluded, W4G32, ignore=[left])) == {"0", "4", "6"}  # the others run
    pot = _prepare_academic(copy.deepcopy(model), {"bit": 4, "per_channel": True,
                                                   "pot_scale": True})
    with pytest.raises(ValueError, match="'2'.s weight_fake_quant has power-of-two scales"):
        rtn(pot, {"bit": 4, "per_channel": True}, layers=_MIDDLE)


@pytest.mark.parametrize("algo", ["gptq", "awq", "smoothquant"])
def test_a_prepared_linear_fused_with_a_batchnorm_is_refused(algo):
    # its forward rescales the weight by the BatchNorm's statistics, so its weight quantizer
    # does not see module.weight (a stand-in: the BatchNorm set as LinearBn1d holds it)
    _, prepared, calib = _prepared_mlp()
    prepared.get_submodule("2").bn = nn.BatchNorm1d(64)
    weights = {n: p.detach().clone() for n, p in prepared.named_parameters()}
    with pytest.raises(ValueError, match=f"{algo}: '2' is a Linear fused with a BatchNorm"):
        if algo == "smoothquant":
            smoothquant(prepared, calib, layers=_MIDDLE)
        else:
            (gptq if algo == "gptq" else awq)(prepared, calib, W4G32, layers=_MIDDLE)
    for n, p in prepared.named_parameters():
        assert torch.equal(p, weights[n]), n


def test_gptq_stopped_on_a_prepared_model_restores_switches_and_keeps_finished_grids(
        monkeypatch):
    import importlib
    gptq_module = importlib.import_module("mqbench.llm.gptq")
    _, prepared, calib = _prepared_mlp()
    before = _switches(prepared)
    real = gptq_module._quantize_layer

    def fail_on_second(name, *args, **kwargs):
        if name == _MIDDLE[1]:
            raise RuntimeError("stopped")
        return real(name, *args, **kwargs)
    monkeypatch.setattr(gptq_module, "_quantize_layer", fail_on_second)
    with pytest.raises(RuntimeError, match="stopped"):
        gptq(prepared, calib, W4G32, layers=_MIDDLE)
    after = _switches(prepared)
    first = f"{_MIDDLE[0]}.weight_fake_quant"
    assert after.pop(first) == (before.pop(first)[0], 0)  # its grid loaded: observer off
    assert after == before
    mod = dict(prepared.named_modules())[_MIDDLE[0]]
    with torch.no_grad():
        assert torch.equal(mod.weight_fake_quant(mod.weight), mod.weight)


def _fold(algo, model, calib, scheme=W4G32, **kw):
    if algo == "awq":
        return awq(model, calib, scheme, **kw)
    return smoothquant(model, calib, **kw)


def _prepared_llama(model, calib, algo):
    """A copy of ``model`` prepared with the torch.export capture: Tensorrt_NLP (W8A8) for
    SmoothQuant, QDQ with INT4 groups of 32 for AWQ."""
    import copy
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    config = {"example_inputs": calib[0],
              "extra_quantizer_dict": {"exclude_module_name": ["embed_tokens", "lm_head"]}}
    if algo == "awq":
        config["extra_qconfig_dict"] = {"w_qscheme": W4G32}
        return prepare_by_platform(copy.deepcopy(model), BackendType.QDQ, config)
    return prepare_by_platform(copy.deepcopy(model), BackendType.Tensorrt_NLP, config)


def _calibrated_logits(prepared, calib):
    from mqbench.utils.state import enable_calibration, enable_quantization
    enable_calibration(prepared)
    with torch.no_grad():
        for c in calib:
            prepared(**c)
    enable_quantization(prepared)
    return _logits(prepared, calib)


@pytest.mark.parametrize("algo,kw", [("smoothquant", {"alpha": 0.5}),
                                     ("smoothquant", {"alpha": "auto", "objective": "block"}),
                                     ("awq", {})])
def test_folding_on_a_prepared_llama_equals_folding_then_prepare(algo, kw):
    # the prepared graph inlined the norms (mul(weight, x)) and put activation quantizers
    # between producers and consumers; the scales fold into the weights it reads, and the
    # quantized model is the two-step flow's, bit for bit
    import copy
    model = _tiny_llama()
    model.config.use_cache = False
    calib = _llama_calib()
    first = copy.deepcopy(model)
    # objective="block" runs the blocks, which a prepared graph does not call: "layer" there
    expected = _fold(algo, first, calib, **dict(kw, objective="layer"))
    two_step = _prepared_llama(first, calib, algo)
    prepared = _prepared_llama(model, calib, algo)
    before = _switches(prepared)
    got = _fold(algo, prepared, calib, **kw)
    assert list(got) == list(expected) and len(got) == 8  # norm -> q/k/v, v -> o, ... x 2
    for producer in got:
        assert torch.equal(got[producer]["scale"], expected[producer]["scale"]), producer
    assert _switches(prepared) == before
    assert torch.equal(_calibrated_logits(prepared, calib), _calibrated_logits(two_step, calib))


def test_folding_on_a_calibrated_prepared_llama_observes_the_moved_quantizers_again():
    # calibrated on other data, then smoothed: the weight quantizers of changed weights and the
    # activation quantizers whose inputs moved observe again (weights: the new weights;
    # activations: smoothquant's calibration data); the others keep their state
    import copy
    model = _tiny_llama()
    model.config.use_cache = False
    calib, other = _llama_calib(), _llama_calib(seed=7)
    first = copy.deepcopy(model)
    smoothquant(first, calib, alpha=0.5)
    two_step = _prepared_llama(first, calib, "smoothquant")
    _calibrated_logits(two_step, calib)
    prepared = _prepared_llama(model, calib, "smoothquant")
    _calibrated_logits(prepared, other)
    before, observed = _switches(prepared), _observer_state(prepared)
    smoothquant(prepared, calib, alpha=0.5)
    assert _switches(prepared) == before
    after, fresh = _observer_state(prepared), _observer_state(two_step)
    moved = {k.rsplit(".", 1)[0] for k in after if not torch.equal(after[k], observed[k])}
    weights = {f"model.layers.{i}.{p}.weight_fake_quant" for i in range(2)
               for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                         "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert weights <= moved
    acts = moved - weights
    # per layer: the inputs of q/k/v, of o_proj, of gate/up and of down_proj; the residual
    # stream's and the layers' outputs keep the ranges observed on the other data
    assert len(acts) == 8, sorted(acts)
    for key in after:  # the moved ones hold what calibrating the two-step model gives
        if key.rsplit(".", 1)[0] in moved:
            assert torch.allclose(after[key], fresh[key], rtol=1e-5, atol=1e-6), key


def _graph_calibration(prepared, calib, cache_blocks=True):
    from mqbench.llm import _prepared
    wq = _weights.resolve_w_qscheme(W4G32, "test")
    run = _prepared.PreparedRun(prepared, None, ("lm_head",), wq, "test")
    run.__enter__()  # quantizers off, as the algorithms run; the caller leaves it
    cal = _calibration.select_and_calibrate(prepared, None, ("lm_head",), calib, False, "test", wq,
                                            cache_blocks)
    return run, cal


def test_graph_block_cache_captures_what_a_forward_gives():
    # a prepared graph calls no block: the cache keeps the values live at each block's first
    # node and runs the graph from there; the captures equal a forward's, also after a weight
    # read before the cached block changes (then it records again from the input)
    from mqbench.llm._graph_cache import GraphBlockCache
    model = _tiny_llama(layers=3)
    model.config.use_cache = False
    calib = _llama_calib()
    prepared = _prepared_llama(model, calib, "awq")
    run, cal = _graph_calibration(prepared, calib)
    plain = _calibration.select_and_calibrate(prepared, None, ("lm_head",), calib, False, "test",
                                              None, cache_blocks=False)
    try:
        assert isinstance(cal.cache, GraphBlockCache) and plain.cache is None
        assert [name for name, _ in cal.cache.blocks] == [f"model.layers.{i}" for i in range(3)]
        mods = dict(prepared.named_modules())

        def inputs(c, name):
            xs = []
            c.capture([(name, mods[name])], lambda _n, x: xs.append(x.clone()))
            return torch.cat(xs)

        for name in ("model.layers.2.self_attn.q_proj", "model.layers.1.mlp.down_proj",
                     "model.layers.2.mlp.down_proj"):
            assert torch.equal(inputs(cal, name), inputs(plain, name)), name
        with torch.no_grad():  # read before block 2's first node: the cache must see it
            mods["model.layers.1.mlp.down_proj"].weight.mul_(1.5)
            prepared.get_parameter("model.layers.0.input_layernorm.weight").mul_(0.5)
        name = "model.layers.2.self_attn.v_proj"
        assert torch.equal(inputs(cal, name), inputs(plain, name))
        # inside the block: down_proj's capture starts at a mark the gate_proj capture passed
        # (the MLP's first node), unless a weight before that mark changed since
        starts = []
        real_run = cal.cache._run

        def spy(env, start, stop, item=None):
            if item is not None:
                starts.append(start)
            return real_run(env, start, stop, item)
        cal.cache._run = spy
        inputs(cal, "model.layers.2.mlp.gate_proj")
        (gate_start,) = set(starts)
        del starts[:]
        name = "model.layers.2.mlp.down_proj"
        assert torch.equal(inputs(cal, name), inputs(plain, name))
        (down_start,) = set(starts)
        o_proj = cal.cache._calls["model.layers.2.self_attn.o_proj"]
        assert gate_start < o_proj < down_start
        del starts[:]
        with torch.no_grad():  # before the MLP's mark: down_proj's capture starts before it
            mods["model.layers.2.self_attn.o_proj"].weight.mul_(0.75)
        assert torch.equal(inputs(cal, name), inputs(plain, name))
        (start,) = set(starts)
        assert start <= o_proj
    finally:
        run.__exit__(None, None, None)


class _InPlaceBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        x.add_(self.fc1(x))  # writes into its input: a cached value, once cached
        return x + self.fc2(x)


class _InPlaceChain(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.layers = nn.ModuleList([_InPlaceBlock() for _ in range(3)])

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("detect", [True, False])
def test_graph_block_cache_and_in_place_ops(detect, monkeypatch):
    # a graph op writing into a tensor (aten.add_ after a fake quantizer that is off and returns
    # its input itself) could change a cached value: such a graph gets no cache; were one built
    # anyway, the cached tensors' version counters send the captures back to the input
    from mqbench.llm import _graph_cache
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    torch.manual_seed(0)
    calib = [torch.randn(4, 16) for _ in range(3)]
    prepared = prepare_by_platform(_InPlaceChain().eval(), BackendType.QDQ,
                                   {"example_inputs": (calib[0],), "capture": "export"})
    if not detect:
        monkeypatch.setattr(_graph_cache, "_mutates", lambda node, mods: False)
    scheme = {"bit": 8, "per_channel": True, "symmetric_range": True}
    wq = _weights.resolve_w_qscheme(scheme, "test")
    from mqbench.llm import _prepared
    with _prepared.PreparedRun(prepared, None, (), wq, "test"):
        cal = _calibration.select_and_calibrate(prepared, None, (), calib, False, "test", None,
                                                True)
        plain = _calibration.select_and_calibrate(prepared, None, (), calib, False, "test", None,
                                                  cache_blocks=False)
        assert (cal.cache is None) == detect
        mods = dict(prepared.named_modules())

        def inputs(c, name):
            xs = []
            c.capture([(name, mods[name])], lambda _n, x: xs.append(x.clone()))
            return torch.cat(xs)
        for name in ("layers.1.fc2", "layers.1.fc2", "layers.1.fc1", "layers.2.fc1"):
            assert torch.equal(inputs(cal, name), inputs(plain, name)), name


@pytest.mark.parametrize("algo", ["gptq", "awq"])
def test_graph_block_cache_gives_the_results_of_forwards_from_the_input(algo, monkeypatch):
    import copy
    model = _tiny_llama(layers=3)
    model.config.use_cache = False
    calib = _llama_calib()
    results, forwards = [], []
    for cache in (True, False):
        prepared = _prepared_llama(model, calib, "awq")
        count = [0]
        real = _calibration.run_model

        def counted(m, sample, real=real, count=count):
            count[0] += 1
            return real(m, sample)
        monkeypatch.setattr(_calibration, "run_model", counted)
        if algo == "gptq":
            gptq(prepared, calib, W4G32, cache_blocks=cache)
        else:
            awq(prepared, calib, W4G32, cache_blocks=cache)
        monkeypatch.setattr(_calibration, "run_model", real)
        results.append(copy.deepcopy(prepared.state_dict()))
        forwards.append(count[0])
    for key, value in results[0].items():
        assert torch.equal(value, results[1][key]), key
    # with the cache: the counting pass, the checks; without it: a forward per capture and item
    assert forwards[0] < forwards[1] / 3, forwards


def _tiny_decoder(family, **extra):
    """A tiny transformers decoder of ``family`` (Gemma, Nemotron) whose norm weights are
    random (N(0, 0.5)), so that a norm scaling by (1 + weight) is not the identity."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, f"{family}ForCausalLM"):
        pytest.skip(f"this transformers has no {family}")
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{family}Config")(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=16, max_position_embeddings=64,
        **extra)
    model = getattr(transformers, f"{family}ForCausalLM")(cfg).eval()
    model.config.use_cache = False
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(0, 0.5)
    return model


def test_a_fold_the_prepared_graph_does_not_compute_is_dropped():
    # Gemma's RMSNorm scales by (1 + weight): its inlined form looks like Llama's, and the check
    # on the output drops those folds (v -> o and up -> down stay); the float function holds,
    # and the quantizers of weights the dropped folds only tried (q/k/v) keep their ranges
    from mqbench.utils.state import disable_all
    model = _tiny_decoder("Gemma")
    calib = _llama_calib()
    prepared = _prepared_llama(model, calib, "smoothquant")
    _calibrated_logits(prepared, calib)
    q_fq = prepared.get_submodule("model.layers.0.self_attn.q_proj").weight_fake_quant
    with torch.no_grad():  # as a learned (LSQ) scale: observing the weight again would lose it
        q_fq.scale.mul_(1.25)
    learned = q_fq.scale.detach().clone()
    observed = _observer_state(prepared)
    disable_all(prepared)
    ref = _logits(prepared, calib)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = smoothquant(prepared, calib, alpha=0.5)
    assert set(got) == {f"model.layers.{i}.{p}" for i in range(2)
                        for p in ("self_attn.v_proj", "mlp.up_proj")}
    assert set(got) == set(smoothquant(model, calib, alpha=0.5))  # as on the float model
    assert _rel(_logits(prepared, calib), ref) < 1e-5
    after = _observer_state(prepared)
    for key in after:
        if ".q_proj." in key or ".k_proj." in key or ".gate_proj." in key:
            assert torch.equal(after[key], observed[key]), key  # tried, not folded
        if ".v_proj.weight_fake_quant." in key and key.endswith("max_val"):
            assert not torch.equal(after[key], observed[key]), key  # rows scaled: observed again
    assert torch.equal(q_fq.scale, learned)


def test_a_fold_a_float_model_does_not_compute_is_dropped():
    # Nemotron's LayerNorm1P is an nn.LayerNorm scaling by (1 + weight), and its MLP is
    # down(relu(up(x))^2): the rules would fold into both; the check on the output drops them
    model = _tiny_decoder("Nemotron")
    calib = _llama_calib()
    ref = _logits(model, calib)
    got = smoothquant(model, calib, alpha=0.5)
    assert "model.layers.0.input_layernorm" not in got
    assert "model.layers.0.mlp.up_proj" not in got
    assert _rel(_logits(model, calib), ref) < 1e-5


def test_the_trial_folds_leave_every_weight_bit_for_bit():
    # halving and doubling is exact, except for subnormal values and values above half the
    # largest float: those are written back (float16 here, where both occur)
    from mqbench.llm import _mappings
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).half()
    with torch.no_grad():
        model[0].weight[0, :3] = torch.tensor([2.0 ** -24, 3 * 2.0 ** -24, 2.0 ** -20])
        model[0].bias[1] = 2.0 ** -23
        model[2].weight[1, :2] = torch.tensor([2.0 ** -24, 40000.0])
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(4, 8).half()
    kept = _mappings.checked_folds(model, [("0", ["2"])], lambda: model(x), "test")
    assert kept == []  # 40000 doubled is inf in float16: the trial cannot match
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q)
    with torch.no_grad():
        model[2].weight[1, 1] = 1.0
    before = [p.detach().clone() for p in model.parameters()]
    assert _mappings.checked_folds(model, [("0", ["2"])], lambda: model(x), "test") == \
        [("0", ["2"])]
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q)


def test_the_trial_folds_of_a_chain_leave_every_weight_bit_for_bit():
    # the middle Linear consumes one fold and produces the next: the trial scales it twice, so
    # values near both ends of float16's normal range are at risk (a 20000 could become inf)
    from mqbench.llm import _mappings
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)).half()
    tiny = torch.finfo(torch.float16).tiny
    with torch.no_grad():  # every other entry large, the rest just above the subnormals
        i, j = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
        model[1].weight.copy_(torch.where((i + j) % 2 == 0, 20000.0, tiny * 3.25))
        model[0].weight[2, 0] = tiny * 1.75
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(4, 8).half()
    _mappings.checked_folds(model, [("0", ["1"]), ("1", ["2"])], lambda: model(x), "test")
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q)


def test_the_fold_check_draws_the_same_dropout_masks_and_keeps_the_users_generators():
    # a model left in training mode: dropout between the producer and its consumer is
    # homogeneous, so the fold is right, and the check must see that (same masks in the
    # reference and the trial); the caller's random state is as before the check
    from mqbench.llm import _mappings
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 8)).train()
    x = torch.randn(16, 8)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    assert _mappings.checked_folds(model, [("0", ["2"])], lambda: model(x), "test") == \
        [("0", ["2"])]
    assert torch.equal(torch.get_rng_state(), state)
    # a GELU is not homogeneous: that fold is dropped, also with dropout drawing
    wrong = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.GELU(), nn.Linear(8, 8)).train()
    assert _mappings.checked_folds(wrong, [("0", ["3"])], lambda: wrong(x), "test") == []


def test_folding_stopped_on_a_prepared_model_restores_switches(monkeypatch):
    import importlib
    smoothquant_module = importlib.import_module("mqbench.llm.smoothquant")
    model = _tiny_llama()
    model.config.use_cache = False
    calib = _llama_calib()
    prepared = _prepared_llama(model, calib, "smoothquant")
    _calibrated_logits(prepared, calib)
    before = _switches(prepared)
    real, calls = smoothquant_module.smooth_scale, [0]

    def fail_on_second(*args):
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("stopped")
        return real(*args)
    monkeypatch.setattr(smoothquant_module, "smooth_scale", fail_on_second)
    with pytest.raises(RuntimeError, match="stopped"):
        smoothquant(prepared, calib, alpha=0.5)
    assert _switches(prepared) == before
    # the first fold is in, and the quantizers it moved observed it
    mods = dict(prepared.named_modules())
    fq = mods["model.layers.0.self_attn.q_proj"].weight_fake_quant
    w = mods["model.layers.0.self_attn.q_proj"].weight.detach()
    assert torch.equal(fq.activation_post_process.max_val, w.amax(1))


@pytest.mark.parametrize("algo", ["awq", "smoothquant"])
def test_folding_on_a_prepared_mlp_equals_folding_then_prepare(algo):
    # fx-prepared (Academic): the graph rule reads the prepared graph, fake quantizers pass
    import copy
    model, prepared, calib = _prepared_mlp()
    first = copy.deepcopy(model)
    expected = _fold(algo, first, calib, layers=_MIDDLE)
    got = _fold(algo, prepared, calib, layers=_MIDDLE)
    assert list(got) == list(expected) == ["0", "2"]
    two_step = _prepare_academic(first)
    with torch.no_grad():
        assert torch.equal(prepared(calib[0]), two_step(calib[0]))


@pytest.mark.parametrize("prepared_first", [False, True])
@pytest.mark.parametrize("algo", ["smoothquant", "awq"])
def test_smoothquant_and_awq_models_deploy_and_run_in_onnxruntime(algo, prepared_first,
                                                                   tmp_path):
    # W8A8 (SmoothQuant, Tensorrt_NLP) and weight-only INT4 groups (AWQ, QDQ) deploy, run on the
    # float model before prepare_by_platform or on the prepared one; onnxruntime's logits
    # against the fake-quant model's
    onnxruntime = pytest.importorskip("onnxruntime")
    from mqbench.convert_deploy import convert_deploy
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    from mqbench.utils.state import (enable_calibration, enable_calibration_quantization,
                                     enable_quantization)
    model = _tiny_llama()
    model.config.use_cache = False
    calib = _llama_calib()
    config = {"example_inputs": calib[0],
              "extra_quantizer_dict": {"exclude_module_name": ["embed_tokens", "lm_head"]}}
    if algo == "awq":
        config["extra_qconfig_dict"] = {"w_qscheme": W4G32}
    backend = BackendType.Tensorrt_NLP if algo == "smoothquant" else BackendType.QDQ
    if prepared_first:
        model = prepare_by_platform(model, backend, config)
    assert smoothquant(model, calib, alpha=0.5) if algo == "smoothquant" else \
        awq(model, calib, W4G32)
    q = model if prepared_first else prepare_by_platform(model, backend, config)
    if algo == "smoothquant":
        enable_calibration(q)
    else:
        enable_calibration_quantization(q, "weight_fake_quant")  # weight-only
    with torch.no_grad():
        for c in calib:
            q(**c)
    if algo == "smoothquant":
        enable_quantization(q)
    ref = _logits(q, calib[:1])
    convert_deploy(q, backend, dummy_input=dict(calib[0]), output_path=str(tmp_path),
                   model_name="m", dynamo=True)
    sess = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"),
                                        providers=["CPUExecutionProvider"])
    got = torch.from_numpy(sess.run(None, {"input_ids": calib[0]["input_ids"].numpy()})[0])
    assert got.shape == ref.shape
    assert _rel(got, ref) < 1e-5, _rel(got, ref)  # Note [Deployed weights on their grid]


def test_bert_encoder_folds_only_value_into_output_dense():
    transformers = pytest.importorskip("transformers")
    from mqbench.llm import _mappings
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128)).eval()
    names = [n for n, _ in _layers.find_linears(model)]
    # post-norm: the LayerNorms also feed the residual, so only value -> output.dense folds
    assert _mappings.find_mappings(model, names) == [
        (f"encoder.layer.{i}.attention.self.value", [f"encoder.layer.{i}.attention.output.dense"])
        for i in range(2)]
    calib = [{"input_ids": torch.randint(0, 100, (2, 16)),
              "attention_mask": torch.ones(2, 16, dtype=torch.long)} for _ in range(2)]
    with torch.no_grad():
        ref = model(**calib[0]).last_hidden_state
    smoothquant(model, calib, alpha=0.5)
    with torch.no_grad():
        assert _rel(model(**calib[0]).last_hidden_state, ref) < 1e-4
    assert len(gptq(model, calib, W4G32)) == len(names)


# ---------------------------------------------------------------- AWQ weight clipping


def _clip_brute_force(x, w, scheme, grid, n):
    """AutoAWQ's clip search by plain loops over rows, groups and candidates: per (row, group) the
    first bound (1 - i / grid) max|w_g| of least mean_t (x_g[t] . (q - w_g))^2, q the min/max
    grid of the clamped group. The grid in float32 scalars as the observer computes it (an
    asymmetric group clipped at both ends has min / scale = -7.5 exactly, a rounding tie that
    float64 would break the other way), the error in float64."""
    wq = _weights.resolve_w_qscheme(scheme, "test")
    qmin, qmax = wq.quant_min, wq.quant_max
    out_f, in_f = w.shape
    gs = wq.group_size or in_f
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    best = torch.empty(out_f, in_f // gs, dtype=torch.float64)
    errs = torch.empty(n, out_f, in_f // gs, dtype=torch.float64)
    xs = x.double().tolist()
    for r in range(out_f):
        for g in range(in_f // gs):
            wg = [f32(v) for v in w[r, g * gs:(g + 1) * gs].tolist()]
            amax = max(abs(v) for v in wg)
            for i in range(n):
                m = amax * (1 - i / grid)
                c = [torch.minimum(torch.maximum(v, -m), m) for v in wg]
                lo, hi = torch.clamp(min(c), max=0.0), torch.clamp(max(c), min=0.0)
                if wq.symmetric:
                    s, z = torch.maximum(-lo, hi) / ((qmax - qmin) / 2.0), 0.0
                else:
                    s = (hi - lo) / float(qmax - qmin)
                    z = torch.clamp(qmin - torch.round(lo / s), qmin, qmax)
                q = [((torch.clamp(torch.round(v * (1.0 / s)) + z, qmin, qmax) - z) * s).item()
                     for v in c]
                d = [qk - wk.item() for qk, wk in zip(q, wg)]
                e = [sum(row[g * gs + k] * d[k] for k in range(gs)) ** 2 for row in xs]
                errs[i, r, g] = sum(e) / len(e)
            i_best = min(range(n), key=lambda i: (errs[i, r, g].item(), i))  # first minimum
            best[r, g] = (amax * (1 - i_best / grid)).item()
    return best, errs


@pytest.mark.parametrize("scheme", [A4G32, W4G32, {"bit": 3, "symmetry": False,
                                                    "per_channel": True}])
def test_awq_clip_search_equals_brute_force(scheme):
    from mqbench.llm.awq import awq_search_clip
    wq = _weights.resolve_w_qscheme(scheme, "test")
    g = torch.Generator().manual_seed(5)
    x = _correlated_inputs(24, 64, seed=2, outliers=(3,))
    w = torch.randn(4, 64, generator=g)
    w[:, [7, 40]] *= 6.0  # outlier weights: clipping them pays in some groups
    max_val, errs = awq_search_clip(x, w, wq, grid=20, max_shrink=0.5, chunk=64 * 24)
    # chunk: 1 row (per channel) or 32 rows a batch
    ref_best, ref_errs = _clip_brute_force(x, w, scheme, 20, 10)
    torch.testing.assert_close(errs.double(), ref_errs, rtol=2e-4, atol=1e-6)
    torch.testing.assert_close(max_val.double(), ref_best, rtol=1e-6, atol=0)
    # the search clipped, and not by one ratio everywhere
    ratio = max_val / w.reshape(4, -1, wq.group_size or 64).abs().amax(-1)
    assert (ratio < 0.999).any() and len(ratio.unique()) > 1, ratio


@pytest.mark.parametrize("scheme", [A4G32, W4G32, {"bit": 4, "per_channel": True},
                                    {"bit": 4, "per_channel": False}])
def test_awq_clip_never_increases_the_objective(scheme):
    from mqbench.llm.awq import apply_clip, awq_search_clip, clip_objective
    wq = _weights.resolve_w_qscheme(scheme, "test")
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x = _correlated_inputs(256, 128, seed=seed, outliers=(5, 70))
        w = torch.randn(48, 128, generator=g) * torch.rand(1, 128, generator=g).add(0.2)
        w[torch.randint(0, 48, (6,), generator=g), torch.randint(0, 128, (6,), generator=g)] *= 8
        max_val, errs = awq_search_clip(x, w, wq)
        clipped = w.clone()
        apply_clip(clipped, max_val, wq)
        assert (clipped.abs() <= w.abs()).all()
        before, after = clip_objective(x, w, w, wq), clip_objective(x, w, clipped, wq)
        assert after <= before, (seed, after, before)
        assert after < 0.97 * before, (seed, after, before)  # outliers: clipping pays
        torch.testing.assert_close(after, errs.min(0).values.sum().item(), rtol=1e-4, atol=0)
        torch.testing.assert_close(before, errs[0].sum().item(), rtol=1e-4, atol=0)


def test_awq_clip_on_llama_not_worse_than_awq():
    import copy
    model = _tiny_llama()
    calib = _llama_calib()
    ref = _logits(model, calib)
    m_awq, m_clip = copy.deepcopy(model), copy.deepcopy(model)
    out0 = awq(m_awq, calib, A4G32, clip=False)
    out1 = awq(m_clip, calib, A4G32, clip=True)
    assert out0.clip == {}
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]
    # q / k projections are not clipped (AutoAWQ: their error meets in q k^T and a softmax)
    assert set(out1.clip) == {n for n in linears if not n.endswith(("q_proj", "k_proj"))}
    for n in linears:  # block 0's scales come before any clip: its q / k stay as scaled
        if n.endswith(("q_proj", "k_proj")) and n.startswith("model.layers.0."):
            assert torch.equal(dict(m_clip.named_modules())[n].weight,
                               dict(m_awq.named_modules())[n].weight)
    for name, r in out1.clip.items():
        assert r["loss"] <= r["loss_unclipped"], name
        assert ((r["ratio"] > 0.5) & (r["ratio"] <= 1 + 1e-6)).all()
    assert any((r["ratio"] < 0.999).any() for r in out1.clip.values())
    rtn(m_awq, A4G32)
    rtn(m_clip, A4G32)
    e_awq, e_clip = _rel(_logits(m_awq, calib), ref), _rel(_logits(m_clip, calib), ref)
    assert e_clip <= e_awq, (e_clip, e_awq)


# ---------------------------------------------------------------- GPT-2 Conv1D


def _tiny_gpt2(seed=0):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, use_cache=False)).eval()
    with torch.no_grad():
        model.transformer.wte.weight[:, [3, 17]] *= 30.0  # activation outliers, as _tiny_llama
    return model


def test_conv1d_is_quantized_as_the_linear_it_transposes():
    import copy
    pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D
    torch.manual_seed(0)
    conv = nn.Sequential(Conv1D(24, 64), nn.ReLU(), Conv1D(16, 24))
    lin = nn.Sequential(nn.Linear(64, 24), nn.ReLU(), nn.Linear(24, 16))
    with torch.no_grad():
        for c, li in ((conv[0], lin[0]), (conv[2], lin[2])):
            li.weight.copy_(c.weight.t())
            c.bias.normal_()
            li.bias.copy_(c.bias)
    assert [n for n, _ in _layers.find_linears(conv)] == ["0", "2"]
    calib = [_correlated_inputs(32, 64, seed=i) for i in range(2)]
    scheme = {"bit": 4, "symmetry": False, "per_channel": True, "group_size": 8}
    for fn in (lambda m: gptq(m, calib, scheme, block_size=16),
               lambda m: awq(m, calib, scheme, grid=5),
               lambda m: rtn(m, scheme)):
        a, b = copy.deepcopy(conv), copy.deepcopy(lin)
        ra, rb = fn(a), fn(b)
        assert set(ra) == set(rb) and ra, (ra, rb)  # awq: "0" -> ["2"] in both
        for i in (0, 2):
            assert a[i].weight.shape == conv[i].weight.shape  # Conv1D's [in, out] layout
            torch.testing.assert_close(a[i].weight.t(), b[i].weight, rtol=1e-5, atol=1e-6)
        if "zero_point" in ra["0"]:
            assert ra["0"]["conv1d"] and not rb["0"]["conv1d"]
            torch.testing.assert_close(ra["0"]["scale"], rb["0"]["scale"])


def test_gpt2_conv1d_gptq_awq_smoothquant():
    import copy
    model = _tiny_gpt2()
    calib = _llama_calib()
    ref = _logits(model, calib)
    names = [n for n, _ in _layers.find_linears(model)]
    assert names == [f"transformer.h.{i}.{p}" for i in range(2)
                     for p in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    m = copy.deepcopy(model)
    out = smoothquant(m, calib, alpha=0.5)
    assert set(out) == {f"transformer.h.{i}.{p}" for i in range(2)
                        for p in ("ln_1", "ln_2", "attn.c_attn[128:192]")}  # values -> c_proj
    assert _rel(_logits(m, calib), ref) < 1e-5
    m_rtn, m_gptq, m_awq = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model)
    rtn(m_rtn, A4G32)
    qp = gptq(m_gptq, calib, A4G32, block_size=32)
    res = awq(m_awq, calib, A4G32)
    assert "transformer.h.0.attn.c_attn" not in res.clip  # fused q/k/v: not clipped
    assert "transformer.h.0.mlp.c_fc" in res.clip
    rtn(m_awq, A4G32)
    e_rtn, e_gptq, e_awq = (_rel(_logits(x, calib), ref) for x in (m_rtn, m_gptq, m_awq))
    assert e_gptq < 0.8 * e_rtn, (e_gptq, e_rtn)
    assert e_awq <= e_rtn, (e_awq, e_rtn)
    assert all(v["conv1d"] for v in qp.values())
    # prepare_by_platform captures each Conv1D as the nn.Linear it transposes, with a weight
    # quantizer: GPTQ's grid loads into it, and GPTQ on the prepared model gives the same
    from mqbench.llm import load_weight_qparams
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    from mqbench.utils.state import enable_calibration_quantization
    with pytest.raises(ValueError, match="has no weight_fake_quant"):
        load_weight_qparams(m_gptq, qp)  # the float model
    config = {"example_inputs": calib[0], "extra_qconfig_dict": {"w_qscheme": A4G32},
              "extra_quantizer_dict": {"exclude_module_name": ["lm_head", "wte", "wpe"]}}
    prepared = prepare_by_platform(copy.deepcopy(m_gptq), BackendType.QDQ, config)
    enable_calibration_quantization(prepared, "weight_fake_quant")
    load_weight_qparams(prepared, qp)
    assert _rel(_logits(prepared, calib), _logits(m_gptq, calib)) < 1e-5
    first = prepare_by_platform(copy.deepcopy(model), BackendType.QDQ, config)
    enable_calibration_quantization(first, "weight_fake_quant")
    gptq(first, calib, A4G32, block_size=32)
    assert torch.equal(_logits(first, calib), _logits(prepared, calib))


@pytest.mark.parametrize("algo", ["awq", "smoothquant"])
def test_folding_on_a_prepared_gpt2(algo):
    # the capture turns each Conv1D into the Linear it transposes and inlines ln_1 / ln_2 as
    # layer_norm(x, shape, weight, bias): the folds (bias too, and the value third of c_attn)
    # land in what the prepared graph reads, as in the two-step flow
    import copy
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    model, calib = _tiny_gpt2(), _llama_calib()
    config = {"example_inputs": calib[0], "extra_qconfig_dict": {"w_qscheme": A4G32},
              "extra_quantizer_dict": {"exclude_module_name": ["lm_head", "wte", "wpe"]}}
    first = copy.deepcopy(model)
    expected = _fold(algo, first, calib, A4G32)
    two_step = prepare_by_platform(first, BackendType.QDQ, config)
    prepared = prepare_by_platform(copy.deepcopy(model), BackendType.QDQ, config)
    got = _fold(algo, prepared, calib, A4G32)
    assert list(got) == list(expected) and len(got) == 6
    assert torch.equal(_calibrated_logits(prepared, calib), _calibrated_logits(two_step, calib))


def test_awq_clip_search_sees_at_most_2_clip_tokens(monkeypatch):
    import importlib
    awq_module = importlib.import_module("mqbench.llm.awq")  # the package exports the function
    seen = []
    real = awq_module.awq_search_clip

    def spy(x, *args, **kwargs):
        seen.append(x.shape[0])
        return real(x, *args, **kwargs)
    monkeypatch.setattr(awq_module, "awq_search_clip", spy)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
    calib = [torch.randn(700, 32) for _ in range(3)]  # 2100 tokens per layer
    out = awq(model, calib, A4G32, clip_tokens=512)
    # AutoAWQ's stride 2100 // 512 = 4: 525 tokens, within [clip_tokens, 2 clip_tokens)
    assert seen == [525, 525] and set(out.clip) == {"0", "2"}
    seen.clear()
    awq(model, calib, A4G32, clip_tokens=5000)  # fewer tokens than asked: all of them
    assert seen == [2100, 2100]
    with pytest.raises(ValueError, match="max_shrink must be a number in \\[0, 1\\)"):
        awq(model, calib, A4G32, max_shrink=1.0)
