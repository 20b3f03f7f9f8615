"""Benchmark: how the deploy passes scale with the graph (every translator, up to 100k nodes).

    PYTHONPATH=python .venv/bin/python bench/bench_deploy_scaling.py [--sizes 10000 100000]

Three synthetic graphs, each built with the onnx package and deployed from bytes through
`mqbench._C.deploy_translate` (parse, passes, serialize; nothing written):
  * shapes:     x -> fake quantizer -> n alternating Flatten / Reshape -> fake quantizer
                (range propagation walks these chains);
  * quantizers: x -> (Relu -> fake quantizer) repeated n / 2 times (n nodes, n / 2 groups);
  * fan-out:    x -> fake quantizer -> n Relu -> Concat -> fake quantizer (one tensor, n readers).
The baseline is the same translator on the smallest size in the same run: for a linear pass the
ratio time(n) / time(smallest) is n / smallest (10 for 10k -> 100k). Figures: docs/benchmarks.md.
"""
import argparse
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from mqbench import _C


def _fq(x, y, name):
    return helper.make_node("FixedPerTensorAffine", [x, "s", "z", "qmin", "qmax"], [y], name=name,
                            domain="mqbench")


def _model(nodes, output):
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int32), "z"),
             numpy_helper.from_array(np.array(-128, np.int64), "qmin"),
             numpy_helper.from_array(np.array(127, np.int64), "qmax"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "shape")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], inits)
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("mqbench", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def shapes(n):
    nodes, prev = [_fq("x", "t0", "fq_x")], "t0"
    for i in range(n):
        out = f"t{i + 1}"
        inputs = [prev, "shape"] if i % 2 else [prev]
        nodes.append(helper.make_node("Reshape" if i % 2 else "Flatten", inputs, [out], name=f"n{i}"))
        prev = out
    return _model(nodes + [_fq(prev, "y", "fq_y")], "y")


def quantizers(n):
    nodes, prev = [], "x"
    for i in range(n // 2):
        nodes += [helper.make_node("Relu", [prev], [f"r{i}"], name=f"relu{i}"), _fq(f"r{i}", f"q{i}", f"fq{i}")]
        prev = f"q{i}"
    return _model(nodes, prev)


def fan_out(n):
    nodes = [_fq("x", "t0", "fq_x")]
    nodes += [helper.make_node("Relu", ["t0"], [f"r{i}"], name=f"relu{i}") for i in range(n)]
    nodes.append(helper.make_node("Concat", [f"r{i}" for i in range(n)], ["c"], name="cat", axis=0))
    return _model(nodes + [_fq("c", "y", "fq_y")], "y")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[10000, 100000])
    parser.add_argument("--translators", nargs="+", default=sorted(_C.deploy_translator_names()))
    args = parser.parse_args()
    sizes = sorted(args.sizes)
    print(f"{'graph':11s} {'translator':17s}" + "".join(f"{n:>10d}" for n in sizes) +
          f"  ratio {sizes[-1]}/{sizes[0]}")
    for name, build in (("shapes", shapes), ("quantizers", quantizers), ("fan-out", fan_out)):
        models = {n: build(n) for n in sizes}
        for t in args.translators:
            times = []
            for n in sizes:
                start = time.perf_counter()
                _C.deploy_translate(models[n], t, "m", False)
                times.append(time.perf_counter() - start)
            print(f"{name:11s} {t:17s}" + "".join(f"{s:9.3f}s" for s in times) +
                  f"  {times[-1] / times[0]:6.1f}", flush=True)


if __name__ == "__main__":
    main()
