"""SmoothQuant, AWQ and GPTQ on the trained decoder of ``llm_decoder.py`` (train it first), in
both orders: on the float model and then ``prepare_by_platform``, or on the prepared model
(docs/llm.md, "On a prepared model"). One cell per fresh process: the algorithm's seconds and
the held-out perplexity of the prepared model, calibrated on the 32 calibration windows
afterwards (W8A8: Tensorrt_NLP with MinMax observers at every Linear's input; AWQ and GPTQ
(``act_order=True``): QDQ, INT4 asymmetric groups of 128, weight quantizers only, GPTQ's grid
loaded with ``load_weight_qparams`` in the float order). Both orders give the same model, so
the perplexities must match; the times show what the prepared graph costs.

    PYTHONPATH=python .venv/bin/python bench/llm_prepared.py --threads 1
    PYTHONPATH=python .venv/bin/python bench/llm_prepared.py --cell awq prepared   # one cell
"""
import argparse
import contextlib
import operator
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llm_decoder  # noqa: E402

ALGORITHMS = ("smoothquant", "smoothquant-auto", "awq", "gptq")
ORDERS = ("float", "prepared")
W4 = {"bit": 4, "per_channel": True, "group_size": 128, "symmetry": False}


def _prepare(model, algorithm, samples):
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    # export specializes a size of 1: the example and the calibration batches hold 8 samples
    chunks = [{k: torch.cat([c[k] for c in samples[i:i + 8]]) for k in samples[0]}
              for i in range(0, len(samples), 8)]
    batch = torch.export.Dim("batch", min=2, max=4096)
    config = {"example_inputs": chunks[0],
              "dynamic_shapes": {k: {0: batch} for k in samples[0]},
              "extra_quantizer_dict": {"exclude_module_name": ["lm_head"]}}
    if algorithm in ("awq", "gptq"):
        config["extra_qconfig_dict"] = {"w_qscheme": W4}
        backend = BackendType.QDQ
    else:
        config["extra_qconfig_dict"] = {"w_observer": "MinMaxObserver",
                                        "a_observer": "MinMaxObserver"}
        config["extra_quantizer_dict"]["exclude_function_type"] = [operator.add, torch.matmul]
        backend = BackendType.Tensorrt_NLP
    with contextlib.redirect_stdout(sys.stderr):
        return prepare_by_platform(model, backend, config), chunks


def _run(model, algorithm, samples):
    from mqbench.llm import awq, gptq, smoothquant
    start = time.perf_counter()
    qparams = None
    if algorithm == "awq":
        awq(model, samples, W4)
    elif algorithm == "gptq":
        qparams = gptq(model, samples, W4, act_order=True)
    else:
        smoothquant(model, samples, alpha="auto" if algorithm == "smoothquant-auto" else 0.5)
    return time.perf_counter() - start, qparams


def cell(algorithm, order):
    from mqbench.llm import load_weight_qparams
    from mqbench.utils.state import (enable_calibration, enable_calibration_quantization,
                                     enable_quantization)
    text, held = (llm_decoder.as_tensor(t) for t in llm_decoder.stdlib_split())
    samples = [{"input_ids": w[None]}
               for w in llm_decoder.windows(text, 32, torch.Generator().manual_seed(1))]
    test = llm_decoder.windows(held, 64)
    model = llm_decoder.load_model()
    model.config.use_cache = False  # export cannot return a DynamicCache
    weight_only = algorithm in ("awq", "gptq")
    if order == "float":
        seconds, qparams = _run(model, algorithm, samples)
        q, chunks = _prepare(model, algorithm, samples)
    else:
        q, chunks = _prepare(model, algorithm, samples)
        if weight_only:
            enable_calibration_quantization(q, "weight_fake_quant")
        seconds, qparams = _run(q, algorithm, samples)
    if weight_only:
        if order == "float":
            enable_calibration_quantization(q, "weight_fake_quant")
            if qparams is not None:
                load_weight_qparams(q, qparams)
    else:
        enable_calibration(q)
    with torch.no_grad():
        for c in chunks:
            q(**c)
        if not weight_only:
            enable_quantization(q)
        ppl = llm_decoder.perplexity(q, test)
    print(f"{seconds:.2f} {ppl:.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cell", nargs=2, metavar=("ALGORITHM", "ORDER"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TQDM_DISABLE", "1")
    if args.cell:
        return cell(*args.cell)
    print("| algorithm | float model, then prepare (s) | prepare, then the algorithm (s) | "
          "perplexity (float order / prepared order) |\n|---|---|---|---|")
    for algorithm in ALGORITHMS:
        got = []
        for order in ORDERS:
            out = subprocess.run([sys.executable, __file__, "--threads", str(args.threads),
                                  "--cell", algorithm, order], capture_output=True, text=True,
                                 check=True).stdout.strip().splitlines()[-1].split()
            got.append(out)
        print(f"| {algorithm} | {got[0][0]} | {got[1][0]} | {got[0][1]} / {got[1][1]} |")


if __name__ == "__main__":
    main()
