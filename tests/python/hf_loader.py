"""A checkpoint folder loaded in a fresh process by plain transformers (with compressed-tensors
installed, as vLLM users have it), no mqbench imported: the logits of given token ids."""
import os
import subprocess
import sys

import torch

# mode "dequantize": transformers' CompressedTensorsConfig(dequantize=True), which affine INT and
# the FP4 formats need in float32 models (docs/serving.md)
_LOADER = r"""
import sys, torch, transformers
path, ids_file, out_file, mode = sys.argv[1:5]
kw = {}
if mode == "dequantize":
    kw["quantization_config"] = transformers.CompressedTensorsConfig(dequantize=True)
model = transformers.AutoModelForCausalLM.from_pretrained(path, **kw).eval()
with torch.no_grad():
    logits = model(input_ids=torch.load(ids_file)).logits.float()
assert not any(m == "mqbench" or m.startswith("mqbench.") for m in sys.modules), "mqbench loaded"
torch.save(logits, out_file)
"""


def transformers_logits(path, ids, tmp_path, mode="default"):
    ids_file, out_file = tmp_path / "ids.pt", tmp_path / "logits.pt"
    torch.save(ids, ids_file)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    r = subprocess.run([sys.executable, "-c", _LOADER, str(path), str(ids_file), str(out_file),
                        mode], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                       timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"transformers could not load {path}:\n{r.stderr[-3000:]}")
    return torch.load(out_file)


