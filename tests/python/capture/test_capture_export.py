"""The torch.export capture (``mqbench.capture``): the same quantizers as the fx capture on
torchvision architectures, calibration, a QAT step and a deploy of an exported model, the
``auto`` fallback and its errors, and the input-shape rules."""
import copy
import os
import sys

import pytest
import torch
import torch.nn as nn
import torchvision

from mqbench.capture import CaptureError
from mqbench.capture.export import export_capture
from mqbench.convert_deploy import convert_deploy
from mqbench.custom_quantizer.graph_ir import canonical_function, to_ir
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.config import UnknownNameError
from mqbench.utils.state import disable_all, enable_calibration, enable_quantization

import ort

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts"))
import sweep_torchvision as sweep  # noqa: E402

ACADEMIC = {"extra_qconfig_dict": {
    "w_qscheme": {"bit": 4, "symmetry": False, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 4, "symmetry": False, "per_channel": False, "pot_scale": False},
    "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
    "w_observer": "MinMaxObserver", "a_observer": "EMAMinMaxObserver"}}


def places(model):
    """Each activation quantizer, in graph order, as (its name, what it quantizes: the module
    path, the canonical function, or 'input')."""
    out = []
    for node in model.graph.nodes:
        if node.op != "call_module" or not node.target.endswith("_post_act_fake_quantizer"):
            continue
        src = node.args[0]
        what = (src.target if src.op == "call_module" else
                "input" if src.op == "placeholder" else
                src.meta.get("mqbench_fx_name") or canonical_function(src.target))
        out.append((node.target, what))
    return out


def weight_quantized(model):
    return sorted(n for n, m in model.named_modules() if hasattr(m, "weight_fake_quant"))


@pytest.mark.parametrize("name,backend", [
    ("resnet18", "Tensorrt"), ("resnet18", "Academic"), ("mobilenet_v2", "Tensorrt"),
    ("mobilenet_v2", "Academic"), ("mobilenet_v3_small", "Tensorrt"),
    ("shufflenet_v2_x0_5", "Tensorrt"), ("regnet_x_400mf", "OPENVINO")])
def test_fx_and_export_place_the_same_quantizers(name, backend):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)().eval()
    x = torch.randn(1, 3, 32, 32)
    extra = ACADEMIC if backend == "Academic" else {}
    fx = prepare_by_platform(model, BackendType[backend], copy.deepcopy(extra))
    ex = prepare_by_platform(model, BackendType[backend],
                             dict(copy.deepcopy(extra), capture="export", example_inputs=(x,)))
    fx_places, ex_places = places(fx), places(ex)
    assert len(fx_places) > 10
    assert [w for _, w in ex_places] == [w for _, w in fx_places]
    # Names too, except the numbering of getitem nodes: fx also numbers the getitems of
    # ShuffleNet's `n, c, h, w = x.size()`, which export folds into constants.
    assert [n for n, w in ex_places if w != "operator.getitem"] == \
        [n for n, w in fx_places if w != "operator.getitem"]
    assert weight_quantized(ex) == weight_quantized(fx)
    for q in (fx, ex):
        enable_calibration(q)
        q(x)
        enable_quantization(q)
    torch.testing.assert_close(ex(x), fx(x), rtol=0, atol=0)


class Upsampler(nn.Module):
    """conv, then a transposed conv + BN + ReLU (whose forward takes an optional
    ``output_size``), then a 1x1 conv head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        return self.head(self.relu(self.bn(self.up(self.conv(x)))))


@pytest.mark.parametrize("backend", ["Tensorrt", "Vitis", "OPENVINO"])
@pytest.mark.parametrize("qat", [True, False])
def test_fx_and_export_place_the_same_quantizers_around_a_transposed_conv(backend, qat):
    # a layer whose forward has optional arguments is lifted when called with one input
    torch.manual_seed(0)
    model, x = Upsampler().train(qat), torch.randn(2, 3, 8, 8)
    fx = prepare_by_platform(copy.deepcopy(model), BackendType[backend], is_qat=qat)
    ex = prepare_by_platform(copy.deepcopy(model), BackendType[backend],
                             {"capture": "export", "example_inputs": (x,)}, is_qat=qat)
    assert places(ex) == places(fx)
    assert weight_quantized(ex) == weight_quantized(fx)
    assert type(ex.up) is type(fx.up)


class UpsamplerToSize(Upsampler):
    def forward(self, x):
        return self.head(self.relu(self.bn(self.up(self.conv(x), output_size=[17, 17]))))


def test_a_transposed_conv_called_with_output_size_is_not_lifted():
    # output_size changes the call's output_padding: a lifted up(x) would lose it
    torch.manual_seed(0)
    model, x = UpsamplerToSize().eval(), torch.randn(2, 3, 8, 8)
    ex = prepare_by_platform(copy.deepcopy(model), BackendType.Tensorrt,
                             {"capture": "export", "example_inputs": (x,)}, is_qat=False)
    assert "up" not in weight_quantized(ex)
    disable_all(ex)
    with torch.no_grad():
        torch.testing.assert_close(ex(x), model(x))
    assert model(x).shape[-1] == 17


def test_export_capture_lifts_leaf_modules_and_names_aten_ops_as_fx():
    model = torchvision.models.resnet18().eval()
    gm = export_capture(model, (torch.randn(1, 3, 32, 32),))
    ir = {d["name"]: d for d in to_ir(gm)}
    assert ir["conv1"]["op"] == "call_module" and ir["conv1"]["module_types"][0] == "nn.Conv2d"
    assert gm.conv1 is model.conv1  # the model's own modules (parameters shared)
    assert ir["layer1_0_relu_1"]["target"] == "layer1.0.relu_dup1"  # second call, own copy
    assert ir["add"]["target"] == "operator.add"  # aten.add_.Tensor (out += identity)
    assert ir["flatten"]["target"] == "torch.flatten"
    assert not [n for n in gm.graph.nodes if n.op == "get_attr"]  # all weights inside modules


def test_export_captured_model_trains_and_deploys_as_the_fx_one(tmp_path):
    # Both captures of one model, calibrated, trained a step and deployed for TensorRT with the
    # dynamo exporter, give the same deployed model (onnxruntime outputs).
    torch.manual_seed(0)
    model = sweep.with_bn_statistics(torchvision.models.resnet18(), 32).train()
    x = torch.randn(2, 3, 32, 32)
    outputs = {}
    for capture in ("export", "fx"):
        q = prepare_by_platform(copy.deepcopy(model), BackendType.Tensorrt,
                                {"capture": capture, "example_inputs": (x,)})
        assert type(q.conv1).__name__ == "ConvBnReLU2d" and q.training
        enable_calibration(q)
        q(x)
        enable_quantization(q)
        opt = torch.optim.SGD(q.parameters(), lr=1e-3)
        before = q.layer1.get_submodule("0").conv1.weight.detach().clone()
        q(x).square().mean().backward()
        assert q.conv1_post_act_fake_quantizer.scale.grad is not None
        opt.step()
        assert not torch.equal(before, q.layer1.get_submodule("0").conv1.weight)
        q.eval()
        with torch.no_grad():
            fake = q(x)
        written = convert_deploy(q, BackendType.Tensorrt, {"x": [2, 3, 32, 32]},
                                 output_path=str(tmp_path / capture), model_name="r18",
                                 dynamo=True)
        path = str(tmp_path / capture / "r18_deploy_model.onnx")
        assert path in written and str(tmp_path / capture / "r18_clip_ranges.json") in written
        with open(path, "rb") as f:
            outputs[capture] = (fake, next(iter(ort.run(f.read(), {"x": x}).values())))
    torch.testing.assert_close(outputs["export"][0], outputs["fx"][0], rtol=0, atol=0)
    torch.testing.assert_close(outputs["export"][1], outputs["fx"][1], rtol=1e-4, atol=1e-5)


class StarredUnpack(nn.Module):
    """fx cannot trace a starred unpacking of a shape; export can."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        n, *rest = x.shape
        y = self.conv(x).mean((2, 3))
        return self.fc(y).reshape(n, -1)


class DataDependent(nn.Module):
    """Neither capture can take a branch on a tensor's value."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return x


def test_auto_falls_back_to_export_when_fx_cannot_trace():
    x = torch.randn(2, 3, 8, 8)
    model = StarredUnpack().eval()
    q = prepare_by_platform(model, BackendType.Tensorrt, {"example_inputs": (x,)})
    assert {"x_post_act_fake_quantizer", "mean_post_act_fake_quantizer"} <= \
        {n for n, _ in q.named_modules()}
    assert type(q.conv).__name__ == "Conv2d" and hasattr(q.conv, "weight_fake_quant")
    enable_calibration(q)
    q(x)
    enable_quantization(q)
    assert q(x).shape == (2, 2)


def test_auto_without_example_inputs_says_to_pass_them():
    with pytest.raises(CaptureError, match=r"(?s)starred unpacking.*example_inputs"):
        prepare_by_platform(StarredUnpack(), BackendType.Tensorrt)
    # capture='fx' gives fx's own error
    with pytest.raises(torch.fx.proxy.TraceError, match="starred unpacking") as info:
        prepare_by_platform(StarredUnpack(), BackendType.Tensorrt, {"capture": "fx"})
    assert not isinstance(info.value, CaptureError)


def test_when_both_captures_fail_one_error_names_both():
    with pytest.raises(CaptureError) as info:
        prepare_by_platform(DataDependent(), BackendType.Tensorrt,
                            {"example_inputs": (torch.randn(2, 4),)})
    message = str(info.value)
    assert "torch.fx: TraceError" in message and "torch.export: " in message
    assert "leaf_module" in message and "concrete_args" in message


def test_capture_options_are_checked():
    with pytest.raises(UnknownNameError, match="'exports'.*did you mean 'export'"):
        prepare_by_platform(StarredUnpack(), BackendType.Tensorrt, {"capture": "exports"})
    with pytest.raises(ValueError, match="needs prepare_custom_config_dict\\['example_inputs'\\]"):
        prepare_by_platform(StarredUnpack(), BackendType.Tensorrt, {"capture": "export"})
    with pytest.raises(TypeError, match="tuple of positional arguments or a dict"):
        prepare_by_platform(StarredUnpack(), BackendType.Tensorrt,
                            {"capture": "export", "example_inputs": [[1, 2]][0][0]})
    with pytest.raises(ValueError, match="give 'example_inputs' too"):
        prepare_by_platform(StarredUnpack(), BackendType.Tensorrt,
                            {"dynamic_shapes": ({0: torch.export.Dim("b")},)})


def test_export_capture_refuses_other_shapes_unless_dynamic():
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 32, 32)
    q = prepare_by_platform(model, BackendType.Tensorrt,
                            {"capture": "export", "example_inputs": (x,)})
    q(x)
    with pytest.raises(ValueError, match=r"input 'x' has shape \[1, 3, 32, 32\], but the model "
                                         r"was captured by torch\.export for \[2, 3, 32, 32\]"
                                         r".*dynamic_shapes"):
        q(x[:1])
    with pytest.raises(ValueError, match=r"has shape \[2, 3, 32\]"):
        q(x[..., 0])
    batch = torch.export.Dim("batch", min=1, max=16)
    d = prepare_by_platform(model, BackendType.Tensorrt,
                            {"capture": "export", "example_inputs": (x,),
                             "dynamic_shapes": ({0: batch},)})
    f = prepare_by_platform(model, BackendType.Tensorrt)
    assert places(d) == places(f)
    for q in (d, f):
        enable_calibration(q)
        q(x)
        enable_quantization(q)
    for n in (1, 3):
        torch.testing.assert_close(d(torch.ones(n, 3, 32, 32)), f(torch.ones(n, 3, 32, 32)))
    with pytest.raises(ValueError, match=r"captured by torch\.export for \[\*, 3, 32, 32\]"):
        d(torch.ones(1, 3, 48, 48))


def _ddp_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        torch.manual_seed(0)
        model = StarredUnpack().train()
        x = torch.randn(4, 3, 8, 8)
        q = prepare_by_platform(model, BackendType.Tensorrt,
                                {"capture": "export", "example_inputs": (x,)})
        enable_calibration(q)
        q(x)
        enable_quantization(q)
        ddp = DistributedDataParallel(q)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        torch.manual_seed(1 + rank)  # each rank its own batch
        for _ in range(2):
            opt.zero_grad()
            ddp(torch.randn(4, 3, 8, 8)).square().mean().backward()
            opt.step()
        torch.save({k: v for k, v in q.named_parameters()}, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_export_captured_model_trains_under_ddp(tmp_path):
    import torch.distributed as dist
    import torch.multiprocessing as mp
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    a, b = (torch.load(tmp_path / f"{r}.pt") for r in (0, 1))
    torch.manual_seed(0)
    start = dict(StarredUnpack().named_parameters())
    assert set(a) == set(b) and "conv.weight" in a and "x_post_act_fake_quantizer.scale" in a
    for name in a:  # DDP averaged the gradients: every rank made the same steps
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    assert not torch.equal(a["conv.weight"], start["conv.weight"])
