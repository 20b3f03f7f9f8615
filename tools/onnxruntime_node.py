"""Runs ONNX models in onnxruntime (the npm package onnxruntime-node, driven by ort_run.js).

Debian has no onnxruntime for Python and PyPI is out of reach, so the CPU runtime that ships
inside onnxruntime-node does the work; scripts/setup.sh installs it into ./node_modules.

    from onnxruntime_node import available, run
    outputs = run(model_bytes, {"x": tensor})   # {output name: float tensor}
"""
import json
import os
import subprocess
import tempfile

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RUNNER = os.path.join(ROOT, "tools", "ort_run.js")


def available():
    """True when onnxruntime-node is installed in the repository."""
    return os.path.isfile(os.path.join(ROOT, "node_modules", "onnxruntime-node", "package.json"))


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
        done = subprocess.run(["node", RUNNER, req, resp], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"onnxruntime failed: {done.stderr.strip()}")
        with open(resp) as f:
            out = json.load(f)
    return {k: torch.tensor(v["data"], dtype=torch.float32).reshape(v["dims"]) for k, v in out.items()}
