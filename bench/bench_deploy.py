"""Benchmark of the deploy passes on resnet50 (Tensorrt).

    PYTHONPATH=python .venv/bin/python bench/bench_deploy.py [--rounds 5]

resnet50 prepared for Tensorrt (per-channel LSQ weights, per-tensor activations), calibrated,
BatchNorm merged. Timed, interleaved round by round (medians in ms, min-max over rounds):
  * export:  export_onnx (torch.onnx.export, TorchScript exporter) of the model with its
             fake-quantize nodes (convert_onnx's work);
  * C++:     the Tensorrt translator on the exported bytes (parse, remove the fake-quantize
             nodes, clip the weights, collect the ranges, serialize the deploy model and JSON);
  * C++ +QDQ: the same with deploy_to_qlinear (also writes the QDQ model);
  * Python:  the same removal written plainly with the onnx Python package and numpy, as
             MQBench's deploy_linear does (the baseline).
Nothing is written to disk. Figures: docs/benchmarks.md.
"""
import argparse
import io
import json
import statistics
import time

import numpy as np
import onnx
import torch
import torchvision
from onnx import numpy_helper

from mqbench import _C
from mqbench.custom_symbolic_opset import export_format, export_onnx
from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.fusion_method import convert_merge_bn
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration, enable_quantization

PER_TENSOR = {"FixedPerTensorAffine", "LearnablePerTensorAffine"}
PER_CHANNEL = {"FixedPerChannelAffine", "FakeQuantizeLearnablePerchannelAffine"}


def python_remove_fake_quant(model_bytes):
    """The baseline: MQBench-style removal with the onnx package (Tensorrt ranges)."""
    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t)
              for n in graph.node if n.op_type == "Constant"}
    producers = {o: n for n in graph.node for o in n.output}

    def value(name):
        while name not in inits and name not in consts:
            name = producers[name].input[0]  # Identity chains torch leaves on parameters
        return numpy_helper.to_array(inits[name]) if name in inits else consts[name]

    consumers = {}
    for n in graph.node:
        for i, t in enumerate(n.input):
            consumers.setdefault(t, []).append((n, i))
    ranges, dead = {}, []
    for n in list(graph.node):
        if n.op_type not in PER_TENSOR | PER_CHANNEL:
            continue
        x, out = n.input[0], n.output[0]
        scale, zp = value(n.input[1]).astype(np.float64), value(n.input[2])
        if n.op_type in ("FixedPerTensorAffine", "LearnablePerTensorAffine", "FixedPerChannelAffine"):
            qmin, qmax = int(value(n.input[-2])), int(value(n.input[-1]))
        else:
            attrs = {a.name: a.i for a in n.attribute}
            qmin, qmax = attrs["quant_min"], attrs["quant_max"]
        zp = np.clip(np.round(zp.astype(np.float64)), qmin, qmax)
        for c, i in consumers.get(out, []):
            c.input[i] = x
        if n.op_type in PER_CHANNEL or x in inits:
            w = numpy_helper.to_array(inits[x])
            shape = [-1] + [1] * (w.ndim - 1)
            lo, hi = (scale * (qmin - zp)).reshape(shape), (scale * (qmax - zp)).reshape(shape)
            inits[x].CopyFrom(numpy_helper.from_array(np.clip(w, lo, hi).astype(np.float32), x))
        else:
            ranges[x] = float(scale.reshape(-1)[0] * max(-qmin, qmax))
        dead.append(n)
    for n in dead:
        graph.node.remove(n)
    used = {t for n in graph.node for t in n.input}
    for n in [n for n in graph.node if n.op_type in ("Constant", "Identity") and n.output[0] not in used]:
        graph.node.remove(n)
    used = {t for n in graph.node for t in n.input}
    for t in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(t)
    return model.SerializeToString(), json.dumps({"tensorrt": {"blob_range": ranges}}, indent=4)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    set_log_level("WARNING")
    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval()
    q = prepare_by_platform(model, BackendType.Tensorrt)
    q.eval()
    enable_calibration(q)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        q(x)
    enable_quantization(q)
    for m in q.modules():
        if isinstance(m, QuantizeBase):
            m.disable_observer()
    convert_merge_bn(q)

    def export():
        buf = io.BytesIO()
        with torch.no_grad(), export_format("mqbench"):
            export_onnx(q, (torch.rand(1, 3, 224, 224),), buf, input_names=["x"],
                        do_constant_folding=True)
        return buf.getvalue()

    fakeq = export()
    n_fq = len(_C.deploy_fake_quant_params(fakeq))
    cases = {
        "export": export,
        "C++": lambda: _C.deploy_translate(fakeq, "tensorrt", "r50"),
        "C++ +QDQ": lambda: _C.deploy_translate(fakeq, "tensorrt", "r50", True),
        "Python": lambda: python_remove_fake_quant(fakeq),
    }
    # The two implementations must agree before their times mean anything.
    files, _ = _C.deploy_translate(fakeq, "tensorrt", "r50")
    ours = json.loads(files["r50_clip_ranges.json"])["tensorrt"]["blob_range"]
    theirs = json.loads(python_remove_fake_quant(fakeq)[1])["tensorrt"]["blob_range"]
    assert ours.keys() >= theirs.keys() and all(abs(ours[k] - v) <= 1e-6 * v for k, v in theirs.items())

    for fn in cases.values():
        fn()  # warm-up
    times = {k: [] for k in cases}
    for _ in range(args.rounds):
        for k, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t0) * 1e3)
    print(f"resnet50, Tensorrt, {n_fq} fake-quantize nodes, ONNX {len(fakeq) / 2**20:.1f} MiB, "
          f"{torch.get_num_threads()} threads, {args.rounds} interleaved rounds")
    cpp = statistics.median(times["C++"])
    for k, t in times.items():
        med = statistics.median(t)
        print(f"  {k:10s} {med:9.1f} ms  (min {min(t):.1f}, max {max(t):.1f})  {med / cpp:6.2f}x C++")


if __name__ == "__main__":
    main()
