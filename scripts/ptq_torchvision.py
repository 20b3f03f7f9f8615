"""Advanced PTQ on torchvision architectures: the output error against the float model after
plain calibration and after AdaRound / BRECQ / QDrop, and the time per unit.

No weights can be downloaded here, so the models have random weights whose BatchNorm
statistics come from train-mode forwards over random images (so BatchNorm is not the identity),
and the data are random images. What is compared is the relative output error
|y_q - y|^2 / |y|^2 on held-out images.

Usage:  python3 scripts/ptq_torchvision.py --arch resnet18 [--size 32] [--iters 100]
                                           [--bits w4a4] [--methods adaround,brecq,qdrop]
                                           [--device cpu|cuda]
docs/ptq.md has the figures of a run.
"""
import argparse
import os
import sys
import time

import torch
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import ptq_digits  # noqa: E402  (examples/ptq_digits.py: the qconfig and the methods)

from mqbench import advanced_ptq  # noqa: E402
from mqbench.utils.logger import set_log_level  # noqa: E402


def float_model(arch, size, device):
    torch.manual_seed(0)
    net = getattr(torchvision.models, arch)(num_classes=100).to(device)
    net.train()
    with torch.no_grad():  # BatchNorm statistics of the data
        for _ in range(4):
            net(torch.randn(16, 3, size, size, device=device))
    return net.eval()


def relative_error(net, model, x):
    with torch.no_grad():
        ref = net(x)
        return float((model(x) - ref).pow(2).sum() / ref.pow(2).sum())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--size", type=int, default=32, help="input height and width")
    parser.add_argument("--iters", type=int, default=100, help="max_count per unit")
    parser.add_argument("--bits", default="w4a4")
    parser.add_argument("--methods", default="adaround,brecq,qdrop")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    set_log_level("WARNING")
    device = torch.device(args.device)
    net = float_model(args.arch, args.size, device)
    gen = torch.Generator().manual_seed(1)
    cali = [torch.randn(8, 3, args.size, args.size, generator=gen).to(device) for _ in range(4)]
    test = torch.randn(32, 3, args.size, args.size, generator=gen).to(device)
    model = ptq_digits.calibrated(net, args.bits, cali)
    print(f"{args.arch} {args.bits}, {args.size}x{args.size}, {args.iters} iterations per unit, "
          f"{device}; relative output error |y_q - y|^2 / |y|^2")
    print(f"  calibration only: {relative_error(net, model, test):.4f}", flush=True)
    for method in args.methods.split(","):
        units = len(advanced_ptq._units(model, dict(model.named_modules()), advanced_ptq._Config(
            dict(ptq_digits.METHODS[method]))))
        torch.manual_seed(1)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.time()
        rec = ptq_digits.reconstruct(model, cali, method, args.iters)
        if device.type == "cuda":
            torch.cuda.synchronize()
        secs = time.time() - start
        print(f"  {method:9s}: {relative_error(net, rec, test):.4f}  ({units} units, "
              f"{secs:.1f} s, {secs / units:.2f} s per unit)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
