"""Spread of the fake-quantize ops across fresh processes (a kernel that is fast in one
process and slow in the next is not fast). Each process times every op on the same 16M-float
tensor; the table gives, per op, the median and the 90th percentile of all samples of all
processes, the per-process medians, and the minor page faults per call.

    PYTHONPATH=python .venv/bin/python bench/bench_spread.py [--processes 6] [--threads 2]

Figures: docs/benchmarks.md ("Steady across processes").
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

OPS = ["copy_", "clone", "pt_torch", "pt_ours", "lsq_torch", "lsq_ours"]


def child(n, threads, repeats):
    import torch

    import mqbench  # noqa: F401
    ops = torch.ops.mqbench
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n // (256 * 1024), 256, 32, 32, generator=g)
    y = torch.empty_like(x)
    dy = torch.randn(x.shape, generator=g)
    s, zi, zf = torch.tensor([0.02]), torch.tensor([0], dtype=torch.int32), torch.tensor([0.0])
    gf = 1.0 / (x.numel() * 127) ** 0.5

    def lsq(fn):
        def step():
            a, b, c = (t.detach().requires_grad_() for t in (x, s, zf))
            fn(a, b, c, -128, 127, gf).backward(dy)
        return step

    fns = {
        "copy_": lambda: y.copy_(x),
        "clone": lambda: x.clone(),
        "pt_torch": lambda: torch.fake_quantize_per_tensor_affine(x, 0.02, 0, -128, 127),
        "pt_ours": lambda: ops.fake_quantize_per_tensor_affine(x, s, zi, -128, 127),
        "lsq_torch": lsq(torch._fake_quantize_learnable_per_tensor_affine),
        "lsq_ours": lsq(ops.fake_quantize_learnable_per_tensor_affine),
    }
    out = {}
    for name in OPS:
        fn = fns[name]
        for _ in range(2):
            fn()
        times, faults = [], []
        for _ in range(repeats):
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        out[name] = {"ms": times, "faults": statistics.median(faults)}
    return out


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--elements", default="16M")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = int(args.elements.rstrip("M")) * 1024 * 1024
    if args.child:
        print(json.dumps(child(n, args.threads, args.repeats)))
        return 0
    runs = []
    for _ in range(args.processes):
        res = subprocess.run([sys.executable, __file__, "--child", "--threads", str(args.threads),
                              "--elements", args.elements, "--repeats", str(args.repeats)],
                             check=True, capture_output=True, text=True, env=dict(os.environ))
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    print(f"{args.elements} floats, {args.threads} threads, {args.processes} processes x "
          f"{args.repeats} calls; ms")
    print(f"{'op':<10} {'median':>7} {'p90':>7} {'p90/med':>7} {'faults/call':>11}  "
          "per-process medians")
    for name in OPS:
        allv = [t for r in runs for t in r[name]["ms"]]
        med, p90 = statistics.median(allv), pct(allv, 0.9)
        per = " ".join(f"{statistics.median(r[name]['ms']):6.1f}" for r in runs)
        faults = statistics.median(r[name]["faults"] for r in runs)
        print(f"{name:<10} {med:7.2f} {p90:7.2f} {p90 / med:7.2f} {faults:11.0f}  {per}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
