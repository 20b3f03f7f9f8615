"""Runs ONNX models in onnxruntime through tools/ort_run.js (onnxruntime-node from npm)."""
import json
import os
import subprocess
import tempfile

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RUNNER = os.path.join(ROOT, "tools", "ort_run.js")


def available():
    return os.path.isfile(os.path.join(ROOT, "node_modules", "onnxruntime-node", "package.json"))


def require():
    """Skips outside CI when onnxruntime-node is not installed; in CI its absence fails."""
    if not available():
        if os.environ.get("CI"):
            pytest.fail("onnxruntime-node is missing: scripts/setup.sh installs it")
        pytest.skip("onnxruntime-node not installed (run scripts/setup.sh)")


def run(model_bytes, inputs):
    """Runs the serialized model on {name: float tensor}; returns {name: float tensor}."""
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model.onnx")
        with open(model, "wb") as f:
            f.write(model_bytes)
        request = {"model": model, "inputs": {
            k: {"dims": list(v.shape), "data": v.float().flatten().tolist()} for k, v in inputs.items()}}
        req, resp = os.path.join(tmp, "request.json"), os.path.join(tmp, "response.json")
        with open(req, "w") as f:
            json.dump(request, f)
        subprocess.run(["node", RUNNER, req, resp], check=True, cwd=ROOT, capture_output=True, text=True)
        with open(resp) as f:
            out = json.load(f)
    return {k: torch.tensor(v["data"], dtype=torch.float32).reshape(v["dims"]) for k, v in out.items()}
