"""A tour of mqbench's fake-quantize ops on real data (the 8x8 digits set shipped with sklearn).

1. Train a small CNN in float.
2. Fake-quantize its weights and activations with every algorithm (fixed, LSQ, PACT, DoReFa,
   DSQ, TQT, NNIE, AdaRound, QDrop) at 8 bits and report the test accuracy of each.
3. Show quantization-aware training at 4 bits: LSQ's learnable scales recover accuracy that
   plain min/max quantization loses.
4. Export each quantized model to ONNX (MQBench's fake-quant nodes, and standard QDQ where the
   algorithm has that form), check every file with onnx.checker, and run the QDQ files in
   onnxruntime to confirm they compute what the fake-quant model computes.
5. MQBench's flow on a module version of the CNN: prepare_by_platform for every backend,
   calibrate, evaluate; 4-bit calibration vs 4-bit QAT; the observers compared at 4 bits.

Usage:  python3 examples/fake_quantize_tour.py [--quick] [--output-dir out/tour]
The main job (README) is examples/deploy_demo.py; this tour is run by the tests.
"""
import argparse
import copy
import io
import os
import sys
import time

import onnx
import torch
import torch.nn.functional as F
from tqdm import tqdm

import mqbench
from mqbench.custom_symbolic_opset import export_format, export_onnx
from mqbench.fake_quantize import QuantizeBase
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration, enable_quantization

ops = torch.ops.mqbench
from digits import DigitsNet, load_data, onnxruntime_run  # noqa: E402  (examples/digits.py)


# ---- data and float model -------------------------------------------------------------------

class Net(torch.nn.Module):
    """conv(1->16) relu conv(16->32) relu pool fc(32*4*4->10); `quant` fake-quantizes tensors."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 4 * 4, 10)
        self.quant = None

    def q(self, kind, name, t):
        return t if self.quant is None else self.quant(kind, name, t)

    def forward(self, x):
        x = self.q("act", "input", x)
        x = F.relu(F.conv2d(x, self.q("weight", "conv1", self.conv1.weight), self.conv1.bias, padding=1))
        x = self.q("act", "conv1", x)
        x = F.relu(F.conv2d(x, self.q("weight", "conv2", self.conv2.weight), self.conv2.bias, padding=1))
        x = F.max_pool2d(self.q("act", "conv2", x), 2).flatten(1)
        return F.linear(x, self.q("weight", "fc", self.fc.weight), self.fc.bias)


def accuracy(model, data):
    x, y = data
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item() * 100


def train(model, data, epochs, lr, desc="train"):
    x, y = data
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    for _ in tqdm(range(epochs), desc=desc, leave=False):
        for idx in torch.randperm(len(y), generator=g).split(64):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()


# ---- quantizers -------------------------------------------------------------------------------

def sym_scale(t, bits, per_channel):
    """Symmetric min/max scale: max|t| / (2^(b-1) - 1), per output channel or per tensor."""
    amax = t.detach().abs().flatten(1).amax(1) if per_channel else t.detach().abs().max().reshape(1)
    return (amax / (2 ** (bits - 1) - 1)).clamp_min(1e-8)


class Quantizer:
    """Holds each tensor's qparams, calibrated from one batch, and applies an algorithm."""

    def __init__(self, algorithm, bits, calib_model, calib_x):
        self.algorithm, self.bits = algorithm, bits
        self.qmax = 2 ** (bits - 1) - 1
        self.qmin = -self.qmax - 1
        self.params = {}
        self.calibrating = True
        calib_model.quant = self
        with torch.no_grad():
            calib_model(calib_x)
        self.calibrating = False
        # Registered on the model, the learnable qparams train, save and export like any
        # parameter (tracing refuses loose tensors that require grad).
        calib_model.qparams = torch.nn.ParameterList(self.learnable())

    def __call__(self, kind, name, t):
        key = (kind, name)
        if self.calibrating:
            self.params[key] = self.init(kind, t)
            return t
        return self.apply(kind, t, self.params[key])

    def init(self, kind, t):
        per_channel = kind == "weight" and self.algorithm not in ("pact", "tqt", "nnie", "qdrop", "dorefa")
        p = {"scale": sym_scale(t, self.bits, per_channel), "per_channel": per_channel}
        p["zero_point"] = torch.zeros_like(p["scale"], dtype=torch.int32)
        if self.algorithm == "lsq":
            p["scale"] = torch.nn.Parameter(p["scale"].clone())
            p["zero_point"] = p["zero_point"].float()
        if self.algorithm == "pact" and kind == "act":
            p["alpha"] = torch.nn.Parameter(t.detach().abs().max().reshape(1))
        if self.algorithm == "nnie":
            p["data_max"] = t.detach().abs().max()
        if self.algorithm == "adaround" and kind == "weight":
            s = p["scale"].view(-1, *([1] * (t.dim() - 1)))
            rest = t.detach() / s - torch.floor(t.detach() / s)
            p["alpha"] = -torch.log(1.2 / (rest + 0.1) - 1)  # h(alpha) = rest: soft output = t
        if self.algorithm == "dorefa" and kind == "weight":
            p["scale"] = torch.tensor([1.0 / self.qmax])  # normalized weights lie in (-1, 1)
        return p

    def apply(self, kind, t, p):
        a, s, z, lo, hi = self.algorithm, p["scale"], p["zero_point"], self.qmin, self.qmax
        if kind == "weight" and a != "dorefa":
            lo = -self.qmax  # symmetric range for weights, as TensorRT
        if a == "fixed":
            if p["per_channel"]:
                return ops.fake_quantize_per_channel_affine(t, s, z, 0, lo, hi)
            return ops.fake_quantize_per_tensor_affine(t, s, z, lo, hi)
        if a == "lsq":
            g = 1.0 / (t[0].numel() * hi) ** 0.5 if p["per_channel"] else 1.0 / (t.numel() * hi) ** 0.5
            if p["per_channel"]:
                return ops.fake_quantize_learnable_per_channel_affine(t, s, z, 0, lo, hi, g)
            return ops.fake_quantize_learnable_per_tensor_affine(t, s, z, lo, hi, g)
        if a == "pact":
            if kind == "act":
                alpha = p["alpha"]
                scale = alpha.detach().abs() / hi
                return ops.fake_quantize_pact(t, alpha, -alpha, scale, z, lo, hi)
            return ops.fake_quantize_per_tensor_affine(t, s, z, lo, hi)
        if a == "dorefa" and kind == "weight":
            # DoReFa weights live in (-1, 1): the network must be trained with them (below).
            return ops.fake_quantize_per_tensor_affine(ops.dorefa_normalize(t), s, z, lo, hi)
        if a == "dsq":
            if p["per_channel"]:
                return ops.fake_quantize_dsq_per_channel(t, s, z, 0, lo, hi, 0.2)
            return ops.fake_quantize_dsq_per_tensor(t, s, z, lo, hi, 0.2)
        if a == "tqt":
            return ops.fake_quantize_tqt(t, s, z.float(), lo, hi, 3 if kind == "weight" else 2)
        if a == "nnie":
            return ops.fake_quantize_nnie(t, p["data_max"])
        if a == "adaround" and kind == "weight":
            return ops.fake_quantize_adaround_per_channel(t, s, z, p["alpha"], 0, lo, hi, True)
        if a == "qdrop" and kind == "act":
            return ops.fake_quantize_qdrop_per_tensor(t, s, z, lo, hi, 0.5 if torch.is_grad_enabled() else 1.0)
        if p["per_channel"]:
            return ops.fake_quantize_per_channel_affine(t, s, z, 0, lo, hi)
        return ops.fake_quantize_per_tensor_affine(t, s, z, lo, hi)

    def learnable(self):
        return [v for p in self.params.values() for v in p.values() if isinstance(v, torch.nn.Parameter)]


ALGORITHMS = ["fixed", "lsq", "pact", "dorefa", "dsq", "tqt", "nnie", "adaround", "qdrop"]
NO_QDQ = {"nnie", "dorefa"}  # logarithmic levels; a weight transform outside the quantizer
NEEDS_TRAINING = {"dorefa"}  # its weight transform changes the weights' scale: train with it


# ---- ONNX -------------------------------------------------------------------------------------

def export(model, x, path, fmt):
    buf = io.BytesIO()
    with export_format(fmt), torch.no_grad():
        export_onnx(model, (x,), buf, input_names=["x"], output_names=["logits"],
                    dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    data = buf.getvalue()
    m = onnx.load_from_string(data)
    onnx.checker.check_model(m)
    with open(path, "wb") as f:
        f.write(data)
    fq = sum(n.domain == "mqbench" or n.op_type == "QuantizeLinear" for n in m.graph.node)
    return data, fq


# ---- main -------------------------------------------------------------------------------------

# ---- backends and observers with prepare_by_platform (MQBench's flow) --------------------------

ACADEMIC_4BIT = {
    "w_qscheme": {"bit": 4, "symmetry": True, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 4, "symmetry": False, "per_channel": False, "pot_scale": False},
    "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
    "w_observer": "MSEObserver", "a_observer": "EMAMSEObserver"}


def calibrated(float_net, backend, extra, calib_x):
    """MQBench's flow: prepare, calibrate (observers only), then quantize."""
    q = prepare_by_platform(copy.deepcopy(float_net), backend, {"extra_qconfig_dict": extra})
    q.eval()
    enable_calibration(q)
    with torch.no_grad():
        q(calib_x)
    enable_quantization(q)
    return q


def backends_and_observers(train_set, test_set, calib_x, quick):
    float_net = DigitsNet()
    train(float_net, train_set, 4 if quick else 12, 3e-3, desc="float (modules)")
    float_net.eval()
    float_acc = accuracy(float_net, test_set)
    print(f"\nprepare_by_platform on the module version of the CNN (float {float_acc:.1f}%), "
          "calibrated on one batch:")
    print(f"{'backend':12s} {'fake quantizers':>15s}  {'weights':28s} {'acc':>6s}")
    for backend in BackendType:
        extra = ACADEMIC_4BIT if backend.name.startswith("Academic") else {}
        q = calibrated(float_net, backend, extra, calib_x)
        n = sum(isinstance(m, QuantizeBase) for m in q.modules())
        w = q.conv2.weight_fake_quant
        kind = "per-ch" if w.is_per_channel else "per-t"
        desc = f"{type(w).__name__[:-12]} [{w.quant_min},{w.quant_max}] {kind}"
        print(f"{backend.name:12s} {n:15d}  {desc:28s} {accuracy(q, test_set):5.1f}%")
    # 4 bits: calibration alone vs quantization-aware training of the same prepared model
    qat = calibrated(float_net, BackendType.Academic, ACADEMIC_4BIT, calib_x)
    before = accuracy(qat, test_set)
    qat.train()
    train(qat, train_set, 2 if quick else 6, 1e-3, desc="Academic 4-bit QAT")
    qat.eval()
    print(f"Academic w4a4 (LSQ): calibrated {before:.1f}%, after QAT {accuracy(qat, test_set):.1f}%")
    cells = []
    for observer in ("MinMaxObserver", "EMAMinMaxObserver", "MSEObserver", "EMAMSEObserver",
                     "EMAQuantileObserver", "ClipStdObserver", "LSQObserver"):
        extra = dict(ACADEMIC_4BIT, a_observer=observer, a_fakequantize="FixedFakeQuantize",
                     w_fakequantize="FixedFakeQuantize")
        cells.append(f"{observer[:-8]} {accuracy(calibrated(float_net, BackendType.Academic, extra, calib_x), test_set):.1f}%")
    print("w4a4 calibrated, by activation observer: " + ", ".join(cells))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer epochs (used by the tests)")
    parser.add_argument("--output-dir", default=os.path.join("out", "tour"))
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    torch.manual_seed(0)
    start = time.time()

    train_set, test_set = load_data()
    model = Net()
    train(model, train_set, 4 if args.quick else 12, 3e-3, desc="float")
    float_acc = accuracy(model, test_set)
    calib_x = train_set[0][:256]
    print(f"mqbench {mqbench.__version__} ({mqbench._C.cpu_capability()} kernels); "
          f"float test accuracy {float_acc:.1f}%")

    rows = []
    for algo in tqdm(ALGORITHMS, desc="algorithms", leave=False):
        qmodel = Net()
        qmodel.load_state_dict(model.state_dict())
        quantizer = Quantizer(algo, 8, qmodel, calib_x)
        if algo in NEEDS_TRAINING:
            train(qmodel, train_set, 2 if args.quick else 6, 1e-3, desc=algo)
        acc = accuracy(qmodel, test_set)
        _, fq_nodes = export(qmodel, test_set[0][:8], os.path.join(args.output_dir, f"{algo}_w8a8.onnx"), "mqbench")
        agree = "-"
        if algo not in NO_QDQ:
            data, _ = export(qmodel, test_set[0][:8], os.path.join(args.output_dir, f"{algo}_w8a8_qdq.onnx"), "qdq")
            x = test_set[0][:64]
            got = onnxruntime_run(data, x)
            with torch.no_grad():
                expected = qmodel(x)
            # onnxruntime accumulates convs in another order and divides by the scale where
            # torch multiplies by its reciprocal, so an activation within an ulp of a rounding
            # tie can land one level away and propagate. Metric: same predictions, and logits
            # within 2% of the largest logit.
            same = (got.argmax(1) == expected.argmax(1)).float().mean().item() * 100
            dev = (got - expected).abs().max().item() / expected.abs().max().item() * 100
            agree = f"{same:.1f}% / {dev:.2f}%"
            if same < 98.0 or dev > 2.0:
                print(f"{algo}: onnxruntime disagrees with the fake-quant model "
                      f"(same prediction {same:.1f}%, max logit deviation {dev:.2f}%)", file=sys.stderr)
                return 1
        rows.append((algo, acc, fq_nodes, agree))

    print(f"\n8-bit weights and activations (dorefa after {2 if args.quick else 6} epochs of QAT, "
          f"the others calibrated on one batch):")
    print(f"{'algorithm':10s} {'w8a8 acc':>9s} {'fq nodes':>9s}   onnxruntime vs torch (QDQ file):")
    print(f"{'':30s}   same prediction / max logit deviation")
    for algo, acc, fq, agree in rows:
        print(f"{algo:10s} {acc:8.1f}% {fq:9d}   {agree}")

    # 4-bit: min/max calibration alone vs LSQ quantization-aware training.
    ptq = Net()
    ptq.load_state_dict(model.state_dict())
    Quantizer("fixed", 4, ptq, calib_x)
    qat = Net()
    qat.load_state_dict(model.state_dict())
    Quantizer("lsq", 4, qat, calib_x)
    before = accuracy(qat, test_set)
    train(qat, train_set, 2 if args.quick else 6, 1e-3, desc="LSQ QAT")  # qparams are registered
    print(f"\n4-bit weights and activations: min/max {accuracy(ptq, test_set):.1f}%, "
          f"LSQ before QAT {before:.1f}%, after QAT {accuracy(qat, test_set):.1f}% (float {float_acc:.1f}%)")
    export(qat, test_set[0][:8], os.path.join(args.output_dir, "lsq_w4a4.onnx"), "mqbench")
    set_log_level("WARNING")  # the qconfig dump of every backend is long
    backends_and_observers(train_set, test_set, calib_x, args.quick)
    print(f"\nONNX files in {args.output_dir}: {len(os.listdir(args.output_dir))}, all pass onnx.checker "
          f"({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
