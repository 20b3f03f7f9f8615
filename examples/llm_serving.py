"""An INT4 checkpoint that serving engines load, from GPTQ (docs/llm.md, "Serving"):

1. a small Llama (transformers 5, random weights with LLM-like outlier channels; no download)
   and a few calibration sequences;
2. GPTQ at INT4, one scale per 32 input channels;
3. ``save_quantized`` writes a compressed-tensors checkpoint (``pack-quantized``), the format
   vLLM, SGLang and transformers read;
4. a fresh Python process loads it with plain ``transformers.AutoModelForCausalLM`` (mqbench is
   not imported there) and computes the logits of held-out sequences;
5. those logits are compared with the GPTQ model's in memory, and the file sizes with the float
   checkpoint's; ``load_quantized`` reads the checkpoint back, bit for bit;
6. ``quantize_checkpoint`` (``python -m mqbench.llm``) makes the same checkpoint from the float
   one block by block, never holding the whole model (docs/llm-scale.md): the same weights.

Usage:  python3 examples/llm_serving.py [--output-dir DIR]
Exits non-zero if transformers' logits differ from the quantized model's by more than 1e-5 of
their range, if the INT4 checkpoint is over 0.45x the float one, or if the round trip through
load_quantized changes a weight, or if the block-by-block checkpoint holds other weights.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch
import transformers

from mqbench.llm import gptq, load_quantized, quantize_checkpoint, save_quantized
from mqbench.utils.logger import set_log_level

W4 = {"bit": 4, "per_channel": True, "group_size": 32}

LOADER = r"""
import sys, torch, transformers
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
with torch.no_grad():
    logits = model(input_ids=torch.load(sys.argv[2])).logits
assert "mqbench" not in sys.modules
torch.save(logits, sys.argv[3])
"""


def small_llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=4, max_position_embeddings=64,
                                   tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a few hidden channels carry large values, as in trained LLMs
        model.model.embed_tokens.weight[:, [3, 17, 90]] *= 30.0
    return model


def sequences(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 32), generator=g)


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
               if f.endswith(".safetensors"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", default=None,
                        help="where the checkpoints go (default: a temporary folder)")
    args = parser.parse_args()
    set_log_level("WARNING")
    out = args.output_dir or tempfile.mkdtemp(prefix="mqbench-llm-serving-")
    os.makedirs(out, exist_ok=True)
    t0 = time.time()

    model = small_llama()
    model.save_pretrained(os.path.join(out, "float"))
    calib = [{"input_ids": s.unsqueeze(0)} for s in sequences(8, seed=1)]
    qp = gptq(model, calib, W4)
    ckpt = os.path.join(out, "int4")
    qc = save_quantized(model, ckpt, W4, qparams=qp, overwrite=True)
    print(f"GPTQ INT4 (groups of 32) written to {ckpt}: format {qc['format']}, "
          f"{len(qp)} Linears quantized, lm_head and embeddings float")

    held_out = sequences(4, seed=2)
    ids_file, logits_file = os.path.join(out, "ids.pt"), os.path.join(out, "logits.pt")
    torch.save(held_out, ids_file)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    subprocess.run([sys.executable, "-c", LOADER, ckpt, ids_file, logits_file], check=True,
                   env=env, cwd=out)
    served = torch.load(logits_file)
    with torch.no_grad():
        ours = model(input_ids=held_out).logits
    err = float((served - ours).abs().max() / ours.abs().max())
    float_b, int4_b = folder_bytes(os.path.join(out, "float")), folder_bytes(ckpt)
    print(f"plain transformers (fresh process, no mqbench) vs the GPTQ model in memory: max "
          f"|difference| / max |logit| = {err:.2e}")
    print(f"safetensors: float {float_b / 1e6:.2f} MB, INT4 {int4_b / 1e6:.2f} MB "
          f"({int4_b / float_b:.2f}x)")

    loaded, qp_back = load_quantized(ckpt)
    same = all(torch.equal(loaded.get_submodule(n).weight, model.get_submodule(n).weight) and
               torch.equal(qp_back[n]["scale"], qp[n]["scale"]) for n in qp)
    print(f"load_quantized: {len(qp_back)} layers back, weights and scales bit for bit: {same}")

    streamed = os.path.join(out, "int4-block-by-block")
    quantize_checkpoint(os.path.join(out, "float"), streamed, "gptq", W4,
                        calib_data=sequences(8, seed=1), overwrite=True)
    blockwise, _ = load_quantized(streamed)
    same_blocks = all(torch.equal(blockwise.get_submodule(n).weight,
                                  model.get_submodule(n).weight) for n in qp)
    print(f"quantize_checkpoint (block by block, from the float checkpoint): the same weights "
          f"bit for bit: {same_blocks}")
    print(f"done in {time.time() - t0:.1f} s")
    failures = []
    if err > 1e-5:
        failures.append(f"transformers' logits differ by {err:.2e}")
    if int4_b > 0.45 * float_b:
        failures.append(f"the INT4 checkpoint is {int4_b / float_b:.2f}x the float one")
    if not same:
        failures.append("load_quantized changed a weight or a scale")
    if not same_blocks:
        failures.append("the block-by-block checkpoint holds other weights")
    if failures:
        sys.exit("llm_serving: " + "; ".join(failures))


if __name__ == "__main__":
    main()
