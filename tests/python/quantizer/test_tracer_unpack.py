"""Unpacking traced values (``n, c, h, w = x.shape``, ``a, b = x.chunk(2, 1)``) in CustomedTracer,
and shape values in the quantizer's IR (Note [Shape values in the IR], graph_ir.py)."""
import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.fx.proxy import TraceError

from mqbench.custom_quantizer.graph_ir import non_tensor_nodes, to_ir
from mqbench.custom_quantizer.tracer import CustomedTracer
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.state import disable_all, enable_calibration, enable_quantization
from test_prepare_by_platform import act_quantizers, config, cosine


class ShapeUnpack(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        n, c, h, w = x.shape  # an Attribute proxy (x.shape) unpacked
        y = self.conv(x).reshape(n, -1, h * w)  # h * w: operator.mul of two ints
        return self.fc(y.mean(2))


class ShapeSliceUnpack(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        b, c = x.shape[:2]
        return self.fc(F.adaptive_avg_pool2d(self.conv(x), 4).view(b, -1))


class ChunkUnpack(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        a, b = self.conv(x).chunk(2, 1)  # a plain (call_method) proxy unpacked
        return self.fc(F.adaptive_avg_pool2d(a + b, 1).flatten(1))


class SizeSliceUnpack(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        h, w = x.size()[2:]
        y = F.adaptive_avg_pool2d(self.conv(x), (h // 2, w // 2))
        return self.fc(y.flatten(1))


class StarredUnpack(nn.Module):
    def forward(self, x):
        n, *rest = x.shape
        return x.reshape(n, -1)


class Wrapper(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


def check_prepared_matches_float(model, backend, x):
    """Prepared with fake quantization off: the float function; calibrated and quantized: close
    to it but not equal. Returns the prepared model."""
    model.eval()
    q = prepare_by_platform(model, backend, config(backend))
    with torch.no_grad():
        y_float = model(x)
        disable_all(q)
        torch.testing.assert_close(q(x), y_float, rtol=1e-5, atol=1e-5)
        enable_calibration(q)
        q(x)
        enable_quantization(q)
        y = q(x)
    assert cosine(y, y_float) > 0.995, cosine(y, y_float)
    assert not torch.equal(y, y_float)
    return q


def quantizers_on_non_tensors(q):
    """Activation fake quantizers whose input the graph shows is not a tensor."""
    meta = non_tensor_nodes(q.graph)
    return [n.target for n in q.graph.nodes
            if n.op == "call_module" and n.target.endswith("_post_act_fake_quantizer")
            and n.args[0] in meta]


# Vitis quantizes the *outputs* of add / mul, TensorRT the inputs: both once put fake
# quantizers on h * w.
@pytest.mark.parametrize("backend", [BackendType.Tensorrt, BackendType.Vitis],
                         ids=lambda b: b.name)
@pytest.mark.parametrize("cls", [ShapeUnpack, ShapeSliceUnpack, ChunkUnpack, SizeSliceUnpack])
def test_unpacking_prepares_and_matches_float(cls, backend):
    torch.manual_seed(0)
    q = check_prepared_matches_float(cls(), backend, torch.randn(4, 3, 8, 8))
    assert quantizers_on_non_tensors(q) == []
    assert q(torch.randn(2, 3, 8, 8)).shape == (2, 4)  # the batch size is traced, not baked in


def test_shape_unpacking_records_one_getitem_per_name():
    gm = torch.fx.GraphModule(ShapeUnpack(), CustomedTracer().trace(ShapeUnpack()))
    getattrs = [n for n in gm.graph.nodes if n.op == "call_function" and n.args[1:] == ("shape",)]
    assert len(getattrs) == 1
    items = [u for u in getattrs[0].users if u.target is operator.getitem]
    assert sorted(u.args[1] for u in items) == [0, 1, 2, 3]


def test_chunk_unpacking_quantizes_both_halves():
    q = prepare_by_platform(ChunkUnpack().eval(), BackendType.Tensorrt)
    assert {"getitem_post_act_fake_quantizer", "getitem_1_post_act_fake_quantizer"} <= set(
        act_quantizers(q))


def test_shape_values_are_constants_in_the_ir():
    gm = torch.fx.GraphModule(ShapeUnpack(), CustomedTracer().trace(ShapeUnpack()))
    assert sorted(n.name for n in non_tensor_nodes(gm.graph)) == [
        "getattr_1", "getitem", "getitem_1", "getitem_2", "getitem_3", "mul"]
    ir = {d["name"]: d for d in to_ir(gm)}
    index = {name: i for i, name in enumerate(ir)}
    assert ir["mul"]["target"] == "non_tensor.operator.mul"
    assert ir["mul"]["inputs"] == [] and not ir["mul"]["all_args_are_nodes"]
    assert ir["getattr_1"]["target"] == "non_tensor.getattr"
    assert ir["getattr_1"]["inputs"] == [index["x"]]  # x's users still show the x.shape read
    assert ir["reshape"]["inputs"] == [index["conv"]]  # n and h * w enter as constants
    assert not ir["reshape"]["all_args_are_nodes"]
    assert ir["conv"]["target"] == "conv" and ir["conv"]["all_args_are_nodes"]


def test_tensor_arithmetic_with_a_shape_value_stays_a_tensor():
    class M(nn.Module):
        def forward(self, x):
            return x * x.shape[1] + x.size(2)

    gm = torch.fx.GraphModule(M(), CustomedTracer().trace(M()))
    meta = {n.name for n in non_tensor_nodes(gm.graph)}
    assert meta == {"getattr_1", "getitem", "size"}
    ir = {d["name"]: d for d in to_ir(gm)}
    assert ir["mul"]["target"] == "operator.mul" and ir["add"]["target"] == "operator.add"


@pytest.mark.parametrize("model", [StarredUnpack(), Wrapper(StarredUnpack())],
                         ids=["forward", "submodule"])
def test_starred_unpacking_says_what_to_write(model):
    # The number of names a starred target takes is the rank, which tracing does not know.
    with pytest.raises(TraceError, match=r"starred unpacking `v0, \*rest = x\.shape`.*"
                                         r"x\.shape\[0\], x\.shape\[1:\]") as info:
        prepare_by_platform(model, BackendType.Tensorrt)
    assert "branches or loops" not in str(info.value)
    if isinstance(model, Wrapper):
        assert "module 'inner' (StarredUnpack)" in str(info.value)


def test_starred_unpacking_of_a_call_result_also_says_what_to_write():
    class M(nn.Module):
        def forward(self, x):
            a, *rest, z = x.chunk(4, 1)
            return a + z

    with pytest.raises(TraceError, match=r"starred unpacking `v0, \*rest, w0 = chunk`"):
        CustomedTracer().trace(M())


def tiny_vit():
    torch.manual_seed(0)
    m = torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=1,
                                             num_heads=2, hidden_dim=32, mlp_dim=64)
    # torchvision zero-initializes the head and the class token; with those the logits are 0
    # and the class token a near-constant row that 8 bits round away. Trained-like values:
    nn.init.normal_(m.heads.head.weight, std=0.2)
    nn.init.normal_(m.class_token)
    return m.eval()


# Every backend, including ones registered by other tests at collection time.
@pytest.mark.parametrize("backend", list(BackendType), ids=lambda b: b.name)
def test_vision_transformer_prepares_for_every_backend(backend):
    # torchvision's VisionTransformer: `n, c, h, w = x.shape`, `torch._assert(h == ...)`,
    # `n_h * n_w`, `class_token.expand(n, -1, -1)` and `x[:, 0]` (a slice key).
    q = check_prepared_matches_float(tiny_vit(), backend, torch.randn(4, 3, 32, 32))
    assert quantizers_on_non_tensors(q) == []
    assert act_quantizers(q)
