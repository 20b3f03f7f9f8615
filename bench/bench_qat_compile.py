"""Benchmark of the QAT training step with and without torch.compile.

    PYTHONPATH=python .venv/bin/python bench/bench_qat_compile.py [--batch 16] [--size 112]
        [--steps 7] [--threads 2] [--device cpu|cuda] [--backend inductor]

resnet18, SGD (lr 0.01, momentum 0.9), cross-entropy; one run:
  * the float step, eager and compiled;
  * the step of the model prepared by prepare_by_platform(Tensorrt) (LearnableFakeQuantize on
    weights and activations, calibrated, observers off), eager and compiled.
The compiled models are ``torch.compile(model, backend=...)`` (forward and backward compiled,
the optimizer step eager); their first step, which compiles, is reported apart. Rounds are
interleaved (float eager, float compiled, QAT eager, QAT compiled, ...) so drift of the
machine's speed hits the four alike; times are medians in ms. Figures: docs/benchmarks.md.
"""
import argparse
import copy
import os
import statistics
import time

import torch
import torchvision

import mqbench
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration, enable_quantization
from timing import sgd_step


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    if os.environ.get("MQBENCH_CPU_CAPABILITY") == "default":
        raise SystemExit("MQBENCH_CPU_CAPABILITY=default: compiled code would call the ops "
                         "through a path this benchmark does not measure; unset it")
    torch.set_num_threads(args.threads)
    set_log_level("WARNING")
    torch.manual_seed(0)
    dev = args.device
    x = torch.randn(args.batch, 3, args.size, args.size, device=dev)
    y = torch.randint(0, 1000, (args.batch,), device=dev)
    float_model = torchvision.models.resnet18().train().to(dev)
    qat = prepare_by_platform(copy.deepcopy(float_model).cpu(), BackendType.Tensorrt).to(dev)
    enable_calibration(qat)
    with torch.no_grad():
        qat(x)
    enable_quantization(qat)

    models = {"float eager": float_model,
              "float compiled": torch.compile(copy.deepcopy(float_model), backend=args.backend),
              "QAT eager": qat,
              "QAT compiled": torch.compile(copy.deepcopy(qat), backend=args.backend)}
    sync = torch.cuda.synchronize if dev == "cuda" else None
    steps = {name: sgd_step(m, x, y, sync) for name, m in models.items()}
    first = {name: timed(s) for name, s in steps.items()}  # compiles the compiled ones
    for s in steps.values():  # second call: a recompile for the grad-mode guards, if any
        s()
    times = {name: [] for name in steps}
    for _ in range(args.steps):
        for name, s in steps.items():
            times[name].append(timed(s))
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"mqbench {mqbench.__version__}, torch {torch.__version__}, {dev}, "
          f"{args.threads} threads; resnet18, batch {args.batch}, {args.size}x{args.size}, SGD; "
          f"backend {args.backend}; medians of {args.steps} steps")
    for name in steps:
        base = med["float eager"]
        print(f"  {name:15s} {med[name]:9.1f} ms   {med[name] / base:5.2f}x float eager   "
              f"first step {first[name] / 1e3:7.1f} s")
    print(f"  QAT compiled / QAT eager: {med['QAT compiled'] / med['QAT eager']:.2f}")


if __name__ == "__main__":
    main()
