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
