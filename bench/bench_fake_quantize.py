"""Benchmark of the fake-quantize ops against torch's built-in ops and against copy_.

    PYTHONPATH=python .venv/bin/python bench/bench_fake_quantize.py [--sizes 1M 16M] [--threads 1 2]

Every figure is a median over repeats, measured in this one run; the table prints ratios
(torch time / ours) and our bandwidth as a fraction of copy_'s (copy_ moves 8 bytes/element:
read 4, write 4, the same as an out-of-place forward). clone() is the floor of any op that
allocates its output: above ~32 MiB glibc maps fresh pages each call, which the kernel must
zero on first touch. Figures: docs/benchmarks.md.
"""
import argparse

import torch

import mqbench
from timing import median_ms

ops = torch.ops.mqbench


def lsq_plain_torch(x, s, z, qmin, qmax, g):
    """LSQ written with plain torch ops and autograd, as a pure-Python library does it."""
    s = s * g + (s - s * g).detach()
    z = z * g + (z - z * g).detach()
    q = torch.clamp((x / s).round() - x.detach() / s.detach() + x / s + z, qmin, qmax)
    return (q - z) * s


def run(n, threads, repeats):
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    c = 256
    x = torch.randn(n // (c * 1024), c, 32, 32, generator=g)
    y = torch.empty_like(x)
    dy = torch.randn(x.shape, generator=g)
    s, zi = torch.tensor([0.02]), torch.tensor([0], dtype=torch.int32)
    sc, zc = torch.rand(c, generator=g) * 0.02 + 0.01, torch.zeros(c, dtype=torch.int32)
    gf = 1.0 / (x.numel() * 127) ** 0.5

    def fwd_bwd(fn, *leaves):
        def step():
            ls = [t.detach().requires_grad_() for t in leaves]
            fn(*ls).backward(dy)
        return step

    r = {}
    r["copy_"] = median_ms(lambda: y.copy_(x), repeats)
    r["clone"] = median_ms(lambda: x.clone(), repeats)  # allocating copy: out-of-place floor
    r["pt_torch"] = median_ms(lambda: torch.fake_quantize_per_tensor_affine(x, 0.02, 0, -128, 127), repeats)
    r["pt_ours"] = median_ms(lambda: ops.fake_quantize_per_tensor_affine(x, s, zi, -128, 127), repeats)
    r["pc_torch"] = median_ms(lambda: torch.fake_quantize_per_channel_affine(x, sc, zc, 1, -128, 127), repeats)
    r["pc_ours"] = median_ms(lambda: ops.fake_quantize_per_channel_affine(x, sc, zc, 1, -128, 127), repeats)
    zf, zcf = torch.tensor([0.0]), torch.zeros(c)
    r["lsq_torch"] = median_ms(fwd_bwd(lambda a, b, d: torch._fake_quantize_learnable_per_tensor_affine(
        a, b, d, -128, 127, gf), x, s, zf), repeats)
    r["lsq_ours"] = median_ms(fwd_bwd(lambda a, b, d: ops.fake_quantize_learnable_per_tensor_affine(
        a, b, d, -128, 127, gf), x, s, zf), repeats)
    r["lsq_plain"] = median_ms(fwd_bwd(lambda a, b, d: lsq_plain_torch(a, b, d, -128, 127, gf), x, s, zf), repeats)
    r["lsqc_torch"] = median_ms(fwd_bwd(lambda a, b, d: torch._fake_quantize_learnable_per_channel_affine(
        a, b, d, 1, -128, 127, gf), x, sc, zcf), repeats)
    r["lsqc_ours"] = median_ms(fwd_bwd(lambda a, b, d: ops.fake_quantize_learnable_per_channel_affine(
        a, b, d, 1, -128, 127, gf), x, sc, zcf), repeats)
    return r


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["1M", "16M"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    args = parser.parse_args()
    print(f"mqbench {mqbench.__version__}, {mqbench._C.cpu_capability()} kernels, torch {torch.__version__}")
    print("float32, shape [N, 256, 32, 32]; times are medians in ms; ratio = torch / ours\n")
    header = (f"{'elements':>9} {'thr':>3} | {'copy_':>7} {'clone':>7} | {'per-tensor fwd':>24} {'%copy':>6} | "
              f"{'per-channel fwd':>24} | {'LSQ fwd+bwd':>24} {'plain':>7} | {'LSQ per-ch fwd+bwd':>24}")
    print(header)
    print("-" * len(header))
    for size in args.sizes:
        n = int(size.rstrip("M")) * 1024 * 1024
        for threads in args.threads:
            r = run(n, threads, repeats=20 if n <= 4 * 1024 * 1024 else 15)

            def cell(a, b):
                return f"{r[a]:7.2f} vs {r[b]:7.2f} {r[a] / r[b]:5.1f}x"

            print(f"{size:>9} {threads:>3} | {r['copy_']:7.2f} {r['clone']:7.2f} | {cell('pt_torch', 'pt_ours')} "
                  f"{r['copy_'] / r['pt_ours'] * 100:5.0f}% | {cell('pc_torch', 'pc_ours')} | "
                  f"{cell('lsq_torch', 'lsq_ours')} {r['lsq_plain'] / r['lsq_ours']:6.1f}x | "
                  f"{cell('lsqc_torch', 'lsqc_ours')}")


if __name__ == "__main__":
    main()
