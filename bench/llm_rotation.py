"""The rotation table of docs/benchmarks.md: W4A4 / W4A8 / FP8 with and without ``rotate`` and a
quantized KV cache, on the decoder bench/llm_decoder.py trains, beside llm-compressor's QuaRot
(``SpinQuantModifier``) where it installs; held-out perplexity and KL to float, in one run.

    PYTHONPATH=python .venv/bin/python bench/llm_decoder.py train      # once (~3 min, 2 cores)
    PYTHONPATH=python .venv/bin/python bench/llm_rotation.py --peers-path /tmp/peers_llmc

The rows (every one calibrated on the same 32 train windows of 256 bytes, measured on 64
held-out windows; each row in a fresh process):
  * ours: ``rotate`` (R1, R2, online R4) or not, then ``gptq`` (INT4 per channel, symmetric,
    act_order) of every Linear but lm_head, then ``prepare_by_platform`` (Academic_NLP, torch.export
    capture) with the GPTQ grid loaded (``load_weight_qparams``), dynamic per-token activations
    at every Linear's input (INT4 or INT8, symmetric) and, for KV4 / KV FP8, the KV cache
    quantizers (INT4 asymmetric per head / FP8 E4M3 per tensor, MinMax on the calibration data);
  * llm-compressor: ``SpinQuantModifier`` (R1, R2, R4 Hadamard) and ``GPTQModifier`` with the
    same weight and activation schemes (its fake quantization in memory after ``oneshot``).
"""
import argparse
import contextlib
import os
import subprocess
import sys
import time

import torch

import llm_decoder
import llm_peers

W4 = {"bit": 4, "per_channel": True, "symmetry": True}
A4 = {"bit": 4, "symmetry": True, "dynamic": "per_token"}
A8 = {"bit": 8, "symmetry": True, "dynamic": "per_token"}
KV4 = {"bit": 4, "symmetry": False, "per_channel": True}
KV_FP8 = {"dtype": "fp8_e4m3"}
FP8_W = {"dtype": "fp8_e4m3", "per_channel": True}
FP8_A = {"dtype": "fp8_e4m3", "dynamic": "per_token"}


def _chunks(samples, n=8):
    return [{k: torch.cat([c[k] for c in samples[i:i + n]]) for k in samples[0]}
            for i in range(0, len(samples), n)]


def ours(rotation, w, a, kv, algorithm="gptq", online=True, mode="hadamard"):
    """rotate (or not) -> GPTQ / RTN weights -> prepared model with per-token activations and
    the KV cache quantizers."""
    def run(model, samples):
        from mqbench.llm import gptq, load_weight_qparams, rotate, rtn
        from mqbench.prepare_by_platform import BackendType, prepare_by_platform
        from mqbench.utils.state import enable_calibration, enable_quantization
        model.config.use_cache = False
        if rotation:
            rotate(model, samples, online=online, mode=mode)
        if w.get("dtype") == "fp8_e4m3":
            qparams = None
        elif algorithm == "gptq":
            qparams = gptq(model, samples, w, act_order=True)
        else:
            qparams = rtn(model, w)
        chunks = _chunks(samples)
        batch = torch.export.Dim("batch", min=2, max=4096)
        config = {"example_inputs": chunks[0],
                  "dynamic_shapes": {k: {0: batch} for k in samples[0]},
                  "extra_qconfig_dict": {"w_qscheme": w, "a_qscheme": a,
                                         "w_observer": "MinMaxObserver",
                                         "a_observer": "MinMaxObserver",
                                         "w_fakequantize": "FixedFakeQuantize",
                                         "a_fakequantize": "FixedFakeQuantize"},
                  "extra_quantizer_dict": {"exclude_module_name": ["lm_head", "embed_tokens"]}}
        if kv is not None:
            config["kv_cache_qscheme"] = kv
        with contextlib.redirect_stdout(sys.stderr):
            q = prepare_by_platform(model, BackendType.Academic_NLP, config)
            if qparams is not None:
                load_weight_qparams(q, qparams)
            enable_calibration(q)
            with torch.no_grad():
                for c in chunks:
                    q(**c)
            enable_quantization(q)
        return q
    return run


def llmcompressor_rotated(rotation, a_bits, kv_bits, rotations=("R1", "R2", "R4")):
    def run(model, samples):
        from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
        from llmcompressor.modifiers.quantization import GPTQModifier
        weights = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="channel")
        acts = QuantizationArgs(num_bits=a_bits, type="int", symmetric=True, strategy="token",
                                dynamic=True)
        scheme = QuantizationScheme(targets=["Linear"], weights=weights, input_activations=acts)
        kv = None if kv_bits is None else QuantizationArgs(
            num_bits=kv_bits, type="int", symmetric=False, strategy="tensor")
        modifiers = []
        if rotation:
            from llmcompressor.modifiers.transform import SpinQuantModifier
            modifiers.append(SpinQuantModifier(rotations=list(rotations),
                                               transform_type="hadamard"))
        modifiers.append(GPTQModifier(config_groups={"group_0": scheme}, ignore=["lm_head"],
                                      kv_cache_scheme=kv))
        return llm_peers.llmcompressor_oneshot(model, samples, modifiers)
    return run


def auto_round_rotated(rotation, a_bits, iters=None):
    """AutoRound (its default 200 iterations) INT4 per-channel symmetric weights with dynamic
    per-token INT activations, after its QuaRot-style in-place Hadamard rotation."""
    def run(model, samples):
        from auto_round import AutoRound
        from transformers import ByT5Tokenizer
        kw = {"rotation_config": {"backend": "inplace", "hadamard_type": "inplace_quarot_hadamard"}} \
            if rotation else {}
        with contextlib.redirect_stdout(sys.stderr):
            ar = AutoRound(model, tokenizer=ByT5Tokenizer(), bits=4, group_size=-1, sym=True,
                           act_bits=a_bits, act_dynamic=True, act_group_size=-1, act_sym=True,
                           dataset=samples, nsamples=len(samples),
                           seqlen=samples[0]["input_ids"].shape[-1], batch_size=8,
                           iters=llm_peers.AUTO_ROUND_ITERS if iters is None else iters,
                           device_map="cpu", amp=False, **kw)
            ar.quantize()
        return ar.model
    return run


def rows(peers):
    out = [("float", "-", "-", None)]
    out.append(("W4A4", "GPTQ", "mqbench", ours(False, W4, A4, None)))
    out.append(("W4A4", "rotate + GPTQ", "mqbench", ours(True, W4, A4, None)))
    out.append(("W4A4", "rotate + RTN", "mqbench", ours(True, W4, A4, None, "rtn")))
    out.append(("W4A4", "rotate (R1, R2; online=False) + GPTQ", "mqbench",
                ours(True, W4, A4, None, online=False)))
    out.append(("W4A4", "rotate spinquant + GPTQ", "mqbench",
                ours(True, W4, A4, None, mode="spinquant")))
    out.append(("W4A4KV4", "rotate + GPTQ", "mqbench", ours(True, W4, A4, KV4)))
    out.append(("W4A4KV4", "rotate spinquant + GPTQ", "mqbench",
                ours(True, W4, A4, KV4, mode="spinquant")))
    out.append(("W4A8", "GPTQ", "mqbench", ours(False, W4, A8, None)))
    out.append(("W4A8", "rotate + GPTQ", "mqbench", ours(True, W4, A8, None)))
    out.append(("W8A8-FP8, KV FP8", "-", "mqbench", ours(False, FP8_W, FP8_A, KV_FP8)))
    if "llmcompressor" in peers:
        out.append(("W4A4", "GPTQ", "llm-compressor", llmcompressor_rotated(False, 4, None)))
        out.append(("W4A4", "QuaRot (SpinQuantModifier) + GPTQ", "llm-compressor",
                    llmcompressor_rotated(True, 4, None)))
        out.append(("W4A4KV4", "QuaRot (SpinQuantModifier) + GPTQ", "llm-compressor",
                    llmcompressor_rotated(True, 4, 4)))
        # its R4 needs a power-of-two width (768 = 12 x 64 is not): R1 and R2 alone
        out.append(("W4A4", "QuaRot R1, R2 (SpinQuantModifier) + GPTQ", "llm-compressor",
                    llmcompressor_rotated(True, 4, None, ("R1", "R2"))))
        out.append(("W4A4KV4", "QuaRot R1, R2 (SpinQuantModifier) + GPTQ", "llm-compressor",
                    llmcompressor_rotated(True, 4, 4, ("R1", "R2"))))
    if "auto_round" in peers:
        out.append(("W4A4", "QuaRot (in place) + AutoRound", "auto-round",
                    auto_round_rotated(True, 4)))
        out.append(("W4A4", "QuaRot (in place) + RTN (iters=0)", "auto-round",
                    auto_round_rotated(True, 4, iters=0)))
        out.append(("W4A4", "RTN (iters=0)", "auto-round", auto_round_rotated(False, 4, iters=0)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    llm_peers.add_arguments(ap)
    ap.set_defaults(peers="llmcompressor,auto_round")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for p in filter(None, args.peers_path.split(os.pathsep)):
        sys.path.append(p)
    peers, skipped = llm_peers.available_peers([p for p in args.peers.split(",") if p])
    text, held = (llm_decoder.as_tensor(t) for t in llm_decoder.stdlib_split())
    samples = [{"input_ids": w[None]}
               for w in llm_decoder.windows(text, 32, torch.Generator().manual_seed(1))]
    test = llm_decoder.windows(held, 64)
    base = llm_decoder.load_model()
    ref = []

    def metric(m):
        if not ref:
            ref.append(llm_decoder.log_probs(base, test))
        ppl, kl = llm_decoder.perplexity_and_kl(m, test, ref[0])
        return ppl, 1e3 * kl
    table = rows(peers)
    if args.row is not None:
        label, algo, who, fn = table[args.row]
        print("ROW " + llm_peers._run_row(label, algo, who, fn, base, samples, metric, (4, 3)),
              flush=True)
        return
    print(f"decoder of bench/llm_decoder.py; held-out {test.numel()} bytes, calibration "
          f"{len(samples) * llm_decoder.WINDOW} bytes; torch {torch.__version__}, {args.threads} "
          f"threads, a fresh process per row")
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    print("| scheme | algorithm | toolkit | held-out perplexity | KL to float (1e-3 nats / byte) "
          "| seconds |")
    print("|---|---|---|---|---|---|")
    for k, (label, algo, who, fn) in enumerate(table):
        if args.only and not any(o in f"{label} {algo} {who}" for o in args.only.split(",")):
            continue
        t = time.perf_counter()
        if args.in_process:
            line = llm_peers._run_row(label, algo, who, fn, base, samples, metric, (4, 3))
        else:
            out = subprocess.run([sys.executable] + sys.argv + ["--row", str(k)],
                                 capture_output=True, text=True)
            lines = [ln[4:] for ln in out.stdout.splitlines() if ln.startswith("ROW ")]
            tail = (out.stderr.strip().splitlines() or ["no output"])[-1][:160]
            line = lines[-1] if lines else f"| {label} | {algo} | {who} | failed: {tail} | |"
        print(line, f"<!-- {time.perf_counter() - t:.0f} s with the process -->", flush=True)


if __name__ == "__main__":
    main()
