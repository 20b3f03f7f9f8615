"""Timing helpers shared by the benchmarks."""
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


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


def fresh_process_runs(script, procs, child_args):
    """Runs ``script --child <child_args>`` in ``procs`` fresh processes (bench/ on their
    PYTHONPATH); returns the dict each printed as JSON on its last line of output."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    runs = []
    for _ in range(procs):
        res = subprocess.run([sys.executable, script, "--child"] + [str(a) for a in child_args],
                             capture_output=True, text=True, check=True, env=env)
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    return runs


def median_and_spread(runs, name):
    """(median, lowest, highest) of entry ``name`` over the processes' results."""
    vals = sorted(r[name] for r in runs)
    return statistics.median(vals), vals[0], vals[-1]
