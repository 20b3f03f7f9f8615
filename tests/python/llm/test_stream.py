"""mqbench.llm.quantize_checkpoint and ``python -m mqbench.llm`` (docs/llm-scale.md): a checkpoint
quantized block by block equals the in-memory algorithm's result, holds one block at a time,
resumes after a stop, and refuses bad input before any work."""
import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from mqbench.llm import gptq, load_quantized, quantize_checkpoint, rtn, signround
from mqbench.llm.stream import _activations, _output, _source, quantize as stream_quantize
from hf_loader import tiny_llama, transformers_logits

transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

W4G32 = {"bit": 4, "per_channel": True, "group_size": 32}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))


def _llama(layers=3, **kwargs):
    return tiny_llama(layers=layers, **kwargs)


def _save(model, path, dtype=torch.float32):
    model.to(dtype).save_pretrained(path)
    model.float()
    return str(path)


def _ids(n=6, seq=24, vocab=128, seed=1):
    return torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(seed))


def _written(path):
    """{file name: sha256} of the checkpoint files (the manifest left out: it records times)."""
    return {n: hashlib.sha256(open(os.path.join(path, n), "rb").read()).hexdigest()
            for n in sorted(os.listdir(path)) if n != _output.MANIFEST}


def _weights(model):
    return {n: m.weight.detach().clone() for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and n != "lm_head"}


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


# ------------------------------------------------------------------------- equal to in-memory
@pytest.mark.parametrize("algorithm,kwargs", [
    ("gptq", {}), ("gptq", {"act_order": True, "true_sequential": False}),
    ("signround", {"iters": 6, "batch_size": 2}), ("rtn", {})])
def test_streamed_equals_the_in_memory_algorithm(algorithm, kwargs, tmp_path):
    """Bit for bit: every weight, and the qparams load_quantized reads back."""
    model = _llama()
    src = _save(model, tmp_path / "src")
    ids = _ids()
    out = tmp_path / "out"
    quantize_checkpoint(src, out, algorithm, W4G32,
                        calib_data=None if algorithm == "rtn" else ids, **kwargs)
    calib = [ids[i:i + 1] for i in range(ids.shape[0])]
    if algorithm == "gptq":
        qp = gptq(model, calib, W4G32, **kwargs)
    elif algorithm == "signround":
        qp = signround(model, calib, W4G32, **kwargs)
    else:
        qp = rtn(model, W4G32)
    loaded, got_qp = load_quantized(out)
    want = _weights(model)
    got = _weights(loaded)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
        assert torch.equal(got_qp[name]["scale"].reshape(-1), qp[name]["scale"].reshape(-1)), name
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    assert torch.equal(loaded.model.norm.weight, model.model.norm.weight)


def test_tied_embeddings(tmp_path):
    """The head shares the embedding (not saved on its own): read once, written once."""
    model = _llama(tie=True)
    src = _save(model, tmp_path / "src")
    ids = _ids()
    quantize_checkpoint(src, tmp_path / "out", "gptq", W4G32, calib_data=ids)
    gptq(model, [ids[i:i + 1] for i in range(ids.shape[0])], W4G32)
    loaded, _ = load_quantized(tmp_path / "out")
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert torch.equal(_logits(loaded, ids), _logits(model, ids))


def test_one_block_in_memory_at_a_time(tmp_path, monkeypatch):
    """When a block gets its tensors, every other block is on the meta device, and the modules
    outside the blocks are too once the first block's inputs are taken."""
    src = _save(_llama(layers=4), tmp_path / "src")
    seen = []
    real = _source.Source.materialize

    def watched(self, prefix, module, dtype=torch.float32):
        out = real(self, prefix, module, dtype)
        if prefix in {b for b, _ in self.blocks}:
            real_blocks = [b for b, blk in self.blocks
                           if any(p.device.type != "meta" for p in blk.parameters())]
            outside = [n for n, p in self.model.named_parameters()
                       if p.device.type != "meta" and not n.startswith("model.layers.")]
            seen.append((prefix, real_blocks, outside))
        return out

    monkeypatch.setattr(_source.Source, "materialize", watched)
    quantize_checkpoint(src, tmp_path / "out", "gptq", W4G32, calib_data=_ids())
    assert [s[0] for s in seen] == [f"model.layers.{i}" for i in range(4)]
    for prefix, real_blocks, outside in seen:
        assert real_blocks == [prefix] and outside == [], (prefix, real_blocks, outside)


# ------------------------------------------------------------ activations at a block boundary
def _calls(n=3, seq=5, hidden=8):
    g = torch.Generator().manual_seed(0)
    pos = torch.arange(seq).unsqueeze(0)
    return [(torch.randn(1, seq, hidden, generator=g), "arg",
             ((), {"position_ids": pos.clone(), "use_cache": False})) for _ in range(n)]


def test_activations_hold_the_rows_in_one_tensor_and_move_on_in_place():
    calls = _calls()
    acts = _activations.Activations(len(calls), calls[0])
    for c in calls[1:]:
        acts.append(c)
    assert len(acts) == 3 and acts.data.shape == (3, 5, 8)
    for (h, w, r), (h0, w0, r0) in zip(acts, calls):
        assert torch.equal(h, h0) and w == w0 and h.data_ptr() != h0.data_ptr()
    # equal other arguments: one object for all rows; different ones kept per row
    assert acts[1][2] is acts[0][2] and acts[2][2] is acts[0][2]
    other = (calls[0][0], "arg", ((), {"position_ids": torch.arange(5).unsqueeze(0) + 1,
                                       "use_cache": False}))
    acts2 = _activations.Activations(2, calls[0])
    acts2.append(other)
    assert acts2[1][2] is not acts2[0][2]
    assert torch.equal(acts2[1][2][1]["position_ids"], other[2][1]["position_ids"])
    with pytest.raises(ValueError, match="does not fit"):
        acts2.append(calls[1])  # a third row of two
    with pytest.raises(ValueError, match="does not fit"):
        _activations.Activations(2, calls[0]).append((torch.zeros(1, 4, 8), "arg", ((), {})))
    # advance: each row replaced by the block's output, as a block run on copies gives
    block = nn.Sequential(nn.Linear(8, 8), nn.GELU())
    block_call = lambda h, **kw: (block(h),)  # noqa: E731  (a decoder block returns a tuple)
    want = stream_quantize._run_block(block_call, acts.copy())
    acts.advance(block_call)
    for (h, _, _), (h_want, _, _) in zip(acts, want):
        assert torch.equal(h, h_want)


def test_activations_on_disk_read_and_write_each_row(tmp_path):
    calls = _calls()
    acts = _activations.Activations(len(calls), calls[0], str(tmp_path))
    for c in calls[1:]:
        acts.append(c)
    before = torch.cat([h for h, _, _ in calls])
    assert acts.on_disk and acts.data is None
    assert os.listdir(tmp_path) == []  # no name in the folder, not even while it is open
    got = [h for h, _, _ in acts]
    assert all(torch.equal(h, before[i:i + 1]) for i, h in enumerate(got))
    assert got[0].data_ptr() != acts[0][0].data_ptr()  # each read a new tensor
    block = nn.Sequential(nn.Linear(8, 8), nn.GELU())
    block_call = lambda h, **kw: (block(h),)  # noqa: E731
    want = stream_quantize._run_block(block_call, [(before[i:i + 1], "arg", ((), {}))
                                                   for i in range(3)])
    acts.advance(block_call)
    for (h, _, _), (h_want, _, _) in zip(acts, want):
        assert torch.equal(h, h_want)
    # the lazy keyword calls read the current rows when asked
    lazy = acts.lazy_calls(lambda args, kwargs: dict(kwargs, x=args[0]))
    assert set(lazy[1]) == {"position_ids", "use_cache", "x"}
    assert torch.equal(lazy[1]["x"], want[1][0]) and lazy[1]["use_cache"] is False
    acts.close()
    with pytest.raises(ValueError):
        acts.hidden(0)  # closed: nothing to read


@pytest.mark.parametrize("algorithm,kwargs", [
    ("gptq", {"act_order": True, "true_sequential": False}), ("gptq", {}),
    ("awq", {}), ("smoothquant", {"alpha": "auto"}), ("signround", {"iters": 4})])
def test_rows_on_disk_give_the_files_of_rows_in_memory(algorithm, kwargs, tmp_path, monkeypatch):
    """The hidden states between blocks in the folder's temporary file (the default) or in
    memory: the same checkpoint, file for file; on disk no row is held between passes."""
    src = _save(_llama(), tmp_path / "src")
    ids = _ids()
    scheme = W4G32 if algorithm != "smoothquant" else {"bit": 8, "per_channel": True}
    real_quantize = stream_quantize._Run.quantize
    held = []

    def quantize(self, b):
        held.append(self.items.on_disk and self.items.data is None)
        return real_quantize(self, b)

    monkeypatch.setattr(stream_quantize._Run, "quantize", quantize)
    quantize_checkpoint(src, tmp_path / "disk", algorithm, scheme, calib_data=ids, **kwargs)
    assert held == [True] * 3
    held.clear()
    quantize_checkpoint(src, tmp_path / "memory", algorithm, scheme, calib_data=ids,
                        offload_activations=False, **kwargs)
    assert held == [False] * 3
    assert _written(tmp_path / "disk") == _written(tmp_path / "memory")
    assert not [n for n in os.listdir(tmp_path / "disk") if n.startswith(".mqbench")]


# ------------------------------------------------------------------ bfloat16 and the real loader
def test_bfloat16_checkpoint_loads_in_transformers_and_beats_rtn(tmp_path):
    """bf16 in, float parts bf16 out; transformers loads it (fresh process, no mqbench) with the
    logits of our decoded model; GPTQ's held-out logits are closer to the float model's than
    RTN's."""
    model = _llama(layers=3, hidden=128, inter=256)
    src = _save(model, tmp_path / "src", torch.bfloat16)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    held_out = _ids(n=4, seq=32, seed=9)
    float_logits = _logits(ref_model, held_out)
    errs = {}
    for alg in ("gptq", "rtn"):
        out = tmp_path / alg
        quantize_checkpoint(src, out, alg, W4G32, calib_data=_ids(n=16, seq=32))
        with open(out / "config.json") as f:
            cfg = json.load(f)
        assert cfg["dtype"] == "bfloat16" and cfg["quantization_config"]["ignore"] == ["lm_head"]
        from safetensors import safe_open
        with safe_open(str(out / "model-00004-of-00004.safetensors"), "pt") as f:
            assert f.get_tensor("model.norm.weight").dtype == torch.bfloat16
        # transformers builds the model in the checkpoint's bfloat16
        loaded, _ = load_quantized(out, dtype=torch.bfloat16)
        theirs = transformers_logits(out, held_out, tmp_path, mode="dequantize")
        assert torch.equal(theirs, _logits(loaded, held_out))
        loaded, _ = load_quantized(out)
        errs[alg] = float((_logits(loaded, held_out) - float_logits).pow(2).mean())
    assert errs["gptq"] < errs["rtn"], errs


@pytest.mark.parametrize("algorithm,kwargs", [("awq", {}), ("smoothquant", {"alpha": 0.5})])
def test_awq_and_smoothquant_stream(algorithm, kwargs, tmp_path):
    """AWQ beats RTN on held-out logits; SmoothQuant writes W8A8 with per-token INT8 inputs."""
    model = _llama()
    src = _save(model, tmp_path / "src")
    scheme = W4G32 if algorithm == "awq" else {"bit": 8, "per_channel": True}
    out = tmp_path / "out"
    quantize_checkpoint(src, out, algorithm, scheme, calib_data=_ids(n=8, seq=32), **kwargs)
    loaded, _ = load_quantized(out)
    held_out = _ids(n=4, seq=32, seed=9)
    ref = _logits(model, held_out)
    err = float((_logits(loaded, held_out) - ref).pow(2).mean())
    qc = json.load(open(out / "config.json"))["quantization_config"]
    acts = qc["config_groups"]["group_0"]["input_activations"]
    if algorithm == "awq":
        quantize_checkpoint(src, tmp_path / "rtn", "rtn", scheme)
        base, _ = load_quantized(tmp_path / "rtn")
        assert err < float((_logits(base, held_out) - ref).pow(2).mean())
        assert acts is None
    else:
        assert acts["dynamic"] is True and acts["strategy"] == "token" and acts["num_bits"] == 8
        assert err < 1e-3 * float(ref.pow(2).mean())


# ----------------------------------------------------------------------------------- resuming
class _Stop(KeyboardInterrupt):
    pass


@pytest.mark.parametrize("algorithm,kwargs", [("gptq", {}),
                                              ("signround", {"iters": 4, "batch_size": 2})])
def test_a_stopped_run_resumes_to_the_same_files(algorithm, kwargs, tmp_path, monkeypatch):
    src = _save(_llama(layers=4), tmp_path / "src")
    ids = _ids()
    whole = tmp_path / "whole"
    quantize_checkpoint(src, whole, algorithm, W4G32, calib_data=ids, **kwargs)

    real = stream_quantize._Run.quantize
    out = tmp_path / "out"

    def stop_at_2(self, b):
        if b == 2:  # as if Ctrl-C came while block 2 was being written
            with open(os.path.join(self.out.path, ".mqbench-half.partial"), "wb") as f:
                f.write(b"torn")
            raise _Stop()
        return real(self, b)

    monkeypatch.setattr(stream_quantize._Run, "quantize", stop_at_2)
    with pytest.raises(_Stop):
        quantize_checkpoint(src, out, algorithm, W4G32, calib_data=ids, **kwargs)
    assert not os.path.exists(out / "config.json")
    manifest = json.load(open(out / _output.MANIFEST))
    assert sorted(manifest["blocks"]) == ["0", "1"] and not manifest["complete"]

    resumed = []
    monkeypatch.setattr(stream_quantize._Run, "quantize",
                        lambda self, b: (resumed.append(b), real(self, b))[1])
    quantize_checkpoint(src, out, algorithm, W4G32, calib_data=ids, **kwargs)
    assert resumed == [2, 3]
    assert _written(out) == _written(whole)
    assert json.load(open(out / _output.MANIFEST))["complete"]

    # complete: a third run does nothing
    resumed.clear()
    quantize_checkpoint(src, out, algorithm, W4G32, calib_data=ids, **kwargs)
    assert resumed == []


def test_a_corrupt_block_is_redone(tmp_path):
    src = _save(_llama(layers=3), tmp_path / "src")
    ids = _ids()
    out = tmp_path / "out"
    quantize_checkpoint(src, out, "gptq", W4G32, calib_data=ids)
    want = _written(out)
    manifest = json.load(open(out / _output.MANIFEST))
    manifest["complete"] = False
    with open(out / _output.MANIFEST, "w") as f:
        json.dump(manifest, f)
    os.remove(out / "config.json")
    with open(out / _output.shard_name(1, 4), "r+b") as f:  # a flipped byte in block 1
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    quantize_checkpoint(src, out, "gptq", W4G32, calib_data=ids)
    assert _written(out) == want


def test_other_settings_are_refused_and_overwrite_starts_again(tmp_path):
    src = _save(_llama(), tmp_path / "src")
    out = tmp_path / "out"
    quantize_checkpoint(src, out, "rtn", W4G32)
    with pytest.raises(ValueError, match=r"other settings \(w_qscheme differ"):
        quantize_checkpoint(src, out, "rtn", {"bit": 3, "per_channel": True, "group_size": 32})
    with pytest.raises(ValueError, match="calibration"):
        quantize_checkpoint(src, out, "gptq", W4G32, calib_data=_ids())
    quantize_checkpoint(src, out, "rtn", {"bit": 3, "per_channel": True, "group_size": 32},
                        overwrite=True)
    assert json.load(open(out / "config.json"))["quantization_config"]["config_groups"][
        "group_0"]["weights"]["num_bits"] == 3
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a run of quantize_checkpoint"):
        quantize_checkpoint(src, other, "rtn", W4G32)
    assert os.listdir(other) == ["notes.txt"]


# ---------------------------------------------------------------------------------- bad input
def test_bad_input_is_refused_before_any_work(tmp_path):
    src = _save(_llama(), tmp_path / "src")
    out = tmp_path / "out"
    empty = tmp_path / "empty"
    empty.mkdir()
    json.dump(_llama().config.to_dict(), open(empty / "config.json", "w"))
    with pytest.raises(ValueError, match="neither model.safetensors nor"):
        quantize_checkpoint(empty, out, "rtn", W4G32)
    one = _save(_llama(layers=1), tmp_path / "one")
    with pytest.raises(ValueError, match="no chain of decoder blocks"):
        quantize_checkpoint(one, out, "rtn", W4G32)
    bad_ids = _ids()
    bad_ids[2, 5] = 128
    with pytest.raises(ValueError, match=r"token 128 \(row 2, position 5\) is outside"):
        quantize_checkpoint(src, out, "gptq", W4G32, calib_data=bad_ids)
    with pytest.raises(ValueError, match="fewer than the group size"):
        quantize_checkpoint(src, out, "gptq", {"bit": 4, "per_channel": True, "group_size": 64},
                            calib_data=_ids(n=2, seq=16))
    with pytest.raises(ValueError, match="needs calibration data"):
        quantize_checkpoint(src, out, "gptq", W4G32)
    with pytest.raises(ValueError, match="takes no argument 'iters'"):
        quantize_checkpoint(src, out, "gptq", W4G32, calib_data=_ids(), iters=3)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        quantize_checkpoint(src, out, "hqq", W4G32)
    torch.save(torch.rand(2, 8), tmp_path / "floats.pt")
    with pytest.raises(ValueError, match="integer tensor"):
        quantize_checkpoint(src, out, "gptq", W4G32, calib_data=str(tmp_path / "floats.pt"))
    assert not out.exists()
    for inside in (src, os.path.join(src, "q"), tmp_path):  # the source, in it, holding it
        with pytest.raises(ValueError, match="is the checkpoint's folder .*, or inside it"):
            quantize_checkpoint(src, inside, "rtn", W4G32, overwrite=True)
    assert os.path.isfile(os.path.join(src, "model.safetensors"))
    # a shard index naming a file outside the folder
    idx = tmp_path / "idx"
    os.makedirs(idx)
    json.dump(_llama().config.to_dict(), open(idx / "config.json", "w"))
    json.dump({"weight_map": {"lm_head.weight": "../src/model.safetensors"}},
              open(idx / "model.safetensors.index.json", "w"))
    with pytest.raises(ValueError, match="not a safetensors file in the checkpoint's folder"):
        quantize_checkpoint(idx, out, "rtn", W4G32)


def _tokenizer_dir(path, vocab=128):
    """A word-level tokenizer of ``vocab`` entries saved in ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = {"[UNK]": 0, "[EOS]": 1}
    words.update({f"w{i}": i for i in range(2, vocab)})
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                                                eos_token="[EOS]")
    fast.save_pretrained(path)
    return fast


def test_text_calibration_and_the_command_line(tmp_path):
    """``python -m mqbench.llm`` on a .jsonl file, tokenized with the checkpoint's tokenizer,
    equals quantize_checkpoint on the same ids; the tokenizer is copied; bad input exits 2 with
    the message."""
    src = _save(_llama(), tmp_path / "src")
    tok = _tokenizer_dir(src)
    g = torch.Generator().manual_seed(3)
    docs = [" ".join(f"w{int(i)}" for i in torch.randint(2, 128, (40,), generator=g))
            for _ in range(8)]
    with open(tmp_path / "calib.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    cmd = [sys.executable, "-m", "mqbench.llm", src, str(tmp_path / "cli"), "--algorithm", "gptq",
           "--bits", "4", "--group-size", "32", "--calib", str(tmp_path / "calib.jsonl"),
           "--nsamples", "4", "--seqlen", "32", "--set", "damp=0.02"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ids = []
    for d in docs:
        ids += tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids = torch.tensor(ids[:4 * 32]).reshape(4, 32)
    quantize_checkpoint(src, tmp_path / "api", "gptq", W4G32, calib_data=ids, damp=0.02)
    assert _written(tmp_path / "cli") == _written(tmp_path / "api")
    assert os.path.isfile(tmp_path / "cli" / "tokenizer.json")

    bad = subprocess.run(cmd[:4] + [str(tmp_path / "bad"), "--algorithm", "gptq", "--calib",
                                    str(tmp_path / "missing.jsonl")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert bad.returncode == 2
    assert "mqbench-llm: error: quantize_checkpoint: calibration file" in bad.stderr


def test_the_console_script_is_declared():
    import tomllib
    import importlib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    module, _, attr = scripts["mqbench-llm"].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
