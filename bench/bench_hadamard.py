"""Benchmark of the LLM activation ops against their torch baselines, in the same process:

* ``hadamard_transform`` (butterflies, then the product with ``had``) against ``torch.matmul`` of
  x with the same dense matrix M^T (precomputed, contiguous), for n = 256, 768 = 12 * 64,
  4096 and 14336 = 28 * 512 (``had`` a random +-1 matrix: the timing does not depend on its
  values), 2048 rows, float32;
* ``fake_quantize_per_token`` (INT4 symmetric, INT8 affine, FP8 E4M3) against a torch
  composite: the rows' amax (or aminmax), then torch's elementwise ops (x / s, round, clamp,
  the float8 cast), on 2048 x 4096 float32;
* ``copy_`` of the same 2048 x 4096 floats, the memory-bound floor.

    PYTHONPATH=python .venv/bin/python bench/bench_hadamard.py [--procs 5] [--threads 1]

Each of ``--procs`` fresh processes times every case and reports its median over ``--repeats``
calls (the 14336-wide matmul, about 0.4 TFLOP, over 3); the table gives the median over the
processes, the spread (lowest and highest process median) and the ratio baseline / ours.
Figures: docs/benchmarks.md ("LLM activation ops").
"""
import argparse
import json
import math

from timing import fresh_process_runs, median_and_spread

ROWS = 2048
HADAMARD = [(256, None), (768, 12), (4096, None), (14336, 28)]
PER_TOKEN = [("int4 sym", (-8, 7, True, "int")), ("int8 asym", (-128, 127, False, "int")),
             ("fp8 e4m3", (0, 0, True, "fp8_e4m3"))]


def composite(x, qmin, qmax, symmetric, fmt):
    """Per-token fake quantization as plain torch code would write it."""
    import torch
    eps = torch.finfo(torch.float32).eps
    if fmt == "fp8_e4m3":
        s = (x.abs().amax(-1, keepdim=True) / 448.0).clamp(min=eps)
        return (x / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * s
    if symmetric:
        s = (x.abs().amax(-1, keepdim=True) / ((qmax - qmin) / 2)).clamp(min=eps)
        return torch.round(x / s).clamp(qmin, qmax) * s
    mn, mx = torch.aminmax(x, dim=-1, keepdim=True)
    mn, mx = mn.clamp(max=0.0), mx.clamp(min=0.0)
    s = ((mx - mn) / (qmax - qmin)).clamp(min=eps)
    z = (qmin - torch.round(mn / s)).clamp(qmin, qmax)
    return (torch.round(x / s) + z).clamp(qmin, qmax).sub(z).mul(s)


def one_process(threads, repeats):
    """Runs in a fresh process: the median ms of each case, as JSON on stdout."""
    import torch

    import mqbench  # noqa: F401
    from mqbench.onnx.llm_ops import sylvester
    from timing import median_ms

    torch.set_num_threads(threads)
    ops = torch.ops.mqbench
    g = torch.Generator().manual_seed(0)
    out = {}
    for n, m in HADAMARD:
        x = torch.randn(ROWS, n, generator=g)
        had = None if m is None else (torch.randint(0, 2, (m, m), generator=g) * 2 - 1).float()
        scale = 1.0 / math.sqrt(n)
        k = sylvester(n) if had is None else torch.kron(had, sylvester(n // m))
        mt = (k * scale).T.contiguous()
        big = n * n * ROWS > 1e11
        out[f"hadamard {n} ours"] = median_ms(lambda: ops.hadamard_transform(x, had, scale),
                                              repeats)
        out[f"hadamard {n} matmul"] = median_ms(lambda: torch.matmul(x, mt),
                                                3 if big else repeats, warmup=1 if big else 2)
    x = torch.randn(ROWS, 4096, generator=g)
    y = torch.empty_like(x)
    out["copy_ 2048x4096"] = median_ms(lambda: y.copy_(x), repeats)
    for name, args in PER_TOKEN:
        out[f"per-token {name} ours"] = median_ms(
            lambda: ops.fake_quantize_per_token(x, *args), repeats)
        out[f"per-token {name} composite"] = median_ms(lambda: composite(x, *args), repeats)
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        one_process(a.threads, a.repeats)
        return
    runs = fresh_process_runs(__file__, a.procs, ["--threads", a.threads, "--repeats", a.repeats])

    def stats(name):
        return median_and_spread(runs, name)

    print(f"{ROWS} rows, float32, {a.threads} thread(s), medians over {a.procs} processes (each "
          f"the median of {a.repeats} calls; the 14336-wide matmul of 3)")
    print(f"{'case':<28}{'ours ms':>9}{'spread':>15}{'baseline ms':>13}{'spread':>17}"
          f"{'baseline / ours':>17}")
    cases = [(f"hadamard n={n}" + ("" if m is None else f" (m={m})"), f"hadamard {n} ours",
              f"hadamard {n} matmul") for n, m in HADAMARD]
    cases += [(f"per-token {name}", f"per-token {name} ours", f"per-token {name} composite")
              for name, _ in PER_TOKEN]
    for label, ours, base in cases:
        o, olo, ohi = stats(ours)
        b, blo, bhi = stats(base)
        print(f"{label:<28}{o:>9.2f}{f'{olo:.2f}-{ohi:.2f}':>15}{b:>13.2f}"
              f"{f'{blo:.2f}-{bhi:.2f}':>17}{b / o:>16.1f}x")
    c, clo, chi = stats("copy_ 2048x4096")
    print(f"{'copy_ 2048x4096 (floor)':<28}{c:>9.2f}{f'{clo:.2f}-{chi:.2f}':>15}")


if __name__ == "__main__":
    main()
