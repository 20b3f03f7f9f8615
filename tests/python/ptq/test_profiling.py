"""Tests of mqbench.utils.profiling: the per-layer errors against an independent computation
(quantizers switched on by hand, outputs read with an fx Interpreter), the caller's model left
untouched, the HTML report (parsed, its PNGs decoded, names escaped, files only inside
report_dir) and the argument checks."""
import copy
import math
import os
from html.parser import HTMLParser

import matplotlib.image
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mqbench._base import is_fake_quantizer
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import logger, set_log_level
from mqbench.utils.profiling import LayerProfile, ProfilingResult, profiling
from mqbench.utils.profiling_report import _render_html
from mqbench.utils.state import enable_calibration, enable_quantization

set_log_level("WARNING")

# 4-bit weights (per channel) and activations, min/max ranges: errors large enough to see.
W4A4 = {"extra_qconfig_dict": {
    "w_qscheme": {"bit": 4, "symmetry": True, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 4, "symmetry": False, "per_channel": False, "pot_scale": False},
    "w_fakequantize": "FixedFakeQuantize", "a_fakequantize": "FixedFakeQuantize",
    "w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver"}}


class SmallCNN(nn.Module):
    """conv-bn-relu, conv-bn, residual add, F.relu, pool, fc: fused modules with and without a
    quantizer after them, a function op without one (a dummy node) and one with one."""

    def __init__(self, pool_name="pool"):
        super().__init__()
        self.pool_name = pool_name
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.add_module(pool_name, nn.AdaptiveAvgPool2d(2))
        self.fc = nn.Linear(8 * 2 * 2, 10)

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        x = F.relu(x + self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(getattr(self, self.pool_name)(x), 1))


def build(pool_name="pool"):
    """A calibrated W4A4 Tensorrt-prepared SmallCNN with realistic BatchNorm statistics, and
    its three calibration batches."""
    torch.manual_seed(0)
    net = SmallCNN(pool_name)
    data = [torch.randn(8, 1, 8, 8) for _ in range(3)]
    for m in net.modules():  # BN statistics of the data, as after training
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = None
    net.train()
    with torch.no_grad():
        for x in data:
            net(x)
    model = prepare_by_platform(net.eval(), BackendType.Tensorrt, W4A4).eval()
    enable_calibration(model)
    with torch.no_grad():
        for x in data:
            model(x)
    enable_quantization(model)
    return model, data


# name -> (op, nodes switched on) in graph order, read off the prepared graph by hand.
EXPECTED = {
    "conv1": ("ConvBnReLU2d", ("conv1", "conv1_post_act_fake_quantizer")),
    "conv2": ("ConvBn2d", ("conv2", "conv2_post_act_fake_quantizer")),
    "add": ("add", ("add_dummy",)),
    "relu": ("relu", ("relu", "relu_post_act_fake_quantizer")),
    "pool": ("AdaptiveAvgPool2d", ("pool",)),
    "fc": ("Linear", ("fc",)),
}


# -- the independent computation -------------------------------------------------------------
def node_output(gm, node_name, x):
    """The value of node ``node_name`` when ``gm`` runs on ``x`` (fx Interpreter)."""
    seen = {}

    class Capture(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n.name == node_name:
                seen["out"] = out
            return out

    with torch.no_grad():
        Capture(gm).run(x)
    return seen["out"]


def quantized_copy(model, node_names):
    """A copy of ``model`` with every quantizer off except those inside the modules of
    ``node_names`` (switched on by hand)."""
    q = copy.deepcopy(model)
    for m in q.modules():
        if is_fake_quantizer(m):
            m.disable_observer()
            m.disable_fake_quant()
    targets = {n.name: n.target for n in q.graph.nodes if n.op == "call_module"}
    for name in node_names:
        if name in targets:
            for m in q.get_submodule(targets[name]).modules():
                if is_fake_quantizer(m):
                    m.enable_fake_quant()
    return q


def errors(model, data, enabled_nodes, compare_node):
    """(mean cosine, SQNR dB, MSE) of ``compare_node``'s output: quantized copy vs float copy."""
    f, q = quantized_copy(model, ()), quantized_copy(model, enabled_nodes)
    cosines, signal, noise, numel = [], 0.0, 0.0, 0
    for x in data:
        a = node_output(f, compare_node, x).double().flatten()
        b = node_output(q, compare_node, x).double().flatten()
        cosines.append(float((a * b).sum().abs() / (a.norm() * b.norm())))
        signal += float((a * a).sum())
        noise += float(((a - b) ** 2).sum())
        numel += a.numel()
    sqnr = math.inf if noise == 0 else 10 * math.log10(signal / noise)
    return sum(cosines) / len(cosines), sqnr, noise / numel


def compare_node_of(nodes):
    # A dummy Identity only exists in profiling's copies: read the function node before it.
    last = nodes[-1]
    return last[: -len("_dummy")] if last.endswith("_dummy") else last


def assert_record(rec, expected):
    cos, sqnr, mse = expected
    assert rec.cosine == pytest.approx(cos, rel=1e-9, abs=1e-12)
    assert rec.mse == pytest.approx(mse, rel=1e-6, abs=1e-15)
    if math.isinf(sqnr):
        assert rec.sqnr_db == math.inf
    else:
        assert rec.sqnr_db == pytest.approx(sqnr, abs=1e-6)


# -- tests ----------------------------------------------------------------------------------
def test_standalone_numbers_match_independent_errors():
    model, data = build()
    result = profiling(model, data, "standalone")
    assert isinstance(result, ProfilingResult) and result.profiling_type == "standalone"
    assert [(r.name, r.op, r.nodes) for r in result] == \
        [(name, op, nodes) for name, (op, nodes) in EXPECTED.items()]
    for rec in result:
        expected = errors(model, data, rec.nodes, compare_node_of(rec.nodes))
        assert_record(rec, expected)
        # the printed table carries the same numbers
        line = next(l for l in result.table.splitlines() if f"| {rec.name} " in l)
        assert f"{expected[0]:.6f}" in line and f"{expected[2]:.4e}" in line
        if math.isfinite(expected[1]):
            assert f"{expected[1]:.2f}" in line
    by_name = {r.name: r for r in result}
    # quantizing nothing (add: no quantizer after it; pool: none either) costs nothing...
    assert by_name["add"].sqnr_db == math.inf and by_name["pool"].mse == 0.0
    # ...while 4-bit layers lose clearly, and the function op followed by a quantizer is
    # profiled (MQBench raises KeyError there)
    for name in ("conv1", "conv2", "relu"):
        assert by_name[name].sqnr_db < 30 and by_name[name].cosine < 0.999
    assert "lowest SQNR: " + min(result, key=lambda r: r.sqnr_db).name in result.summary


def test_interaction_accumulates_the_layers_before():
    model, data = build()
    standalone = profiling(model, data, "standalone")
    result = profiling(model, data, "interaction")
    assert [r.nodes for r in result] == [r.nodes for r in standalone]
    enabled = []
    for rec in result:
        enabled += rec.nodes
        assert_record(rec, errors(model, data, enabled, compare_node_of(rec.nodes)))
    # the first op has nothing before it; later ones carry the error of those before them
    assert result[0].cosine == pytest.approx(standalone[0].cosine, rel=1e-12)
    assert result[-1].sqnr_db < standalone[-1].sqnr_db
    assert result[2].sqnr_db < math.inf  # add: no quantizer of its own, upstream error only


def test_model_state_is_left_alone():
    model, data = build()
    model.conv2_post_act_fake_quantizer.enable_observer()  # a state disable_all would erase
    model.fc.weight_fake_quant.disable_fake_quant()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    code, names = model.code, [n for n, _ in model.named_modules()]
    set_log_level("WARNING")
    profiling(model, data, "interaction")
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k
    assert model.code == code and [n for n, _ in model.named_modules()] == names
    assert not any(n.name.endswith("_dummy") for n in model.graph.nodes)
    assert int(model.conv2_post_act_fake_quantizer.observer_enabled[0]) == 1
    assert int(model.conv1_post_act_fake_quantizer.fake_quant_enabled[0]) == 1
    assert logger.level == 30  # WARNING, restored


class ReportParser(HTMLParser):
    """Collects image sources and the text of the table cells, row by row."""

    def __init__(self):
        super().__init__()
        self.images, self.rows, self._row, self._cell = [], [], None, None

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs))
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None


def read_report(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    parser = ReportParser()
    parser.feed(text)
    parser.close()
    return text, parser


def test_html_report(tmp_path):
    model, data = build(pool_name="pool<b>&")
    out = tmp_path / "report"
    outside = tmp_path / "outside.html"
    outside.write_text("keep me")
    out.mkdir()
    os.symlink(outside, out / "index.html")  # a planted link must be replaced, not followed
    result = profiling(model, data, "standalone", report_dir=str(out), num_worst=2)
    assert result.report_path == str(out / "index.html")
    assert outside.read_text() == "keep me" and not os.path.islink(out / "index.html")
    text, parser = read_report(out / "index.html")

    # every layer in the table, with the printed numbers; the odd name escaped in the source
    header, *rows = parser.rows
    assert header == ["op", "name", "nodes", "cosine", "sqnr_db", "mse"]
    assert [row[1] for row in rows] == [r.name for r in result]
    for row, rec in zip(rows, result):
        assert f"| {row[3]} | {row[4].rjust(7)} | {row[5]} |" in result.table
        assert float(row[3]) == pytest.approx(rec.cosine, abs=1e-6)
    assert "pool<b>&" in [row[1] for row in rows]
    assert "pool<b>&" not in text and "pool&lt;b&gt;&amp;" in text

    # images: relative names of files inside report_dir, valid non-blank PNGs
    srcs = [img["src"] for img in parser.images]
    worst = result.worst(2)
    assert srcs == ["sqnr.png", "worst1_weight.png", "worst1_act.png", "worst2_weight.png",
                    "worst2_act.png"]
    assert worst[0].name == "conv2"  # the lowest SQNR, shown first
    for src in srcs:
        with open(out / src, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        pixels = matplotlib.image.imread(str(out / src))
        assert pixels.shape[0] > 50 and pixels.shape[1] > 50
        assert float(np.var(pixels[..., :3])) > 0, src
    # the bar chart has both bar colours: the worst layers highlighted
    bars = matplotlib.image.imread(str(out / "sqnr.png"))[..., :3]
    red = np.all(np.abs(bars - np.array([0xC4, 0x4E, 0x52]) / 255) < 0.02, axis=-1)
    blue = np.all(np.abs(bars - np.array([0x4C, 0x72, 0xB0]) / 255) < 0.02, axis=-1)
    assert red.sum() > 100 and blue.sum() > 100
    # nothing else written: no temporary file left behind
    assert sorted(os.listdir(out)) == sorted(srcs + ["index.html"])


def test_render_html_escapes_names_everywhere():
    bad = 'x"><script>alert(1)</script>'
    rec = LayerProfile("Conv2d", bad, (bad,), 0.5, 3.0, 0.1)
    page = _render_html(ProfilingResult([rec], summary=f"worst layer: {bad}"), [rec],
                        {bad: [("worst1_act.png", f"{bad}: activation")]})
    assert "<script>" not in page and "&lt;script&gt;" in page
    parser = ReportParser()
    parser.feed(page)
    assert parser.rows[1][1] == bad  # unescaped back to the name by the parser
    assert parser.images[-1]["alt"] == f"{bad}: activation"


def test_report_dir_must_be_a_directory(tmp_path):
    model, data = build()
    target = tmp_path / "a_file"
    target.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        profiling(model, data, report_dir=target)
    assert target.read_text() == "x" and os.listdir(tmp_path) == ["a_file"]


def test_module_list_and_one_shot_iterator():
    model, data = build()
    expected = profiling(model, data, "standalone")

    class Wrapper(nn.Module):
        def __init__(self, body):
            super().__init__()
            self.body = body

        def forward(self, x):
            return self.body(x)

    wrapper = Wrapper(model)  # in training mode: only BatchNorm / dropout modes matter
    wrapped = profiling(wrapper, iter(data), "standalone", module_list=["body"])
    assert [r.name for r in wrapped] == ["body." + r.name for r in expected]
    for a, b in zip(wrapped, expected):
        assert a.cosine == pytest.approx(b.cosine, rel=1e-12) and a.mse == pytest.approx(b.mse)


def test_argument_errors():
    model, data = build()
    with pytest.raises(ValueError, match="'standalone', 'interaction'"):
        profiling(model, data, profiling_type="layerwise")
    with pytest.raises(ValueError, match="num_worst"):
        profiling(model, data, num_worst=-1)
    with pytest.raises(ValueError, match="no batch"):
        profiling(model, [])
    with pytest.raises(TypeError, match="GraphModule"):
        profiling(SmallCNN(), data)
    with pytest.warns(UserWarning, match="training mode"):
        profiling(model.train(), data[:1])
    with pytest.raises(TypeError, match="not a torch.fx.GraphModule"):
        profiling(nn.Sequential(nn.ReLU()), data, module_list=["0"])


def test_shape_arithmetic_is_not_profiled():
    """``x.shape[-1] - 2`` is an ``operator.sub`` on ints: no row, no crash."""
    import torch.nn.functional as F

    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    from mqbench.utils.profiling import profiling
    from mqbench.utils.state import enable_calibration, enable_quantization

    class Crop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            y = self.conv(x)
            w = x.shape[-1] - 2
            return F.relu(y[..., :w]) + y[..., :w]

    torch.manual_seed(0)
    model = prepare_by_platform(Crop().eval(), BackendType.Tensorrt)
    data = [torch.randn(2, 3, 8, 8) for _ in range(2)]
    enable_calibration(model)
    with torch.no_grad():
        for b in data:
            model(b)
    enable_quantization(model)
    result = profiling(model, data)
    names = [r.name for r in result]
    assert "conv" in names and "add" in names and "sub" not in names
