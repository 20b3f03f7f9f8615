"""mqbench.mix_precision: Hessian estimators against exact Hessians, the bit-width ILP against
brute force, and the whole flow (sensitivity -> bit config under a budget -> applied model) on a
small digits CNN."""
import copy
import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.func import functional_call

from mqbench.mix_precision.hessian_per_layer import (hessian_per_layer, hessian_per_layer_acti,
                                                     hutchinson_trace, power_iteration)
from mqbench.mix_precision.mix_precision import (ILP_bit_selection, apply_bit_config,
                                                 bit_config_size, get_delta_w, hawq,
                                                 mixprecision_bit_selection,
                                                 mixprecision_profiling, model_size_analysis,
                                                 mp_model_size, mp_unquantized_size,
                                                 prec_degradation_by_layer)
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration, enable_quantization


@pytest.fixture(autouse=True)
def _quiet_logger():
    set_log_level("WARNING")
    yield
    set_log_level("INFO")


# ---- Hessian estimators vs the exact Hessian ---------------------------------------------

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.fc = nn.Linear(2 * 3 * 3, 3)

    def forward(self, x):
        return self.fc(torch.tanh(self.conv(x)).flatten(1))


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = Tiny().double()
    x = torch.randn(16, 1, 5, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (16,))
    return model, x, y, nn.CrossEntropyLoss()


def exact_weight_hessian(model, x, y, crit, layer):
    """d^2 L / dW^2 of one layer's weight, by torch.autograd.functional.hessian."""
    params = dict(model.named_parameters())
    w0 = params[layer + ".weight"].detach()

    def loss_of(w):
        p = dict(params)
        p[layer + ".weight"] = w
        return crit(functional_call(model, p, (x,)), y)
    return torch.autograd.functional.hessian(loss_of, w0).reshape(w0.numel(), w0.numel())


def top_eigenvalue(h):
    ev = torch.linalg.eigvalsh(h)
    return float(ev[ev.abs().argmax()])


def test_layer_trace_matches_exact_hessian_trace(tiny):
    model, x, y, crit = tiny
    comp = hessian_per_layer(model, crit, data=(x, y), generator=torch.Generator().manual_seed(0))
    traces = comp.layer_trace(maxIter=2000, tol=0)
    assert set(traces) == {"conv", "fc"}
    assert comp.iterations == {"conv": 2000, "fc": 2000}
    for layer in ("conv", "fc"):
        exact = float(exact_weight_hessian(model, x, y, crit, layer).trace())
        assert traces[layer] == pytest.approx(exact, rel=0.03), layer


def test_layer_eigenvalues_match_exact_hessian(tiny):
    model, x, y, crit = tiny
    comp = hessian_per_layer(model, crit, data=(x, y), generator=torch.Generator().manual_seed(1))
    eig = comp.layer_eigenvalues(maxIter=1000, tol=1e-10)
    for layer in ("conv", "fc"):
        exact = top_eigenvalue(exact_weight_hessian(model, x, y, crit, layer))
        assert eig[layer] == pytest.approx(exact, rel=1e-6), layer


def test_acti_hessian_matches_exact(tiny):
    model, x, y, crit = tiny
    comp = hessian_per_layer_acti(model, crit, data=(x, y),
                                  generator=torch.Generator().manual_seed(2))
    conv_out = model.conv(x).detach()
    h_conv = torch.autograd.functional.hessian(
        lambda a: crit(model.fc(torch.tanh(a).flatten(1)), y), conv_out).reshape(
            conv_out.numel(), -1)
    logits = model(x).detach()
    h_fc = torch.autograd.functional.hessian(lambda a: crit(a, y), logits).reshape(
        logits.numel(), -1)
    eig = comp.layer_eigenvalues(maxIter=1000, tol=1e-10)
    assert eig["conv"] == pytest.approx(top_eigenvalue(h_conv), rel=1e-6)
    assert eig["fc"] == pytest.approx(top_eigenvalue(h_fc), rel=1e-6)
    tr = comp.layer_trace(maxIter=1000, tol=0)
    assert tr["conv"] == pytest.approx(float(h_conv.trace()), rel=0.05)
    assert tr["fc"] == pytest.approx(float(h_fc.trace()), rel=0.05)


def test_dataloader_mode_equals_one_batch_and_leaves_model_alone(tiny):
    model, x, y, crit = tiny
    model.train()
    loader = [(x[:6], y[:6]), (x[6:], y[6:])]  # mean losses, weighted by batch size
    a = hessian_per_layer(model, crit, data=(x, y), generator=torch.Generator().manual_seed(3))
    b = hessian_per_layer(model, crit, dataloader=loader,
                          generator=torch.Generator().manual_seed(3))
    ta, tb = a.layer_trace(maxIter=20, tol=0), b.layer_trace(maxIter=20, tol=0)
    for layer in ta:
        assert tb[layer] == pytest.approx(ta[layer], rel=1e-9)
    # seeded: the same generator seed gives the same estimate
    c = hessian_per_layer(model, crit, data=(x, y), generator=torch.Generator().manual_seed(3))
    assert c.layer_trace(maxIter=20, tol=0) == ta
    assert model.training and all(m.training for m in model.modules())
    assert all(p.grad is None for p in model.parameters())
    model.eval()


def test_estimators_stop_on_tol_and_handle_zero_operator():
    diag = torch.tensor([5.0, 1.0, 0.5], dtype=torch.float64)
    value, iters = power_iteration(lambda v: diag * v, torch.ones(3, dtype=torch.float64),
                                   maxIter=500, tol=1e-9)
    assert value == pytest.approx(5.0, rel=1e-8) and iters < 500
    signs = itertools.cycle([torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)])
    trace, n = hutchinson_trace(lambda v: diag * v, lambda: next(signs), maxIter=100, tol=1e-3)
    assert trace == pytest.approx(6.5) and n == 2  # z^T D z = tr(D) exactly: stops at once
    assert power_iteration(lambda v: 0 * v, torch.ones(3), maxIter=10)[0] == 0.0
    with pytest.raises(ValueError, match="maxIter"):
        power_iteration(lambda v: v, torch.ones(3), maxIter=0)
    with pytest.raises(ValueError, match="tol"):
        hutchinson_trace(lambda v: v, lambda: torch.ones(3), tol=-1)


def test_hessian_argument_errors(tiny):
    model, x, y, crit = tiny
    with pytest.raises(ValueError, match="exactly one of data"):
        hessian_per_layer(model, crit)
    with pytest.raises(ValueError, match="exactly one of data"):
        hessian_per_layer(model, crit, data=(x, y), dataloader=[(x, y)])
    with pytest.raises(ValueError, match="one batch"):
        hessian_per_layer_acti(model, crit, dataloader=[(x, y)])
    with pytest.raises(ValueError, match="no Conv2d or Linear"):
        hessian_per_layer(nn.Sequential(nn.ReLU()), crit, data=(x, y))
    frozen = copy.deepcopy(model)
    frozen.fc.weight.requires_grad_(False)
    with pytest.raises(ValueError, match="require grad"):
        hessian_per_layer(frozen, crit, data=(x, y))
    with pytest.raises(ValueError, match="unknown type 'hessian'.*'trace', 'eigenvalues'"):
        hawq(model, (x, y), crit, type="hessian")


# ---- ILP against brute force --------------------------------------------------------------

def brute_force(bits, sens, params, budget_mb):
    best = None
    layers = list(sens)
    for combo in itertools.product(range(len(bits)), repeat=len(layers)):
        size = sum(bits[j] * params[n] for n, j in zip(layers, combo)) / (8 * 1024 * 1024)
        if size > budget_mb:
            continue
        value = sum(sens[n][j] for n, j in zip(layers, combo))
        if best is None or value < best[0]:
            best = (value, {n: bits[j] for n, j in zip(layers, combo)})
    return best


@pytest.mark.parametrize("seed", range(4))
def test_ilp_finds_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    bits = [2, 4, 8]
    layers = [f"block{i}.conv" for i in range(4)] + ["fc"]
    params = {n: int(rng.integers(5_000, 200_000)) for n in layers}
    # sensitivities falling with the bit width, at random per-layer scales
    sens = {n: sorted(rng.exponential(1.0, 3) * rng.uniform(0.1, 10), reverse=True)
            for n in layers}
    smallest = bit_config_size({n: 2 for n in layers}, params)
    largest = bit_config_size({n: 8 for n in layers}, params)
    for frac in (0.1, 0.4, 0.75):
        budget = smallest + frac * (largest - smallest)
        config = ILP_bit_selection(bits, sens, params, budget, None)
        best_value, best_config = brute_force(bits, sens, params, budget)
        value = sum(sens[n][bits.index(b)] for n, b in config.items())
        assert value == pytest.approx(best_value, rel=1e-9, abs=1e-12)
        assert config == best_config
        assert bit_config_size(config, params) <= budget
    # the whole budget: every layer at 8 bits; the smallest: every layer at 2 bits
    assert set(ILP_bit_selection(bits, sens, params, largest).values()) == {8}
    assert set(ILP_bit_selection(bits, sens, params, smallest).values()) == {2}


def test_ilp_errors():
    bits = [2, 4]
    params = {"a": 1024 * 1024, "b": 1024 * 1024}  # 0.25 MB each at 2 bits
    sens = {"a": [1.0, 0.5], "b": [2.0, 0.1]}
    with pytest.raises(ValueError, match="infeasible.*at least 0.5"):
        ILP_bit_selection(bits, sens, params, 0.4)
    with pytest.raises(ValueError, match="infeasible"):  # the fixed part counts too
        ILP_bit_selection(bits, sens, params, 0.6, fixed_size_mb=0.2)
    with pytest.raises(ValueError, match="only in sensetive_dict: \\['c'\\]"):
        ILP_bit_selection(bits, {**sens, "c": [0, 0]}, params, 1.0)
    with pytest.raises(ValueError, match="has 3 values for 2 bit widths"):
        ILP_bit_selection(bits, {"a": [1, 2, 3], "b": [1, 2]}, params, 1.0)
    with pytest.raises(NotImplementedError, match="latency"):
        ILP_bit_selection(bits, sens, params, 1.0, latency_constraints=5)
    with pytest.raises(ValueError, match="model_size_constraints"):
        ILP_bit_selection(bits, sens, params, None)
    with pytest.raises(ValueError, match="repeated"):
        ILP_bit_selection([2, 2], sens, params, 1.0)
    with pytest.raises(ValueError, match="bit width must be an int in \\[2, 16\\]"):
        ILP_bit_selection([1, 4], sens, params, 1.0)
    # 0.75 MB: one layer can take 4 bits; the one whose sensitivity drops most (b) gets them
    assert mixprecision_bit_selection(bits, sens, params, 0.75) == {"a": 2, "b": 4}


# ---- end to end on a digits CNN -----------------------------------------------------------

class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(16, 16, 3, padding=1)
        self.relu3 = nn.ReLU()
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.pool(self.relu2(self.conv2(x)))
        x = self.relu3(self.conv3(x))
        return self.fc(x.flatten(1))


ACADEMIC_W8A8 = {"extra_qconfig_dict": {
    "w_qscheme": {"bit": 8, "symmetry": True, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 8, "symmetry": False, "per_channel": False, "pot_scale": False},
    "w_fakequantize": "FixedFakeQuantize", "a_fakequantize": "FixedFakeQuantize",
    "w_observer": "MinMaxObserver", "a_observer": "EMAMinMaxObserver"}}


@pytest.fixture(scope="module")
def digits():
    """A DigitsCNN trained briefly on sklearn's digits, and its calibrated W8A8 twin."""
    from sklearn.datasets import load_digits
    set_log_level("WARNING")
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target)
    torch.manual_seed(0)
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    crit = nn.CrossEntropyLoss()
    for _ in range(60):
        idx = torch.randint(0, len(y), (128,))
        loss = crit(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    qmodel = prepare_by_platform(copy.deepcopy(model), BackendType.Academic, ACADEMIC_W8A8)
    enable_calibration(qmodel)
    with torch.no_grad():
        qmodel(x[:512])
    enable_quantization(qmodel)
    return model, qmodel, x, y, crit


def per_channel_weight_quant(w, bits):
    """Independent reference: symmetric per-channel fake quantization with torch's own op."""
    qmax = 2 ** (bits - 1) - 1
    amax = w.detach().flatten(1).abs().amax(1)
    scale = (amax / ((qmax - (-qmax - 1)) / 2)).clamp(min=torch.finfo(torch.float32).eps)
    return torch.fake_quantize_per_channel_affine(
        w.detach(), scale, torch.zeros_like(scale, dtype=torch.int32), 0, -qmax - 1, qmax)


def test_size_helpers(digits):
    model, qmodel, *_ = digits
    params = model_size_analysis(model)
    assert params == {"conv1": 72, "conv2": 1152, "conv3": 2304, "fc": 2560}
    mb = 8 * 1024 * 1024
    assert mp_unquantized_size(qmodel) == pytest.approx(8 * 32 / mb)  # bn1.weight
    assert mp_model_size(qmodel) == pytest.approx((sum(params.values()) * 8 + 8 * 32) / mb)
    assert mp_model_size(model) == pytest.approx((sum(params.values()) + 8) * 32 / mb)


def test_get_delta_w_matches_reference_and_leaves_model(digits):
    model, qmodel, *_ = digits
    before = {k: v.clone() for k, v in qmodel.state_dict().items()}
    delta = get_delta_w(qmodel, [2, 4, 8])
    assert set(delta) == {"conv1", "conv2", "conv3", "fc"}
    for name, values in delta.items():
        w = getattr(model, name).weight.detach()
        ref = [float(((w - per_channel_weight_quant(w, b)) ** 2).mean()) for b in (2, 4, 8)]
        np.testing.assert_allclose(values, ref, rtol=1e-5)
        assert values[0] > values[1] > values[2] > 0
    after = qmodel.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(getattr(qmodel, n).weight_fake_quant.bitwidth == 8 for n in delta)
    # the error is that of the current weight, not of what the quantizer observed before
    shrunk = copy.deepcopy(qmodel)
    shrunk.conv2.weight.data *= 0.5
    w = shrunk.conv2.weight.detach()
    np.testing.assert_allclose(get_delta_w(shrunk, [4])["conv2"],
                               [float(((w - per_channel_weight_quant(w, 4)) ** 2).mean())],
                               rtol=1e-5)


def test_naive_sensitivity_matches_reference(digits):
    model, qmodel, x, y, crit = digits
    xs, ys = x[:256], y[:256]
    switches = [(m.observer_enabled.clone(), m.fake_quant_enabled.clone())
                for m in qmodel.modules() if hasattr(m, "fake_quant_enabled")]
    sens = prec_degradation_by_layer(model, qmodel, [2, 4], (xs, ys), crit)
    with torch.no_grad():
        fp = float(crit(model(xs), ys))
        for name in ("conv2", "fc"):
            ref_model = copy.deepcopy(model)
            layer = getattr(ref_model, name)
            for k, b in enumerate((2, 4)):
                layer.weight.data = per_channel_weight_quant(getattr(model, name).weight, b)
                ref = float(crit(ref_model(xs), ys)) - fp
                assert sens[name][k] == pytest.approx(ref, rel=1e-3, abs=1e-6), (name, b)
    after = [(m.observer_enabled, m.fake_quant_enabled)
             for m in qmodel.modules() if hasattr(m, "fake_quant_enabled")]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(switches, after))


def measured_loss(qmodel, config, x, y, crit):
    trial = copy.deepcopy(qmodel)
    apply_bit_config(trial, config)
    with torch.no_grad():
        return float(crit(trial(x), y)), mp_model_size(trial)


@pytest.mark.parametrize("algo", ["naive", "hawq_trace"])
def test_end_to_end_budgeted_bit_config(digits, algo):
    model, qmodel, x, y, crit = digits
    bits = [2, 4, 8]
    layers = model_size_analysis(model)
    sens = mixprecision_profiling(model, qmodel, bits, (x[:512], y[:512]), crit, algo=algo,
                                  maxIter=50, generator=torch.Generator().manual_seed(0))
    assert set(sens) == set(layers) and all(len(v) == 3 for v in sens.values())
    fixed = mp_unquantized_size(qmodel)
    all2 = fixed + bit_config_size({n: 2 for n in layers}, layers)
    all8 = fixed + bit_config_size({n: 8 for n in layers}, layers)
    budget = all2 + 0.25 * (all8 - all2)
    config = mixprecision_bit_selection(bits, sens, layers, budget, fixed_size_mb=fixed)
    assert set(config.values()) != {2}, config  # the budget buys more than all-2-bit
    loss_mixed, size_mixed = measured_loss(qmodel, config, x, y, crit)
    assert size_mixed <= budget
    assert size_mixed == pytest.approx(fixed + bit_config_size(config, layers))
    # A badly chosen config at least as large: the most sensitive layer (at 2 bits) at 2 bits,
    # every other layer at 8.
    worst = max(layers, key=lambda n: sens[n][0])
    bad = {n: 2 if n == worst else 8 for n in layers}
    loss_bad, size_bad = measured_loss(qmodel, bad, x, y, crit)
    assert size_bad >= size_mixed
    assert loss_mixed < loss_bad
    # and the uniform config that fits the budget (all 2 bits) is worse too
    loss_all2, _ = measured_loss(qmodel, {n: 2 for n in layers}, x, y, crit)
    assert loss_mixed < loss_all2


def test_apply_bit_config_sets_ranges_and_qparams(digits):
    model, qmodel, *_ = digits
    trial = copy.deepcopy(qmodel)
    apply_bit_config(trial, {"conv2": 2, "fc": 4})
    fq = trial.conv2.weight_fake_quant
    assert (fq.quant_min, fq.quant_max, fq.bitwidth) == (-2, 1, 2)
    obs = fq.activation_post_process
    assert (obs.quant_min, obs.quant_max) == (-2, 1)
    amax = model.conv2.weight.detach().flatten(1).abs().amax(1)
    torch.testing.assert_close(fq.scale, amax / 1.5)
    with torch.no_grad():
        torch.testing.assert_close(fq(model.conv2.weight),
                                   per_channel_weight_quant(model.conv2.weight, 2))
    assert trial.conv1.weight_fake_quant.bitwidth == 8
    with pytest.raises(KeyError, match="\\['conv9'\\] are not layers.*'conv1', 'conv2'"):
        apply_bit_config(trial, {"conv9": 4})
    with pytest.raises(ValueError, match="bit_config\\['fc'\\]"):
        apply_bit_config(trial, {"fc": 40})


def test_unknown_algo_lists_choices(digits):
    model, qmodel, x, y, crit = digits
    with pytest.raises(ValueError, match="'hawq'.*'naive', 'hawq_eigen', 'hawq_trace'"):
        mixprecision_profiling(model, qmodel, [2, 4], (x, y), crit, algo="hawq")
    with pytest.raises(ValueError, match="bitwidth_list is empty"):
        mixprecision_profiling(model, qmodel, [], (x, y), crit)


def test_prepare_by_platform_takes_the_selected_bit_config(digits):
    """The selection's {layer: bits} goes into prepare_by_platform as w_qscheme_by_layer: each
    layer gets its own weight quantizer at its bit width, and the calibrated model computes
    what apply_bit_config gives on the uniform model."""
    from mqbench.utils.config import UnknownNameError
    model, qmodel, x, y, crit = digits
    config = {"conv1": 8, "conv2": 2, "fc": {"bit": 4}}
    mixed = prepare_by_platform(copy.deepcopy(model), BackendType.Academic,
                                dict(ACADEMIC_W8A8, w_qscheme_by_layer=config))
    for name, bits in (("conv1", 8), ("conv2", 2), ("fc", 4)):
        fq = mixed.get_submodule(name).weight_fake_quant
        assert fq.quant_max - fq.quant_min + 1 == 2 ** bits, name
    enable_calibration(mixed)
    with torch.no_grad():
        mixed(x[:512])
    enable_quantization(mixed)
    trial = copy.deepcopy(qmodel)
    apply_bit_config(trial, {"conv1": 8, "conv2": 2, "fc": 4})
    with torch.no_grad():
        assert torch.allclose(mixed(x[:64]), trial(x[:64]), atol=1e-5)
    assert mp_model_size(mixed) == pytest.approx(mp_model_size(trial))
    with pytest.raises(UnknownNameError, match="conv9"):
        prepare_by_platform(copy.deepcopy(model), BackendType.Academic,
                            dict(ACADEMIC_W8A8, w_qscheme_by_layer={"conv9": 4}))
