"""QAT against every peer that installs beside torch 2.14.1, side by side: the QAT
training step, the calibration pass, prepare time and peak memory of torchvision models.

    PYTHONPATH=python .venv/bin/python bench/bench_peers.py [--rounds 2] [--batch 8] [--steps 6]
        [--threads 2] [--models resnet18 resnet50 mobilenet_v2] [--toolkits float mqbench ...]

Each (model, toolkit) runs in a fresh process; the toolkits' order rotates from round to round.
Every figure is a median over the rounds' processes. A process prepares the model, calibrates
it (one pass over 4 batches with the toolkit's observers), then times `--steps` SGD steps after
3 warm-up steps (batch at 224x224, cross-entropy, lr 0.01, momentum 0.9). Peak memory is the
process's maximum resident set.

Toolkits, each with its 8-bit QAT recipe for a TensorRT-like target:
  float         the model itself
  mqbench       prepare_by_platform(BackendType.Tensorrt) (this package)
  mqbench-mse   the same with MSEObserver / EMAMSEObserver (calibration row only)
  mqbench-fixed the same with FixedFakeQuantize: scales fixed by the calibration, no gradient to
                them, as in modelopt's, torch.ao's and torchao's recipes: none of these needs
                the first conv's input gradient, which learning the input's scale does
  modelopt      nvidia-modelopt's mtq.quantize(INT8_DEFAULT_CFG) (optional)
  torch.ao      prepare_qat_fx with get_default_qat_qconfig_mapping("x86")
  torchao-pt2e  torchao's prepare_qat_pt2e with its XNNPACKQuantizer, per-channel (optional)
  brevitas      brevitas's quantize() after preprocess_for_quantize (torch.fx trace, BatchNorm kept
                unfused): INT8 per-tensor weights and activations, scales learned from
                statistics; calibrated in its calibration_mode (optional)
  nncf          nncf.quantize() (its default: INT8, per-channel symmetric weights, per-tensor
                activations; BatchNorm kept unfused; statistics and fast bias correction on the
                4 batches, inside prepare: no calibration cell), then trained with its scales
                learned (optional; its first import compiles a C++ extension, which takes
                minutes)
A toolkit whose import fails is reported as skipped, with the error. MQBench's main branch is
not run: it imports as `mqbench`, this package's name, and it needs torch 1.x's torch.fx.
Figures: docs/benchmarks.md ("Peers").
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

TOOLKITS = ["float", "mqbench", "mqbench-fixed", "mqbench-mse", "modelopt", "torch.ao",
            "torchao-pt2e", "brevitas", "nncf"]
CALIBRATION_ONLY = {"mqbench-mse"}
CALIBRATED_IN_PREPARE = {"nncf"}


def prepare(toolkit, model, x):
    """The toolkit's QAT model of `model` and its calibration pass (a callable)."""
    import torch
    if toolkit == "float":
        return model, lambda m: None
    if toolkit.startswith("mqbench"):
        from mqbench.prepare_by_platform import BackendType, prepare_by_platform
        from mqbench.utils.logger import set_log_level
        from mqbench.utils.state import enable_calibration, enable_quantization
        set_log_level("ERROR")
        extra = {"mqbench": {},
                 "mqbench-mse": {"extra_qconfig_dict": {"w_observer": "MSEObserver",
                                                        "a_observer": "EMAMSEObserver"}},
                 "mqbench-fixed": {"extra_qconfig_dict": {"w_fakequantize": "FixedFakeQuantize",
                                                          "a_fakequantize": "FixedFakeQuantize"}},
                 }[toolkit]
        m = prepare_by_platform(model, BackendType.Tensorrt, extra)

        def calibrate(m):
            enable_calibration(m)
            for _ in range(4):
                m(x)
            enable_quantization(m)
        return m, calibrate
    if toolkit == "modelopt":  # quantizers inserted (in place), then calibrated ("max")
        import modelopt.torch.quantization as mtq
        m = mtq.quantize(model, mtq.INT8_DEFAULT_CFG, forward_loop=None)
        return m, lambda m: mtq.calibrate(m, algorithm="max",
                                          forward_loop=lambda mm: [mm(x) for _ in range(4)])
    if toolkit == "torch.ao":
        from torch.ao.quantization import get_default_qat_qconfig_mapping
        from torch.ao.quantization.quantize_fx import prepare_qat_fx
        m = prepare_qat_fx(model, get_default_qat_qconfig_mapping("x86"), (x,))
        return m, lambda m: [m(x) for _ in range(4)]
    if toolkit == "torchao-pt2e":
        from torchao.quantization.pt2e import allow_exported_model_train_eval
        from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e
        from torchao.testing.pt2e._xnnpack_quantizer import (
            XNNPACKQuantizer, get_symmetric_quantization_config)
        exported = torch.export.export(model, (x,)).module()
        quantizer = XNNPACKQuantizer().set_global(
            get_symmetric_quantization_config(is_per_channel=True, is_qat=True))
        m = prepare_qat_pt2e(exported, quantizer)
        allow_exported_model_train_eval(m)  # m.train() below, as for every other toolkit
        return m, lambda m: [m(x) for _ in range(4)]
    if toolkit == "brevitas":
        from brevitas.graph.calibrate import calibration_mode
        from brevitas.graph.quantize import preprocess_for_quantize, quantize
        m = quantize(preprocess_for_quantize(model, trace_model=True, equalize_iters=0,
                                             merge_bn=False))

        def calibrate(m):
            with calibration_mode(m):  # with autograd on, as every other calibration here
                for _ in range(4):
                    m(x)
        return m, calibrate
    if toolkit == "nncf":
        import nncf
        return nncf.quantize(model, nncf.Dataset([x] * 4), subset_size=4), lambda m: None
    raise ValueError(f"unknown toolkit {toolkit!r}")


def child(toolkit, model_name, batch, steps, threads):
    import torch
    import torchvision
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timing import sgd_step
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = getattr(torchvision.models, model_name)(num_classes=1000).train()
    x = torch.randn(batch, 3, 224, 224)
    y = torch.randint(0, 1000, (batch,))
    try:
        t0 = time.perf_counter()
        m, calibrate = prepare(toolkit, model, x)
        t1 = time.perf_counter()
    except ImportError as e:
        return {"skip": f"{type(e).__name__}: {e}"}
    calibrate(m)
    t2 = time.perf_counter()
    out = {"prepare_s": t1 - t0}
    if toolkit not in CALIBRATED_IN_PREPARE:
        out["calib_ms"] = (t2 - t1) * 1e3 / 4
    if toolkit not in CALIBRATION_ONLY:
        m.train()
        step = sgd_step(m, x, y)
        for _ in range(3):
            step()
        times = []
        for _ in range(steps):
            s = time.perf_counter()
            step()
            times.append((time.perf_counter() - s) * 1e3)
        out["step_ms"] = statistics.median(times)
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def table(title, models, toolkits, cell):
    print(f"\n{title}")
    print(f"{'model':<13}" + "".join(f"{t:>16}" for t in toolkits))
    for name in models:
        print(f"{name:<13}" + "".join(f"{cell(name, t):>16}" for t in toolkits))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50", "mobilenet_v2"])
    parser.add_argument("--toolkits", nargs="+", default=TOOLKITS, choices=TOOLKITS)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", nargs=2, metavar=("TOOLKIT", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.batch, args.steps, args.threads)))
        return 0
    runs = {}  # (model, toolkit) -> [result per round]
    skips = {}
    for r in range(args.rounds):
        order = args.toolkits[r % len(args.toolkits):] + args.toolkits[:r % len(args.toolkits)]
        for name in args.models:
            for toolkit in order:
                if toolkit in skips:
                    continue
                cmd = [sys.executable, __file__, "--child", toolkit, name, "--batch",
                       str(args.batch), "--steps", str(args.steps), "--threads",
                       str(args.threads)]
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode != 0:
                    raise SystemExit(f"{toolkit} on {name} failed:\n{res.stderr[-3000:]}")
                out = json.loads(res.stdout.strip().splitlines()[-1])
                if "skip" in out:
                    skips[toolkit] = out["skip"]
                    continue
                runs.setdefault((name, toolkit), []).append(out)
                print(f"round {r + 1} {name:<13} {toolkit:<13} {out}", flush=True)
    import torch
    print(f"\ntorch {torch.__version__}, {args.threads} threads, batch {args.batch} at 224x224, "
          f"{args.rounds} processes per cell (medians)")
    shown = [t for t in args.toolkits if t not in skips]

    def med(name, toolkit, key):
        values = [o[key] for o in runs.get((name, toolkit), []) if key in o]
        return statistics.median(values) if values else None

    def step_cell(name, toolkit):
        v, f = med(name, toolkit, "step_ms"), med(name, "float", "step_ms")
        if v is None:
            return "-"
        return f"{v:.0f} ({v / f:.2f}x)" if f else f"{v:.0f}"

    def spread_cell(name, toolkit):
        values = [o["step_ms"] for o in runs.get((name, toolkit), []) if "step_ms" in o]
        return f"{min(values):.0f}-{max(values):.0f}" if values else "-"

    table("QAT step, ms (x float)", args.models, shown, step_cell)
    table("QAT step, range over the processes, ms", args.models, shown, spread_cell)
    table("calibration pass, ms per batch", args.models, shown,
          lambda n, t: "-" if t == "float" or med(n, t, "calib_ms") is None
          else f"{med(n, t, 'calib_ms'):.0f}")
    table("prepare, s", args.models, shown,
          lambda n, t: "-" if t == "float" else f"{med(n, t, 'prepare_s'):.2f}")
    table("peak memory, MB", args.models, shown, lambda n, t: f"{med(n, t, 'peak_mb'):.0f}")
    for toolkit, why in skips.items():
        print(f"skipped {toolkit}: {why}")
    print("not run: MQBench main (it imports as `mqbench`, this package's name, and needs "
          "torch 1.x's torch.fx)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
