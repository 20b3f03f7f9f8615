"""Benchmark of mqbench.llm's C++ ops against their torch references, and the GPTQ re-grid check.

    PYTHONPATH=python .venv/bin/python bench/bench_llm.py [--rounds 3] [--out 1024 --in 1024]
    PYTHONPATH=python .venv/bin/python bench/bench_llm.py --threads 1 \
        --shapes 512x512,1536x512,512x1536

``--shapes OUTxIN,...`` times only the two GPTQ ops, on the layer shapes of a decoder (above:
hidden 512's) (docs/design/llm.md): per shape, the median
of 5 calls after one warm-up of ``gptq_quantize_weight`` (INT4 g128 asymmetric, act_order, the
Hessian of 8,192 random rows) and of ``gptq_hessian_update`` on 2,048 rows of width IN, each
beside the Python reference on the same inputs in the same process.

1. Time (medians over rounds, interleaved) of GPTQ on one [out, in] layer, INT4 g128,
   block 128: ``torch.ops.mqbench.gptq_quantize_weight`` (C++) vs
   ``gptq_quantize_weight_reference`` (the same ATen ops driven from Python, the tests' oracle in
   tests/python/reference.py), and of AWQ's
   20-point search on [2048, in] tokens for two [out, in] Linears.
2. GPTQ's grid vs a MinMax observer re-observing GPTQ's weights (docs/llm.md, "Composing with
   prepare_by_platform"): relative output error of RTN, GPTQ, and GPTQ re-rounded, on a 64 x 128
   layer with correlated inputs, for three INT4 ranges.
The peer comparison (torchao, modelopt, AutoRound, llm-compressor) is bench/llm_peers.py.
"""
import argparse
import os
import statistics
import sys
import time

import torch

import mqbench  # noqa: F401  (loads the ops)
from mqbench.llm import _weights
from mqbench.llm.awq import awq_weight_mean

# the torch formulations the C++ ops are timed against: the tests' oracles
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))
from reference import (awq_search_scale_reference, gptq_quantize_weight_reference,  # noqa: E402
                       hessian_update_reference)


def correlated(n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d // 4, generator=g)
    return z @ torch.randn(d // 4, d, generator=g) + 0.1 * torch.randn(n, d, generator=g)


def timed(fn, rounds):
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def median_ms(fn, calls=5):
    fn()  # warm-up
    return timed(fn, calls) * 1e3


def op_shapes(shapes):
    """The GPTQ ops on decoder layer shapes, against the reference (docs/design/llm.md)."""
    wq = _weights.resolve_w_qscheme({"bit": 4, "symmetry": False, "per_channel": True,
                                    "group_size": 128}, "bench")
    print("| out x in | gptq_quantize_weight ms | reference ms | gptq_hessian_update ms "
          "(2,048 rows) | reference ms |")
    print("|---|---|---|---|---|")
    for shape in shapes.split(","):
        out_f, in_f = (int(v) for v in shape.split("x"))
        g = torch.Generator().manual_seed(0)
        X = torch.randn(8192, in_f, generator=g)
        H = X.t() @ X / 8192
        w = torch.randn(out_f, in_f, generator=g)
        args = (*wq.as_args(), 128, 0.01, True, "b")
        x, H0 = X[:2048].contiguous(), torch.randn(in_f, in_f, generator=g)
        H0 = H0 + H0.t()
        cells = [median_ms(lambda: torch.ops.mqbench.gptq_quantize_weight(w, H, *args)),
                 median_ms(lambda: gptq_quantize_weight_reference(w, H, wq, 128, 0.01, True)),
                 median_ms(lambda: torch.ops.mqbench.gptq_hessian_update(H0, x, 2048)),
                 median_ms(lambda: hessian_update_reference(H0, x, 2048))]
        print(f"| {out_f} x {in_f} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=None,
                    help="OUTxIN,...: time only the GPTQ ops on these layer shapes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--out", type=int, default=1024)
    ap.add_argument("--in", dest="in_f", type=int, default=1024)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if a.shapes:
        return op_shapes(a.shapes)
    wq = _weights.resolve_w_qscheme({"bit": 4, "per_channel": True, "group_size": 128}, "bench")
    x = correlated(4096, a.in_f)
    w = torch.randn(a.out, a.in_f)
    H = hessian_update_reference(torch.zeros(a.in_f, a.in_f), x, 0)
    def cpp():
        return torch.ops.mqbench.gptq_quantize_weight(w, H, *wq.as_args(), 128, 0.01, False, "b")

    def ref():
        return gptq_quantize_weight_reference(w, H, wq, 128, 0.01, False)
    cpp()
    t_cpp, t_ref = [], []
    for _ in range(a.rounds):
        t_cpp.append(timed(cpp, 1))
        t_ref.append(timed(ref, 1))
    print(f"gptq [{a.out}, {a.in_f}] g128: C++ {statistics.median(t_cpp) * 1e3:.0f} ms, "
          f"Python reference {statistics.median(t_ref) * 1e3:.0f} ms, "
          f"ratio {statistics.median(t_ref) / statistics.median(t_cpp):.2f}x")
    xs = x[:2048]
    ws = [w, torch.randn(a.out, a.in_f)]
    args = (xs, ws, xs.abs().mean(0), awq_weight_mean(ws, wq), 20)
    t_cpp = timed(lambda: torch.ops.mqbench.awq_search_scale(*args, *wq.as_args()), a.rounds)
    t_ref = timed(lambda: awq_search_scale_reference(*args, wq), a.rounds)
    print(f"awq search 2 x [{a.out}, {a.in_f}], 2048 tokens, grid 20: C++ {t_cpp * 1e3:.0f} ms, "
          f"Python reference {t_ref * 1e3:.0f} ms, ratio {t_ref / t_cpp:.2f}x")

    print("\nGPTQ's grid vs a MinMax observer re-rounding GPTQ's weights (64 x 128, g32):")
    for scheme in ({"bit": 4, "per_channel": True, "group_size": 32},
                   {"bit": 4, "per_channel": True, "group_size": 32, "symmetric_range": True},
                   {"bit": 4, "symmetry": False, "per_channel": True, "group_size": 32}):
        q = _weights.resolve_w_qscheme(scheme, "bench")
        x = correlated(512, 128)
        w = torch.randn(64, 128, generator=torch.Generator().manual_seed(3))
        H = hessian_update_reference(torch.zeros(128, 128), x, 0)
        Q = gptq_quantize_weight_reference(w, H, q, 32, 0.01, False)[0]
        R = _weights.rtn_weight(Q, q)[0]

        def err(v):
            return ((x @ w.t() - x @ v.t()).norm() / (x @ w.t()).norm()).item()
        print(f"  [{q.quant_min}, {q.quant_max}]: RTN {err(_weights.rtn_weight(w, q)[0]):.3f}, "
              f"GPTQ {err(Q):.3f}, GPTQ re-rounded {err(R):.3f} "
              f"({(R != Q).float().mean().item() * 100:.0f} % of weights moved)")


if __name__ == "__main__":
    main()
