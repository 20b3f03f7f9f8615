"""A plain ``torch.onnx.export`` of a prepared model (``mqbench.onnx.plain_export``): with the dynamo
exporter (torch's default since 2.9) and the TorchScript one, it writes the nodes
``export_onnx`` writes (same graph without names: ``test_onnx_dynamo.signature``), for every
backend and fake-quantize algorithm, and the file deploys. An export never moves calibration
statistics, and where the plain call cannot write our nodes it fails at once naming
``export_onnx``."""
import copy
import io

import onnx
import pytest
import torch

pytest.importorskip("onnxscript", reason="onnxscript is not installed: the dynamo exporter needs "
                    "it (scripts/setup.sh installs requirements-dev.txt)")

from deploy_helpers import calibrated, deploy_copy  # noqa: E402
from mqbench import _C  # noqa: E402
from mqbench.onnx import plain_export  # noqa: E402
from mqbench.custom_symbolic_opset import export_format, export_onnx  # noqa: E402
from mqbench.prepare_by_platform import BackendType  # noqa: E402
from test_convert_deploy import FILES, SmallNet  # noqa: E402
from test_onnx_dynamo import signature  # noqa: E402
from test_prepare_by_platform import ACADEMIC, config, with_bn_statistics  # noqa: E402

SHAPE = [2, 3, 16, 16]
X = torch.randn(*SHAPE, generator=torch.Generator().manual_seed(3))
HAS_HOOK = hasattr(torch.onnx, "ops") and hasattr(torch.onnx.ops, "symbolic")
needs_hook = pytest.mark.skipif(not HAS_HOOK, reason=f"torch {torch.__version__} has no "
                                "torch.onnx.ops.symbolic (2.8+): the plain dynamo export refuses")


@pytest.fixture(scope="module")
def small_net():
    torch.manual_seed(0)
    return with_bn_statistics(SmallNet(), (8, 3, 16, 16))


def _academic(w_fq, a_fq):
    cfg = copy.deepcopy(ACADEMIC)
    cfg["extra_qconfig_dict"].update({"w_fakequantize": w_fq, "a_fakequantize": a_fq})
    return cfg


# (backend, prepare config) pairs covering every fake quantizer
CASES = {name: (BackendType[name], config(BackendType[name])) for name in FILES}
CASES.update({
    "Academic_DSQ": (BackendType.Academic, _academic("DSQFakeQuantize", "DSQFakeQuantize")),
    "Academic_PACT_DoReFa": (BackendType.Academic, _academic("DoReFaFakeQuantize",
                                                             "PACTFakeQuantize")),
    "Academic_AdaRound_QDrop": (BackendType.Academic, _academic("AdaRoundFakeQuantize",
                                                                "QDropFakeQuantize")),
    "Academic_Fixed": (BackendType.Academic, _academic("FixedFakeQuantize", "FixedFakeQuantize")),
})


def _exports(model, dynamo):
    plain, ours = io.BytesIO(), io.BytesIO()
    opset = 18 if dynamo else 13
    torch.onnx.export(model, (X,), plain, opset_version=opset, dynamo=dynamo,
                      input_names=["x"], output_names=["y"])
    export_onnx(model, (X,), ours, opset_version=opset, dynamo=dynamo,
                input_names=["x"], output_names=["y"])
    return plain.getvalue(), ours.getvalue()


@pytest.mark.parametrize("dynamo", [pytest.param(True, marks=needs_hook, id="dynamo"),
                                    pytest.param(False, id="torchscript")])
@pytest.mark.parametrize("case", list(CASES))
def test_plain_export_writes_the_nodes_of_export_onnx(case, dynamo, small_net):
    backend, cfg = CASES[case]
    q = calibrated(small_net, backend, SHAPE, prepare_custom_config_dict=cfg)
    if case == "Academic_DSQ":  # DSQ observes in training mode only (as MQBench)
        with torch.no_grad():
            q.train()(X)
        q.eval()
    model = deploy_copy(q) if "Academic" not in backend.name and "NLP" not in backend.name \
        else copy.deepcopy(q)
    plain, ours = _exports(model, dynamo)
    m = onnx.load_from_string(plain)
    onnx.checker.check_model(m, full_check=True)
    assert any(n.domain == "mqbench" for n in m.graph.node)
    assert {o.domain: o.version for o in m.opset_import}.get("mqbench") == 1
    assert signature(m) == signature(onnx.load_from_string(ours))
    # and the deploy reads it as it reads export_onnx's file
    translator = _C.deploy_translator_of(backend.value)
    files, _ = _C.deploy_translate(plain, translator, "m")
    assert sorted(files) == sorted(f.format("m") for f in FILES.get(backend.name, ["{}.onnx"])
                                   if f.format("m") != "m.onnx" or translator in
                                   ("onnx_qnn", "qdq", "academic", "tensorrt_nlp"))


def test_an_export_never_moves_the_calibration(small_net):
    """Observers on (right after calibration): the export neither updates the statistics nor
    writes observer ops into the graph."""
    from mqbench.utils.state import enable_calibration
    q = calibrated(small_net, BackendType.Tensorrt, SHAPE)
    enable_calibration(q)
    q.eval()
    before = {k: v.clone() for k, v in q.state_dict().items()}
    buf = io.BytesIO()
    torch.onnx.export(q, (X * 50,), buf, opset_version=13, dynamo=False)
    for k, v in q.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not any("observer" in n.op_type.lower() for n in onnx.load_from_string(
        buf.getvalue()).graph.node)


@needs_hook
def test_the_qdq_format_and_a_missing_hook_name_export_onnx(small_net, monkeypatch):
    q = deploy_copy(calibrated(small_net, BackendType.Tensorrt, SHAPE))
    with export_format("qdq"), pytest.raises(Exception, match="export_onnx"):
        torch.onnx.export(q, (X,), io.BytesIO(), opset_version=18, dynamo=True)
    monkeypatch.setattr(plain_export, "_HAS_HOOK", False)
    with pytest.raises(Exception, match=r"torch.onnx.ops.symbolic \(torch >= 2.8.*export_onnx"):
        torch.onnx.export(q, (X,), io.BytesIO(), opset_version=18, dynamo=True)
    # outside an export the quantizers run the ops themselves
    assert plain_export.ops() is torch.ops.mqbench
