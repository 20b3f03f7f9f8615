"""The QDQ export runs in a real runtime (onnxruntime) and computes what the op computes."""
import io

import onnx
import pytest
import torch

import ort
from mqbench.custom_symbolic_opset import export_format, export_onnx

ops = torch.ops.mqbench


class Model(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


SC = torch.tensor([0.011, 0.02, 0.034, 0.05])
CASES = {
    "per_tensor_int8": lambda x: ops.fake_quantize_per_tensor_affine(x, torch.tensor([0.013]), torch.tensor([0]), -128, 127),
    "per_tensor_uint8_zp": lambda x: ops.fake_quantize_per_tensor_affine(x, torch.tensor([0.017]), torch.tensor([93]), 0, 255),
    "per_tensor_symmetric_range": lambda x: ops.fake_quantize_per_tensor_affine(x, torch.tensor([0.013]), torch.tensor([0]), -127, 127),
    "per_channel": lambda x: ops.fake_quantize_per_channel_affine(x, SC, torch.tensor([0, 3, -4, 9], dtype=torch.int32), 1, -128, 127),
    "learnable_4bit": lambda x: ops.fake_quantize_learnable_per_tensor_affine(x, torch.tensor([0.21]), torch.tensor([2.2]), 0, 15, 1.0),
    "learnable_per_channel": lambda x: ops.fake_quantize_learnable_per_channel_affine(x, SC, torch.tensor([0.0, 1.0, 2.0, 3.0]), 1, -127, 127, 1.0),
    "pact": lambda x: ops.fake_quantize_pact(x, torch.tensor([1.5]), torch.tensor([-1.5]), torch.tensor([3.0 / 255]), torch.tensor([0]), -128, 127),
    "tqt": lambda x: ops.fake_quantize_tqt(x, torch.tensor([0.013]), torch.tensor([0.0]), -128, 127, 3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_qdq_export_agrees_with_the_op_in_onnxruntime(case):
    ort.require()
    fn = CASES[case]
    x = torch.randn(2, 4, 16, 16, generator=torch.Generator().manual_seed(0)) * 2
    expected = fn(x)
    buf = io.BytesIO()
    with export_format("qdq"):
        export_onnx(Model(fn), (x,), buf, input_names=["x"], output_names=["y"])
    onnx.checker.check_model(onnx.load_from_string(buf.getvalue()))
    got = ort.run(buf.getvalue(), {"x": x})["y"]
    # onnxruntime divides by the scale where torch multiplies by its float reciprocal, so an
    # input within an ulp of a rounding tie may land one level away. Metric: every output within
    # one quantization step, and at least 99.9% identical.
    step = 0.21 if case == "learnable_4bit" else 0.06
    assert (got - expected).abs().max().item() <= step
    assert (got == expected).float().mean().item() >= 0.999
