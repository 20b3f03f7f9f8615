"""Calibration data for ``quantize_checkpoint``: token ids ``[n, seq]``, from a tensor, a ``.pt``
file holding one, or text (``.jsonl``, ``.txt``) tokenized with the checkpoint's tokenizer, each
checked before any block runs."""
import hashlib
import json
import os

import torch

from mqbench.llm.stream._source import WHO

# the text field of a .jsonl record, in the order looked for (datasets' and llm-compressor's)
_TEXT_FIELDS = ("text", "content")


def _from_text(path, tokenizer_dir, nsamples, seqlen):
    import transformers
    texts = []
    with open(path, encoding="utf-8") as f:
        if path.endswith(".jsonl"):
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{WHO}: line {i + 1} of {path} is not JSON ({e})") from None
                field = next((k for k in _TEXT_FIELDS if isinstance(rec, dict) and
                              isinstance(rec.get(k), str)), None)
                if field is None:
                    raise ValueError(f"{WHO}: line {i + 1} of {path} has no string field "
                                     f"{' or '.join(repr(k) for k in _TEXT_FIELDS)}")
                texts.append(rec[field])
        else:
            texts = [t for t in f.read().split("\n\n") if t.strip()]
    if not texts:
        raise ValueError(f"{WHO}: {path} holds no text")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    except (OSError, ValueError) as e:
        raise ValueError(f"{WHO}: text calibration data needs the checkpoint's tokenizer, and "
                         f"{tokenizer_dir} has none that loads ({e}); pass token ids (a .pt "
                         "LongTensor [n, seq]) instead") from None
    ids = []
    for t in texts:  # one stream of the documents, cut into rows of seqlen tokens
        ids.extend(tok(t, add_special_tokens=False)["input_ids"])
        if tok.eos_token_id is not None:
            ids.append(tok.eos_token_id)
        if len(ids) >= nsamples * seqlen:
            break
    rows = min(nsamples, len(ids) // seqlen)
    if rows < 1:
        raise ValueError(f"{WHO}: {path} gives {len(ids)} tokens, fewer than one row of "
                         f"seqlen={seqlen}")
    return torch.tensor(ids[:rows * seqlen], dtype=torch.long).reshape(rows, seqlen)


def load_calibration(calib, tokenizer_dir, nsamples=128, seqlen=512):
    """Token ids [n, seq] (int64) from ``calib``: a tensor, a ``.pt`` file of one, or a
    ``.jsonl`` (a ``"text"`` field per line) / ``.txt`` (documents parted by blank lines) file,
    tokenized with the tokenizer in ``tokenizer_dir`` into at most ``nsamples`` rows of
    ``seqlen`` tokens."""
    if isinstance(calib, (str, os.PathLike)):
        path = os.fspath(calib)
        if not os.path.isfile(path):
            raise ValueError(f"{WHO}: calibration file {path} does not exist")
        if path.endswith(".pt"):
            calib = torch.load(path, map_location="cpu", weights_only=True)
        elif path.endswith((".jsonl", ".txt")):
            return _from_text(path, tokenizer_dir, nsamples, seqlen)
        else:
            raise ValueError(f"{WHO}: calibration file {path}: expected a .pt file of token ids "
                             "[n, seq], or text in a .jsonl or .txt file")
    if not isinstance(calib, torch.Tensor):
        raise ValueError(f"{WHO}: calibration data must be token ids, a LongTensor [n, seq]; got "
                         f"{type(calib).__name__}")
    if calib.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8) or \
            calib.dim() != 2 or calib.numel() == 0:
        raise ValueError(f"{WHO}: calibration data must be token ids, an integer tensor "
                         f"[n, seq] with n, seq >= 1; got {calib.dtype} {list(calib.shape)}")
    return calib.to(torch.int64).contiguous()


def check_calibration(ids, vocab_size, group_size):
    """Refuses token ids outside the vocabulary, and fewer tokens than one weight group."""
    bad = (ids < 0) | (ids >= vocab_size)
    if bool(bad.any()):
        row, col = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"{WHO}: calibration token {int(ids[row, col])} (row {row}, position "
                         f"{col}) is outside the model's vocabulary [0, {vocab_size})")
    if group_size and ids.numel() < group_size:
        raise ValueError(f"{WHO}: {ids.numel()} calibration tokens are fewer than the group size "
                         f"{group_size}: no group's statistics could be estimated")


def fingerprint(ids):
    """A digest of the token ids: a resumed run must see the same data."""
    return hashlib.sha256(ids.numpy().tobytes() + str(list(ids.shape)).encode()).hexdigest()
