"""ONNX export of hadamard_transform and fake_quantize_per_token (python/mqbench/onnx/llm_ops.py)
from both exporters: standard ops only (no custom domain), onnx's full checker, and onnxruntime
against the op: the Hadamard MatMul (below BUTTERFLY_MIN_N) and butterflies (from it on) within
float32 rounding of the op, with static and dynamic leading dimensions, the per-token graphs bit
for bit (INT4 symmetric, INT8 affine, UINT8 symmetric, FP8 E4M3 / E5M2, with zero, NaN and
infinite rows), float16 / float64 inputs, the opset refusals, the same nodes from both
exporters, and a plain dynamo export through plain_export's torch forms."""
import io
import math
from collections import Counter

import numpy as np
import onnx
import pytest
import torch

from mqbench.onnx import HAS_TORCHSCRIPT_EXPORTER, export_onnx, plain_export
from mqbench.onnx.llm_ops import BUTTERFLY_MIN_N, hadamard_dense, per_token_composite, sylvester

ops = torch.ops.mqbench
ort = pytest.importorskip("onnxruntime")
# TorchScript exporter (opset 13, 19 for FP8) and dynamo (18, 19 for FP8)
EXPORTERS = ([pytest.param(False, id="torchscript")] if HAS_TORCHSCRIPT_EXPORTER else []) + \
    [pytest.param(True, id="dynamo")]


class Hadamard(torch.nn.Module):
    def __init__(self, had, scale):
        super().__init__()
        if had is not None:
            self.register_buffer("had", had)
        else:
            self.had = None
        self.scale = scale

    def forward(self, x):
        return ops.hadamard_transform(x, self.had, self.scale)


class PerToken(torch.nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.args = args

    def forward(self, x):
        return ops.fake_quantize_per_token(x, *self.args)


def export(model, x, dynamo, opset=None):
    f = io.BytesIO()
    opset = opset or (18 if dynamo else 13)
    export_onnx(model.eval(), (x,), f, opset_version=opset, dynamo=dynamo, custom_opsets=None)
    m = onnx.load_from_string(f.getvalue())
    onnx.checker.check_model(m, full_check=True)
    assert {n.domain for n in m.graph.node} <= {""}, "standard ONNX only"
    return m


def run(m, x):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return torch.from_numpy(np.array(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]))


def signs(m, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (m, m), generator=g) * 2 - 1).float()


def op_types(m):
    return [n.op_type for n in m.graph.node if n.op_type != "Constant"]


@pytest.mark.parametrize("dynamo", EXPORTERS)
@pytest.mark.parametrize("n,m", [(256, None), (768, 12), (28 * 16, 28)])
def test_hadamard_is_one_matmul_with_the_dense_matrix(dynamo, n, m):
    had = None if m is None else signs(m)
    scale = 1.0 / math.sqrt(n)
    x = torch.randn(2, 3, n, generator=torch.Generator().manual_seed(1))
    model = export(Hadamard(had, scale), x, dynamo)
    assert op_types(model) == ["MatMul"]  # the matrix folded into one constant
    mats = [onnx.numpy_helper.to_array(t) for t in model.graph.initializer] + \
        [onnx.numpy_helper.to_array(n_.attribute[0].t) for n_ in model.graph.node
         if n_.op_type == "Constant"]
    mt = [a for a in mats if a.shape == (n, n)]
    assert len(mt) == 1
    k = sylvester(n) if had is None else torch.kron(had, sylvester(n // m))
    torch.testing.assert_close(torch.from_numpy(mt[0].copy()), (k * scale).T, rtol=1e-6,
                               atol=1e-7)
    y = run(model, x)
    torch.testing.assert_close(y, ops.hadamard_transform(x, had, scale), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_hadamard_float64_and_float16_inputs(dynamo):
    had = signs(12, 2).double()
    x = torch.randn(4, 768, dtype=torch.float64)
    y = run(export(Hadamard(had, 0.1), x, dynamo), x)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, ops.hadamard_transform(x, had, 0.1), rtol=1e-12, atol=1e-12)
    xh = torch.randn(4, 256).half()
    y = run(export(Hadamard(None, 1 / 16), xh, dynamo), xh)
    assert y.dtype == torch.float16
    torch.testing.assert_close(y.float(), ops.hadamard_transform(xh, None, 1 / 16).float(),
                               rtol=2e-3, atol=2e-3)


def butterfly_nodes(n, m):
    """The node types of the butterfly form: per stage a Reshape, two Slices, Add, Sub, Concat;
    the product with had (Reshape, MatMul); the Reshape to x's shape and the Mul by scale."""
    stages = int(math.log2(n // (m or 1)))
    want = {"Reshape": stages + 1, "Slice": 2 * stages, "Add": stages, "Sub": stages,
            "Concat": stages, "Mul": 1}
    if m:
        want.update(Reshape=stages + 2, MatMul=1)
    return want


@pytest.mark.parametrize("dynamo", EXPORTERS)
@pytest.mark.parametrize("n,m", [(256, None), (2048, None), (12 * 256, 12)])
def test_hadamard_matmul_below_the_threshold_butterflies_from_it(dynamo, n, m):
    g = torch.Generator().manual_seed(10)
    had = None if m is None else torch.randn(m, m, generator=g)  # any values: MatMul rounds
    scale = 1.0 / math.sqrt(n)
    x = torch.randn(2, 3, n, generator=g)
    model = export(Hadamard(had, scale), x, dynamo)
    if n < BUTTERFLY_MIN_N:
        assert op_types(model) == ["MatMul"]
    else:
        assert Counter(op_types(model)) == butterfly_nodes(n, m)
        sizes = [math.prod(t.dims) for t in model.graph.initializer] + \
            [math.prod(n_.attribute[0].t.dims) for n_ in model.graph.node
             if n_.op_type == "Constant"]
        assert max(sizes) < n, "no dense matrix"
    y, want = run(model, x), ops.hadamard_transform(x, had, scale)
    assert y.shape == want.shape == (2, 3, n)
    assert (y - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_hadamard_butterflies_with_dynamic_leading_dims(dynamo):
    had, n = signs(12, 11), 12 * 256
    f = io.BytesIO()
    x = torch.randn(2, 3, n)
    if dynamo:
        dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("tokens")},)
        kw = dict(dynamic_shapes=dims, opset_version=18)
    else:
        kw = dict(dynamic_axes={"x": {0: "batch", 1: "tokens"}}, input_names=["x"],
                  opset_version=13)
    export_onnx(Hadamard(had, 0.5).eval(), (x,), f, dynamo=dynamo, custom_opsets=None, **kw)
    model = onnx.load_from_string(f.getvalue())
    onnx.checker.check_model(model, full_check=True)
    assert Counter(op_types(model)) == {**butterfly_nodes(n, 12), "Shape": 1}
    x = torch.randn(4, 5, n, generator=torch.Generator().manual_seed(12))
    y, want = run(model, x), ops.hadamard_transform(x, had, 0.5)
    assert y.shape == want.shape
    assert (y - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_hadamard_butterflies_float64_and_float16(dynamo):
    had = torch.randn(8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(13))
    x = torch.randn(3, 8 * 256, dtype=torch.float64)
    y = run(export(Hadamard(had, 0.1), x, dynamo), x)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, ops.hadamard_transform(x, had, 0.1), rtol=1e-12, atol=1e-12)
    xh = torch.randn(3, 2048).half()
    y = run(export(Hadamard(None, 1 / 32), xh, dynamo), xh)
    assert y.dtype == torch.float16  # computed in float32 as the op, rounded once
    torch.testing.assert_close(y, ops.hadamard_transform(xh, None, 1 / 32), rtol=0, atol=0)


def edge_rows(n=70, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 6, n, generator=g) * torch.logspace(-3, 3, 6)[:, None]
    x[0, 0] = 0.0                      # zeros
    x[0, 1, 5] = float("nan")          # a NaN
    x[0, 2] = float("nan")             # NaN only
    x[0, 3, 7] = float("inf")          # +inf
    x[0, 4, 9] = -float("inf")         # -inf
    x[1, 0, :16] = torch.arange(-8, 8) + 0.5  # ties of symmetric INT4 (s = 1)
    x[1, 0, 16:] = 0.25
    return x


def assert_bits_equal(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    keep = ~torch.isnan(want)
    assert torch.equal(got[keep], want[keep]), (got[keep] != want[keep]).sum()


INT_CASES = [(-8, 7, True, "int"), (-128, 127, False, "int"), (0, 255, True, "int"),
             (0, 15, False, "int")]
FP8_CASES = [(0, 0, True, "fp8_e4m3"), (0, 0, True, "fp8_e5m2")]


@pytest.mark.parametrize("dynamo", EXPORTERS)
@pytest.mark.parametrize("args", INT_CASES + FP8_CASES, ids=lambda a: f"{a[3]}{a[0]}_{a[1]}")
def test_per_token_in_onnxruntime_bit_for_bit(dynamo, args):
    x = edge_rows()
    opset = 19 if args[3] != "int" else None
    model = export(PerToken(*args), x, dynamo, opset)
    kinds = set(op_types(model))
    assert {"ReduceMin", "ReduceMax", "Round" if args[3] == "int" else "Cast"} <= kinds
    assert_bits_equal(run(model, x), ops.fake_quantize_per_token(x, *args))


@pytest.mark.parametrize("dynamo", EXPORTERS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
@pytest.mark.parametrize("args", [INT_CASES[0], INT_CASES[1], FP8_CASES[0]],
                         ids=lambda a: f"{a[3]}{a[0]}_{a[1]}")
def test_per_token_other_dtypes(dynamo, dtype, args):
    x = edge_rows(seed=4).to(dtype)
    model = export(PerToken(*args), x, dynamo, 19 if args[3] != "int" else None)
    y = run(model, x)
    assert y.dtype == dtype
    assert_bits_equal(y, ops.fake_quantize_per_token(x, *args))


def test_both_exporters_write_the_same_nodes():
    if not HAS_TORCHSCRIPT_EXPORTER:
        pytest.skip("this torch has no TorchScript exporter to compare with")
    x = edge_rows()
    ts = export(PerToken(-128, 127, False, "int"), x, False, 19)
    dy = export(PerToken(-128, 127, False, "int"), x, True, 19)
    assert op_types(ts) == op_types(dy)
    for n, m in [(768, 12), (12 * 256, 12)]:
        x = torch.randn(2, n)
        ts = export(Hadamard(signs(m), 0.5), x, False, 18)
        dy = export(Hadamard(signs(m), 0.5), x, True, 18)
        assert op_types(ts) == op_types(dy)


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_fp8_below_opset_19_is_refused(dynamo):
    with pytest.raises(ValueError, match=r"fake_quantize_per_token: format 'fp8_e4m3' exports as "
                                         r"a Cast to a float8 type, which needs ONNX opset 19 or "
                                         r"later; export with opset_version=19 \(got 1[38]\)"):
        export(PerToken(0, 0, True, "fp8_e4m3"), torch.randn(2, 8), dynamo)


def test_torch_forms_equal_the_ops():
    """plain_export's forms (a plain torch.onnx.export with dynamo=True traces these)."""
    x = edge_rows(seed=5)
    for args in INT_CASES + FP8_CASES:
        assert_bits_equal(per_token_composite(x, *args), ops.fake_quantize_per_token(x, *args))
    had = signs(12, 6)
    h = torch.randn(3, 768)
    torch.testing.assert_close(hadamard_dense(h, had, 0.1), ops.hadamard_transform(h, had, 0.1),
                               rtol=1e-5, atol=1e-5)


def test_plain_dynamo_export_uses_the_torch_forms(tmp_path):
    class Rotated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("had", signs(12, 7))

        def forward(self, x):
            q = plain_export.ops()
            return q.fake_quantize_per_token(q.hadamard_transform(x, self.had, 0.125), -8, 7,
                                             True)

    x = torch.randn(2, 768, generator=torch.Generator().manual_seed(8))
    model = Rotated().eval()
    path = str(tmp_path / "rotated.onnx")
    torch.onnx.export(model, (x,), path, dynamo=True, opset_version=18, verbose=False)
    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)
    assert {n.domain for n in m.graph.node} <= {""}
    y = run(m, x)
    want = model(x)
    # the rotation sums in MatMul's order: each row's scale moves by rounding, and a value at a
    # rounding tie may move by one level
    step = want.abs().amax(-1, keepdim=True) / 7.5
    assert ((y - want).abs() <= step * 1.0001).all()
    assert ((y - want).abs() > 1e-4 * step).float().mean() < 0.01
