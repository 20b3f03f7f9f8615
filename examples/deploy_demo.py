"""mqbench's main job on real data: quantize, train, deploy, verify.

1. Train a small CNN (conv-bn-relu x2, max-pool, conv-bn-relu, fc) in float on the 8x8 digits data set that
   ships inside scikit-learn (PyPI; 1437 training / 360 test images, no download).
2. prepare_by_platform for a backend (Tensorrt by default), calibrate on training images,
   then quantization-aware training for a few epochs.
3. convert_deploy: BatchNorm merged, ONNX export, the backend's C++ translator writes MQBench's
   files; the quantized artifact runs in onnxruntime on the test set.
4. One table: float, fake-quant and deployed accuracy, and the files written. The deployed
   model must agree with the fake-quant model within 0.5 points (exit status 1 otherwise).
5. A low-bit Academic run (2-bit weights, 4-bit activations, per-tensor, min/max calibration):
   plain calibration loses accuracy, QAT (LSQ) recovers it; that model deploys too.
6. With --ptq adaround|brecq|qdrop: post-training reconstruction instead of training, at
   --ptq-bits (default w2a4), as MQBench's PTQ example (examples/ptq_digits.py); the
   reconstructed model deploys and runs in onnxruntime like the others.

Usage:  python3 examples/deploy_demo.py [--backend Tensorrt] [--epochs 4] [--quick]
                                        [--ptq qdrop] [--ptq-bits w2a4] [--ptq-iters 2000]
                                        [--output-dir out/demo]
"""
import argparse
import copy
import os
import sys
import time

import onnx
import torch
import torch.nn.functional as F
from tqdm import tqdm

from mqbench import _C
from mqbench.convert_deploy import convert_deploy
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration, enable_quantization

from digits import DigitsNet, load_data, onnxruntime_run  # noqa: E402  (examples/digits.py)
import ptq_digits  # noqa: E402  (examples/ptq_digits.py)

AGREEMENT = 0.5  # points between fake-quant and deployed accuracy


def accuracy_of(logits, y):
    return (logits.argmax(1) == y).float().mean().item() * 100


def accuracy(model, data):
    x, y = data
    model.eval()
    with torch.no_grad():
        return accuracy_of(model(x), y)


def train(model, data, epochs, lr, desc):
    x, y = data
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    bar = tqdm(range(epochs), desc=desc, leave=False, file=sys.stdout)
    for _ in bar:
        for idx in torch.randperm(len(y), generator=g).split(64):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()


def calibrate(model, data, batches=4):
    """MQBench's PTQ step: observers on, fake quantization off, a few batches; then quantize."""
    model.eval()
    enable_calibration(model)
    with torch.no_grad():
        for b in data[0][: 64 * batches].split(64):
            model(b)
    enable_quantization(model)


# What onnxruntime runs for each backend. Linear backends deploy a float model plus ranges that
# the vendor's tool applies; onnxruntime runs their parameters in QDQ form (same scales).
RUNNABLE = {
    "Tensorrt": ("onnx_quantized_model.onnx", "QDQ model (deploy_to_qlinear)"),
    "QDQ": ("{name}.onnx", "QDQ model"),
    "ONNX_QNN": ("{name}.onnx", "QLinear model"),
    "Academic": ("{name}.onnx", "QDQ model"),
    "Academic_NLP": ("{name}.onnx", "QDQ model"),
    "Tensorrt_NLP": ("{name}.onnx", "QDQ model"),
}


def deployed_logits(backend, name, out_dir, x):
    """(logits from onnxruntime, what ran) for the deployed model, or (None, why not)."""
    if backend.value in RUNNABLE:
        file, what = RUNNABLE[backend.value]
        path = os.path.join(out_dir, file.format(name=name))
        with open(path, "rb") as f:
            model = f.read()
        label = f"{os.path.basename(path)}: {what}"
    else:
        with open(os.path.join(out_dir, name + ".onnx"), "rb") as f:
            fakeq = f.read()
        try:
            files, _ = _C.deploy_translate(fakeq, "qdq", name)
        except ValueError as e:
            return None, f"no onnxruntime form: {e}"
        model = files[name + ".onnx"]
        label = f"QDQ form of {name}.onnx (the vendor runtime reads the files below)"
    onnx.checker.check_model(onnx.load_from_string(model))
    return onnxruntime_run(model, x), label


def quantize_and_deploy(float_net, backend, data, args, lr, config=None, tag=None):
    train_set, test_set = data
    x_test, y_test = test_set
    name = f"digits_{(tag or backend.value).lower()}"
    model = prepare_by_platform(copy.deepcopy(float_net), backend, config)
    calibrate(model, train_set)
    calibrated_acc = accuracy(model, test_set)
    train(model, train_set, args.epochs, lr, desc=f"QAT {tag or backend.value}")
    fq_acc = accuracy(model, test_set)
    written = convert_deploy(model, backend, {"x": list(x_test.shape)}, output_path=args.output_dir,
                             model_name=name, deploy_to_qlinear=backend == BackendType.Tensorrt)
    logits, ran = deployed_logits(backend, name, args.output_dir, x_test)
    deployed_acc = None if logits is None else accuracy_of(logits, y_test)
    return {"backend": tag or backend.value, "calibrated": calibrated_acc, "fake-quant": fq_acc,
            "deployed": deployed_acc, "ran": ran, "files": written}


def reconstruct_and_deploy(float_net, data, args):
    """Advanced PTQ (--ptq): calibrate, reconstruct, deploy for Academic, run in onnxruntime."""
    train_set, test_set = data
    x_test, y_test = test_set
    tag = f"Academic_{args.ptq_bits}_{args.ptq}"
    cali = ptq_digits.calibration_batches(train_set)
    model = ptq_digits.calibrated(float_net, args.ptq_bits, cali)
    calibrated_acc = accuracy(model, test_set)
    torch.manual_seed(0)
    model = ptq_digits.reconstruct(model, cali, args.ptq, args.ptq_iters, progress=True)
    fq_acc = accuracy(model, test_set)
    name = f"digits_{tag.lower()}"
    written = convert_deploy(model, BackendType.Academic, {"x": list(x_test.shape)},
                             output_path=args.output_dir, model_name=name)
    logits, ran = deployed_logits(BackendType.Academic, name, args.output_dir, x_test)
    return {"backend": tag, "calibrated": calibrated_acc, "fake-quant": fq_acc,
            "deployed": accuracy_of(logits, y_test), "ran": ran, "files": written}


# 2-bit weights and 4-bit activations, per tensor, min/max calibration, LSQ: a setting where
# calibration alone costs accuracy on this easy data set.
LOW_BIT = {"extra_qconfig_dict": {
    "w_qscheme": {"bit": 2, "symmetry": True, "per_channel": False, "pot_scale": False},
    "a_qscheme": {"bit": 4, "symmetry": False, "per_channel": False, "pot_scale": False},
    "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
    "w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver"}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="Tensorrt", choices=[b.value for b in BackendType],
                        help="deploy target (default Tensorrt)")
    parser.add_argument("--epochs", type=int, default=4, help="QAT epochs")
    parser.add_argument("--lr", type=float, default=1e-4,
                        help="QAT learning rate of the --backend run (the low-bit run uses 1e-3)")
    parser.add_argument("--quick", action="store_true", help="fewer epochs (used by the tests)")
    parser.add_argument("--ptq", choices=sorted(ptq_digits.METHODS),
                        help="also run this post-training reconstruction (AdaRound, BRECQ, QDrop)")
    parser.add_argument("--ptq-bits", default="w2a4", help="bit widths of the --ptq run")
    parser.add_argument("--ptq-iters", type=int, default=2000,
                        help="reconstruction iterations per layer or block (--quick: 300)")
    parser.add_argument("--output-dir", default=os.path.join("out", "demo"))
    args = parser.parse_args()
    set_log_level("WARNING")
    torch.manual_seed(0)
    start = time.time()
    data = load_data()
    float_net = DigitsNet()
    train(float_net, data[0], 5 if args.quick else 15, 3e-3, desc="float")
    float_acc = accuracy(float_net, data[1])
    if args.quick:
        args.epochs = min(args.epochs, 2)

    backend = BackendType[args.backend]
    config = {"extra_qconfig_dict": LOW_BIT["extra_qconfig_dict"]} if backend.value.startswith("Academic") else None
    rows = [quantize_and_deploy(float_net, backend, data, args, args.lr, config)]
    low = quantize_and_deploy(float_net, BackendType.Academic, data, args, 1e-3, LOW_BIT,
                              tag="Academic_w2a4")
    low["epochs"] = args.epochs
    rows.append(low)
    if args.ptq:
        if args.quick:
            args.ptq_iters = min(args.ptq_iters, 300)
        rows.append(reconstruct_and_deploy(float_net, data, args))

    print(f"\n8x8 digits, {len(data[1][1])} test images; float CNN: {float_acc:.1f}%\n")
    width = max(16, *(len(r["backend"]) for r in rows))
    print(f"{'backend':{width}s} {'calibrated':>10s} {'QAT/PTQ':>7s} {'deployed':>9s}  "
          "onnxruntime ran")
    failed = False
    for r in rows:
        dep = "n/a" if r["deployed"] is None else f"{r['deployed']:.1f}%"
        print(f"{r['backend']:{width}s} {r['calibrated']:9.1f}% {r['fake-quant']:6.1f}% {dep:>9s}  "
              f"{r['ran']}")
        if r["deployed"] is not None and abs(r["deployed"] - r["fake-quant"]) > AGREEMENT:
            failed = True
    print("\n'QAT/PTQ' is the fake-quant accuracy after quantization-aware training (or, for a --ptq")
    print("row, after reconstruction); 'deployed' runs the deployed model in onnxruntime (it must be")
    print(f"within {AGREEMENT} points of 'QAT/PTQ').")
    print(f"Academic_w2a4 (2-bit weights, 4-bit activations): calibration {low['calibrated']:.1f}% -> "
          f"QAT {low['fake-quant']:.1f}% in {args.epochs} epochs (float {float_acc:.1f}%).")
    if args.ptq:
        r = rows[-1]
        print(f"{r['backend']}: post-training reconstruction ({args.ptq}, {args.ptq_iters} "
              f"iterations per unit, no training): calibration {r['calibrated']:.1f}% -> "
              f"{r['fake-quant']:.1f}%.")
    print("\nfiles written:")
    for r in rows:
        for path in r["files"]:
            print(f"  {path}  ({os.path.getsize(path)} bytes)")
    print(f"\ndone in {time.time() - start:.0f} s")
    if failed:
        print(f"FAILED: deployed and fake-quant accuracy differ by more than {AGREEMENT} points")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
