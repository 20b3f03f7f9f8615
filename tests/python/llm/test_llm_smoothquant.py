"""mqbench.llm.smoothquant with alpha="auto" (Note [SmoothQuant's alpha search]): the search
against an independent W8A8 simulation built from torch's fake-quantize ops, the choice against
the fixed alphas on models with activation outliers, both objectives, bad input."""
import copy
import logging

import pytest
import torch
from torch import nn

from mqbench.llm import rtn, smoothquant
from mqbench.llm.smoothquant import _centres, _pick, smooth_scale, smoothquant_search_alpha

from test_llm import _llama_calib, _logits, _rel, _tiny_llama


def _outlier_mlp():
    """LayerNorm -> Linear -> ReLU -> Linear, with outlier channels in the norm's output and in
    the hidden activations (two groups to smooth: "0" -> ["1"], "1" -> ["3"])."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 128), nn.ReLU(),
                          nn.Linear(128, 64)).eval()
    with torch.no_grad():
        model[0].weight[[3, 17, 40]] = 40.0
        model[1].weight[[7, 90]] *= 30.0
    return model, [torch.randn(32, 64) for _ in range(4)]


def _w8a8(model, calib):
    """The model's outputs on ``calib`` with INT8 weights per output channel and every Linear's
    input rounded to INT8 per tensor, its scale the max over ``calib`` (static, [-127, 127])."""
    m = copy.deepcopy(model)
    rtn(m, {"bit": 8, "per_channel": True, "symmetric_range": True})
    linears = {n: mod for n, mod in m.named_modules()
               if isinstance(mod, nn.Linear) and "lm_head" not in n}
    amax = {n: 0.0 for n in linears}
    hooks = [mod.register_forward_pre_hook(
        lambda _m, a, n=n: amax.__setitem__(n, max(amax[n], a[0].abs().max().item())))
        for n, mod in linears.items()]
    run = (lambda: _logits(m, calib)) if isinstance(calib[0], dict) else \
        (lambda: m(torch.cat(calib)))
    with torch.no_grad():
        run()
    for h in hooks:
        h.remove()
    for n, mod in linears.items():
        mod.register_forward_pre_hook(lambda _m, a, n=n: (torch.fake_quantize_per_tensor_affine(
            a[0], amax[n] / 127, 0, -127, 127),))
    with torch.no_grad():
        return run()


def _oracle_loss(x, weights, s):
    """The search's error of candidate scale s, from torch's fake-quantize ops: per token
    |Qa(X / s) Qw(W s)^T - X W^T|^2 / |X W^T|^2, averaged, summed over the weights."""
    xs = x / s
    xq = torch.fake_quantize_per_tensor_affine(xs, xs.abs().max().item() / 127, 0, -127, 127)
    total = 0.0
    for w in weights:
        ws = w * s
        scale = ws.abs().amax(1) / 127
        wq = torch.fake_quantize_per_channel_affine(ws, scale, torch.zeros(len(scale),
                                                    dtype=torch.int32), 0, -127, 127)
        ref = (x @ w.t()).double()
        err = (xq @ wq.t()).double() - ref
        total += (err.pow(2).sum(1) / ref.pow(2).sum(1)).mean().item()
    return total


def test_search_scores_every_candidate_as_the_fake_quantize_simulation():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 48, generator=g)
    x[:, [5, 30]] *= 25.0  # outlier channels
    weights = [torch.randn(32, 48, generator=g), torch.randn(16, 48, generator=g)]
    act_max = x.abs().amax(0)
    grid = 10
    s, alpha, losses = smoothquant_search_alpha(x, weights, act_max, grid)
    w_max = torch.stack([w.abs().amax(0) for w in weights]).amax(0)
    for i in range(grid + 2):
        cand = smooth_scale(act_max, w_max, i / grid) if i <= grid else torch.ones(48)
        assert losses[i].item() == pytest.approx(_oracle_loss(x, weights, cand), rel=1e-4), i
    best = int(losses.argmin())
    assert best <= grid and alpha == best / grid  # the outliers make some scaling win
    assert losses[best] < 0.5 * losses[grid + 1]
    assert torch.equal(s, smooth_scale(act_max, w_max, alpha))


def test_search_keeps_the_weights_when_no_scaling_ties():
    # every channel's activation and weight maxima are 1: s = 1 for every alpha, all tie
    x = torch.ones(8, 16)
    w = torch.ones(4, 16)
    s, alpha, losses = smoothquant_search_alpha(x, [w], x.abs().amax(0), 4)
    assert alpha is None and torch.equal(s, torch.ones(16))
    assert torch.all(losses == losses[-1])


@pytest.mark.parametrize("objective", ["layer", "block"])
def test_auto_beats_the_fixed_alphas_on_an_outlier_mlp(objective):
    model, calib = _outlier_mlp()
    x = torch.cat(calib)
    with torch.no_grad():
        ref = model(x)
    errors = {}
    for alpha in (0.5, 1.0, "auto"):
        m = copy.deepcopy(model)
        out = smoothquant(m, calib, alpha=alpha, objective=objective)
        assert set(out) == {"0", "1"}
        with torch.no_grad():
            assert _rel(m(x), ref) < 1e-4  # float function kept
        errors[alpha] = _rel(_w8a8(m, calib), ref)
        if alpha == "auto":
            for entry in out.values():
                assert entry["alpha"] is not None and 0 <= entry["alpha"] <= 1
                assert entry["scored_on"] == ("layer" if objective == "layer" else "")
                assert len(entry["losses"]) == 22
    errors["none"] = _rel(_w8a8(model, calib), ref)
    assert errors["auto"] < 0.3 * errors["none"], errors
    assert errors["auto"] < min(errors[0.5], errors[1.0]), errors


@pytest.mark.parametrize("objective", ["layer", "block"])
def test_auto_on_a_llama_keeps_float_and_beats_the_fixed_alphas(objective):
    model = _tiny_llama()
    calib = _llama_calib()
    ref = _logits(model, calib)
    errors = {}
    for alpha in (0.5, 1.0, "auto"):
        m = copy.deepcopy(model)
        out = smoothquant(m, calib, alpha=alpha, objective=objective)
        assert len(out) == 8
        assert _rel(_logits(m, calib), ref) < 1e-4
        errors[alpha] = _rel(_w8a8(m, calib), ref)
        if alpha == "auto":
            scored = {p: e["scored_on"] for p, e in out.items()}
            if objective == "block":  # the module holding producer and consumers
                assert scored["model.layers.0.input_layernorm"] == "model.layers.0"
                assert scored["model.layers.0.self_attn.v_proj"] == "model.layers.0.self_attn"
                assert scored["model.layers.1.mlp.up_proj"] == "model.layers.1.mlp"
            else:
                assert set(scored.values()) == {"layer"}
    errors["none"] = _rel(_w8a8(model, calib), ref)
    assert errors["auto"] < 0.6 * errors["none"], errors
    assert errors["auto"] < min(errors[0.5], errors[1.0]), errors


class _NormFc(nn.Module):
    """LayerNorm (two outlier channels) -> Linear, the Linear called positionally, with a
    keyword input, or its output returned in a dict (``how``)."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.norm = nn.LayerNorm(32)
        self.fc = nn.Linear(32, 8)
        with torch.no_grad():
            self.norm.weight[[2, 9]] = 30.0

    def forward(self, x):
        h = self.norm(x)
        if self.how == "keyword":
            return self.fc(input=h)
        y = self.fc(h)
        return {"y": y} if self.how == "dict" else y


def _norm_fc(how):
    torch.manual_seed(0)
    return _NormFc(how).eval(), [torch.randn(16, 32) for _ in range(2)]


def test_block_objective_falls_back_to_the_layers_when_the_scope_returns_no_tensor(caplog):
    model, calib = _norm_fc("dict")
    with caplog.at_level(logging.INFO, logger="MQBENCH"):
        out = smoothquant(model, calib, alpha="auto", objective="block")
    assert out["norm"]["scored_on"] == "layer"
    assert "the output of _NormFc holds no tensor" in caplog.text


@pytest.mark.parametrize("kwargs, match", [
    ({"alpha": "best"}, "alpha must be a number in \\[0, 1\\] or 'auto'"),
    ({"alpha": 1.5}, "alpha must be"),
    ({"alpha": True}, "alpha must be"),
    ({"alpha": "auto", "objective": "model"}, "objective must be 'block' or 'layer'"),
    ({"alpha": "auto", "grid": 0}, "grid must be a positive integer"),
    ({"alpha": "auto", "max_tokens": 0}, "max_tokens must be a positive integer"),
])
def test_bad_arguments_refused_before_anything_changes(kwargs, match):
    model, calib = _outlier_mlp()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=match):
        smoothquant(model, calib, **kwargs)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_token_subsample_takes_stride_centres_never_the_first_row():
    x = torch.arange(100.0).view(100, 1)
    assert _centres(x, 4).flatten().tolist() == [12.0, 37.0, 62.0, 87.0]
    assert _centres(x, 1).flatten().tolist() == [50.0]
    assert torch.equal(_centres(x, 200), x)


def test_a_non_finite_loss_never_wins():
    act_max, w_max = torch.full((4,), 2.0), torch.ones(4)
    losses = torch.tensor([float("nan"), 0.5, float("inf"), 1.0], dtype=torch.float64)
    s, alpha = _pick(losses, act_max, w_max, 2)  # candidates: alpha 0, 0.5, 1, none
    assert alpha == 0.5 and torch.allclose(s, smooth_scale(act_max, w_max, 0.5))
    s, alpha = _pick(torch.full((4,), float("nan"), dtype=torch.float64), act_max, w_max, 2)
    assert alpha is None and torch.equal(s, torch.ones(4))


def test_the_block_search_quantizes_a_consumer_called_with_a_keyword_input():
    # the same model and weights, fc(h) against fc(input=h): the same search, loss for loss
    # (a keyword input left float would change every candidate's loss)
    found = {}
    for how in ("positional", "keyword"):
        model, calib = _norm_fc(how)
        found[how] = smoothquant(model, calib, alpha="auto", objective="block")["norm"]
        assert found[how]["scored_on"] == ""
    assert torch.equal(found["keyword"]["losses"], found["positional"]["losses"])
    assert found["keyword"]["alpha"] is not None
