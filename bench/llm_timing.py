"""Wall time of the weight-only LLM algorithms against the peers': each cell is a fresh
process that loads the decoder of ``llm_decoder.py`` (train it first), quantizes a fresh copy
with one row's algorithm on the same 32 calibration windows and prints the algorithm's seconds
(the toolkit's modules are imported before the clock starts: ``llm_peers.import_toolkit``);
rows rotate between rounds, so every row sees the machine's good and bad moments alike. Printed:
per row, the median over the rounds, the spread (min-max) and the median as a multiple of our
GPTQ's (``--base``: another row's), plus the held-out perplexity of the row's model (deterministic: one number per row).

Rows (W4, groups of 128; asymmetric unless named symmetric; ``--rows`` picks some):
  ours-gptq, ours-gptq-block (``true_sequential=False``: a block's layers all calibrated on one
  pass of the block, as llm-compressor does), ours-gptq-nocache (captures re-run the model from
  its input: ``cache_blocks=False``),
  ours-gptq-sym, ours-awq (with AutoAWQ's clip search), ours-awq-noclip, ours-signround,
  llmcompressor-gptq, modelopt-gptq-sym, modelopt-awq-sym (its awq_lite), autoround
  (AutoRound's defaults, as ours-signround's: 200 steps of 8 items per block).
``--hidden N`` times a random-weight decoder of width N instead (no perplexity), ``--minilm``
all-MiniLM-L6-v2 on llm_minilm.py's 64 sentences (the last column: embedding cosine to float).
Peers come from ``--peers-path`` as in ``llm_decoder.py``; a row whose toolkit does not import is
skipped with the reason.

    PYTHONPATH=python .venv/bin/python bench/llm_timing.py --rounds 5 --threads 1 \\
        --peers-path /tmp/peers_llmc:/tmp/peers_site
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

ROWS = ("ours-gptq", "ours-gptq-block", "ours-gptq-nocache", "ours-gptq-sym", "ours-awq",
        "ours-awq-noclip", "ours-signround", "llmcompressor-gptq", "modelopt-gptq-sym",
        "modelopt-awq-sym", "autoround")
BITS, GROUP = 4, 128
TOOLKITS = {"ours": "mqbench", "llmcompressor": "llm-compressor", "modelopt": "modelopt",
            "autoround": "auto-round"}


def quantize(row, model, samples):
    """Runs the row's algorithm on model (in place or returned)."""
    import llm_peers
    from mqbench.llm import awq, gptq, signround
    asym, sym = llm_peers.w_scheme(BITS, GROUP), llm_peers.w_scheme(BITS, GROUP, True)
    if row == "ours-gptq":
        gptq(model, samples, asym, act_order=True)
    elif row == "ours-gptq-block":
        gptq(model, samples, asym, act_order=True, true_sequential=False)
    elif row == "ours-gptq-nocache":
        gptq(model, samples, asym, act_order=True, cache_blocks=False)
    elif row == "ours-gptq-sym":
        gptq(model, samples, sym, act_order=True)
    elif row in ("ours-awq", "ours-awq-noclip"):  # the search only: the rounding is RTN's
        awq(model, samples, asym, clip=row == "ours-awq")
    elif row == "ours-signround":
        signround(model, samples, asym)
    elif row == "autoround":
        model = llm_peers.auto_round_weight_only(model, samples, BITS, GROUP)
    elif row == "llmcompressor-gptq":
        model = llm_peers.llmcompressor_weight_only(model, samples, BITS, GROUP, "GPTQ")
    elif row == "modelopt-gptq-sym":
        model = llm_peers.modelopt_quantize(model, samples, llm_peers.modelopt_config(
            "INT4_AWQ_CFG", BITS, GROUP, "GPTQ"))
    elif row == "modelopt-awq-sym":
        model = llm_peers.modelopt_quantize(model, samples, llm_peers.modelopt_config(
            "INT4_AWQ_CFG", BITS, GROUP, "AWQ"))
    else:
        raise ValueError(f"unknown row {row!r}; rows: {', '.join(ROWS)}")
    return model


def child(args):
    import torch
    import llm_decoder
    import llm_peers
    torch.set_num_threads(args.threads)
    for p in filter(None, args.peers_path.split(os.pathsep)):
        sys.path.append(p)
    text, held = (llm_decoder.as_tensor(t) for t in llm_decoder.stdlib_split())
    samples = [{"input_ids": w[None]} for w in
               llm_decoder.windows(text, 32, torch.Generator().manual_seed(1))]
    cosine = None
    if args.minilm:  # all-MiniLM-L6-v2 on the 64 sentences of llm_minilm.py
        import llm_minilm
        model, samples, cosine, _ = llm_minilm.setup(64)
    elif args.hidden:  # random weights: the timing of a wider decoder, no meaningful perplexity
        import transformers
        torch.manual_seed(0)
        h = args.hidden
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=256, hidden_size=h, intermediate_size=3 * h, num_hidden_layers=4,
            num_attention_heads=max(1, h // 64), num_key_value_heads=max(1, h // 64),
            max_position_embeddings=llm_decoder.WINDOW, tie_word_embeddings=False))
        # loaded back from a folder, as the trained one: llm-compressor reads the model's path
        # (the folder lives until this process ends)
        args.folder = tempfile.TemporaryDirectory(prefix="llm_timing_")
        model.save_pretrained(args.folder.name)
        model = transformers.LlamaForCausalLM.from_pretrained(args.folder.name).float().eval()
    else:
        model = llm_decoder.load_model()
    llm_peers.import_toolkit(TOOLKITS[args.child.split("-")[0]])  # not timed: imports
    t = time.perf_counter()
    model = quantize(args.child, model, samples)
    seconds = time.perf_counter() - t
    if args.child.startswith("ours-awq"):
        from mqbench.llm import rtn
        rtn(model, llm_peers.w_scheme(BITS, GROUP))
    if cosine is not None:
        ppl = cosine(model.eval())  # the quality column: embedding cosine to float
    else:
        ppl = None if args.hidden else llm_decoder.perplexity(model.eval(),
                                                              llm_decoder.windows(held, 64))
    print("RESULT " + json.dumps({"row": args.child, "seconds": seconds, "ppl": ppl}))


def importable(row, peers_path):
    need = {"llmcompressor": "llmcompressor", "modelopt": "modelopt.torch.quantization",
            "autoround": "auto_round"}
    mod = need.get(row.split("-")[0])
    if mod is None:
        return None
    code = (f"import sys; sys.path += {peers_path.split(os.pathsep)!r}; import {mod}")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1][:120]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--peers-path", default="")
    ap.add_argument("--minilm", action="store_true",
                    help="time all-MiniLM-L6-v2 (64 sentences, llm_minilm.py) instead; the last "
                         "column is then its embedding cosine to float")
    ap.add_argument("--hidden", type=int, default=0,
                    help="time a random-weight decoder of this width (4 layers, MLP 3x, heads of "
                         "64) instead of the trained one; no perplexity")
    ap.add_argument("--base", default="ours-gptq",
                    help="the row the ratio column divides by (default ours-gptq)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    rows = [r for r in args.rows.split(",") if r]
    for r in rows:
        if r not in ROWS:
            sys.exit(f"unknown row {r!r}; rows: {', '.join(ROWS)}")
    skipped = {r: why for r in rows for why in [importable(r, args.peers_path)] if why}
    rows = [r for r in rows if r not in skipped]
    seconds, ppl = {r: [] for r in rows}, {}
    env = dict(os.environ, TQDM_DISABLE="1")
    for k in range(args.rounds):
        order = rows[k % len(rows):] + rows[:k % len(rows)]
        for r in order:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", r,
                   "--threads", str(args.threads), "--peers-path", args.peers_path,
                   "--hidden", str(args.hidden)] + (["--minilm"] if args.minilm else [])
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode or not lines:
                tail = (out.stderr.strip().splitlines() or ["?"])[-1][:160]
                print(f"round {k}: {r} failed: {tail}", flush=True)
                continue
            res = json.loads(lines[-1][len("RESULT "):])
            seconds[r].append(res["seconds"])
            ppl[r] = res["ppl"]
            print(f"round {k}: {r} {res['seconds']:.2f} s", flush=True)
    import torch
    what = ("all-MiniLM-L6-v2, 64 sentences" if args.minilm else
            f"random-weight decoder, hidden {args.hidden}, 4 layers, 32 windows of 256 bytes"
            if args.hidden else "decoder of llm_decoder.py, 32 windows of 256 bytes")
    print(f"\nW{BITS} g{GROUP}, {what}; torch "
          f"{torch.__version__}, {args.threads} thread(s), {args.rounds} rounds, one fresh "
          "process per cell")
    for r, why in skipped.items():
        print(f"skipped {r}: {why}")
    base = statistics.median(seconds[args.base]) if seconds.get(args.base) else None
    quality = "embedding cosine" if args.minilm else "held-out perplexity"
    print(f"| row | median s | min-max s | x {args.base} | {quality} |")
    print("|---|---|---|---|---|")
    for r in rows:
        if not seconds[r]:
            print(f"| {r} | failed | | | |")
            continue
        med = statistics.median(seconds[r])
        ratio = f"{med / base:.2f}" if base else "-"
        print(f"| {r} | {med:.2f} | {min(seconds[r]):.2f}-{max(seconds[r]):.2f} | {ratio} | "
              f"{'-' if ppl[r] is None else f'{ppl[r]:.5f}' if args.minilm else f'{ppl[r]:.4f}'} |")


if __name__ == "__main__":
    main()
