"""Advanced PTQ on the digits CNN: plain calibration vs AdaRound vs BRECQ vs QDrop at low bit
widths, as MQBench's PTQ example does it (Academic backend, MSE weight observer per channel,
EMA-MSE activation observer, AdaRoundFakeQuantize weights, QDropFakeQuantize activations;
the first and last layers stay at 8 bits, Academic's rule).

Usage:  python3 examples/ptq_digits.py [--bits w2a4,w3a3,w2a2] [--methods naive,adaround,brecq,qdrop]
                                      [--iters 2000] [--seeds 1]
Prints one table (test accuracy in %, mean over the seeds) and the seconds each method took.
docs/ptq.md has the figures of a run.
"""
import argparse
import copy
import re
import sys
import time

import torch
import torch.nn.functional as F

from mqbench.advanced_ptq import ptq_reconstruction
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration_woquantization, enable_quantization

from digits import DigitsNet, load_data  # noqa: E402  (examples/digits.py)

# MQBench's reconstruction settings (its configs/*/r18_2_4.yaml), max_count set by --iters.
METHODS = {
    "adaround": {"pattern": "layer", "prob": 1.0},
    "brecq": {"pattern": "block", "prob": 1.0},
    "qdrop": {"pattern": "block", "prob": 0.5, "scale_lr": 4e-5},
}
COMMON = {"warm_up": 0.2, "weight": 0.01, "b_range": [20, 2], "keep_gpu": True,
          "round_mode": "learned_hard_sigmoid"}


def ptq_qconfig(bits):
    """prepare_by_platform's extra_prepare_dict for 'w<W>a<A>', as MQBench's PTQ configs."""
    match = re.fullmatch(r"w(\d+)a(\d+)", bits)
    if not match:
        raise ValueError(f"bits must look like 'w2a4', got {bits!r}")
    w, a = int(match.group(1)), int(match.group(2))
    return {"extra_qconfig_dict": {
        "w_observer": "MSEObserver", "a_observer": "EMAMSEObserver",
        "w_fakequantize": "AdaRoundFakeQuantize", "a_fakequantize": "QDropFakeQuantize",
        "w_qscheme": {"bit": w, "symmetry": False, "per_channel": True, "pot_scale": False},
        "a_qscheme": {"bit": a, "symmetry": False, "per_channel": False, "pot_scale": False}}}


def calibrated(float_net, bits, cali):
    """The prepared model, calibrated as MQBench's example: activations over every batch, then
    weights on one batch; quantization on."""
    model = prepare_by_platform(copy.deepcopy(float_net).train(), BackendType.Academic,
                                ptq_qconfig(bits))
    model.eval()
    enable_calibration_woquantization(model, quantizer_type="act_fake_quant")
    with torch.no_grad():
        for batch in cali:
            model(batch)
    enable_calibration_woquantization(model, quantizer_type="weight_fake_quant")
    with torch.no_grad():
        model(cali[0])
    enable_quantization(model)
    return model


def reconstruct(model, cali, method, iters, progress=False):
    """ptq_reconstruction with ``METHODS[method]``; returns the reconstructed copy."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    config = dict(COMMON, max_count=iters, progress=progress, **METHODS[method])
    return ptq_reconstruction(model, cali, config)


def accuracy(model, data):
    x, y = data
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item() * 100


def train_float(data, epochs=15, seed=0):
    x, y = data
    torch.manual_seed(seed)
    net = DigitsNet()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    net.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(64):
            loss = F.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return net.eval()


def calibration_batches(train_set, n=4, size=64):
    return list(train_set[0][: n * size].split(size))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bits", default="w2a4,w3a3,w2a2")
    parser.add_argument("--methods", default="naive,adaround,brecq,qdrop")
    parser.add_argument("--iters", type=int, default=2000, help="max_count per unit")
    parser.add_argument("--seeds", type=int, default=1, help="reconstruction seeds to average")
    args = parser.parse_args()
    set_log_level("WARNING")
    train_set, test_set = load_data()
    net = train_float(train_set)
    cali = calibration_batches(train_set)
    methods = args.methods.split(",")
    print(f"digits CNN, float {accuracy(net, test_set):.1f}%; {len(cali)} calibration batches "
          f"of 64; {args.iters} iterations per unit; mean of {args.seeds} seed(s)")
    print(f"{'bits':6s}" + "".join(f"{m:>12s}" for m in methods))
    for bits in args.bits.split(","):
        model = calibrated(net, bits, cali)
        cells = []
        for method in methods:
            if method == "naive":
                cells.append(f"{accuracy(model, test_set):11.1f}%")
                continue
            accs, start = [], time.time()
            for seed in range(args.seeds):
                torch.manual_seed(seed)
                accs.append(accuracy(reconstruct(model, cali, method, args.iters), test_set))
            secs = (time.time() - start) / args.seeds
            cells.append(f"{sum(accs) / len(accs):6.1f}%({secs:3.0f}s)")
        print(f"{bits:6s}" + "".join(f"{c:>12s}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
