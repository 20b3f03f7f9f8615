"""Helpers of the deploy tests: prepared models and the lockstep comparison with onnxruntime."""
import io

import onnx
import torch

import ort
from mqbench.convert_deploy import convert_onnx, export_copy
from mqbench.custom_symbolic_opset import export_onnx
from mqbench.fusion_method import convert_merge_bn
from mqbench.prepare_by_platform import prepare_by_platform
from mqbench.utils.state import enable_calibration, enable_quantization


def calibrated(model, backend, shape, seed=2, **prepare_kwargs):
    """prepare_by_platform + one calibration batch + quantization on, in eval mode."""
    q = prepare_by_platform(model, backend, **prepare_kwargs)
    q.eval()
    enable_calibration(q)
    with torch.no_grad():
        q(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)))
    enable_quantization(q)
    return q


def deploy_copy(model):
    """What convert_deploy exports for a backend with BN merge."""
    return convert_merge_bn(export_copy(model))


def activation_tensors(fakeq_bytes):
    """{activation quantizer module name: ONNX tensor it outputs} of a model exported with
    mqbench's nodes (their scale input is named after the quantizer module)."""
    out = {}
    for n in onnx.load_from_string(fakeq_bytes).graph.node:
        if n.domain == "mqbench" and len(n.input) > 1 and n.input[1].endswith(".scale"):
            name = n.input[1][:-len(".scale")]
            if name.endswith("_post_act_fake_quantizer"):
                out[name] = n.output[0]
    return out


def export_fakeq(model, shape, tmp_path):
    path = str(tmp_path / "fakeq.onnx")
    convert_onnx(model, {"x": shape}, None, path)
    with open(path, "rb") as f:
        return f.read()


def lockstep(model, x, deployed_bytes, tensors, optimize=True, runner=None, tol_steps=0.0):
    """Runs the deployed model in onnxruntime with every activation quantizer's output exposed,
    then the torch model with each activation quantizer's output replaced by onnxruntime's value
    of the same tensor, so each quantizer is compared on identical inputs (a one-level rounding
    flip cannot grow through the following layers).

    ``optimize`` as in ``ort.run``; ``runner(model_bytes, {"x": x}) -> {output name: tensor}``
    runs another runtime instead of onnxruntime (OpenVINO); values within ``tol_steps``
    quantization steps count as equal (a runtime that dequantizes with other float arithmetic).
    Returns ({quantizer: (values that differ, values, max
    difference in quantization steps)}, torch output, onnxruntime output)."""
    m = onnx.load_from_string(deployed_bytes)
    outputs = [o.name for o in m.graph.output]
    for t in tensors.values():
        if t not in outputs:
            m.graph.output.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
    got = runner(m.SerializeToString(), {"x": x}) if runner else \
        ort.run(m.SerializeToString(), {"x": x}, optimize=optimize)
    stats, hooks = {}, []
    for name, t in tensors.items():
        def hook(module, inputs, output, name=name, t=t):
            theirs = got[t].reshape(output.shape)
            diff = (output - theirs).abs()
            step = module.scale.detach().max()
            stats[name] = (int((diff > tol_steps * step).sum()), diff.numel(),
                           (diff.max() / module.scale.detach().max()).item())
            return theirs
        hooks.append(model.get_submodule(name).register_forward_hook(hook))
    try:
        with torch.no_grad():
            ours = model(x)
    finally:
        for h in hooks:
            h.remove()
    return stats, ours, got[outputs[0]]


def as_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def buffer_export(model, x, **kwargs):
    buf = io.BytesIO()
    export_onnx(model, (x,), buf, **kwargs)
    return buf.getvalue()


def check_lockstep(stats, identical=0.999):
    """Every quantizer within one quantization step; over all of them, at least `identical` of
    the values equal."""
    assert all(steps <= 1.0001 for _, _, steps in stats.values()), stats
    differ = sum(d for d, _, _ in stats.values())
    total = sum(n for _, n, _ in stats.values())
    assert differ <= (1 - identical) * total, (differ, total)


class SmallNet(torch.nn.Module):
    """conv-bn-relu, a residual add, average pooling and a classifier: every op ONNX_QNN rewrites
    (BatchNorm momentum 0.1: no host read of num_batches_tracked, as momentum=None has)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)) + y)
        return self.fc(torch.flatten(self.pool(y), 1))
