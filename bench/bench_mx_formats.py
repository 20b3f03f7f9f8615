"""Benchmark of the block-scaled formats' fake quantization (MXFP8, MXFP6, MXFP4, NVFP4) against
copy_ and against torchao 0.18's implementation of the same format, in the same process.

    PYTHONPATH=python .venv/bin/python bench/bench_mx_formats.py [--procs 5] [--threads 2]

Each of ``--procs`` fresh processes times every op on one 4096 x 4096 float32 tensor (16M
floats; blocks along the last axis) and reports its median over ``--repeats`` calls; the table
gives the median and the 90th percentile of those per-process medians, and the ratio of each
median to copy_'s. torchao's forward is its quantize-dequantize round trip: ``to_mx`` (FLOOR
scale, the OCP spec's) then ``to_dtype``; ``NVFP4Tensor.to_nvfp4`` with the per-tensor scale then
``dequantize``; ours equals both bit for bit (tests/python/formats/test_mx_ops.py,
tests/python/formats/test_mxfp6.py). Figures:
docs/benchmarks.md.
"""
import argparse
import json
import statistics

from timing import fresh_process_runs


NAMES = ["copy_", "mxfp8 ours", "mxfp8 torchao", "mxfp6_e2m3 ours", "mxfp6_e2m3 torchao",
         "mxfp6_e3m2 ours", "mxfp6_e3m2 torchao", "mxfp4 ours", "mxfp4 torchao", "nvfp4 ours",
         "nvfp4 torchao"]


def one_process(threads, repeats):
    """Runs in a fresh process: the median ms of each op, as JSON on stdout."""
    import warnings

    import torch

    import mqbench  # noqa: F401
    from timing import median_ms
    warnings.filterwarnings("ignore")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    torch.set_num_threads(threads)
    ops = torch.ops.mqbench
    x = torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0))
    y = torch.empty_like(x)
    amax = x.abs().max()
    pts = per_tensor_amax_to_scale(amax)

    def tao_mx(elem):
        s, d = to_mx(x, elem, 32, ScaleCalculationMode.FLOOR)
        return to_dtype(d, s, elem, 32, torch.float32)

    def tao_nvfp4():
        return NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts).dequantize(torch.float32)

    fns = {
        "copy_": lambda: y.copy_(x),
        "mxfp8 ours": lambda: ops.fake_quantize_mx(x, "mxfp8_e4m3"),
        "mxfp8 torchao": lambda: tao_mx(torch.float8_e4m3fn),
        "mxfp6_e2m3 ours": lambda: ops.fake_quantize_mx(x, "mxfp6_e2m3"),
        "mxfp6_e2m3 torchao": lambda: tao_mx("fp6_e2m3"),
        "mxfp6_e3m2 ours": lambda: ops.fake_quantize_mx(x, "mxfp6_e3m2"),
        "mxfp6_e3m2 torchao": lambda: tao_mx("fp6_e3m2"),
        "mxfp4 ours": lambda: ops.fake_quantize_mx(x, "mxfp4"),
        "mxfp4 torchao": lambda: tao_mx(torch.float4_e2m1fn_x2),
        "nvfp4 ours": lambda: ops.fake_quantize_nvfp4(x, amax),
        "nvfp4 torchao": tao_nvfp4,
    }
    # torchao is 10-50x slower: fewer repeats keep the run short; the median is still of >= 5
    out = {k: median_ms(f, repeats if "torchao" not in k else max(5, repeats // 4))
           for k, f in fns.items()}
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        one_process(a.threads, a.repeats)
        return
    runs = fresh_process_runs(__file__, a.procs, ["--threads", a.threads, "--repeats", a.repeats])
    copy = statistics.median(r["copy_"] for r in runs)
    print(f"16M floats (4096 x 4096 float32), {a.threads} threads, medians over {a.procs} "
          f"processes (each the median of {a.repeats} calls; torchao {max(5, a.repeats // 4)})")
    print(f"{'op':<20}{'median ms':>11}{'p90 ms':>9}{'x copy_':>9}{'torchao / ours':>16}")
    for name in NAMES:
        vals = sorted(r[name] for r in runs)
        med = statistics.median(vals)
        p90 = vals[min(len(vals) - 1, int(round(0.9 * (len(vals) - 1))))]
        speedup = ""
        if name.endswith("ours"):
            tao = statistics.median(r[name.replace("ours", "torchao")] for r in runs)
            speedup = f"{tao / med:.1f}x"
        print(f"{name:<20}{med:>11.2f}{p90:>9.2f}{med / copy:>9.2f}{speedup:>16}")


if __name__ == "__main__":
    main()
