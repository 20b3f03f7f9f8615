"""Benchmark of the observers' searches and of a LearnableFakeQuantize training step.

    PYTHONPATH=python .venv/bin/python bench/bench_observers.py [--threads 1 2] [--repeats 5]

On a 4M-element activation ([16, 64, 64, 64] float32), in one run:
  * MSEObserver per tensor and per channel (ch_axis=1) against a straightforward pure-PyTorch
    implementation of the same search written here as MQBench writes it: a Python loop over the
    95 (80 per channel) candidate ranges, one torch fake-quant pass and one Lp loss per
    candidate, `.item()` syncs, and per channel a loop over channels;
  * EMAQuantileObserver (per tensor only, as in MQBench) against torch.histc plus a Python loop
    over the 2048 bins;
  * LearnableFakeQuantize forward+backward (observer off, fake quant on) against the same module
    calling torch's built-in `_fake_quantize_learnable_per_tensor_affine`.
Times are medians in ms; ratio = baseline / ours. Figures: docs/benchmarks.md.
"""
import argparse

import torch

import mqbench
from timing import median_ms
from mqbench.fake_quantize import LearnableFakeQuantize
from mqbench.observer import EMAMinMaxObserver, EMAQuantileObserver, MSEObserver


# ---- baselines: MQBench's algorithms in plain PyTorch ------------------------------------------

def _qparams(mn, mx, qmin, qmax, eps):
    mn, mx = torch.clamp(mn, max=0), torch.clamp(mx, min=0)
    s = torch.clamp(torch.maximum(-mn, mx) / ((qmax - qmin) / 2), min=eps)
    return s, torch.zeros_like(s, dtype=torch.int32)


def mse_search_plain(x, x_min, x_max, qmin, qmax, iters, eps=torch.finfo(torch.float32).eps):
    best_score, best = 1e10, (x_min, x_max)
    for i in range(iters):
        new_min, new_max = x_min * (1.0 - i * 0.01), x_max * (1.0 - i * 0.01)
        s, z = _qparams(new_min, new_max, qmin, qmax, eps)
        xq = torch.fake_quantize_per_tensor_affine(x, s.item(), int(z.item()), qmin, qmax)
        score = (xq - x).abs().pow(2.0).mean()
        if score < best_score:
            best_score, best = score, (new_min, new_max)
    return best


def mse_observe_plain(x, ch_axis, qmin=-128, qmax=127):
    if ch_axis == -1:
        mn, mx = torch.aminmax(x)
        return mse_search_plain(x, mn, mx, qmin, qmax, 95)
    xc = x.transpose(0, ch_axis)
    mn, mx = torch.aminmax(xc.flatten(1), dim=1)
    for c in range(xc.shape[0]):
        mn[c], mx[c] = mse_search_plain(xc[c], mn[c], mx[c], qmin, qmax, 80)
    return mn, mx


def quantile_observe_plain(x, threshold=0.99999, bins=2048):
    mn, mx = torch.aminmax(x)
    r = torch.max(-mn, mx)
    hist = torch.histc(torch.abs(x), bins=bins, min=0.0, max=float(r))
    cum, clip = 0, r
    for i, cnt in enumerate(hist):
        cum += cnt
        if cum >= threshold * x.numel():
            clip = (i + 0.5) * (r / bins)
            break
    return torch.max(mn, -clip), torch.min(mx, clip)


class TorchLearnable(LearnableFakeQuantize):
    """LearnableFakeQuantize calling torch's built-in learnable op (MQBench's per-tensor path)."""

    def forward(self, X):
        self._observe_into_parameters(X)
        g = 1.0 / (X.numel() * self.quant_max) ** 0.5
        return torch._fake_quantize_learnable_per_tensor_affine(
            X, self.scale, self.zero_point, self.quant_min, self.quant_max, g)


SYM8 = dict(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric, quant_min=-128, quant_max=127)
SYM8_CH = dict(dtype=torch.qint8, qscheme=torch.per_channel_symmetric, quant_min=-128,
               quant_max=127, ch_axis=1)


def run(threads, repeats):
    torch.set_num_threads(threads)
    x = torch.randn(16, 64, 64, 64, generator=torch.Generator().manual_seed(0))
    rows = []

    def row(label, base_fn, ours_fn, base_repeats=None):
        b = median_ms(base_fn, base_repeats or repeats, warmup=1)
        o = median_ms(ours_fn, repeats, warmup=1)
        rows.append((label, b, o))

    mse_t, mse_c, quantile = MSEObserver(**SYM8), MSEObserver(**SYM8_CH), EMAQuantileObserver(**SYM8)
    row("MSEObserver per tensor", lambda: mse_observe_plain(x, -1), lambda: mse_t(x))
    row("MSEObserver per channel (64 ch)", lambda: mse_observe_plain(x, 1), lambda: mse_c(x),
        base_repeats=max(1, repeats // 3))
    row("EMAQuantileObserver", lambda: quantile_observe_plain(x), lambda: quantile(x))

    def step(cls):
        fq = cls(EMAMinMaxObserver, **SYM8)
        fq(x)
        fq.disable_observer()
        dy = torch.randn_like(x)

        def once():
            xr = x.detach().requires_grad_()
            fq(xr).backward(dy)
        return once
    row("LearnableFakeQuantize fwd+bwd", step(TorchLearnable), step(LearnableFakeQuantize))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"mqbench {mqbench.__version__}, {mqbench._C.cpu_capability()} kernels, "
          f"torch {torch.__version__}; x = [16, 64, 64, 64] float32 (4M elements)\n")
    print(f"{'':34} {'thr':>3} | {'baseline ms':>11} {'ours ms':>9} {'ratio':>7}")
    print("-" * 72)
    for threads in args.threads:
        for label, b, o in run(threads, args.repeats):
            print(f"{label:34} {threads:>3} | {b:11.1f} {o:9.2f} {b / o:6.1f}x")


if __name__ == "__main__":
    main()
