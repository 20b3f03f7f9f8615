"""The tiny-model figures of docs/benchmarks.md: relative error of the logits to the float model's for
RTN, GPTQ, AWQ without and with its weight clipping (``awq(clip=...)``) and SignRound (its
defaults: 200 steps of 8 items; the 4 sequences make each step a pass), on the tests' tiny
random Llama and a tiny random GPT-2 (transformers ``Conv1D`` layers), seeds 0 and 1 of model
and data, 4 sequences of 32 random tokens; and SmoothQuant's change of the float logits.

    PYTHONPATH=python .venv/bin/python bench/llm_tiny_models.py

Accuracy figures of random-weight models (the orderings the tests pin, not a benchmark of
trained models: those are bench/llm_decoder.py and bench/llm_minilm.py). Wall times are
printed for AWQ with and without clipping (shared CPU: noisy).
"""
import copy
import os
import sys
import time

import torch

_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python")
sys.path[:0] = [_TESTS, os.path.join(_TESTS, "llm")]  # test_llm's helpers, and its reference.py
from test_llm import _llama_calib, _logits, _rel, _tiny_gpt2, _tiny_llama  # noqa: E402

from mqbench.llm import awq, gptq, rtn, signround, smoothquant  # noqa: E402

SCHEMES = {
    "INT4 symmetric [-8, 7] g32": {"bit": 4, "per_channel": True, "group_size": 32},
    "INT4 asymmetric [0, 15] g32": {"bit": 4, "symmetry": False, "per_channel": True,
                                    "group_size": 32},
    "INT3 asymmetric [0, 7] g32": {"bit": 3, "symmetry": False, "per_channel": True,
                                   "group_size": 32},
}


def row(make, scheme):
    cells = {k: [] for k in ("RTN", "GPTQ", "AWQ", "AWQ + clip", "SignRound", "t AWQ",
                             "t AWQ + clip")}
    for seed in (0, 1):
        model, calib = make(seed), _llama_calib(seed=seed + 1)
        ref = _logits(model, calib)
        m = copy.deepcopy(model)
        rtn(m, scheme)
        cells["RTN"].append(_rel(_logits(m, calib), ref))
        m = copy.deepcopy(model)
        gptq(m, calib, scheme, block_size=32)
        cells["GPTQ"].append(_rel(_logits(m, calib), ref))
        for clip, key in ((False, "AWQ"), (True, "AWQ + clip")):
            m = copy.deepcopy(model)
            t = time.perf_counter()
            awq(m, calib, scheme, clip=clip)
            cells["t " + key].append(time.perf_counter() - t)
            rtn(m, scheme)
            cells[key].append(_rel(_logits(m, calib), ref))
        m = copy.deepcopy(model)
        signround(m, calib, scheme)
        cells["SignRound"].append(_rel(_logits(m, calib), ref))
    return cells


def main():
    for label, make in (("tiny Llama", _tiny_llama), ("tiny GPT-2 (Conv1D)", _tiny_gpt2)):
        print(f"\n{label}: logits' relative error to float, seed 0 / seed 1")
        print("| weights | RTN | GPTQ | AWQ (clip=False) + RTN | AWQ (clip=True) + RTN | "
              "SignRound |")
        print("|---|---|---|---|---|---|")
        times = []
        for name, scheme in SCHEMES.items():
            c = row(make, scheme)
            print(f"| {name} | " + " | ".join(
                " / ".join(f"{v:.4f}" for v in c[k]) for k in ("RTN", "GPTQ", "AWQ",
                                                                 "AWQ + clip", "SignRound")) + " |",
                  flush=True)
            times.append((sum(c["t AWQ"]), sum(c["t AWQ + clip"])))
        print("AWQ wall time, all rows: clip=False %.1f s, clip=True %.1f s"
              % (sum(t[0] for t in times), sum(t[1] for t in times)))
        model, calib = make(0), _llama_calib(seed=1)
        ref = _logits(model, calib)
        smoothquant(model, calib, alpha=0.5)
        print(f"SmoothQuant (alpha 0.5) change of the float logits: "
              f"{_rel(_logits(model, calib), ref):.1e}")


if __name__ == "__main__":
    main()
