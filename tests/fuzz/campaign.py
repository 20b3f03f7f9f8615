"""A fuzz campaign against the mqbench-deploy CLI, checking every artifact with the real tools.

The libFuzzer target (deploy_fuzzer.cpp) finds crashes and checks artifacts with libonnx; this
script adds what only Python has: onnx's current checker and onnxruntime's loader. Each round
takes a seed model of the corpus, mutates it at the protobuf level (attribute values, initializer
values, dims, data types, truncated raw data, rewired inputs, dropped / duplicated / retyped nodes,
domains, opsets, IR versions, graph outputs), deploys it with the CLI for a random backend of the
12 translators, and classifies the result:

* crash: the CLI died of a signal or exited with a code other than 0 (deployed) or 1 (refused
  with a message), or ran past --timeout seconds;
* invariant break: an exit code 0 whose artifacts fail `onnx.checker.check_model(full_check=True)`
  (NNIE's deploy model keeps Upsample, deprecated since opset 10, which NNIE's toolchain reads:
  it is checked with Upsample in a private domain), or whose ONNX file holds only standard
  (and com.microsoft) ops yet does not load in `onnxruntime.InferenceSession`, or whose JSON does
  not parse or holds NaN / Infinity. A file that onnxruntime refuses only through its own Q/DQ
  propagation fault (ORT_QDQ_PROPAGATION_FAULT: valid, loads at ORT_ENABLE_BASIC) is counted as
  loaded and tallied in runtime_optimizer_faults. onnxruntime 1.32 has no FLOAT4E2M1 Q / DQ
  kernel (MXFP4 / NVFP4 deploys): a file holding float 4 tensors that it refuses for a missing
  kernel must run in onnx's reference evaluator instead (tallied in reference_loaded_float4;
  reference_too_large_float4 where the evaluator runs out of memory expanding a block scale).
  Academic's fallback, NNIE and OPENVINO keep custom nodes by design (mqbench, NNIE's Upsample,
  org.openvinotoolkit): they get the checker only.

Each finding's input is saved under --findings with a .txt saying what happened. A JSON report
(--report) is rewritten every minute and at the end: executions, exit codes per backend,
crashes, invariant breaks.

    nice -n 10 .venv/bin/python tests/fuzz/campaign.py --cli build/mqbench-deploy \\
        --minutes 60 --seed 1 --findings fuzz-campaign --report fuzz-campaign/report.json
"""
import argparse
import copy
import glob
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnx.reference
import onnxruntime as ort
from onnx import TensorProto

BACKENDS = ["Academic", "Tensorrt", "SNPE", "PPLW8A16", "NNIE", "Vitis", "ONNX_QNN", "PPLCUDA",
            "OPENVINO", "Tengine_u8", "STPU", "QDQ"]
RUNTIME_DOMAINS = {"", "ai.onnx", "com.microsoft"}
EXTREME_INTS = [0, 1, -1, 2, 3, -100, 100, 127, 255, 2 ** 31, -2 ** 31, 2 ** 62, -2 ** 62]
EXTREME_FLOATS = [0.0, -1.0, 1e-45, 1e38, -1e38, math.nan, math.inf, -math.inf]
OP_TYPES = ["Relu", "Conv", "Add", "Mul", "Flatten", "Reshape", "Concat", "Clip", "Resize",
            "QuantizeLinear", "DequantizeLinear", "Unsqueeze", "Squeeze", "Identity", "Cast",
            "Gemm", "MaxPool", "GlobalAveragePool", "Slice", "Pad", "Transpose", "Upsample",
            "FixedPerTensorAffine", "LearnablePerTensorAffine", "FakeQuantizeTqtAffine",
            "NNIEQuantize", "FakeQuantizeLearnablePerchannelAffine"]
DOMAINS = ["", "ai.onnx", "mqbench", "com.microsoft", "org.openvinotoolkit", "com.example"]
TYPES = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32,
         TensorProto.INT8, TensorProto.UINT8, TensorProto.FLOAT16, TensorProto.BOOL,
         TensorProto.STRING, 0, 99,
         # the types of QuantizeLinear / DequantizeLinear at opsets 19-23
         TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2, TensorProto.INT4, TensorProto.UINT4,
         TensorProto.FLOAT4E2M1]
# Attributes QuantizeLinear / DequantizeLinear gained at opsets 19-21, with the values tried.
QDQ_ATTRIBUTES = {"block_size": [0, 1, 2, 3, 8, -1, 2 ** 40], "saturate": [0, 1, 2],
                  "output_dtype": TYPES, "axis": [-3, -1, 0, 1, 3, 100]}


def tensor_names(g):
    names = [i.name for i in g.input] + [t.name for t in g.initializer]
    for n in g.node:
        names.extend(o for o in n.output if o)
    return names


def mutate_attribute(m, rng):
    qdq = [n for n in m.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    if qdq and rng.randrange(4) == 0:  # one of the attributes of the later opsets, added or set
        n = rng.choice(qdq)
        name = rng.choice(sorted(QDQ_ATTRIBUTES))
        for a in n.attribute:
            if a.name == name:
                n.attribute.remove(a)
                break
        n.attribute.append(onnx.helper.make_attribute(name, rng.choice(QDQ_ATTRIBUTES[name])))
        return
    nodes = [n for n in m.graph.node if n.attribute]
    if not nodes:
        return
    a = rng.choice(rng.choice(nodes).attribute)
    if a.type == onnx.AttributeProto.INT:
        a.i = rng.choice(EXTREME_INTS)
    elif a.type == onnx.AttributeProto.FLOAT:
        a.f = rng.choice(EXTREME_FLOATS)
    elif a.type == onnx.AttributeProto.INTS and a.ints:
        a.ints[rng.randrange(len(a.ints))] = rng.choice(EXTREME_INTS)
    elif a.type == onnx.AttributeProto.FLOATS and a.floats:
        a.floats[rng.randrange(len(a.floats))] = rng.choice(EXTREME_FLOATS)
    elif a.type == onnx.AttributeProto.STRING:
        a.s = rng.choice([b"", b"linear", b"nearest", b"\xff\xfe", b"x" * 300])
    else:
        a.type = rng.choice([onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT,
                             onnx.AttributeProto.INTS])


def mutate_initializer(m, rng):
    g = m.graph
    if not g.initializer:
        return
    t = rng.choice(g.initializer)
    what = rng.randrange(6)
    if what == 0:  # dims
        dims = list(t.dims)
        op = rng.randrange(3)
        if op == 0 and dims:
            dims[rng.randrange(len(dims))] = rng.choice([0, 1, 2, 3, -1, 2 ** 40])
        elif op == 1:
            dims.insert(rng.randrange(len(dims) + 1), rng.choice([1, 2]))
        elif dims:
            dims.pop(rng.randrange(len(dims)))
        del t.dims[:]
        t.dims.extend(dims)
    elif what == 1:  # data type
        t.data_type = rng.choice(TYPES)
    elif what == 2 and t.raw_data:  # truncated raw data
        t.raw_data = t.raw_data[: rng.randrange(len(t.raw_data))]
    elif what == 3 and t.data_type == TensorProto.FLOAT:  # values
        arr = onnx.numpy_helper.to_array(t).copy()
        if arr.size:
            arr.flat[rng.randrange(arr.size)] = rng.choice(EXTREME_FLOATS)
            t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
    elif what == 4 and t.data_type in (TensorProto.INT64, TensorProto.INT32):
        arr = onnx.numpy_helper.to_array(t).copy()
        if arr.size:
            arr.flat[rng.randrange(arr.size)] = rng.choice([v for v in EXTREME_INTS
                                                            if abs(v) < 2 ** 31])
            t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
    else:  # a fresh small constant under the same name
        t.CopyFrom(onnx.numpy_helper.from_array(
            np.array([rng.choice([-100, -1, 0, 1, 2])], dtype="int64"), t.name))


def mutate_node(m, rng):
    g = m.graph
    if not g.node:
        return
    i = rng.randrange(len(g.node))
    n = g.node[i]
    what = rng.randrange(8)
    if what == 0 and n.input:  # rewire an input
        k = rng.randrange(len(n.input))
        n.input[k] = rng.choice(tensor_names(g) + ["", "nowhere"])
    elif what == 1:  # drop
        del g.node[i]
    elif what == 2:  # duplicate
        g.node.insert(rng.randrange(len(g.node) + 1), copy.deepcopy(n))
    elif what == 3:  # retype
        n.op_type = rng.choice(OP_TYPES)
    elif what == 4:  # another domain
        n.domain = rng.choice(DOMAINS)
    elif what == 5 and n.input:  # drop or add an input
        if rng.randrange(2):
            del n.input[-1]
        else:
            n.input.append(rng.choice(tensor_names(g)))
    elif what == 6:  # move
        node = g.node.pop(i)
        g.node.insert(rng.randrange(len(g.node) + 1), node)
    else:  # an extra Unsqueeze / Squeeze with odd axes on a constant, feeding a graph output
        src = rng.choice([t.name for t in g.initializer] or [tensor_names(g)[0]])
        axes = f"axes_{len(g.node)}"
        g.initializer.append(onnx.numpy_helper.from_array(
            np.array([rng.choice([-100, -3, -1, 0, 1, 5, 100])], dtype="int64"),
            axes))
        out = f"extra_{len(g.node)}"
        g.node.append(onnx.helper.make_node(rng.choice(["Unsqueeze", "Squeeze"]), [src, axes],
                                            [out], name=out))
        g.output.append(onnx.helper.make_tensor_value_info(out, TensorProto.FLOAT, None))


def mutate_model(m, rng):
    what = rng.randrange(10)
    if what == 0:
        ops = m.opset_import
        op = rng.randrange(4)
        if op == 0 and ops:
            rng.choice(ops).version = rng.choice([1, 7, 9, 10, 11, 12, 13, 17, 18, 19, 20, 21, 22,
                                                  23, 30, 0, -1])
        elif op == 1 and ops:
            del ops[rng.randrange(len(ops))]
        elif op == 2:
            ops.append(onnx.helper.make_opsetid(rng.choice(DOMAINS), rng.choice([1, 13])))
    elif what == 1:
        m.ir_version = rng.choice([0, 1, 3, 6, 7, 8, 9, 10, 11, 12, 100])
    elif what == 2 and m.graph.output:
        o = rng.choice(m.graph.output)
        if rng.randrange(2):
            o.name = rng.choice(tensor_names(m.graph) + ["ghost"])
        else:
            o.type.tensor_type.elem_type = rng.choice(TYPES)
    elif what == 3 and m.graph.input:
        i = rng.choice(m.graph.input)
        dims = i.type.tensor_type.shape.dim
        if dims and rng.randrange(2):
            dims[rng.randrange(len(dims))].dim_value = rng.choice([0, 1, 7, 2 ** 20])
        else:
            i.type.tensor_type.elem_type = rng.choice(TYPES)
    elif what in (4, 5):
        mutate_attribute(m, rng)
    elif what in (6, 7):
        mutate_initializer(m, rng)
    else:
        mutate_node(m, rng)


def check_onnx(path, backend):
    """Returns the reason `path` breaks the invariants, "loaded" when onnxruntime loaded it,
    "loaded at ORT_ENABLE_BASIC" (ORT_QDQ_PROPAGATION_FAULT), "loaded by onnx.reference (float 4)"
    or "too large for onnx.reference (float 4)" (ORT_MISSING_QDQ_KERNEL), or None (checked, not
    a runtime's model)."""
    m = onnx.load(path)
    checked = copy.deepcopy(m)
    if backend == "NNIE":
        moved = False
        for n in checked.graph.node:
            if n.domain in ("", "ai.onnx") and n.op_type == "Upsample":
                n.domain, moved = "nnie.upsample", True
        if moved:
            checked.opset_import.append(onnx.helper.make_opsetid("nnie.upsample", 1))
    try:
        onnx.checker.check_model(checked, full_check=True)
    except Exception as e:  # noqa: BLE001 -- every checker failure is a finding
        return f"onnx.checker: {str(e).strip().splitlines()[0][:400]}"
    if backend == "NNIE" or any(n.domain not in RUNTIME_DOMAINS for n in m.graph.node):
        return None
    try:
        ort_session(path)
    except Exception as e:  # noqa: BLE001
        why = f"onnxruntime: {str(e).strip().splitlines()[0][:400]}"
        if ORT_MISSING_QDQ_KERNEL.search(why) and holds_float4(m):
            # onnxruntime 1.32 has no FLOAT4E2M1 Q / DQ kernel (docs/formats-mx.md): the file
            # must run in onnx's reference evaluator instead, which implements them.
            try:
                run_reference(m)
            except (MemoryError, ValueError) as e2:
                if isinstance(e2, MemoryError) or "array is too big" in str(e2):
                    # The evaluator expands each block scale block_size times: a valid block far
                    # longer than its axis (2^62) is beyond it, not beyond onnxruntime.
                    return "too large for onnx.reference (float 4)"
                return f"onnx.reference: {str(e2).strip().splitlines()[0][:400]}"
            except Exception as e2:  # noqa: BLE001
                return f"onnx.reference: {str(e2).strip().splitlines()[0][:400]}"
            return "loaded by onnx.reference (float 4)"
        if ORT_QDQ_PROPAGATION_FAULT not in why:
            return why
        try:  # the model is valid; onnxruntime's own optimizer breaks it (ORT_QDQ_PROPAGATION_FAULT)
            ort_session(path, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
        except Exception as e2:  # noqa: BLE001
            return f"onnxruntime: {str(e2).strip().splitlines()[0][:400]}"
        return "loaded at ORT_ENABLE_BASIC"
    return "loaded"


# onnxruntime 1.32's Q/DQ propagation (ORT_ENABLE_EXTENDED and up) moves a QuantizeLinear with an
# int8 zero point across a MaxPool at default opset >= 21 and gives the new node `output_dtype`
# INT8 with a uint8 zero point, then refuses its own node: "Node (<tensor>_q) Op (QuantizeLinear)
# [TypeInferenceError] output_dtype INT8 does not match y_zero_point type UINT8". A three-node
# model (Q -> DQ -> MaxPool, int8 zero point, opset 21) shows it (test_deploy_cli.py pins it); at
# ORT_ENABLE_BASIC the same file loads and runs (docs/deploy.md, "onnxruntime notes").
ORT_QDQ_PROPAGATION_FAULT = "does not match y_zero_point type UINT8"


# onnxruntime 1.32 implements QuantizeLinear / DequantizeLinear for FLOAT4E2M1 in no provider
# here: "NOT_IMPLEMENTED : Could not find an implementation for DequantizeLinear(23) node".
ORT_MISSING_QDQ_KERNEL = re.compile(
    r"Could not find an implementation for (QuantizeLinear|DequantizeLinear)\(\d+\)")


def run_reference(m):
    """Runs `m` once in onnx's reference evaluator on zeros of its inputs' shapes (1 for a
    symbolic or unknown dimension)."""
    inits = {t.name for t in m.graph.initializer}
    feeds = {}
    for i in m.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 1 for d in t.shape.dim]
        feeds[i.name] = np.zeros(dims, dtype=onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
    onnx.reference.ReferenceEvaluator(m).run(None, feeds)


def holds_float4(m):
    """Whether the model holds FLOAT4E2M1 tensors: an initializer, or a Q/DQ's output_dtype."""
    f4 = TensorProto.FLOAT4E2M1
    if any(t.data_type == f4 for t in m.graph.initializer):
        return True
    return any(a.name == "output_dtype" and a.i == f4 for n in m.graph.node for a in n.attribute)


def ort_session(path, level=None):
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    if level is not None:
        opts.graph_optimization_level = level
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def reject_constant(name):
    raise ValueError(f"{name} in JSON")


def check_json(path, backend):
    """Returns None or the reason `path` breaks the invariants (PPL CUDA's file is text lines)."""
    if backend == "PPLCUDA":
        return None
    try:
        json.load(open(path, encoding="utf-8"), parse_constant=reject_constant)
    except (ValueError, UnicodeDecodeError) as e:
        return f"json: {e}"
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cli", required=True)
    p.add_argument("--corpus", default=os.path.join(os.path.dirname(__file__), "corpus"))
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=20)
    p.add_argument("--findings", required=True)
    p.add_argument("--report", required=True)
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="comma-separated translators to deploy for (default: all 12)")
    args = p.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown or not backends:
        p.error(f"--backends: unknown {unknown}; choose from {BACKENDS}")
    rng = random.Random(args.seed)
    seeds = [onnx.load(f) for f in sorted(glob.glob(os.path.join(args.corpus, "*.onnx")))]
    os.makedirs(args.findings, exist_ok=True)
    work = tempfile.mkdtemp(prefix="mqbench-campaign-")
    stats = {"command": " ".join(sys.argv), "cli": os.path.abspath(args.cli), "seed": args.seed,
             "seeds": len(seeds), "executions": 0, "deployed": 0, "refused": 0,
             "artifacts_checked": 0, "runtime_loaded": 0, "runtime_optimizer_faults": 0,
             "reference_loaded_float4": 0, "reference_too_large_float4": 0,
             "crashes": 0, "invariant_breaks": 0,
             "per_backend": {b: {"runs": 0, "deployed": 0} for b in backends}, "findings": []}
    start = time.time()
    last_report = 0.0

    def report():
        stats["elapsed_s"] = round(time.time() - start, 1)
        with open(args.report + ".tmp", "w") as f:
            json.dump(stats, f, indent=1)
        os.replace(args.report + ".tmp", args.report)

    def finding(kind, model_path, backend, what):
        n = stats["crashes"] + stats["invariant_breaks"]
        name = os.path.join(args.findings, f"{kind}{n}_{backend}.onnx")
        shutil.copy(model_path, name)
        with open(name[:-5] + ".txt", "w") as f:
            f.write(f"{kind} backend={backend}\n{what}\n")
        stats["crashes" if kind == "crash" else "invariant_breaks"] += 1
        stats["findings"].append({"kind": kind, "backend": backend, "file": name,
                                  "what": what[:500]})

    while time.time() - start < args.minutes * 60:
        m = copy.deepcopy(rng.choice(seeds))
        for _ in range(1 + rng.randrange(3)):
            try:
                mutate_model(m, rng)
            except Exception:  # noqa: BLE001 -- a mutation that does not apply
                pass
        try:
            data = m.SerializeToString()
        except Exception:  # noqa: BLE001
            continue
        model_path = os.path.join(work, "in.onnx")
        with open(model_path, "wb") as f:
            f.write(data)
        out = os.path.join(work, "out")
        shutil.rmtree(out, ignore_errors=True)
        backend = rng.choice(backends)
        stats["executions"] += 1
        stats["per_backend"][backend]["runs"] += 1
        try:
            r = subprocess.run([args.cli, "--backend", backend, "--output-dir", out,
                                "--model-name", "m", model_path], capture_output=True, text=True,
                               timeout=args.timeout, errors="replace")
        except subprocess.TimeoutExpired:
            finding("crash", model_path, backend, f"timeout after {args.timeout} s")
            continue
        if r.returncode not in (0, 1) or (r.returncode == 1 and
                                          not r.stderr.startswith("mqbench-deploy: ")):
            finding("crash", model_path, backend, f"exit code {r.returncode}\n{r.stderr[-2000:]}")
        elif r.returncode == 1:
            stats["refused"] += 1
        else:
            stats["deployed"] += 1
            stats["per_backend"][backend]["deployed"] += 1
            for f in sorted(os.listdir(out)):
                path = os.path.join(out, f)
                why = None
                if f.endswith(".onnx"):
                    stats["artifacts_checked"] += 1
                    why = check_onnx(path, backend)
                    if why == "loaded":
                        stats["runtime_loaded"] += 1
                        why = None
                    elif why == "loaded at ORT_ENABLE_BASIC":
                        stats["runtime_loaded"] += 1
                        stats["runtime_optimizer_faults"] += 1
                        why = None
                    elif why == "loaded by onnx.reference (float 4)":
                        stats["reference_loaded_float4"] += 1
                        why = None
                    elif why == "too large for onnx.reference (float 4)":
                        stats["reference_too_large_float4"] += 1
                        why = None
                elif f.endswith(".json"):
                    why = check_json(path, backend)
                if why:
                    finding("invariant", model_path, backend, f"{f}: {why}")
                    break
        if time.time() - last_report > 60:
            last_report = time.time()
            report()
    report()
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({k: v for k, v in stats.items() if k not in ("per_backend", "findings")}))
    return 1 if stats["crashes"] or stats["invariant_breaks"] else 0


if __name__ == "__main__":
    sys.exit(main())
