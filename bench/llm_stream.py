"""Peak memory and wall time of quantizing a checkpoint larger than we want in memory: ``python -m
mqbench.llm`` (block by block) against our in-memory ``gptq`` and the peers (llm-compressor's
``oneshot``, AutoRound with ``low_gpu_mem_usage``), on one random-weight Llama in bfloat16
safetensors and the same calibration ids; then each output loaded by plain transformers and
scored against the float model (docs/benchmarks.md, "Checkpoints larger than memory").

    python bench/llm_stream.py build /tmp/llama1.6b            # about 1.6B parameters, 3.2 GB
    AUTO_ROUND_ITERS=2 python bench/llm_stream.py run /tmp/llama1.6b \\
        --rows imports,stream,stream_2,stream_rtn,\\
        memory,llmcompressor,autoround --calib-rows 16 --seqlen 512 --score \\
        --peers-path /tmp/peers_llmc:/tmp/peers_ar --out /tmp/stream.json
    python bench/llm_stream.py moe                               # GPTQ's seconds per expert

Each row runs in a fresh process under GNU time (peak RSS, wall seconds). The model has random
weights (normal, std 0.02) and the calibration and held-out ids are random tokens: the scores
compare the quantizers' damage (KL of the next-token distributions to the float model's), not a
language model's quality.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# symmetric groups of 128 with act_order (static groups): llm-compressor's W4A16 preset; its
# pipeline takes a block's Hessians from one pass (our true_sequential=False)
SCHEME = {"bit": 4, "per_channel": True, "group_size": 128}


def build(path, layers, hidden, inter, vocab, heads, seed=0):
    import torch
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                   num_hidden_layers=layers, num_attention_heads=heads,
                                   num_key_value_heads=heads, max_position_embeddings=2048,
                                   tie_word_embeddings=False, dtype="bfloat16")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    model.to_empty(device="cpu")
    model.to(torch.bfloat16)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        model.model.rotary_emb.__init__(cfg)  # its frequencies, computed
    model.save_pretrained(path)
    n = sum(p.numel() for p in model.parameters())
    print(f"built {path}: {n / 1e9:.3f}B parameters")


def _ids(path, rows, seqlen, vocab, seed):
    import torch
    ids = torch.randint(0, vocab, (rows, seqlen), generator=torch.Generator().manual_seed(seed))
    torch.save(ids, path)
    return path


# --- the rows, each in a process of its own ----------------------------------------------------

# The peers' rows start with this: the bfloat16 model, the ids, and a tokenizer the peers ask for
# though the checkpoint has none (a word-level one over the bare vocabulary, never used to
# tokenize), and the ids as rows of one sample with their attention masks.
_PEER_PRELUDE = r"""
import sys, torch, transformers, tokenizers
model_dir, out, calib = sys.argv[1], sys.argv[2], sys.argv[3]
ids = torch.load(calib)
model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
tok = transformers.PreTrainedTokenizerFast(
    tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0")))
rows = [{"input_ids": ids[i:i + 1], "attention_mask": torch.ones_like(ids[i:i + 1])}
        for i in range(ids.shape[0])]
"""

ROWS = {
    "imports": "import torch, transformers, mqbench.llm",
    "stream_2": None,  # the same on two processes (torchrun, gloo)
    "stream": None,  # python -m mqbench.llm, below
    "stream_rtn": None,
    "memory": r"""
import sys, torch, transformers
from mqbench.llm import gptq, save_quantized
model_dir, out, calib, scheme = sys.argv[1], sys.argv[2], sys.argv[3], eval(sys.argv[4])
model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
ids = torch.load(calib)
qp = gptq(model, [ids[i:i + 1] for i in range(ids.shape[0])], scheme, act_order=True,
          true_sequential=False)
save_quantized(model, out, scheme, qparams=qp)
""",
    "llmcompressor": r"""
from torch.utils.data import DataLoader
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import GPTQModifier
# oneshot wants a processor whenever it is given data (the prelude's); the ids go in as a
# DataLoader of ready batches of one row (oneshot takes it as is: no datasets.Dataset, whose
# fingerprinting fails on this pyarrow)
oneshot(model=model, processor=tok, dataset=DataLoader(rows, batch_size=None),
        recipe=GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"]),
        num_calibration_samples=ids.shape[0], max_seq_length=ids.shape[1])
model.save_pretrained(out, save_compressed=True)
""",
    "autoround": r"""
import os, shutil
from auto_round import AutoRound
# AutoRound wants a tokenizer with a model object (the prelude's: no pad token, whose id AutoRound
# would take out of the loss); the calibration is the given ids, one row a sample
ar = AutoRound(model, tok, bits=4, group_size=128, sym=True, low_gpu_mem_usage=True,
               iters=int(os.environ.get("AUTO_ROUND_ITERS", "200")), nsamples=ids.shape[0],
               seqlen=ids.shape[1], dataset=rows)
_, folders = ar.quantize_and_save(out, format="llm_compressor")
# it writes into a folder of its own naming under out (e.g. out/small-w4g128): lift that to out
sub = folders[0] if isinstance(folders, (list, tuple)) else folders
if os.path.abspath(sub) != os.path.abspath(out):
    for name in os.listdir(sub):
        shutil.move(os.path.join(sub, name), os.path.join(out, name))
    os.rmdir(sub)
""",
}


def _timed(cmd, env):
    """(peak RSS in MB, wall seconds, return code, stderr tail) of ``cmd`` under GNU time."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as f:
        r = subprocess.run(["/usr/bin/time", "-f", "%M %e", "-o", f.name] + cmd,
                           capture_output=True, text=True, env=env)
        line = f.read().strip().splitlines()[-1] if os.path.getsize(f.name) else "0 0"
    rss_kb, wall = line.split()[:2]
    return int(rss_kb) / 1024.0, float(wall), r.returncode, r.stderr[-2000:]


def run(model_dir, rows, work, calib_rows, seqlen, peers_path, vocab):
    os.makedirs(work, exist_ok=True)
    calib = _ids(os.path.join(work, "calib.pt"), calib_rows, seqlen, vocab, seed=1)
    results = []
    for row in rows:
        out = os.path.join(work, f"out_{row}")
        subprocess.run(["rm", "-rf", out])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            ([peers_path] if peers_path and row in ("llmcompressor", "autoround") else []) +
            [os.path.join(ROOT, "python")])
        if row in ("stream", "stream_rtn", "stream_2"):
            alg = "rtn" if row == "stream_rtn" else "gptq"
            launch = [sys.executable, "-m", "mqbench.llm"] if row != "stream_2" else \
                [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                 "--master-port", "0", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 "localhost:0", "-m", "mqbench.llm"]
            cmd = launch + [model_dir, out, "--algorithm", alg,
                   "--bits", "4", "--group-size", "128", "--calib", calib] + \
                (["--act-order", "--set", "true_sequential=False"] if alg == "gptq" else [])
        elif row == "imports":
            cmd = [sys.executable, "-c", ROWS[row]]
        else:
            script = ROWS[row] if row == "memory" else _PEER_PRELUDE + ROWS[row]
            cmd = [sys.executable, "-c", script, model_dir, out, calib, repr(SCHEME)]
        rss, wall, rc, err = _timed(cmd, env)
        res = {"row": row, "peak_rss_mb": round(rss, 1), "wall_s": wall, "rc": rc}
        if rc != 0:
            res["error"] = err
        print(json.dumps(res), flush=True)
        results.append(res)
    return results


def score(model_dir, outs, rows, seqlen, vocab):
    """KL(float || quantized) per token, mean over 4 held-out rows of random ids, each output
    loaded by plain transformers (bfloat16, as its config says)."""
    import torch
    import transformers
    ids = torch.randint(0, vocab, (4, seqlen), generator=torch.Generator().manual_seed(2))

    def logprobs(path):
        model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
        with torch.no_grad():
            out = [torch.log_softmax(model(input_ids=ids[i:i + 1]).logits.float(), -1)
                   for i in range(ids.shape[0])]
        del model
        return torch.cat(out)

    ref = logprobs(model_dir)
    scores = {}
    for row, path in zip(rows, outs):
        q = logprobs(path)
        scores[row] = float((ref.exp() * (ref - q)).sum(-1).mean())
        print(json.dumps({"row": row, "kl_to_float": scores[row]}), flush=True)
    return scores


def moe(experts, hidden, inter, layers, rows, seqlen, repeats):
    """Seconds per expert of GPTQ on a random Qwen3-MoE (in memory): median over ``repeats``
    fresh copies, against the same model's dense attention-only time (experts left float)."""
    import statistics
    import time
    import torch
    import transformers
    from mqbench.llm import gptq
    cfg = transformers.Qwen3MoeConfig(vocab_size=1000, hidden_size=hidden,
                                      intermediate_size=inter, moe_intermediate_size=inter,
                                      num_hidden_layers=layers, num_attention_heads=8,
                                      num_key_value_heads=8, num_experts=experts,
                                      num_experts_per_tok=2, head_dim=hidden // 8,
                                      max_position_embeddings=seqlen)
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(0, 1000, (rows, seqlen), generator=torch.Generator().manual_seed(1))
    calib = [ids[i:i + 1] for i in range(rows)]
    attention = [n for n, m in base.named_modules()
                 if isinstance(m, torch.nn.Linear) and "self_attn" in n]
    times = {"all": [], "attention": []}
    import copy
    for _ in range(repeats):
        for which in times:
            model = copy.deepcopy(base)
            t0 = time.perf_counter()
            gptq(model, calib, {"bit": 4, "per_channel": True, "group_size": 128},
                 layers=attention if which == "attention" else None, min_expert_tokens=0)
            times[which].append(time.perf_counter() - t0)
    all_s, attn_s = statistics.median(times["all"]), statistics.median(times["attention"])
    res = {"experts_per_layer": experts, "layers": layers, "hidden": hidden,
           "moe_intermediate": inter, "tokens": rows * seqlen, "gptq_all_s": round(all_s, 3),
           "gptq_attention_only_s": round(attn_s, 3),
           "s_per_expert": round((all_s - attn_s) / (experts * layers), 4),
           "spread_all_s": [round(min(times["all"]), 3), round(max(times["all"]), 3)]}
    print(json.dumps(res))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("path")
    b.add_argument("--layers", type=int, default=24)
    b.add_argument("--hidden", type=int, default=2048)
    b.add_argument("--inter", type=int, default=7168)
    b.add_argument("--vocab", type=int, default=32000)
    b.add_argument("--heads", type=int, default=16)
    r = sub.add_parser("run")
    r.add_argument("path")
    r.add_argument("--rows", default="imports,stream,stream_rtn,memory")
    r.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "llm_stream_bench"))
    r.add_argument("--calib-rows", type=int, default=8)
    r.add_argument("--seqlen", type=int, default=512)
    r.add_argument("--peers-path", default=None)
    r.add_argument("--score", action="store_true", help="load each output in transformers and "
                   "give its KL to the float model")
    r.add_argument("--out", default=None, help="a JSON file of the results")
    m = sub.add_parser("moe", help="GPTQ's seconds per expert on a random Qwen3-MoE")
    m.add_argument("--experts", type=int, default=16)
    m.add_argument("--hidden", type=int, default=512)
    m.add_argument("--inter", type=int, default=256)
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--rows", type=int, default=16)
    m.add_argument("--seqlen", type=int, default=256)
    m.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.cmd == "moe":
        moe(args.experts, args.hidden, args.inter, args.layers, args.rows, args.seqlen,
            args.repeats)
        return
    if args.cmd == "build":
        build(args.path, args.layers, args.hidden, args.inter, args.vocab, args.heads)
        return
    with open(os.path.join(args.path, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rows = args.rows.split(",")
    results = run(args.path, rows, args.work, args.calib_rows, args.seqlen, args.peers_path,
                  vocab)
    size = sum(os.path.getsize(os.path.join(args.path, n)) for n in os.listdir(args.path)
               if n.endswith(".safetensors"))
    summary = {"checkpoint_bytes": size, "rows": results}
    if args.score:
        done = [r["row"] for r in results if r["rc"] == 0 and r["row"] != "imports"]
        summary["kl_to_float"] = score(args.path, [os.path.join(args.work, f"out_{r}")
                                                   for r in done], done, 256, vocab)
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
