"""The observer ops (statistics, searches, running / EMA state, qparam formulas) on CUDA against
the CPU kernels (test_observers.py checks those). The comparison rules and the GPU skip:
cuda_harness.py."""
import pytest
import torch

from cuda_harness import (EXACT, FLOATS, INF, LAYOUTS, REDUCED, Case, assert_agree,
                          check_op_agrees_with_the_cpu_kernel, needs_gpu, on)

ops = torch.ops.mqbench


# Observers: ch_axis -1 is per tensor; 0, 1 and 3 per channel.
OBSERVER_AXES = [-1, 0, 1, 3]
STAT = REDUCED(1e-5, data_scale=True)


def _eps(d):
    return on(d, [torch.finfo(torch.float32).eps])


def observer_cases():
    c = [
        Case("observer_quantile_range[0.99999]", lambda x, g, a, d:
             ops.observer_quantile_range(x, 0.99999, 2048), [EXACT, EXACT], half=False),
        Case("observer_quantile_range[0.9]", lambda x, g, a, d:
             ops.observer_quantile_range(x, 0.9, 2048), [EXACT, EXACT], half=False),
        Case("observer_quantile_range[0.5,bins=7]", lambda x, g, a, d:
             ops.observer_quantile_range(x, 0.5, 7), [EXACT, EXACT], half=False),
    ]
    for range_n, mth in ((1, 2), (5, 2), (5, 3)):
        c.append(Case(f"observer_pot_exponent[n={range_n},mth={mth}]", lambda x, g, a, d, n=range_n,
                      m=mth: (ops.observer_pot_exponent(x, *ops.observer_min_max(x, -1), -128, 127,
                                                        n, m),), [EXACT], x_scale=0.7, half=False))
    for ch in OBSERVER_AXES:
        iters = 95 if ch == -1 else 80
        c += [
            Case(f"observer_min_max[{ch}]", lambda x, g, a, d, ch=ch:
                 ops.observer_min_max(x, ch), [EXACT, EXACT], half=False),
            Case(f"observer_moments[{ch}]", lambda x, g, a, d, ch=ch:
                 ops.observer_moments(x, ch), [STAT, STAT, STAT, EXACT, EXACT], half=False),
            Case(f"observer_clip_std_range[{ch}]", lambda x, g, a, d, ch=ch:
                 ops.observer_clip_std_range(x, ch, 2.6), [STAT, STAT], half=False),
            Case(f"observer_mse_range_symmetric_8bit[{ch}]", lambda x, g, a, d, ch=ch, it=iters:
                 ops.observer_mse_range(x, ch, -128, 127, True, 0, _eps(d), 2.0, it),
                 [EXACT, EXACT], half=False),
            Case(f"observer_mse_range_affine_4bit_p1[{ch}]", lambda x, g, a, d, ch=ch, it=iters:
                 ops.observer_mse_range(x, ch, 0, 15, False, 8, _eps(d), 1.0, it),
                 [EXACT, EXACT], half=False),
        ]
    return c


OBSERVER_CASES = observer_cases()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=["float32", "float64"])
@pytest.mark.parametrize("case", OBSERVER_CASES, ids=repr)
def test_observer_op_agrees_with_the_cpu_kernel(case, dtype, layout, device):
    check_op_agrees_with_the_cpu_kernel(case, dtype, layout, device)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", OBSERVER_CASES, ids=repr)
def test_observers_take_half_input_on_cuda(case, dtype):
    """Observers may compute and answer in float32: their statistics of half x equal the
    float32 observer's of x.float() (cast to the answer's dtype)."""
    x, g, a = case.inputs(dtype, "contiguous", "cuda")
    got = case.fn(x, g, a, "cuda")
    want = case.fn(x.float(), g.float(), a.float(), "cuda")
    for i, (o, w, k) in enumerate(zip(got, want, case.kinds)):
        what = f"{case.name} output {i} ({dtype})"
        if isinstance(o, torch.Tensor):
            assert o.dtype in (dtype, torch.float32), what
            w = w.to(o.dtype)
        assert_agree(o, w.cpu() if isinstance(w, torch.Tensor) else w, k, torch.float32, x.float(),
                     what)


# ---- ops on small state tensors ----------------------------------------------------------------

def _state_pairs(device):
    """(name, min_val, max_val, cur_min, cur_max): per tensor, per channel, the initial
    (+inf, -inf) state and batches without finite data."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(6, generator=g), torch.randn(6, generator=g)
    mn, mx = torch.minimum(a, b), torch.maximum(a, b)
    c, d = torch.randn(6, generator=g) * 2, torch.randn(6, generator=g) * 2
    cmn, cmx = torch.minimum(c, d), torch.maximum(c, d)
    cmn[2], cmx[2] = INF, -INF  # a channel without data in this batch
    init_mn, init_mx = torch.tensor(INF), torch.tensor(-INF)
    cases = [("per_tensor", mn[0], mx[0], cmn[0], cmx[0]),
             ("per_channel", mn, mx, cmn, cmx),
             ("first_per_channel_batch", init_mn, init_mx, cmn, cmx),
             ("first_per_tensor_batch", init_mn, init_mx, cmn[1], cmx[1]),
             ("per_tensor_float64", mn[0].double(), mx[0].double(), cmn[0].double(),
              cmx[0].double())]
    return [(n,) + tuple(t.to(device) for t in ts) for n, *ts in cases]


def test_observer_state_ops_agree_with_the_cpu(device):
    """Running min/max, EMA and the qparam formulas (per tensor, per channel, the initial state,
    symmetric / affine / narrow ranges, LSQ and LSQ+ initialisation): exactly the CPU's."""
    for (name, *dev), (_, *cpu) in zip(_state_pairs(device), _state_pairs("cpu")):
        for fn, label in [
            (lambda m, M, cm, cM: ops.observer_running_min_max(m, M, cm, cM), "running"),
            (lambda m, M, cm, cM: ops.observer_ema_min_max(m, M, cm, cM, 0.9), "ema"),
        ]:
            for o, w in zip(fn(*dev), fn(*cpu)):
                assert_agree(o, w, EXACT, torch.float32, w, f"{label} {name}")
        mn, mx = ops.observer_running_min_max(*cpu)
        mn_d, mx_d = ops.observer_running_min_max(*dev)
        for qrange, sym, szp in [((-128, 127), True, 0), ((-127, 127), True, 0),
                                 ((0, 255), False, 0), ((0, 15), False, 0), ((0, 255), True, 128),
                                 ((0, 65535), False, 0)]:
            eps = torch.tensor([torch.finfo(torch.float32).eps], dtype=mn.dtype)
            w = ops.observer_calculate_qparams(mn, mx, *qrange, sym, szp, eps)
            o = ops.observer_calculate_qparams(mn_d, mx_d, *qrange, sym, szp, eps.to(device))
            for oo, ww in zip(o, w):
                assert_agree(oo, ww, EXACT, torch.float32, ww, f"qparams {name} {qrange} {sym}")
        norm = mx.abs() + 0.1
        for sym in (True, False):
            for pot in (False, True):
                eps = torch.tensor([torch.finfo(torch.float32).eps])
                w = ops.observer_lsq_qparams(norm, mn, 0, 255, sym, pot, eps)
                o = ops.observer_lsq_qparams(norm.to(device), mn_d, 0, 255, sym, pot,
                                             eps.to(device))
                for oo, ww in zip(o, w):
                    assert_agree(oo, ww, EXACT, torch.float32, ww, f"lsq {name} {sym} {pot}")
                gmin = mn.min().abs()  # LSQ+ takes the global minimum (>= 0 gives an offset)
                w = ops.observer_lsq_plus_qparams(norm, norm * 0.5, gmin, 0, 255, sym, pot, eps)
                o = ops.observer_lsq_plus_qparams(norm.to(device), norm.to(device) * 0.5,
                                                  gmin.to(device), 0, 255, sym, pot,
                                                  eps.to(device))
                for oo, ww in zip(o, w):
                    assert_agree(oo, ww, EXACT, torch.float32, ww, f"lsq+ {name} {sym} {pot}")


@pytest.mark.parametrize("n", [256, 160000], ids=["selected", "histogram"])
def test_quantile_of_values_whose_bin_index_overflows_float(n, device):
    """|x| * bins above float's max (|x| > 1.7e35 at 2048 bins): each value still lands in its
    own bin, as in float64 (the product overflowed, and its conversion to an integer was
    undefined behaviour on the CPU and the last bin on CUDA). Both of the CPU's paths: the
    selection of the largest values (few to keep) and the histogram (many)."""
    x = torch.tensor([1e36, 5e35, 2.5e35, 1.0]).repeat(n // 4)
    for threshold in (0.5, 0.9):
        want = ops.observer_quantile_range(x.double(), threshold, 2048)
        got = ops.observer_quantile_range(x.to(device), threshold, 2048)
        for o, w in zip(got, want):
            assert_agree(o, w.float(), EXACT, torch.float32, x, f"quantile {threshold}")
    assert float(ops.observer_quantile_range(x, 0.5, 2048)[1]) < 3e35  # 2.5e35's bin
