"""The OPENVINO backend's deployed model run in OpenVINO itself (PyPI ``openvino``, CPU), against
the fake-quant model after quantization-aware training, where learned scales clip (calibration
alone hides clipping bugs): a small conv net after 100 LSQ steps, the digits CNN of the
examples after training and QAT, and torchvision's resnet18 and mobilenet_v2 after QAT steps.

OPENVINO simulates 7-bit weights ([-64, 63]) and deploys them, as MQBench does, as 256-level
FakeQuantize nodes over [-128 s, 127 s] (the int8 layout OpenVINO's low-precision transforms
expect); the weights are written already clipped to the simulated [-64 s, 63 s], so the
deployed model computes what was trained (docs/compatibility.md row 136).

openvino is a test dependency (requirements-dev.txt): a missing install fails these tests."""
import os
import sys

import numpy as np
import onnx
import pytest
import torch
import torchvision
from onnx import numpy_helper

from deploy_helpers import (SmallNet, activation_tensors, check_lockstep, deploy_copy,
                            export_fakeq, lockstep)
from mqbench.convert_deploy import convert_deploy
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.state import enable_calibration, enable_quantization
from test_prepare_by_platform import with_bn_statistics

try:
    import openvino
except ImportError:  # reported by each test
    openvino = None

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples")


def run_openvino(path, x):
    if openvino is None:
        pytest.fail("openvino is not installed: scripts/setup.sh installs requirements-dev.txt")
    core = openvino.Core()
    compiled = core.compile_model(core.read_model(path), "CPU")
    return torch.from_numpy(np.asarray(compiled(x.numpy())[0]))


def prepared_and_trained(net, batches, steps, lr=1e-2, target=None):
    """OPENVINO prepare, calibration on the batches, then `steps` Adam steps of LSQ QAT."""
    q = prepare_by_platform(net, BackendType.OPENVINO)
    q.train()
    enable_calibration(q)
    with torch.no_grad():
        for b in batches:
            q(b)
    enable_quantization(q)
    opt = torch.optim.Adam(q.parameters(), lr=lr)
    for step in range(steps):
        x = batches[step % len(batches)]
        out = q(x)
        loss = (out - (target(x) if target else 0.0)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return q.eval()


def deploy_and_compare(q, x, tmp_path):
    """(relative L2, max |difference|, max |output|) of OpenVINO's run against the fake-quant
    model, and the deployed ONNX."""
    with torch.no_grad():
        want = q(x)
    convert_deploy(q, BackendType.OPENVINO, {"x": list(x.shape)}, output_path=str(tmp_path),
                   model_name="m")
    path = str(tmp_path / "m_deploy_model.onnx")
    got = run_openvino(path, x)
    rel = ((got - want).norm() / want.norm()).item()
    return rel, (got - want).abs().max().item(), want.abs().max().item(), onnx.load(path)


def test_weights_trained_to_clip_are_deployed_clipped(tmp_path):
    torch.manual_seed(0)
    batches = [torch.randn(8, 3, 16, 16) for _ in range(4)]
    q = prepared_and_trained(SmallNet(), batches, steps=100,
                             target=lambda x: x.mean((1, 2, 3))[:, None])
    for m in q.modules():
        if hasattr(m, "weight_fake_quant"):  # OPENVINO's weights: 7 bits
            assert (m.weight_fake_quant.quant_min, m.weight_fake_quant.quant_max) == (-64, 63)
    deployed = check_in_lockstep(q, [4, 3, 16, 16], tmp_path)
    # end to end in OpenVINO (a small net: the tie flips of its int8 kernels stay small)
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = q(x)
    got = run_openvino(str(tmp_path / "m_deploy_model.onnx"), x)
    assert ((got - want).norm() / want.norm()).item() < 1e-2
    # the layout OpenVINO expects: 256-level FakeQuantize on every weight, [-128 s, 127 s]
    inits = {i.name: numpy_helper.to_array(i) for i in deployed.graph.initializer}
    weight_fqs = [n for n in deployed.graph.node
                  if n.op_type == "FakeQuantize" and n.input[0] in inits]
    assert len(weight_fqs) == 3
    for n in weight_fqs:
        levels = {a.name: a.i for a in n.attribute}["levels"]
        assert levels == 256
        w, lo, hi = inits[n.input[0]], inits[n.input[1]], inits[n.input[2]]
        s = (hi - lo) / 255
        assert np.allclose(lo, -128 * s) and np.allclose(hi, 127 * s)
        assert (w >= -64 * s * (1 + 1e-6)).all() and (w <= 63 * s * (1 + 1e-6)).all()


def _epoch(model, x, y, lr):
    """One epoch of Adam on cross-entropy, batches of 64."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for i in range(0, len(x), 64):
        loss = torch.nn.functional.cross_entropy(model(x[i:i + 64]), y[i:i + 64])
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_digits_cnn_after_qat_runs_in_openvino(tmp_path):
    sys.path.insert(0, EXAMPLES)
    try:
        from digits import DigitsNet, load_data
    finally:
        sys.path.remove(EXAMPLES)
    (x, y), (xt, yt) = load_data()
    torch.manual_seed(0)
    net = DigitsNet()
    _epoch(net, x, y, lr=1e-2)  # float
    q = prepare_by_platform(net, BackendType.OPENVINO)
    q.train()
    enable_calibration(q)
    with torch.no_grad():
        q(x[:256])
    enable_quantization(q)
    _epoch(q, x, y, lr=1e-3)  # QAT
    q.eval()
    rel, diff, peak, _ = deploy_and_compare(q, xt, tmp_path)
    assert rel < 1e-3, (rel, diff, peak)
    with torch.no_grad():
        want = q(xt).argmax(1)
    got = run_openvino(str(tmp_path / "m_deploy_model.onnx"), xt).argmax(1)
    assert (got == want).float().mean().item() >= 0.995


def emulated(model_bytes):
    """The deployed model with each OpenVINO FakeQuantize written as the standard ONNX ops of its
    definition (OpenVINO's operation spec): q = round((clip(x, il, ih) - il) / (ih - il) *
    (levels - 1)), y = q / (levels - 1) * (oh - ol) + ol. onnxruntime runs it op by op: what the
    artifact computes, apart from how OpenVINO's int8 kernels compute it."""
    m = onnx.load_from_string(model_bytes)
    nodes = []
    for n in m.graph.node:
        if n.op_type != "FakeQuantize":
            nodes.append(n)
            continue
        levels = {a.name: a.i for a in n.attribute}["levels"]
        x, il, ih, ol, oh = n.input
        p = n.name + "/emulated/"
        m.graph.initializer.append(numpy_helper.from_array(
            np.array(levels - 1, dtype=np.float32), p + "steps"))
        make = onnx.helper.make_node
        nodes += [make("Max", [x, il], [p + "a"]), make("Min", [p + "a", ih], [p + "b"]),
                  make("Sub", [p + "b", il], [p + "c"]), make("Sub", [ih, il], [p + "r"]),
                  make("Div", [p + "c", p + "r"], [p + "d"]), make("Mul", [p + "d", p + "steps"], [p + "e"]),
                  make("Round", [p + "e"], [p + "f"]), make("Div", [p + "f", p + "steps"], [p + "g"]),
                  make("Sub", [oh, ol], [p + "h"]), make("Mul", [p + "g", p + "h"], [p + "i"]),
                  make("Add", [p + "i", ol], [n.output[0]])]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    keep = [o for o in m.opset_import if o.domain != "org.openvinotoolkit"]
    del m.opset_import[:]
    m.opset_import.extend(keep)
    return m.SerializeToString()


def openvino_runner(model_bytes, inputs):
    """deploy_helpers.lockstep's runner: every graph output by name, from OpenVINO."""
    if openvino is None:
        pytest.fail("openvino is not installed: scripts/setup.sh installs requirements-dev.txt")
    core = openvino.Core()
    compiled = core.compile_model(core.read_model(model=model_bytes, weights=b""), "CPU")
    result = compiled({k: v.numpy() for k, v in inputs.items()})
    return {out.get_any_name(): torch.from_numpy(np.asarray(result[out]))
            for out in compiled.outputs}


def check_in_lockstep(q, shape, tmp_path):
    """Deploys `q` and compares it in lockstep (deploy_helpers.lockstep: every activation
    quantizer of the torch model gets the runtime's value of its input layer): the artifact, its
    FakeQuantize nodes emulated with standard ops in onnxruntime, gives the fake-quant model's
    quantized values (up to 1e-3 of a step: the definition dequantizes as q / 255 * (oh - ol) +
    ol, not q * s), but for a few ties; OpenVINO's int8 kernels agree within one step (their
    requantization rounds values near a tie the other way: counted exactly, 9% of resnet18's
    values and 27% of mobilenet_v2's on one machine). Values are compared to 1e-3 of a step, as
    for the emulation: on an AMD EPYC without AVX-512 OpenVINO's FakeQuantize differs from the
    fake-quant model in the last bits of nearly every value (44% of mobilenet_v2's counted
    exactly, 1 in 292,672 beyond 1e-3 of a step; resnet18 26 in 139,264), which is the float
    formula, not a rounding. Returns the deployed ONNX."""
    convert_deploy(q, BackendType.OPENVINO, {"x": shape}, output_path=str(tmp_path),
                   model_name="m")
    merged = deploy_copy(q)
    tensors = activation_tensors(export_fakeq(merged, shape, tmp_path))
    with open(tmp_path / "m_deploy_model.onnx", "rb") as f:
        deployed = f.read()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5))
    stats, ours, theirs = lockstep(merged, x, emulated(deployed), tensors, optimize=False,
                                   tol_steps=1e-3)
    assert len(stats) == len(tensors)
    check_lockstep(stats, identical=0.999)
    assert (ours - theirs).abs().max() <= 1e-4 * max(1.0, ours.abs().max().item())
    stats, _, _ = lockstep(merged, x, deployed, tensors, runner=openvino_runner, tol_steps=1e-3)
    check_lockstep(stats, identical=0.6)
    return onnx.load_from_string(deployed)


@pytest.mark.parametrize("arch", ["resnet18", "mobilenet_v2"])
def test_torchvision_after_qat_runs_in_openvino(arch, tmp_path):
    """Deep random-weight nets amplify any rounding tie flipped by another summation order:
    compared in lockstep (check_in_lockstep)."""
    torch.manual_seed(0)
    net = with_bn_statistics(getattr(torchvision.models, arch)(num_classes=10), (8, 3, 32, 32))
    batches = [torch.randn(4, 3, 32, 32) for _ in range(2)]
    q = prepared_and_trained(net, batches, steps=6, lr=1e-3)
    check_in_lockstep(q, [2, 3, 32, 32], tmp_path)
