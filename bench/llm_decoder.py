"""The decoder table of docs/benchmarks.md: a small Llama-style decoder trained here on real text,
then its held-out perplexity after each post-training quantization, ours and the peers', in one
run.

    PYTHONPATH=python .venv/bin/python bench/llm_decoder.py train      # ~9 min on 2 cores
    PYTHONPATH=python .venv/bin/python bench/llm_decoder.py eval \
        --peers-path /tmp/peers_llmc:/tmp/peers_ar:/tmp/peers_site    # ~50 min (docs/benchmarks.md)

The text is the source of Python's standard library (``.py`` files of the running interpreter's
stdlib, without its test suites, idlelib and lib2to3), read as bytes (vocabulary 256: no
tokenizer to download), split into train and held-out by file (one file in ten, by a CRC of its
path, is held out). The model is transformers' ``LlamaForCausalLM``: hidden 256, 4 layers, 4
heads, MLP 768 (3.5M parameters), trained for ``--steps`` AdamW steps of ``--batch`` windows of
256 bytes, seeded; the checkpoint and its training log go to ``checkpoints/llama-stdlib/`` beside
this script (not in git: ``train`` makes it again).

``eval`` measures, on 64 held-out windows of 256 bytes (evenly spaced), the perplexity per byte
of the float model and of each row of bench/llm_peers.py, all calibrated on the same 32 train
windows of 256 bytes: weight-only INT4 and INT3 in groups of 128 and per channel, W8A8, FP8.
"""
import argparse
import glob
import json
import math
import os
import sys
import sysconfig
import time
import zlib

import torch
import torch.nn as nn

import llm_peers

HERE = os.path.dirname(os.path.abspath(__file__))
CKPT = os.path.join(HERE, "checkpoints", "llama-stdlib")
WINDOW = 256


# --- data -------------------------------------------------------------------------------------

def stdlib_split():
    """(train bytes, held-out bytes): the stdlib's .py files without tests, split by file."""
    root = sysconfig.get_paths()["stdlib"]
    train, held = [], []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, root)
        parts = rel.split(os.sep)
        if parts[0] in ("test", "idlelib", "site-packages", "lib2to3") or "tests" in parts:
            continue
        with open(path, "rb") as f:
            data = f.read()
        (held if zlib.crc32(rel.encode()) % 10 == 0 else train).append(data)
    return b"\n\n".join(train), b"\n\n".join(held)


def as_tensor(data):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def windows(text, n, generator=None):
    """n windows of WINDOW bytes: random (a generator) or evenly spaced."""
    if generator is not None:
        starts = torch.randint(0, len(text) - WINDOW - 1, (n,), generator=generator).tolist()
    else:
        starts = [i * ((len(text) - WINDOW - 1) // n) for i in range(n)]
    return torch.stack([text[s:s + WINDOW] for s in starts])


# --- model ------------------------------------------------------------------------------------

def make_model():
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=768,
                                   num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=4, max_position_embeddings=WINDOW,
                                   tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg)


def load_model():
    import transformers
    if not os.path.exists(os.path.join(CKPT, "config.json")):
        sys.exit(f"no checkpoint in {CKPT}: run `bench/llm_decoder.py train` first")
    return transformers.LlamaForCausalLM.from_pretrained(CKPT).float().eval()


def train(args):
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    text, held = (as_tensor(t) for t in stdlib_split())
    model = make_model().train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(0)
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / args.steps))) + 0.05)
    log = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        x = windows(text, args.batch, g)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == args.steps - 1:
            log.append({"step": step, "loss": round(loss.item(), 4),
                        "seconds": round(time.perf_counter() - t0, 1)})
            print(log[-1], flush=True)
    model.eval()
    ppl = perplexity(model, windows(held, 64))
    os.makedirs(CKPT, exist_ok=True)
    model.save_pretrained(CKPT)
    info = {"parameters": n_params, "steps": args.steps, "lr": args.lr,
            "train_bytes": len(text), "held_out_bytes": len(held),
            "python": sys.version.split()[0], "torch": torch.__version__,
            "seconds": round(time.perf_counter() - t0, 1), "held_out_perplexity": ppl, "log": log}
    with open(os.path.join(CKPT, "training.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"{n_params} parameters, {args.steps} steps in {info['seconds']} s; held-out "
          f"perplexity {ppl:.3f}; saved to {CKPT}")


@torch.no_grad()
def perplexity(model, batch, chunk=16):
    nll, count = 0.0, 0
    for i in range(0, len(batch), chunk):
        x = batch[i:i + chunk]
        logits = model(input_ids=x).logits[:, :-1].float()
        nll += nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           x[:, 1:].reshape(-1), reduction="sum").item()
        count += x[:, 1:].numel()
    return math.exp(nll / count)


def log_probs(model, batch, chunk=16):
    """[windows, WINDOW - 1, 256] log-probabilities of each next byte."""
    with torch.no_grad():
        return torch.cat([model(input_ids=batch[i:i + chunk]).logits[:, :-1].float()
                          .log_softmax(-1) for i in range(0, len(batch), chunk)])


def perplexity_and_kl(model, batch, ref, chunk=16):
    """(perplexity as ``perplexity``, mean over predicted bytes of KL(float || model) in nats,
    ``ref``: the float model's ``log_probs``): how far the next-byte distributions moved from
    the float model's. Perplexity moves both ways by chance when a change is small (a quantized
    model can read below float); this does not."""
    nll, kl, count = 0.0, 0.0, 0
    with torch.no_grad():
        for i in range(0, len(batch), chunk):
            x = batch[i:i + chunk]
            logits = model(input_ids=x).logits[:, :-1].float()
            nll += nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               x[:, 1:].reshape(-1), reduction="sum").item()
            r = ref[i:i + chunk]
            kl += (r.exp() * (r - logits.log_softmax(-1))).sum().item()
            count += x[:, 1:].numel()
    return math.exp(nll / count), kl / count


def evaluate(args):
    text, held = (as_tensor(t) for t in stdlib_split())
    samples = [{"input_ids": w[None]}
               for w in windows(text, 32, torch.Generator().manual_seed(1))]
    test = windows(held, 64)
    info = json.load(open(os.path.join(CKPT, "training.json")))
    header = (f"decoder: {info['parameters']} parameters, {info['steps']} steps on the stdlib of "
              f"Python {info['python']}; held-out: {test.numel()} bytes, calibration: "
              f"{len(samples) * WINDOW} bytes")
    base = load_model()
    ref = []  # the float model's held-out log-probabilities, computed once per process

    def metric(m):
        if not ref:
            ref.append(log_probs(base, test))
        ppl, kl = perplexity_and_kl(m, test, ref[0])
        return ppl, 1e3 * kl
    llm_peers.run_table(args, base, samples, metric,
                        "held-out perplexity | KL to float (1e-3 nats / byte)",
                        ((4, 128), (3, 128), (4, None), (3, None)), header, digits=(4, 3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["train", "eval"])
    ap.add_argument("--steps", type=int, default=450)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    llm_peers.add_arguments(ap)
    args = ap.parse_args()
    (train if args.mode == "train" else evaluate)(args)


if __name__ == "__main__":
    main()
