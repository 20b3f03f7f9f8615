"""Timing helper shared by the benchmarks."""
import statistics
import time


def median_ms(fn, repeats, warmup=2):
    """Median wall time of fn() in ms over `repeats` calls, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def sgd_step(model, x, y, sync=None):
    """One training step as a function: SGD (lr 0.01, momentum 0.9), cross-entropy; ``sync``
    (e.g. torch.cuda.synchronize) is called at the end so wall time covers the device work."""
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        if sync is not None:
            sync()
    return step
