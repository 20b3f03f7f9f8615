"""Measurements of docs/transformers.md on all-MiniLM-L6-v2 (real weights, offline).

    PYTHONPATH=python OMP_NUM_THREADS=2 .venv/bin/python bench/bench_transformers.py [--repeats 5]

For each recipe: prepare_by_platform (torch.export capture, as ``capture='auto'`` takes this
model), calibration on the 8 calibration sentences (tests/python/data/minilm_sentences.json,
max length 32), then the cosine similarity of each of the 8 evaluation sentences' embedding
(mean pooling, L2-normalized) to the float model's (mean and min over sentences). Then the
prepare time and the QAT step time (forward + backward + Adam step on the 8 calibration
sentences) against the float model's step, medians over ``--repeats`` runs, interleaved, as
wall time and as the process's CPU time (steadier on a shared machine; run with
OMP_NUM_THREADS=1 so that CPU time is the step's work).
"""
import argparse
import copy
import operator
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from minilm import SENTENCES, cosines, embed, encode, load  # noqa: E402

from mqbench.prepare_by_platform import BackendType, prepare_by_platform  # noqa: E402
from mqbench.utils.logger import set_log_level  # noqa: E402
from mqbench.utils.state import enable_calibration, enable_quantization  # noqa: E402

NO_ADDS = {"exclude_function_type": [operator.add]}
EMBEDDINGS = ["word_embeddings", "position_embeddings", "token_type_embeddings"]
ASYM8 = {"bit": 8, "symmetry": False, "per_channel": False, "pot_scale": False}
W4A8_LSQ = {"w_qscheme": {"bit": 4, "symmetry": True, "per_channel": True, "pot_scale": False},
            "a_qscheme": {"bit": 8, "symmetry": True, "per_channel": False, "pot_scale": False},
            "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
            "w_observer": "MSEObserver", "a_observer": "MSEObserver"}

RECIPES = [
    ("Tensorrt_NLP", "W8A8, defaults (EMAMinMax acts)", {}, {}),
    ("Tensorrt_NLP", "W8A8, MSE acts", {"a_observer": "MSEObserver"}, {}),
    ("Tensorrt_NLP", "W8A8, MSE acts, adds float", {"a_observer": "MSEObserver"}, NO_ADDS),
    ("Tensorrt_NLP", "W8A8, MSE asym acts, adds float",
     {"a_observer": "MSEObserver", "a_qscheme": ASYM8}, NO_ADDS),
    ("Tensorrt_NLP", "W8A8, EMAMinMax asym acts, adds float", {"a_qscheme": ASYM8}, NO_ADDS),
    ("Academic_NLP", "W4A8 LSQ, MSE observers", W4A8_LSQ, {}),
    ("Academic_NLP", "W4A8 LSQ, MSE observers, asym acts",
     dict(W4A8_LSQ, a_qscheme=ASYM8), {}),
]


def prepared(model, backend, qconfig, quantizer, calib):
    return prepare_by_platform(model, BackendType[backend], {
        "extra_qconfig_dict": qconfig, "extra_quantizer_dict": quantizer,
        "example_inputs": calib})


def qat_step(model, batch, target, opt):
    loss = (1 - cosines(embed(model, batch), target)).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    set_log_level("WARNING")
    torch.manual_seed(0)
    model, tokenizer = load()
    calib = encode(tokenizer, SENTENCES["calibration"])
    evaluation = encode(tokenizer, SENTENCES["evaluation"])
    with torch.no_grad():
        ref = embed(model, evaluation)
        calib_ref = embed(model, calib)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| backend | recipe | act quantizers | cosine mean | cosine min |")
    print("|---|---|---|---|---|")
    for backend, name, qconfig, quantizer in RECIPES:
        q = prepared(copy.deepcopy(model), backend, qconfig, quantizer, calib)
        with torch.no_grad():
            enable_calibration(q)
            q(**calib)
            enable_quantization(q)
            c = cosines(embed(q, evaluation), ref)
        n = sum(1 for m, _ in q.named_modules() if m.endswith("_post_act_fake_quantizer"))
        print(f"| {backend} | {name} | {n} | {c.mean():.4f} | {c.min():.4f} |", flush=True)

    # Timings: prepare, and one QAT step against the float model's, interleaved.
    recipe = {"a_observer": "MSEObserver", "a_qscheme": ASYM8}
    no_embeddings = dict(NO_ADDS, exclude_module_name=EMBEDDINGS)
    timed = {"Tensorrt_NLP recipe": ("Tensorrt_NLP", recipe, no_embeddings),
             "Tensorrt_NLP recipe, embeddings quantized": ("Tensorrt_NLP", recipe, NO_ADDS),
             "Academic_NLP W4A8": ("Academic_NLP", W4A8_LSQ,
                                   {"exclude_module_name": EMBEDDINGS})}
    prep, steps = [], {"float": [], **{k: [] for k in timed}}
    cpu = {k: [] for k in steps}
    float_model = copy.deepcopy(model).train()
    models = {"float": float_model}
    for key, (backend, qconfig, quantizer) in timed.items():
        q = prepared(copy.deepcopy(model), backend, qconfig, quantizer, calib)
        with torch.no_grad():
            enable_calibration(q)
            q(**calib)
        enable_quantization(q)
        models[key] = q.train()
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-6) for k, m in models.items()}
    for k, m in models.items():  # warm-up
        qat_step(m, calib, calib_ref, opts[k])
    for _ in range(args.repeats):
        t = time.perf_counter()
        prepared(copy.deepcopy(model), "Tensorrt_NLP", {}, {}, calib)
        prep.append(time.perf_counter() - t)
        for k, m in models.items():
            t, c = time.perf_counter(), time.process_time()
            qat_step(m, calib, calib_ref, opts[k])
            steps[k].append(time.perf_counter() - t)
            cpu[k].append(time.process_time() - c)
    med = {k: statistics.median(v) for k, v in steps.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"prepare (Tensorrt_NLP, export capture): median {statistics.median(prep):.2f} s "
          f"(min {min(prep):.2f}, max {max(prep):.2f})")
    for k in timed:
        print(f"QAT step {k}: {med[k] * 1e3:.0f} ms vs float {med['float'] * 1e3:.0f} ms = "
              f"{med[k] / med['float']:.2f}x wall; CPU time {med_cpu[k] * 1e3:.0f} ms vs "
              f"{med_cpu['float'] * 1e3:.0f} ms = {med_cpu[k] / med_cpu['float']:.2f}x "
              "(batch 8 x 32 tokens)")


if __name__ == "__main__":
    main()
