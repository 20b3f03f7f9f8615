"""mqbench.observer against torch's observers (the qparam formula) and against MQBench-style
references (observer_reference.py)."""
import copy
import io
import math

import pytest
import torch

import mqbench
from mqbench import observer as obs
import observer_reference as ref

EPS = torch.finfo(torch.float32).eps
ops = torch.ops.mqbench


def make(cls, bits=8, symmetric=True, per_channel=False, symmetric_range=False, **kw):
    if symmetric:
        qmin = -(2 ** (bits - 1)) + (1 if symmetric_range else 0)
        qmax = 2 ** (bits - 1) - 1
    else:
        qmin, qmax = 0, 2 ** bits - 1
    qscheme = {(True, False): torch.per_tensor_symmetric, (True, True): torch.per_channel_symmetric,
               (False, False): torch.per_tensor_affine,
               (False, True): torch.per_channel_affine}[(symmetric, per_channel)]
    return cls(dtype=torch.qint8 if symmetric else torch.quint8, qscheme=qscheme,
               quant_min=qmin, quant_max=qmax, ch_axis=0 if per_channel else -1, **kw)


# ---- the qparam formula ------------------------------------------------------------------

@pytest.mark.parametrize("qscheme,dtype,qrange", [
    (torch.per_tensor_symmetric, torch.qint8, (-128, 127)),
    (torch.per_tensor_symmetric, torch.qint8, (-127, 127)),
    (torch.per_tensor_symmetric, torch.qint8, (-8, 7)),
    (torch.per_tensor_symmetric, torch.quint8, (0, 255)),
    (torch.per_tensor_affine, torch.quint8, (0, 255)),
    (torch.per_tensor_affine, torch.quint8, (0, 15)),
    (torch.per_tensor_affine, torch.qint8, (-128, 127)),
    (torch.per_channel_symmetric, torch.qint8, (-127, 127)),
    (torch.per_channel_affine, torch.quint8, (0, 255)),
])
def test_calculate_qparams_bit_exact_against_torch(qscheme, dtype, qrange):
    g = torch.Generator().manual_seed(1)
    per_channel = qscheme in (torch.per_channel_symmetric, torch.per_channel_affine)
    shape = (16,) if per_channel else ()
    for trial in range(20):
        a = torch.randn(shape, generator=g) * 3 ** (trial % 5 - 2)
        b = torch.randn(shape, generator=g) * 3 ** (trial % 5 - 2)
        if trial % 4 == 0:  # all-positive range: the affine zero point is qmin
            a, b = a.abs(), b.abs()
        mn, mx = torch.minimum(a, b), torch.maximum(a, b)
        s_ref, z_ref = ref.torch_qparams(mn, mx, *qrange, qscheme, dtype)
        o = obs.MinMaxObserver(dtype=dtype, qscheme=qscheme, quant_min=qrange[0],
                               quant_max=qrange[1], ch_axis=0 if per_channel else -1)
        s, z = o._calculate_qparams(mn, mx)
        assert torch.equal(s, s_ref), (trial, s, s_ref)
        assert torch.equal(z.long(), z_ref.long()), (trial, z, z_ref)
        assert z.dtype == torch.int32


def test_qparams_of_wide_ranges():
    o = obs.MinMaxObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine, quant_min=0,
                           quant_max=65535)
    o(torch.tensor([-2.0, 3.0]))
    s, z = o.calculate_qparams()
    assert (o.quant_min, o.quant_max) == (0, 65535)
    assert s.item() == pytest.approx(5.0 / 65535, rel=1e-6)
    assert z.item() == round(2.0 / s.item())


def test_default_ranges_follow_dtype():
    assert obs.MinMaxObserver(dtype=torch.qint8)._calculate_qmin_qmax() == (-128, 127)
    assert obs.MinMaxObserver(dtype=torch.quint8).quant_max == 255
    assert obs.MinMaxObserver(dtype=torch.quint8, reduce_range=True).quant_max == 127


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_pot_scale(bits, symmetric):
    o = make(obs.MinMaxObserver, bits=bits, symmetric=symmetric, pot_scale=True)
    o(torch.linspace(-1.3, 2.9, 100))
    s, _ = o.calculate_qparams()
    plain, _ = o._calculate_qparams(o.min_val, o.max_val)
    assert s.item() == 2.0 ** round(math.log2(plain.item()))


# ---- statistics and updates ----------------------------------------------------------------

def test_min_max_running_over_batches_per_tensor_and_per_channel():
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(4, 6, 5, 5, generator=g) * (i + 1) for i in range(3)]
    o_t = make(obs.MinMaxObserver)
    o_c = obs.MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=1)
    for b in batches:
        o_t(b)
        o_c(b)
    allb = torch.cat(batches)
    assert o_t.min_val.item() == allb.min().item() and o_t.max_val.item() == allb.max().item()
    per = allb.transpose(0, 1).flatten(1)
    assert torch.equal(o_c.min_val, per.min(1).values)
    assert torch.equal(o_c.max_val, per.max(1).values)


@pytest.mark.parametrize("per_channel", [False, True])
def test_ema_over_batches(per_channel):
    g = torch.Generator().manual_seed(0)
    o = make(obs.EMAMinMaxObserver, per_channel=per_channel, ema_ratio=0.8)
    ref_min = ref_max = None
    for i in range(4):
        b = torch.randn(6, 10, generator=g) * (i + 1)
        o(b)
        cur = (b.min(1).values, b.max(1).values) if per_channel else (b.min(), b.max())
        if ref_min is None:
            ref_min, ref_max = cur
        else:
            ref_min = ref_min * 0.8 + cur[0] * (1.0 - 0.8)
            ref_max = ref_max * 0.8 + cur[1] * (1.0 - 0.8)
    assert torch.allclose(o.min_val, ref_min, rtol=0, atol=0)
    assert torch.allclose(o.max_val, ref_max, rtol=0, atol=0)


def test_clip_std_widens_to_mean_plus_k_std():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g) * 2 + 0.5
    o = make(obs.ClipStdObserver, std_scale=2.6)
    o(x)
    assert o.min_val.item() == pytest.approx(min(float(x.mean() - 2.6 * x.std()), float(x.min())), rel=1e-5)
    assert o.max_val.item() == pytest.approx(max(float(x.mean() + 2.6 * x.std()), float(x.max())), rel=1e-5)
    oc = make(obs.ClipStdObserver, per_channel=True, std_scale=1.0)
    w = torch.randn(8, 50, generator=g)
    oc(w)
    assert torch.allclose(oc.max_val, torch.maximum(w.mean(1) + w.std(1), w.max(1).values), rtol=1e-5)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("shift", [-0.5, 0.1])
def test_lsq_observer_initialisation(symmetric, per_channel, shift):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(8, 3, 4, 4, generator=g) * 2 + shift
    o = make(obs.LSQObserver, symmetric=symmetric, per_channel=per_channel)
    o(x)
    s, z = o.calculate_qparams()
    norm = x.flatten(1).abs().mean(1) if per_channel else x.abs().mean()
    s_ref = 2 * norm / math.sqrt(o.quant_max)
    assert torch.allclose(s.reshape(-1), s_ref.reshape(-1), rtol=1e-5)
    if symmetric:
        assert torch.all(z == 0)
        return
    # MQBench's z = qmin - round(min / s), with min per channel for a per-channel observer;
    # clamped to the range (MQBench leaves it out of range; its fake quantizer clamps it).
    mn = x.flatten(1).min(1).values if per_channel else x.min()
    z_ref = torch.clamp(o.quant_min - torch.round(mn / s.reshape(mn.shape)), o.quant_min,
                        o.quant_max)
    assert torch.equal(z.reshape(-1), z_ref.reshape(-1))
    if shift < 0:  # a negative minimum gives a zero point inside the range (was 0 before)
        assert torch.all(z > o.quant_min) and torch.all(z < o.quant_max)
    else:  # all positive: MQBench's value is below quant_min
        assert torch.all(z == o.quant_min)


@pytest.mark.parametrize("symmetric", [True, False])
def test_lsq_plus_observer_initialisation(symmetric):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g) * 0.3 + 1.0
    o = make(obs.LSQPlusObserver, symmetric=symmetric)
    o(x)
    s, z = o.calculate_qparams()
    m, sd = x.mean(), x.std()
    s_ref = torch.maximum((m - 3 * sd).abs(), (m + 3 * sd).abs()) / (o.quant_max - o.quant_min + 1)
    assert s.item() == pytest.approx(s_ref.item(), rel=1e-5)
    if not symmetric and x.min() >= 0:
        assert z.item() == o.quant_min - round(x.min().item() / s.item())


# ---- searches against MQBench-style loops ------------------------------------------------------

@pytest.mark.parametrize("symmetric,bits", [(True, 8), (False, 8), (True, 4), (False, 4)])
def test_mse_per_tensor_matches_reference_search(symmetric, bits):
    g = torch.Generator().manual_seed(bits)
    x = torch.cat([torch.randn(5000, generator=g), torch.randn(20, generator=g) * 8])
    o = make(obs.MSEObserver, bits=bits, symmetric=symmetric)
    o(x)
    mn, mx = torch.aminmax(x)
    rmin, rmax, rscore = ref.mse_search(x, mn, mx, o.quant_min, o.quant_max, symmetric, 95)
    ours = ref.mse_score(x, o.min_val, o.max_val, o.quant_min, o.quant_max, symmetric)
    # The same candidate, or (summation order) one whose score ties the reference's best.
    assert ours == pytest.approx(rscore, rel=1e-5)
    assert o.min_val.item() == pytest.approx(rmin.item(), rel=0.011)


def test_mse_per_channel_searches_each_channel():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(6, 64, 3, 3, generator=g) * torch.arange(1, 7).reshape(6, 1, 1, 1)
    w[2, 0, 0, 0] = 40.0  # an outlier in one channel only
    o = make(obs.MSEObserver, bits=4, per_channel=True)
    o(w)
    for c in range(6):
        mn, mx = torch.aminmax(w[c])
        _, _, rscore = ref.mse_search(w[c], mn, mx, o.quant_min, o.quant_max, True, 80)
        ours = ref.mse_score(w[c], o.min_val[c], o.max_val[c], o.quant_min, o.quant_max, True)
        assert ours == pytest.approx(rscore, rel=1e-5), c
    assert o.max_val[2] < 40.0  # 4-bit: clipping the outlier channel pays off


def test_ema_mse_averages_chosen_ranges():
    g = torch.Generator().manual_seed(0)
    o = make(obs.EMAMSEObserver, ema_ratio=0.5)
    single = make(obs.MSEObserver)
    b1, b2 = torch.randn(2000, generator=g), torch.randn(2000, generator=g) * 2
    o(b1)
    o(b2)
    m1 = ops.observer_mse_range(b1, -1, -128, 127, True, 0, single.eps, 2.0, 95)
    m2 = ops.observer_mse_range(b2, -1, -128, 127, True, 0, single.eps, 2.0, 95)
    assert o.max_val.item() == pytest.approx(m1[1].item() * 0.5 + m2[1].item() * 0.5, rel=1e-6)


def test_mse_with_p_other_than_two():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, generator=g)
    o = make(obs.MSEObserver, p=1.0)
    o(x)
    mn, mx = torch.aminmax(x)
    _, _, rscore = ref.mse_search(x, mn, mx, -128, 127, True, 95, p=1.0)
    assert ref.mse_score(x, o.min_val, o.max_val, -128, 127, True, p=1.0) == pytest.approx(rscore, rel=1e-5)


def test_quantile_observer_matches_cumulative_histogram():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(200000, generator=g), torch.tensor([60.0, -45.0])])
    o = make(obs.EMAQuantileObserver, threshold=0.9999)
    o(x)
    rmin, rmax = ref.quantile_range(x, threshold=0.9999)
    assert o.min_val.item() == pytest.approx(rmin.item(), rel=1e-5)
    assert o.max_val.item() == pytest.approx(rmax.item(), rel=1e-5)
    assert o.max_val.item() < 10  # the outliers were clipped


@pytest.mark.parametrize("threshold", [0.5, 0.9, 0.999, 0.99999, 1.0])
def test_quantile_selection_and_histogram_paths_agree_with_the_reference(threshold):
    # Up to 2^16 kept values the op selects the largest |x|; beyond, it builds the histogram.
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300000, generator=g) * 1.7 - 0.2
    lo, hi = torch.ops.mqbench.observer_quantile_range(x, threshold, 2048)
    rmin, rmax = ref.quantile_range(x, threshold=threshold)
    assert hi.item() == pytest.approx(rmax.item(), rel=1e-6)
    assert lo.item() == pytest.approx(rmin.item(), rel=1e-6)
    with pytest.raises(AssertionError, match="per-tensor"):
        make(obs.EMAQuantileObserver, per_channel=True)


@pytest.mark.parametrize("quant_type", ["input", "tensor", "param"])
def test_min_max_floor_pot_search(quant_type):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4000, generator=g) * 0.7
    o = make(obs.MinMaxFloorObserver)
    o.set_quant_type(quant_type)
    o(x)
    s, z = o.calculate_qparams()
    e = ref.pot_exponent(x, float(x.min()), float(x.max()), -128, 127, quant_type)
    assert s.item() == 2.0 ** -e and z.item() == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lsq_initial_scales_of_half_statistics_divide_by_the_number(dtype):
    """Half statistics divide by the number itself (float32 maths, as torch's own ops), not by
    it rounded to their dtype: 65536 (LSQ+ at 16 bits) is inf in float16."""
    t = torch.rand(1000, generator=torch.Generator().manual_seed(0)).to(dtype) + 0.1
    eps = torch.tensor([torch.finfo(torch.float32).eps])
    s, _ = torch.ops.mqbench.observer_lsq_qparams(t, torch.zeros(1000, dtype=dtype), 0, 127,
                                                  True, False, eps)
    assert s.dtype == dtype and torch.equal(s, 2 * t / 127 ** 0.5)
    mean, std = torch.tensor([1.0], dtype=dtype), torch.tensor([0.5], dtype=dtype)
    s, _ = torch.ops.mqbench.observer_lsq_plus_qparams(mean, std, torch.tensor([0.0]), 0, 65535,
                                                       True, False, eps)
    assert torch.equal(s, torch.maximum((mean - 3 * std).abs(), (mean + 3 * std).abs()) / 65536)


@pytest.mark.parametrize("range_n", [0, 129, 2 ** 40])
def test_pot_search_refuses_a_count_of_exponents_out_of_range(range_n):
    """range_n in [1, 128] on every device (2^40 would size the scores from the caller)."""
    x = torch.randn(100)
    with pytest.raises(RuntimeError, match=rf"range_n must be in \[1, 128\], got {range_n}"):
        torch.ops.mqbench.observer_pot_exponent(x, x.min(), x.max(), -128, 127, range_n, 3)
    assert torch.ops.mqbench.observer_pot_exponent(x, x.min(), x.max(), -128, 127, 128, 3) >= 0


def test_pot_mode_uses_the_most_frequent_exponent():
    g = torch.Generator().manual_seed(0)
    o = make(obs.PoTModeObserver)
    o.set_quant_type("tensor")
    scales = []
    for amp in (1.0, 1.0, 8.0):
        o(torch.randn(2000, generator=g) * amp)
        scales.append(o.calculate_qparams()[0].item())
    assert scales[2] == scales[0]  # two votes against one
    assert sum(o.counter) == 3
    with pytest.raises(ValueError, match="set the observer type"):
        make(obs.MinMaxFloorObserver).calculate_qparams()


# ---- bad input -------------------------------------------------------------------------------

ALL = [obs.MinMaxObserver, obs.EMAMinMaxObserver, obs.EMAQuantileObserver, obs.ClipStdObserver,
       obs.LSQObserver, obs.LSQPlusObserver, obs.MSEObserver, obs.EMAMSEObserver,
       obs.MinMaxFloorObserver, obs.PoTModeObserver]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
@pytest.mark.parametrize("case", ["empty", "nan", "inf", "constant", "zeros", "mixed"])
def test_degenerate_batches_give_finite_qparams(cls, case):
    x = {"empty": torch.empty(0, 4), "nan": torch.full((5, 4), float("nan")),
         "inf": torch.tensor([[float("inf"), float("-inf")]] * 3),
         "constant": torch.full((5, 4), 2.5), "zeros": torch.zeros(5, 4),
         "mixed": torch.tensor([[1.0, float("nan"), -2.0, float("inf")]])}[case]
    for symmetric in (True, False):
        o = make(cls, symmetric=symmetric)
        if hasattr(o, "set_quant_type"):
            o.set_quant_type("tensor")
        out = o(x)
        assert out is x or torch.equal(out.nan_to_num(), x.nan_to_num())
        s, z = o.calculate_qparams()
        assert torch.isfinite(s).all() and (s > 0).all(), (case, s)
        assert torch.isfinite(z.double()).all()
        if case == "mixed" and cls in (obs.MinMaxObserver, obs.EMAMinMaxObserver):
            assert (o.min_val.item(), o.max_val.item()) == (-2.0, 1.0)  # NaN and inf ignored


def test_per_channel_count_mismatch_is_an_error():
    o = make(obs.MinMaxObserver, per_channel=True)
    o(torch.randn(4, 3))
    with pytest.raises(RuntimeError, match="same channel count"):
        o(torch.randn(5, 3))


def test_observer_op_errors_name_the_argument():
    eps = torch.tensor([EPS])
    with pytest.raises(RuntimeError, match="ch_axis"):
        ops.observer_min_max(torch.randn(3, 4), 2)
    with pytest.raises(RuntimeError, match="call x.float"):
        ops.observer_min_max(torch.randn(3).half(), -1)
    with pytest.raises(RuntimeError, match="iters"):
        ops.observer_mse_range(torch.randn(3), -1, -128, 127, True, 0, eps, 2.0, 0)
    with pytest.raises(RuntimeError, match="eps"):
        ops.observer_calculate_qparams(torch.tensor(0.), torch.tensor(1.), 0, 255, False, 0,
                                       torch.tensor([0.0]))



@pytest.mark.parametrize("kwargs, message", [
    ({"bins": 2 ** 62}, r"bins must be an integer in \[1, 16777216\], got 4611686018427387904"),
    ({"bins": 0}, r"bins must be an integer in \[1, 16777216\], got 0"),
    ({"bins": 20.5}, r"bins must be an integer"),
    ({"threshold": 0.0}, r"threshold must be in \(0, 1\], got 0.0"),
    ({"threshold": float("nan")}, r"threshold must be in \(0, 1\], got nan"),
])
def test_quantile_observer_refuses_absurd_bins_and_thresholds(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(obs.EMAQuantileObserver, **kwargs)


def test_quantile_op_refuses_bin_counts_it_would_have_to_allocate():
    # A low threshold keeps many values: the histogram path, which allocates `bins` counters.
    x = torch.randn(1 << 18)
    with pytest.raises(ValueError, match=r"bins must be in \[1, 16777216\], got 4611686018427387904"):
        ops.observer_quantile_range(x, 0.5, 2 ** 62)
    with pytest.raises(ValueError, match="bins must be in"):
        ops.observer_quantile_range(x, 0.5, -1)
    with pytest.raises(ValueError, match="threshold"):
        ops.observer_quantile_range(x, 1.5, 2048)
    lo, hi = ops.observer_quantile_range(x, 0.5, mqbench._C.MAX_QUANTILE_BINS)
    assert 0 < float(hi) < float(x.abs().max())


# ---- module behaviour -----------------------------------------------------------------------

def test_state_dict_keys_and_per_channel_checkpoint_load():
    o = make(obs.EMAMinMaxObserver, per_channel=True)
    assert list(o.state_dict()) == ["eps", "min_val", "max_val"]
    o(torch.randn(8, 4))
    buf = io.BytesIO()
    torch.save(o.state_dict(), buf)
    buf.seek(0)
    fresh = make(obs.EMAMinMaxObserver, per_channel=True)
    fresh.load_state_dict(torch.load(buf))
    assert torch.equal(fresh.min_val, o.min_val) and fresh.min_val.shape == (8,)


def test_deepcopy_and_double():
    o = make(obs.MSEObserver)
    o(torch.randn(100))
    c = copy.deepcopy(o)
    assert torch.equal(c.max_val, o.max_val)
    d = make(obs.MinMaxObserver).double()
    d(torch.randn(50, dtype=torch.float64))
    s, _ = d.calculate_qparams()
    assert d.min_val.dtype == torch.float64 and s.dtype == torch.float64
