"""The LLM tests' shared pieces: a tiny random Llama (``tiny_llama``), and a checkpoint folder
loaded in a fresh process by plain transformers (with compressed-tensors installed, as vLLM users
have it), no mqbench imported: the logits of given token ids (``transformers_logits``)."""
import os
import subprocess
import sys

import torch


def tiny_llama(seed=0, hidden=64, inter=128, vocab=128, layers=2, tie=False):
    """A transformers ``LlamaForCausalLM`` with random weights (4 heads, 2 key/value heads)."""
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=tie)
    return transformers.LlamaForCausalLM(cfg).eval()

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


