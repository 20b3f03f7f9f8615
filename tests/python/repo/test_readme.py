"""The README's Python quick start runs as written."""
import os
import re

import onnx

README = os.path.join(os.path.dirname(__file__), "..", "..", "..", "README.md")


def test_readme_python_quick_start_runs(tmp_path, monkeypatch):
    with open(README) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    assert blocks, "the README has no Python block"
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
    for name in ("fq.onnx", "qdq.onnx", "fq18.onnx"):
        onnx.checker.check_model(onnx.load(str(tmp_path / name)))
    assert any(n.op_type == "QuantizeLinear" for n in onnx.load(str(tmp_path / "qdq.onnx")).graph.node)
