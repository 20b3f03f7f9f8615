"""Benchmark of the format fake-quantize ops (FP8 E4M3 / E5M2, group-wise INT4) against copy_
and against torchao 0.18's implementation of the same format, forward only, CPU.

    PYTHONPATH=python .venv/bin/python bench/bench_formats.py [--n 16M] [--threads 2]
        [--processes 5] [--repeats 7]

x is a [4096, n / 4096] float32 tensor (a weight-shaped matrix). Each case runs in fresh
processes (``--processes``); each process reports the median of ``--repeats`` calls after a
warm-up, and the table prints the median over processes, with the ratio to copy_ measured the
same way. Cases:

* ``copy_``: y.copy_(x), 8 bytes/element, the floor of an elementwise op;
* ``fp8_*_tensor`` / ``fp8_e4m3_channel`` (ours): ``torch.ops.mqbench.fake_quantize_fp8``;
* ``torch_cast_e4m3_row``: the reference written with torch's cast,
  ``(x / s).clamp(-448, 448).to(float8_e4m3fn).float() * s`` with a per-row scale;
* ``torchao_fp8_e4m3_row``: torchao's ``_quantize_affine_float8`` + ``_dequantize_affine_float8``
  with the same per-row scale;
* ``int4_group128`` (ours): ``fake_quantize_per_group_affine``, group 128 along axis 1;
* ``torchao_int4_group128``: torchao's ``_fake_quantize_affine`` with block_size (1, 128).
Figures: docs/benchmarks.md.
"""
import argparse
import json
import os
import subprocess
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ["copy_", "fp8_e4m3_tensor", "fp8_e5m2_tensor", "fp8_e4m3_channel",
         "torch_cast_e4m3_row", "torchao_fp8_e4m3_row", "int4_group128", "torchao_int4_group128"]


def _size(text):
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def measure(case, n, threads, repeats):
    """One case in this process: the median of `repeats` calls, in ms."""
    import torch
    sys.path.insert(0, HERE)
    from timing import median_ms
    import mqbench  # noqa: F401
    torch.set_num_threads(threads)
    ops = torch.ops.mqbench
    g = torch.Generator().manual_seed(0)
    rows = 4096
    x = torch.randn(rows, n // rows, generator=g)
    amax = x.abs().amax(1)
    s_row = amax / 448
    s_t = (amax.max() / 448).reshape(1)
    if case == "copy_":
        y = torch.empty_like(x)
        fn = lambda: y.copy_(x)  # noqa: E731
    elif case in ("fp8_e4m3_tensor", "fp8_e5m2_tensor"):
        fmt = case[:8]
        fn = lambda: ops.fake_quantize_fp8(x, s_t, None, fmt)  # noqa: E731
    elif case == "fp8_e4m3_channel":
        fn = lambda: ops.fake_quantize_fp8(x, s_row, 0, "fp8_e4m3")  # noqa: E731
    elif case == "torch_cast_e4m3_row":
        s = s_row.reshape(-1, 1)
        fn = lambda: (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s  # noqa: E731
    elif case == "torchao_fp8_e4m3_row":
        from torchao.quantization.quant_primitives import (_dequantize_affine_float8,
                                                           _quantize_affine_float8)
        s = s_row.reshape(-1, 1)
        fn = lambda: _dequantize_affine_float8(  # noqa: E731
            _quantize_affine_float8(x, s, torch.float8_e4m3fn), s, torch.float32)
    elif case in ("int4_group128", "torchao_int4_group128"):
        gs = 128
        sg = x.reshape(rows, -1, gs).abs().amax(-1) / 7.5
        zg = torch.zeros(sg.shape, dtype=torch.int32)
        if case == "int4_group128":
            fn = lambda: ops.fake_quantize_per_group_affine(x, sg, zg, 1, gs, -8, 7)  # noqa: E731
        else:
            from torchao.quantization.quant_primitives import _fake_quantize_affine
            fn = lambda: _fake_quantize_affine(x, (1, gs), sg, zg, torch.int8, -8, 7)  # noqa: E731
    else:
        raise ValueError(case)
    return median_ms(fn, repeats)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", default="16M")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--processes", type=int, default=5)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--cases", nargs="*", default=CASES)
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args()
    n = _size(a.n)
    if a.one:
        print(json.dumps(measure(a.one, n, a.threads, a.repeats)))
        return
    import torch
    print(f"# torch {torch.__version__}, n={n} float32 ([4096, {n // 4096}]), "
          f"{a.threads} threads, medians over {a.processes} processes x {a.repeats} calls")
    results = {}
    for _ in range(a.processes):  # interleaved: each round runs every case once
        for case in a.cases:
            out = subprocess.run([sys.executable, __file__, "--one", case, "--n", a.n,
                                  "--threads", str(a.threads), "--repeats", str(a.repeats)],
                                 capture_output=True, text=True, check=True)
            results.setdefault(case, []).append(json.loads(out.stdout.strip().splitlines()[-1]))
    copy = statistics.median(results["copy_"]) if "copy_" in results else None
    print(f"{'case':<24}{'median ms':>10}{'x copy_':>9}")
    for case in a.cases:
        m = statistics.median(results[case])
        ratio = f"{m / copy:9.1f}" if copy else ""
        print(f"{case:<24}{m:10.2f}{ratio}")


if __name__ == "__main__":
    main()
