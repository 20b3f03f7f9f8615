"""Helpers of the deploy tests: prepared models, the lockstep comparison with onnxruntime, and
the reading of Tensorrt's calibration cache."""
import io
import json
import re
import struct

import numpy as np
import onnx
import torch
from onnx import numpy_helper

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


# TensorRT's calibration cache (docs/deploy.md, "TensorRT: the calibration cache"): a first line
# TRT-<version>-EntropyCalibration2, then one "<tensor>: <scale>" line per tensor, the scale the
# 8 hex digits of its float32 bits; a name runs to the line's last ": ".
CALIBRATION_CACHE_HEADER = re.compile(r"TRT-[0-9]{4,6}-EntropyCalibration2")
CALIBRATION_CACHE_LINE = re.compile(r"(.+): ([0-9a-f]{8})")


def read_calibration_cache(text):
    """``{tensor: the float32 bits of its scale}`` of a calibration cache, in its order; every
    line is checked against the format."""
    assert text.endswith("\n"), repr(text[-40:])
    lines = text[:-1].split("\n")
    assert CALIBRATION_CACHE_HEADER.fullmatch(lines[0]), lines[0]
    out = {}
    for line in lines[1:]:
        m = CALIBRATION_CACHE_LINE.fullmatch(line)
        assert m, line
        assert m.group(1) not in out, line
        out[m.group(1)] = int(m.group(2), 16)
    return out


def float32_bits(value):
    """The bits of ``value`` rounded to float32, as an int."""
    return struct.unpack(">I", struct.pack(">f", value))[0]


def qdq_activation_scales(model_bytes):
    """``{tensor: the float32 bits of its scale}`` of a QDQ model: the QuantizeLinear nodes whose
    input is a tensor the graph computes (not a weight)."""
    m = onnx.load_from_string(model_bytes)
    inits = {i.name: i for i in m.graph.initializer}
    out = {}
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in inits:
            scale = numpy_helper.to_array(inits[n.input[1]])
            assert scale.dtype == np.float32 and scale.size == 1, n.name
            out[n.input[0]] = int(scale.reshape(-1).view(np.uint32)[0])
    return out


def check_calibration_cache(directory, name, qdq_bytes=None):
    """Checks ``<name>_calib.cache`` in ``directory`` against ``<name>_clip_ranges.json``: every
    tensor of blob_range, in its order, with the float32 of its range / 127 bit for bit; and, given
    the Tensorrt QDQ model of the same export, that each tensor quantized in both has the same
    float32 scale bit for bit, and that every activation of the QDQ model is in the cache.
    Returns the cache (``read_calibration_cache``)."""
    with open(directory / f"{name}_calib.cache") as f:
        cache = read_calibration_cache(f.read())
    with open(directory / f"{name}_clip_ranges.json") as f:
        blob_range = json.load(f)["tensorrt"]["blob_range"]
    assert list(cache) == list(blob_range)
    assert cache == {t: float32_bits(r / 127) for t, r in blob_range.items()}
    if qdq_bytes is not None:
        qdq = qdq_activation_scales(qdq_bytes)
        assert qdq and set(qdq) <= set(cache), sorted(set(qdq) - set(cache))
        assert {t: cache[t] for t in qdq} == qdq
    return cache


def without_quantizers(model, *names):
    """``model`` (a prepared GraphModule, changed in place and returned) without the activation
    fake quantizers ``names``: their users read the quantizers' inputs."""
    for node in list(model.graph.nodes):
        if node.op == "call_module" and node.target in names:
            node.replace_all_uses_with(node.args[0])
            model.graph.erase_node(node)
            model.delete_submodule(node.target)
    model.recompile()
    missing = [n for n in names if hasattr(model, n)]
    assert not missing, missing
    return model
