"""The LLM post-training quantization tables of docs/benchmarks.md: our algorithms
(mqbench.llm) and the peers' on one model, in one process, each row on a fresh copy of the float
model, calibrated on the same samples. Used by bench/llm_decoder.py and bench/llm_minilm.py.

Rows: weight-only (asymmetric unless a row says symmetric: RTN, GPTQ, AWQ, SignRound; peers:
torchao's RTN, AutoRound, modelopt's AWQ, which is symmetric only), W8A8 (per-channel INT8
weights and per-tensor static INT8 activations on every Linear's input, without and with
SmoothQuant; peers: torchao's and modelopt's SmoothQuant) and FP8 E4M3 (per-tensor weights and
activations, amax scales); our W8A8 and FP8 rows simulate the formats with torch's own
fake-quantize ops and cast here (``_input_quantized``), after ``mqbench.llm.smoothquant``;
the rows "prepare_by_platform Tensorrt_NLP" are the real path (``ours_w8a8_prepared``).
lm_head stays float, as every toolkit leaves it. Peers are optional: each runs if it imports
(``--peers-path`` adds folders, e.g. of a ``pip install --target``) and is otherwise reported
as skipped with the reason; a peer that fails on the model is reported as failed.
Each row runs in a fresh process (``--in-process``: all in one): a toolkit that patches classes
or sets global state must not change the rows after it (in one process the MiniLM table's
SmoothQuant and symmetric GPTQ rows changed with the rows run before them). Seconds are the
wall time of the algorithm alone, one run each: indicative, not medians over processes
(``llm_timing.py`` gives those).
"""
import argparse
import contextlib
import copy
import importlib
import os
import subprocess
import sys
import time

import torch
import torch.nn as nn

AUTO_ROUND_ITERS = int(os.environ.get("AUTO_ROUND_ITERS", "200"))  # its default


# --- our methods ------------------------------------------------------------------------------

def w_scheme(bits, group, symmetric=False):
    """The w_qscheme of weight-only rows: groups of `group` (None: one range per channel)."""
    s = {"bit": bits, "symmetry": symmetric, "per_channel": True}
    if group:
        s["group_size"] = group
    return s


def ours_weight_only(model, samples, scheme, algorithm):
    from mqbench.llm import awq, gptq, rtn, signround
    if algorithm == "SignRound":  # AutoRound's defaults: 200 steps of 8 items per block
        signround(model, samples, scheme)
    elif algorithm.startswith("GPTQ"):
        gptq(model, samples, scheme, act_order=True,
             true_sequential=algorithm != "GPTQ true_sequential=False")
    elif algorithm.startswith("AWQ"):
        awq(model, samples, scheme, clip=algorithm == "AWQ")
        rtn(model, scheme)
    else:
        rtn(model, scheme)
    return model


def linear_input_amax(model, samples):
    """{name: max |input| over the samples} of every Linear but lm_head."""
    linears = {n: m for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and not n.endswith("lm_head")}
    amax = {n: torch.zeros(()) for n in linears}
    hooks = [m.register_forward_pre_hook(
        lambda m, a, n=n: amax.__setitem__(n, torch.maximum(amax[n], a[0].abs().max())))
        for n, m in linears.items()]
    with torch.no_grad():
        for c in samples:
            model(**c)
    for h in hooks:
        h.remove()
    return amax


def _input_quantized(model, samples, quantize_input, weight_fn):
    """Replaces every decoder Linear's weight by weight_fn(weight) and wraps its forward so its
    input goes through quantize_input(x, observed amax), the amax observed on the samples first."""
    amax = linear_input_amax(model, samples)
    linears = {n: m for n, m in model.named_modules() if n in amax}
    with torch.no_grad():
        for m in linears.values():
            m.weight.copy_(weight_fn(m.weight))
    for n, m in linears.items():
        m.register_forward_pre_hook(lambda m, a, n=n: (quantize_input(a[0], amax[n]),))
    return model


def int8_per_channel(w):
    s = (w.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-8)
    return torch.fake_quantize_per_channel_affine(
        w, s.flatten(), torch.zeros(w.shape[0], dtype=torch.int32), 0, -128, 127)


def int8_per_tensor(x, amax):
    s = max(float(amax) / 127, 1e-8)
    return torch.fake_quantize_per_tensor_affine(x, s, 0, -128, 127)


def fp8_e4m3(x, amax):
    s = max(float(amax) / 448.0, 1e-12)
    return (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s


def ours_w8a8(model, samples, smooth):
    """Simulated W8A8 after ``smoothquant(alpha=smooth)`` (None: no smoothing)."""
    from mqbench.llm import smoothquant
    if smooth is not None:
        smoothquant(model, samples, alpha=smooth)
    return _input_quantized(model, samples, int8_per_tensor, int8_per_channel)


def ours_w8a8_prepared(model, samples, smooth):
    """W8A8 as a user gets it: ``prepare_by_platform(Tensorrt_NLP)`` (torch.export capture, batch
    dimension dynamic) with per-channel INT8 weights and per-tensor INT8 inputs of every Linear
    but lm_head, MinMax observers (the peers' amax calibration) over the samples, matmuls and adds
    left float as in the peers' recipes; after ``smoothquant(alpha=smooth)`` unless smooth is
    None."""
    import operator
    from mqbench.llm import smoothquant
    from mqbench.prepare_by_platform import BackendType, prepare_by_platform
    from mqbench.utils.state import enable_calibration, enable_quantization
    if smooth is not None:
        smoothquant(model, samples, alpha=smooth)
    if getattr(model.config, "use_cache", None):
        model.config.use_cache = False  # export cannot return a DynamicCache
    # export specializes a size of 1: the example and the calibration batches hold 8 samples
    chunks = [{k: torch.cat([c[k] for c in samples[i:i + 8]]) for k in samples[0]}
              for i in range(0, len(samples), 8)]
    batch = torch.export.Dim("batch", min=2, max=4096)
    with contextlib.redirect_stdout(sys.stderr):
        q = prepare_by_platform(model, BackendType.Tensorrt_NLP, {
            "example_inputs": chunks[0],
            "dynamic_shapes": {k: {0: batch} for k in samples[0]},
            "extra_qconfig_dict": {"w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver"},
            "extra_quantizer_dict": {"exclude_function_type": [operator.add, torch.matmul],
                                     "exclude_module_name": ["lm_head"]}})
        enable_calibration(q)
        with torch.no_grad():
            for c in chunks:
                q(**c)
        enable_quantization(q)
    return q


def ours_fp8(model, samples):
    return _input_quantized(model, samples, fp8_e4m3, lambda w: fp8_e4m3(w, w.abs().max()))


# --- peers ------------------------------------------------------------------------------------

def auto_round_weight_only(model, samples, bits, group):
    from auto_round import AutoRound
    from transformers import ByT5Tokenizer  # AutoRound wants one; the data is token ids already
    with contextlib.redirect_stdout(sys.stderr):
        ar = AutoRound(model, tokenizer=ByT5Tokenizer(), bits=bits, group_size=group or -1,
                       sym=False,
                       dataset=samples, nsamples=len(samples),
                       seqlen=samples[0]["input_ids"].shape[-1],
                       batch_size=8, iters=AUTO_ROUND_ITERS, device_map="cpu", amp=False)
        ar.quantize()
    return ar.model


def llmcompressor_oneshot(model, samples, modifiers):
    """llm-compressor's oneshot over the samples (a datasets.Dataset of their token ids)."""
    import datasets
    import pyarrow
    from llmcompressor import oneshot
    from transformers import ByT5Tokenizer  # a processor it can save; the data is ids already
    table = pyarrow.table({k: [s[k][0].tolist() for s in samples] for k in samples[0]})
    # a fingerprint given: datasets' own hashing of the table fails with this pyarrow
    data = datasets.Dataset(table, fingerprint="mqbench-bench-calibration")
    with contextlib.redirect_stdout(sys.stderr):
        oneshot(model=model, dataset=data, recipe=modifiers,
                processor=ByT5Tokenizer(), num_calibration_samples=len(samples),
                max_seq_length=samples[0]["input_ids"].shape[-1], shuffle_calibration_samples=False)
    return model


def llmcompressor_weight_only(model, samples, bits, group, algorithm):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor.modifiers.awq import AWQModifier
    from llmcompressor.modifiers.quantization import GPTQModifier
    weights = QuantizationArgs(num_bits=bits, type="int", symmetric=False,
                               strategy="group" if group else "channel", group_size=group)
    scheme = QuantizationScheme(targets=["Linear"], weights=weights)
    cls = GPTQModifier if algorithm == "GPTQ" else AWQModifier
    return llmcompressor_oneshot(model, samples, [cls(config_groups={"group_0": scheme},
                                                      ignore=["lm_head"])])


def modelopt_config(name, bits=None, group=128, algorithm=None):
    """modelopt's named config (lm_head already off), with the weights' bit width and groups
    (None: per channel) changed, and its algorithm: "AWQ" (its awq_lite, INT4_AWQ_CFG's) or
    "GPTQ"."""
    import modelopt.torch.quantization as mtq
    cfg = copy.deepcopy(getattr(mtq, name))
    if bits is not None:
        entries = [e for e in cfg["quant_cfg"] if e.get("quantizer_name") == "*weight_quantizer"]
        entries[0]["cfg"]["num_bits"] = bits
        if group is None:
            del entries[0]["cfg"]["block_sizes"]
            entries[0]["cfg"]["axis"] = 0
        else:
            entries[0]["cfg"]["block_sizes"][-1] = group
    if algorithm == "GPTQ":
        cfg["algorithm"] = {"method": "gptq", "perc_damp": 0.01, "block_size": 128}
    return cfg


def modelopt_quantize(model, samples, cfg):
    import modelopt.torch.quantization as mtq

    def loop(m):
        for c in samples:
            m(**c)
    with contextlib.redirect_stdout(sys.stderr):
        return mtq.quantize(model, cfg, forward_loop=loop)


def _torchao_filter(mod, fqn):
    return isinstance(mod, nn.Linear) and not fqn.endswith("lm_head")


def torchao_rtn(model, bits, group):
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_primitives import MappingType
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"),
                                          granularity=PerGroup(group) if group else PerAxis(0),
                                          mapping_type=MappingType.ASYMMETRIC),
              filter_fn=_torchao_filter)
    return model


def torchao_smoothquant(model, samples, static):
    """torchao's SmoothQuant (prototype) over its INT8 per-row weights and INT8 activations:
    static per-tensor (the scale observed on the samples) or dynamic per-token. The static
    config's default granularity, PerRow for activations too, keeps one scale per calibration
    row (token), applied by position to whatever input comes later; it is not asked for here."""
    from torchao.prototype.smoothquant import SmoothQuantConfig
    from torchao.quantization import (Int8DynamicActivationInt8WeightConfig,
                                      Int8StaticActivationInt8WeightConfig, quantize_)
    from torchao.quantization.granularity import PerRow, PerTensor
    base = (Int8StaticActivationInt8WeightConfig(granularity=[PerTensor(), PerRow()]) if static
            else Int8DynamicActivationInt8WeightConfig())
    quantize_(model, SmoothQuantConfig(base, step="prepare", alpha=0.5),
              filter_fn=_torchao_filter)
    with torch.no_grad():
        for c in samples:
            model(**c)
    quantize_(model, SmoothQuantConfig(base, step="convert", alpha=0.5),
              filter_fn=_torchao_filter)
    return model


# --- the table --------------------------------------------------------------------------------

def rows(peers, weight_settings):
    """(setting, algorithm, toolkit, fn(model, samples) -> quantized model): float first, then
    weight-only for each (bits, group) of weight_settings, W8A8, FP8."""
    out = [("float", "-", "float", None)]
    for bits, group in weight_settings:
        label = f"W{bits} " + (f"g{group}" if group else "per-channel")
        for algo in ("RTN", "GPTQ", "GPTQ true_sequential=False", "AWQ", "AWQ clip=False",
                     "SignRound"):
            out.append((label, algo, "mqbench", lambda m, c, s=w_scheme(bits, group), a=algo:
                        ours_weight_only(m, c, s, a)))
        if "torchao" in peers:
            out.append((label, "RTN (IntxWeightOnlyConfig)", "torchao",
                        lambda m, c, b=bits, g=group: torchao_rtn(m, b, g)))
        if "llmcompressor" in peers:
            for algo in ("GPTQ", "AWQ"):
                out.append((label, algo, "llm-compressor",
                            lambda m, c, b=bits, g=group, a=algo: llmcompressor_weight_only(
                                m, c, b, g, a)))
        if "auto_round" in peers:
            out.append((label, "AutoRound", "auto-round",
                        lambda m, c, b=bits, g=group: auto_round_weight_only(m, c, b, g)))
        for algo in ("GPTQ", "AWQ"):
            out.append((label + " symmetric", algo, "mqbench",
                        lambda m, c, s=w_scheme(bits, group, True), a=algo:
                        ours_weight_only(m, c, s, a)))
            if "modelopt" in peers:
                out.append((label + " symmetric", algo, "modelopt",
                            lambda m, c, b=bits, g=group, a=algo: modelopt_quantize(
                                m, c, modelopt_config("INT4_AWQ_CFG", b, g, a))))
    out.append(("W8A8", "RTN (no smoothing)", "mqbench", lambda m, c: ours_w8a8(m, c, None)))
    for alpha in (0.5, "auto"):
        out.append(("W8A8", f"SmoothQuant {alpha}", "mqbench",
                    lambda m, c, a=alpha: ours_w8a8(m, c, a)))
    out.append(("W8A8", "prepare_by_platform Tensorrt_NLP", "mqbench",
                lambda m, c: ours_w8a8_prepared(m, c, None)))
    for alpha in (0.5, "auto"):
        out.append(("W8A8", f"SmoothQuant {alpha} + prepare_by_platform Tensorrt_NLP", "mqbench",
                    lambda m, c, a=alpha: ours_w8a8_prepared(m, c, a)))
    if "torchao" in peers:
        out.append(("W8A8", "SmoothQuant 0.5 (static per-tensor)", "torchao",
                    lambda m, c: torchao_smoothquant(m, c, True)))
        out.append(("W8A8", "SmoothQuant 0.5 (dynamic per token)", "torchao",
                    lambda m, c: torchao_smoothquant(m, c, False)))
    if "modelopt" in peers:
        out.append(("W8A8", "SmoothQuant", "modelopt",
                    lambda m, c: modelopt_quantize(m, c, modelopt_config("INT8_SMOOTHQUANT_CFG"))))
    out.append(("FP8 E4M3", "per-tensor", "mqbench", lambda m, c: ours_fp8(m, c)))
    if "modelopt" in peers:
        out.append(("FP8 E4M3", "per-tensor", "modelopt",
                    lambda m, c: modelopt_quantize(m, c, modelopt_config("FP8_DEFAULT_CFG"))))
    return out


# The modules each toolkit's row functions import. A row imports them before its clock starts, so
# that its seconds are the algorithm's: llm-compressor's imports took 0.6-1.1 s inside its first
# call on a 2-core CI machine (its GPTQ on the decoder takes about 3.7 s without them), ours
# 0.07 s.
_TOOLKIT_MODULES = {
    "mqbench": ("mqbench.llm", "mqbench.prepare_by_platform", "mqbench.utils.state"),
    "llm-compressor": ("datasets", "pyarrow", "llmcompressor", "llmcompressor.modifiers.awq",
                       "llmcompressor.modifiers.quantization", "compressed_tensors.quantization"),
    "modelopt": ("modelopt.torch.quantization",),
    "torchao": ("torchao.quantization", "torchao.quantization.granularity",
                "torchao.quantization.quant_primitives", "torchao.prototype.smoothquant"),
    "auto-round": ("auto_round",),
}


def import_toolkit(who):
    """Imports the modules the rows of toolkit ``who`` use (``_TOOLKIT_MODULES``); a failure is
    left to the row, which reports it."""
    for name in _TOOLKIT_MODULES.get(who, ()):
        try:
            importlib.import_module(name)
        except Exception:  # the row itself imports it again and reports the failure
            return


def available_peers(wanted):
    peers, skipped = [], {}
    for name in wanted:
        try:
            __import__("modelopt.torch.quantization" if name == "modelopt" else name)
            peers.append(name)
        except Exception as e:  # any import failure: report it, run the rest
            skipped[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return peers, skipped


def add_arguments(ap):
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peers", default="torchao,auto_round,modelopt,llmcompressor")
    ap.add_argument("--peers-path", default="", help="folders to add to sys.path (os.pathsep)")
    ap.add_argument("--only", default="",
                    help="run only rows whose 'setting algorithm toolkit' holds one of these "
                         "comma-separated strings")
    ap.add_argument("--in-process", action="store_true",
                    help="run every row in this process (default: each row in a fresh one)")
    ap.add_argument("--row", type=int, default=None, help=argparse.SUPPRESS)


def _run_row(label, algo, who, fn, base, samples, metric, digits):
    """One row's table line (or its failure), on a fresh copy of the float model."""
    model = copy.deepcopy(base)
    seconds = None
    import_toolkit(who)
    try:
        if fn is not None:
            t = time.perf_counter()
            model = fn(model, samples)
            seconds = time.perf_counter() - t
        value = metric(model.eval())
    except Exception as e:  # a peer that fails on this model: say so (and where) and go on
        where = "running the quantized model" if seconds is not None or fn is None \
            else "quantizing"
        return (f"| {label} | {algo} | {who} | failed {where}: {type(e).__name__} "
                f"{str(e).splitlines()[0][:100] if str(e) else ''} | |")
    values = value if isinstance(value, tuple) else (value,)  # a metric of several columns
    places = digits if isinstance(digits, tuple) else (digits,) * len(values)
    cells = " | ".join(f"{v:.{d}f}" for v, d in zip(values, places))
    return f"| {label} | {algo} | {who} | {cells} | " \
        f"{'-' if seconds is None else f'{seconds:.1f}'} |"


def _row_in_fresh_process(k, label, algo, who):
    """Runs row k by running this script again with --row k: no state a toolkit leaves in the
    process (patched classes, registered hooks, global flags) reaches the next row."""
    out = subprocess.run([sys.executable] + sys.argv + ["--row", str(k)], capture_output=True,
                         text=True)
    lines = [ln[len("ROW "):] for ln in out.stdout.splitlines() if ln.startswith("ROW ")]
    if lines:
        return lines[-1]
    tail = (out.stderr.strip().splitlines() or ["no output"])[-1][:100]
    return f"| {label} | {algo} | {who} | failed: process exited {out.returncode}: {tail} | |"


def run_table(args, base, samples, metric, metric_name, weight_settings, header, digits=4):
    """Prints the markdown table: one row per (setting, algorithm, toolkit), metric(model). Each
    row runs in a fresh process (``--in-process``: all in this one). A metric of several columns
    returns a tuple, with ``metric_name`` their headers joined by " | " and ``digits`` a tuple."""
    torch.set_num_threads(args.threads)
    for p in filter(None, args.peers_path.split(os.pathsep)):
        sys.path.append(p)
    peers, skipped = available_peers([p for p in args.peers.split(",") if p])
    table = rows(peers, weight_settings)
    if args.row is not None:  # a child of _row_in_fresh_process
        label, algo, who, fn = table[args.row]
        print("ROW " + _run_row(label, algo, who, fn, base, samples, metric, digits), flush=True)
        return
    print(f"{header}; torch {torch.__version__}, {args.threads} threads, "
          f"{'one process' if args.in_process else 'a fresh process per row'}")
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    print(f"| weights | algorithm | toolkit | {metric_name} | seconds |")
    print("|---|---|---|" + "---|" * (metric_name.count("|") + 1) + "---|")
    for k, (label, algo, who, fn) in enumerate(table):
        if args.only and not any(o in f"{label} {algo} {who}" for o in args.only.split(",")):
            continue
        if args.in_process:
            line = _run_row(label, algo, who, fn, base, samples, metric, digits)
        else:
            line = _row_in_fresh_process(k, label, algo, who)
        print(line, flush=True)
