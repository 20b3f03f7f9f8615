"""Benchmark of the two ONNX forms of ``hadamard_transform`` in onnxruntime (CPU): one MatMul
with the dense M^T against the butterflies, for n = 256 .. 4096 (no ``had``, scale 1/sqrt(n)),
2048 rows, float32. Measures where python/mqbench/onnx/llm_ops.py switches form
(``BUTTERFLY_MIN_N``).

    PYTHONPATH=python .venv/bin/python bench/bench_hadamard_onnx.py [--procs 3] [--threads 1]

The parent exports both forms of each size with ``export_onnx`` (the graphs the exporters write,
the form forced by setting ``BUTTERFLY_MIN_N``), checks them against the op, then each of
``--procs`` fresh processes times every model with ``intra_op_num_threads = --threads`` and
reports its median over ``--repeats`` runs; the table gives the median over the processes and
the spread (lowest and highest process median). Figures: docs/benchmarks.md ("LLM activation
ops").
"""
import argparse
import io
import json
import math
import os
import tempfile

from timing import fresh_process_runs, median_and_spread

ROWS = 2048
SIZES = [256, 512, 1024, 2048, 4096]
FORMS = {"matmul": 1 << 62, "butterfly": 1}  # BUTTERFLY_MIN_N that forces each form


def export_models(folder):
    """Writes <form>_<n>.onnx for every form and size; checks each in onnxruntime."""
    import numpy as np
    import onnxruntime as ort
    import torch

    import mqbench  # noqa: F401
    from mqbench.onnx import HAS_TORCHSCRIPT_EXPORTER, export_onnx, llm_ops

    class Hadamard(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.scale = 1.0 / math.sqrt(n)

        def forward(self, x):
            return torch.ops.mqbench.hadamard_transform(x, None, self.scale)

    saved = llm_ops.BUTTERFLY_MIN_N
    try:
        for n in SIZES:
            x = torch.randn(ROWS, n)
            want = torch.ops.mqbench.hadamard_transform(x, None, 1.0 / math.sqrt(n)).numpy()
            for form, threshold in FORMS.items():
                llm_ops.BUTTERFLY_MIN_N = threshold
                f = io.BytesIO()
                export_onnx(Hadamard(n).eval(), (x,), f, dynamo=not HAS_TORCHSCRIPT_EXPORTER,
                            custom_opsets=None)
                path = os.path.join(folder, f"{form}_{n}.onnx")
                with open(path, "wb") as out:
                    out.write(f.getvalue())
                sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
                y = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
                err = float(np.abs(y - want).max() / np.abs(want).max())
                assert err <= 1e-5, f"{form} n={n}: relative error {err}"
    finally:
        llm_ops.BUTTERFLY_MIN_N = saved


def one_process(folder, threads, repeats):
    """Runs in a fresh process: the median ms of each model, as JSON on stdout."""
    import numpy as np
    import onnxruntime as ort
    from timing import median_ms

    out = {}
    rng = np.random.default_rng(0)
    for n in SIZES:
        x = rng.standard_normal((ROWS, n), dtype=np.float32)
        for form in FORMS:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            sess = ort.InferenceSession(os.path.join(folder, f"{form}_{n}.onnx"), opts,
                                        providers=["CPUExecutionProvider"])
            feed = {sess.get_inputs()[0].name: x}
            out[f"{form} {n}"] = median_ms(lambda: sess.run(None, feed), repeats)
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        one_process(a.child, a.threads, a.repeats)
        return
    with tempfile.TemporaryDirectory() as folder:
        export_models(folder)
        runs = fresh_process_runs(__file__, a.procs, [folder, "--threads", a.threads,
                                                      "--repeats", a.repeats])

    def stats(name):
        return median_and_spread(runs, name)

    print(f"onnxruntime CPU, {ROWS} rows, float32, {a.threads} thread(s), medians over "
          f"{a.procs} processes (each the median of {a.repeats} runs)")
    print(f"{'n':>6}{'MatMul ms':>11}{'spread':>17}{'butterfly ms':>14}{'spread':>17}"
          f"{'MatMul / butterfly':>20}")
    for n in SIZES:
        d, dlo, dhi = stats(f"matmul {n}")
        b, blo, bhi = stats(f"butterfly {n}")
        print(f"{n:>6}{d:>11.2f}{f'{dlo:.2f}-{dhi:.2f}':>17}{b:>14.2f}"
              f"{f'{blo:.2f}-{bhi:.2f}':>17}{d / b:>19.2f}x")


if __name__ == "__main__":
    main()
