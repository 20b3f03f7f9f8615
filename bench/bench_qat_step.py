"""Benchmark of a QAT training step and of prepare_by_platform.

    PYTHONPATH=python .venv/bin/python bench/bench_qat_step.py [--batch 16] [--steps 5] [--threads 2]

One run, this machine: resnet18, batch 16, 224x224, SGD (lr 0.01, momentum 0.9):
  * the float training step;
  * the step of the model prepared by prepare_by_platform(Tensorrt) (LearnableFakeQuantize on
    weights and activations, after calibration);
  * the step of torch.ao's prepare_qat_fx with its default QAT qconfig (fbgemm), as baseline.
Then the time of prepare_by_platform on resnet50. Times are medians in ms. Figures:
docs/benchmarks.md.
"""
import argparse
import copy
import statistics
import time

import torch
import torchvision

import mqbench
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration, enable_quantization
from timing import median_ms, sgd_step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    set_log_level("WARNING")
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224)
    y = torch.randint(0, 1000, (args.batch,))
    float_model = torchvision.models.resnet18().train()

    ours = prepare_by_platform(copy.deepcopy(float_model), BackendType.Tensorrt)
    enable_calibration(ours)
    with torch.no_grad():
        ours(x)
    enable_quantization(ours)

    from torch.ao.quantization import get_default_qat_qconfig_mapping
    from torch.ao.quantization.quantize_fx import prepare_qat_fx
    ao = prepare_qat_fx(copy.deepcopy(float_model), get_default_qat_qconfig_mapping("fbgemm"),
                        example_inputs=(x,))

    # Interleaved rounds (float, ours, torch.ao, float, ...): drift of this shared machine's
    # speed then hits the three alike.
    steps = [sgd_step(float_model, x, y), sgd_step(ours, x, y), sgd_step(ao, x, y)]
    for s in steps:
        s()
    times = [[], [], []]
    for _ in range(args.steps):
        for i, s in enumerate(steps):
            times[i].append(median_ms(s, 1, warmup=0))
    t_float, t_ours, t_ao = (statistics.median(t) for t in times)
    print(f"mqbench {mqbench.__version__}, torch {torch.__version__}, {args.threads} threads; "
          f"resnet18, batch {args.batch}, 224x224, SGD; medians of {args.steps} steps")
    print(f"  float step                         {t_float:8.1f} ms   1.00x")
    print(f"  mqbench Tensorrt (LSQ) QAT step    {t_ours:8.1f} ms   {t_ours / t_float:.2f}x float")
    print(f"  torch.ao prepare_qat_fx QAT step   {t_ao:8.1f} ms   {t_ao / t_float:.2f}x float "
          f"({t_ao / t_ours:.2f}x ours)")

    r50 = torchvision.models.resnet50().eval()
    times = []
    for _ in range(3):
        m = copy.deepcopy(r50)
        t0 = time.perf_counter()
        prepare_by_platform(m, BackendType.Tensorrt)
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"  prepare_by_platform(resnet50, Tensorrt): {sorted(times)[1]:.0f} ms (median of 3)")


if __name__ == "__main__":
    main()
