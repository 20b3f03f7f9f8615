"""Prepared models on the device: a QAT step with no host synchronisation, the same step as on the
CPU, quantizers built on the model's device, and torchvision's resnet18 trained on the device then
deployed and run in onnxruntime. The harness and the GPU skip: cuda_harness.py."""
import copy
from contextlib import contextmanager

import pytest
import torch
import torch.nn as nn
import torchvision

from cuda_harness import batch, needs_gpu, no_host_sync
from deploy_helpers import SmallNet  # conv-bn-relu, residual, pool, fc
from mqbench.convert_deploy import convert_deploy
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration, enable_quantization

set_log_level("WARNING")


ACADEMIC_LSQ = {"extra_qconfig_dict": {
    "w_qscheme": {"bit": 8, "symmetry": True, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 8, "symmetry": True, "per_channel": False, "pot_scale": False},
    "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
    "w_observer": "MinMaxObserver", "a_observer": "EMAMinMaxObserver"}}
FLOWS = {"Academic_LSQ": (BackendType.Academic, ACADEMIC_LSQ),
         "Tensorrt": (BackendType.Tensorrt, {})}


def calibrated_net(flow, device, net=None, shape=(4, 3, 16, 16)):
    """A network prepared on `device` (the float model moved there first), calibrated on two
    batches in training mode (the BatchNorm statistics QAT will see), then in QAT mode
    (observers off, fake quantization on)."""
    backend, config = FLOWS[flow]
    torch.manual_seed(0)
    net = (net or SmallNet()).to(device).train()
    q = prepare_by_platform(net, backend, copy.deepcopy(config))
    enable_calibration(q)
    with torch.no_grad():
        for seed in (1, 2):
            q(batch(shape, seed).to(device))
    enable_quantization(q)
    return q


def qat_step(model, x, target, opt):
    opt.zero_grad()
    out = model(x)
    loss = (out - target).square().mean()
    loss.backward()
    opt.step()
    return out.detach(), loss.detach()


@pytest.mark.parametrize("flow", FLOWS)
def test_qat_step_has_no_host_synchronisation(flow, device):
    """Forward, backward and SGD step of a calibrated LSQ (Academic) or fixed (Tensorrt) model
    neither read values on the host nor, on CUDA, synchronise with the device."""
    q = calibrated_net(flow, device)
    opt = torch.optim.SGD(q.parameters(), lr=0.01, momentum=0.9)
    x, target = batch((4, 3, 16, 16), 3).to(device), batch((4, 10), 4).to(device)
    qat_step(q, x, target, opt)  # warm-up: allocator, cuDNN and cuBLAS set-up
    before = {n: p.detach().clone() for n, p in q.named_parameters()}
    with no_host_sync(device):
        for _ in range(2):
            qat_step(q, x, target, opt)
    assert any(not torch.equal(before[n], p.detach()) for n, p in q.named_parameters()
               if n.endswith(".scale")), "the step trained no quantizer scale"


@contextmanager
def full_precision_convolutions():
    """cuDNN convolutions in TF32 (torch's default on Ampere and later) round their inputs to 10
    bits: comparisons with the CPU run in float32."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def cosine(a, b):
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(),
                                                 dim=0).item()


@pytest.mark.parametrize("flow", FLOWS)
def test_qat_step_on_device_equals_the_cpu_step(flow, device):
    """From identical state (a deep copy of a model calibrated on the CPU, moved to `device`),
    one QAT step gives the same output, loss, gradients and updated parameters as on the CPU,
    within float rounding (a value at a rounding tie may land one level away on another
    device, so whole tensors are compared by cosine)."""
    cpu = calibrated_net(flow, "cpu")
    dev = copy.deepcopy(cpu).to(device)
    x, target = batch((4, 3, 16, 16), 3), batch((4, 10), 4)
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.01)
    opt_d = torch.optim.SGD(dev.parameters(), lr=0.01)
    out_c, loss_c = qat_step(cpu, x, target, opt_c)
    with full_precision_convolutions():
        out_d, loss_d = qat_step(dev, x.to(device), target.to(device), opt_d)
    assert abs(loss_d.item() - loss_c.item()) <= 1e-3 * abs(loss_c.item())
    assert cosine(out_d.cpu(), out_c) >= 0.999
    params_d = dict(dev.named_parameters())
    # Gradients that are zero in exact arithmetic (a conv bias before BatchNorm, a symmetric
    # zero point) are float noise: directions are compared for the others.
    largest = max(p.grad.norm().item() for p in cpu.parameters() if p.grad is not None)
    checked = 0
    for name, p in cpu.named_parameters():
        pd = params_d[name]
        assert pd.device.type == device, name
        if p.grad is None:
            assert pd.grad is None, name
            continue
        if p.grad.norm() > 1e-4 * largest:
            assert cosine(pd.grad.cpu(), p.grad) >= 0.99, name
            checked += 1
        torch.testing.assert_close(pd.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"{name} after the step: {m}")
    assert checked >= 8
    for (name, b), bd in zip(cpu.named_buffers(), dev.buffers()):
        if b.is_floating_point():
            torch.testing.assert_close(bd.cpu(), b, rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"buffer {name}: {m}")


@pytest.mark.parametrize("target", ["meta", pytest.param("cuda", marks=needs_gpu)])
def test_prepare_puts_quantizers_on_the_model_device(target):
    """prepare_by_platform on a model that lives on another device than the CPU builds its
    quantizers there too (a CUDA model's first forward would otherwise mix devices); the meta
    device proves it here."""
    for flow in FLOWS:
        backend, config = FLOWS[flow]
        q = prepare_by_platform(SmallNet().to(target), backend, copy.deepcopy(config))
        devices = {t.device.type for t in list(q.parameters()) + list(q.buffers())}
        assert devices == {target}, (flow, devices)


# ---- resnet18 end to end -------------------------------------------------------------------

R18_SHAPE = [2, 3, 64, 64]


def test_resnet18_qat_on_device_deploys_and_runs_in_onnxruntime(device, tmp_path):
    """torchvision's resnet18 (random weights) prepared for Academic with LSQ on the device,
    calibrated on two batches; one QAT step equals the same step on the CPU from identical state
    (a deep copy: loss and logits; the small network's test compares gradients, which on a
    random resnet spread from any one-level flip); three QAT steps with SGD; then moved to the
    CPU, deployed with convert_deploy and run in onnxruntime, agreeing with the prepared model
    as the CPU deploy tests require."""
    import ort
    from deploy_helpers import (activation_tensors, check_lockstep, deploy_copy, export_fakeq,
                                lockstep)
    from test_prepare_by_platform import with_bn_statistics
    ort.require()
    torch.manual_seed(0)
    net = with_bn_statistics(torchvision.models.resnet18(), (4, 3, 64, 64))
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.momentum = 0.1
    q = calibrated_net("Academic_LSQ", device, net, tuple(R18_SHAPE))
    assert {t.device.type for t in q.parameters()} == {device}
    ref = copy.deepcopy(q).cpu()
    x, target = batch(R18_SHAPE, 20), batch((2, 1000), 21) * 0.1
    opt = torch.optim.SGD(q.parameters(), lr=1e-3, momentum=0.9)
    with full_precision_convolutions():
        out_d, loss_d = qat_step(q, x.to(device), target.to(device), opt)
    out_c, loss_c = qat_step(ref, x, target, torch.optim.SGD(ref.parameters(), lr=1e-3,
                                                             momentum=0.9))
    assert abs(loss_d.item() - loss_c.item()) <= 0.02 * abs(loss_c.item())
    assert cosine(out_d.cpu(), out_c) >= 0.97
    for step in range(2):
        qat_step(q, batch(R18_SHAPE, 22 + step).to(device), target.to(device), opt)
    q = q.cpu().eval()
    convert_deploy(q, BackendType.Academic, {"x": R18_SHAPE}, output_path=str(tmp_path),
                   model_name="r18")
    with open(tmp_path / "r18.onnx", "rb") as f:
        deployed = f.read()
    merged = deploy_copy(q)
    tensors = activation_tensors(export_fakeq(merged, R18_SHAPE, tmp_path))
    assert tensors
    stats, ours, theirs = lockstep(merged, batch(R18_SHAPE, 30), deployed, tensors)
    assert len(stats) == len(tensors)
    check_lockstep(stats, identical=0.995)  # Academic's measure in test_convert_deploy.py
    assert (ours - theirs).abs().max() <= 1e-3 * max(1.0, ours.abs().max().item())
