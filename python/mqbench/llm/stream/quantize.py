"""``quantize_checkpoint``: a transformers checkpoint quantized block by block into a
compressed-tensors checkpoint, the whole model never in memory (docs/llm-scale.md;
docs/design/llm.md, "Checkpoint to checkpoint")."""
import hashlib
import inspect
import json
import os
import time

import torch

from mqbench.llm import _blocks, _expert_runs, _experts, _layers, _memory, _weights
from mqbench.llm.awq import awq, run_awq
from mqbench.llm.gptq import gptq, run_gptq
from mqbench.llm.rtn import rtn
from mqbench.llm.signround import learn_block, options, signround
from mqbench.llm.smoothquant import run_smoothquant, smoothquant
from mqbench.llm.checkpoint import _encode, _schemes
from mqbench.llm.stream import _calib, _dist, _output
from mqbench.llm.stream._activations import Activations, block_outputs
from mqbench.llm.stream._source import WHO, Source, release
from mqbench.utils.logger import logger

ALGORITHMS = ("gptq", "awq", "signround", "rtn", "smoothquant")
_FUNCTIONS = {"gptq": gptq, "awq": awq, "signround": signround, "rtn": rtn,
              "smoothquant": smoothquant}
# arguments the driver sets itself: not the user's to pass through
_OWN = {"model", "calib_data", "w_qscheme", "layers", "ignore", "skip_unreached", "cache_blocks"}
# SmoothQuant's checkpoints quantize the inputs too: INT8 per token, computed by the engine
_SMOOTHQUANT_ACTS = {"bit": 8, "dynamic": "per_token"}
# the files of a tokenizer copied beside the weights when the source has them
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                    "chat_template.jinja", "chat_template.json")


def _check_kwargs(algorithm, kwargs):
    params = inspect.signature(_FUNCTIONS[algorithm]).parameters
    allowed = sorted(set(params) - _OWN)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"{WHO}: {algorithm} takes no argument {unknown[0]!r} here (it takes "
                         f"{allowed})")
    for k, v in kwargs.items():
        if not (v is None or isinstance(v, (bool, int, float, str))):
            raise ValueError(f"{WHO}: {algorithm} argument {k}={v!r}: a number, string, bool or "
                             "None is expected (the manifest records it)")
    return dict(kwargs)


def _check_folders(model_dir, save_dir):
    """Refuses an output folder that is the checkpoint's, or inside it, or holds it: a resumed
    or overwritten run deletes what it finds there."""
    src, dst = os.path.realpath(model_dir), os.path.realpath(save_dir)
    if src == dst or dst.startswith(src + os.sep) or src.startswith(dst + os.sep):
        raise ValueError(f"{WHO}: the output folder {dst} is the checkpoint's folder {src}, or "
                         "inside it, or holds it; name a folder of its own")


def _scheme(wq):
    """The resolved weight scheme as the dict the algorithms and the manifest take."""
    return {"bit": wq.bit, "symmetry": bool(wq.symmetric), "per_channel": bool(wq.per_channel),
            "group_size": wq.group_size or None}


def _source_digest(source):
    """The source as a resumed run must find it again: its config, its tensor names, and each
    shard's size and modification time (a replaced shard changes them; hashing the contents
    would read the whole checkpoint at every start)."""
    h = hashlib.sha256(json.dumps(source.config_dict, sort_keys=True).encode())
    for k in sorted(source.where):
        h.update(k.encode())
    for fname in source.files:
        st = os.stat(os.path.join(source.path, fname))
        h.update(f"{fname}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def _ignored(name, ignore):
    return name in ignore or name.rsplit(".", 1)[-1] in ignore


def _outside_modules(model, blocks_list):
    """[(name, module)]: the largest modules that hold no block (embeddings, rotary embedding,
    final norm, head)."""
    ancestors = {""}
    parts = blocks_list.split(".")
    for i in range(1, len(parts)):
        ancestors.add(".".join(parts[:i]))
    found = []
    for anc in sorted(ancestors, key=len):
        mod = model.get_submodule(anc) if anc else model
        for cname, child in mod.named_children():
            full = f"{anc}.{cname}" if anc else cname
            if full == blocks_list or full in ancestors:
                continue
            found.append((full, child))
    return found


def _first_inputs(source, ids, folder=None):
    """Block 0's inputs per calibration row (``Activations``, in a temporary file of ``folder``
    when given: Note [Activations at a block boundary]): the model's modules outside the blocks
    (embeddings, rotary) run on each row and stopped at block 0."""
    model = source.model
    blocks_list = source.blocks[0][0].rsplit(".", 1)[0]
    head = model.get_output_embeddings()  # never called before block 0; tied or not, left
    outside = [(n, m) for n, m in _outside_modules(model, blocks_list) if m is not head]
    for name, mod in outside:
        source.materialize(name, mod)
    got = []

    def pre(_m, args, kwargs):
        got.append(_blocks._split(args, kwargs))
        raise _blocks.StopForward

    items = None
    handle = source.blocks[0][1].register_forward_pre_hook(pre, with_kwargs=True)
    try:
        with torch.no_grad():
            for i in range(ids.shape[0]):
                got.clear()
                try:
                    model(ids[i:i + 1])
                except _blocks.StopForward:
                    pass
                if len(got) != 1 or got[0][0] is None:
                    raise ValueError(f"{WHO}: {source.cls.__name__} did not call its first block "
                                     f"{source.blocks[0][0]} once with hidden states")
                hidden, where, rest = got[0]
                call = (hidden.detach(), where, _blocks._no_cache(rest))
                if items is None:
                    items = _activations(ids.shape[0], call, folder)
                else:
                    items.append(call)
                got.clear()
    except BaseException:
        if items is not None:
            items.close()
        raise
    finally:
        handle.remove()
        for _, mod in outside:
            release(mod)
    return items


def _activations(rows, call, folder):
    """``Activations`` in a file of ``folder`` (None: in memory), or in memory with a warning
    where the file cannot be made."""
    if folder is not None:
        try:
            return Activations(rows, call, folder)
        except OSError as e:
            logger.warning("%s: the hidden states stay in memory (a temporary file in %s "
                           "failed: %s)", WHO, folder, e)
    return Activations(rows, call)


def _as_kwargs(block, args, kwargs):
    """One block call (args, kwargs) as keyword arguments: a calibration item of the block."""
    sig = inspect.signature(block.forward)
    bound = sig.bind_partial(*args, **kwargs)
    out = {}
    for name, value in bound.arguments.items():
        kind = sig.parameters[name].kind
        if kind == inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif kind == inspect.Parameter.VAR_POSITIONAL:
            raise ValueError(f"{WHO}: {type(block).__name__}.forward takes *args; its calls "
                             "cannot be replayed by name")
        else:
            out[name] = value
    return out


def _run_block(block, items, keep=True):
    """Block outputs on ``items`` (a sequence of block calls): the next block's inputs (the same
    other arguments); none kept with ``keep=False`` (a pass for the block's hooks alone)."""
    out = []
    for (_, where, rest), h in zip(items, block_outputs(block, items)):
        if keep:
            out.append((h, where, rest))
        del h
    return out if keep else None


class _Run(object):
    """One call of ``quantize_checkpoint``: the source, the output, the schemes, and the state
    carried from block to block."""

    def __init__(self, source, out, algorithm, wq, wfmt, kwargs, ignore, comm=None):
        self.source, self.out, self.algorithm, self.comm = source, out, algorithm, comm
        kwargs = dict(kwargs)
        self.all_tokens = kwargs.pop("calibrate_all_experts", False)
        self.min_tokens = kwargs.pop("min_expert_tokens", _experts.MIN_EXPERT_TOKENS)
        _expert_runs.check_expert_args(self.all_tokens, self.min_tokens, algorithm)
        self.wq, self.wfmt, self.kwargs, self.ignore = wq, wfmt, kwargs, ignore
        self.items = None      # the quantized model's hidden states at the current block
                               # (``Activations``)
        self.float_items = None  # SignRound: the float model's
        self.opts = self.use_cpp = None
        if algorithm == "signround":
            kw = {k: kwargs[k] for k in ("iters", "lr", "batch_size", "seed", "impl")
                  if k in kwargs}
            batch = kw.get("batch_size", 8)
            if comm is not None and isinstance(batch, int) and not isinstance(batch, bool):
                batch = comm.share(batch)  # Note [SignRound over several ranks]
            self.opts, self.use_cpp = options(
                kw.get("iters", 200), kw.get("lr"), batch, kw.get("seed", 0),
                kw.get("impl", "auto"))

    def linears(self, bname, block):
        """The block's Linears to quantize (within ``_view``: one per expert projection), not
        ignored, not a router."""
        return [(n, m) for n, m in block.named_modules(prefix=bname)
                if _layers.is_linear(m) and not _ignored(n, self.ignore) and
                n not in self.source.routers]

    def quantize(self, b):
        """Block b from the source: quantized, written, its outputs the next inputs."""
        bname, block = self.source.blocks[b]
        t0 = time.perf_counter()
        self.source.materialize(bname, block)
        extra = {}
        with self._view(block) as view:
            linears = self.linears(bname, block)
            for n, m in linears:
                self.wq.check_layer(n, _layers.weight_2d(m))
            low = self._starved(bname, block, view, linears)
            chosen = [(n, m) for n, m in linears if n not in low]
            qparams = {}
            if chosen:
                qparams = self._algorithm(bname, block, chosen,
                                          [n[len(bname) + 1:] for n, _ in chosen])
            if low:  # experts with too few tokens: round to nearest
                qparams.update(rtn(block, self.wq_dict(), ignore=(),
                                   layers=[n[len(bname) + 1:] for n in low]))
            tensors = self._encode(bname, block, linears, qparams)
            if b + 1 < len(self.source.blocks) and self.items is not None:
                self.items.advance(block)
        if self.opts is not None:  # each rank's (several: rank 0 writes them all)
            state = self.opts[3].get_state().numpy().tobytes().hex()
            extra["generator"] = state if self.comm is None else \
                self.comm.gather_object(state)
        extra["seconds"] = round(time.perf_counter() - t0, 3)
        self.out.write_block(b, {self.source.names.to_disk(k): v for k, v in tensors.items()},
                             extra)
        release(block)

    def _view(self, block):
        """The block's fused experts one Linear per expert (``_experts.ExpertView``)."""
        return _experts.ExpertView(block, self.all_tokens, names=self.source.expert_names)

    def _starved(self, bname, block, view, linears):
        """The Linears of experts routed fewer than ``min_expert_tokens`` calibration tokens in
        this block (a pass of the block counts them), with a warning naming them."""
        if not view or self.items is None or self.algorithm == "rtn":
            return []
        starved = view.starved(lambda: _run_block(block, self.items, keep=False),
                               self.min_tokens)
        if not starved:
            return []
        _expert_runs.warn_starved({f"{bname}.{k}": v for k, v in starved.items()}, WHO)
        return [n for n, _ in linears if n[len(bname) + 1:].rpartition(".")[0] in starved]

    def _algorithm(self, bname, block, linears, rel):
        """Runs the algorithm on the block alone; returns its qparams by block-relative name
        (none for awq and smoothquant, whose weights stay float until encoded)."""
        if self.algorithm == "rtn":
            return rtn(block, self.wq_dict(), layers=rel, ignore=())
        if self.algorithm == "signround":
            h_f = [h for h, _, _ in self.float_items]
            qp, _, float_out = learn_block(bname, block, linears, self.items, h_f,
                                           [None] * len(self.items), self.wq, self.opts,
                                           self.use_cpp, comm=self.comm)
            self.float_items = [(h, w, r) for h, (_, w, r) in zip(float_out, self.float_items)]
            return {n[len(bname) + 1:]: v for n, v in qp.items()}
        # Note [Activations at a block boundary]: each row's hidden states read when a pass
        # reaches it
        samples = self.items.lazy_calls(lambda args, kwargs: _as_kwargs(block, args, kwargs))
        if self.algorithm == "gptq":
            return run_gptq(block, samples, self.wq_dict(), layers=rel, ignore=(),
                            one_block=True, comm=self.comm, **self.kwargs)
        if self.algorithm == "awq":
            run_awq(block, samples, self.wq_dict(), layers=rel, ignore=(), comm=self.comm,
                    **self.kwargs)
        else:
            run_smoothquant(block, samples, layers=rel, ignore=(), comm=self.comm,
                            **self.kwargs)
        return {}

    def wq_dict(self):
        return _scheme(self.wq)

    def _encode(self, bname, block, linears, qparams):
        """The block's checkpoint tensors; its weights set to what the checkpoint holds (the
        encoded grid, the float parts in the source's dtype), which the next block's inputs
        then come from."""
        tensors = {}
        quantized = {n for n, _ in linears}
        with torch.no_grad():
            for name, mod in linears:
                rel = name[len(bname) + 1:]
                enc, deq = _encode.encode_weight(name, mod.weight, self.wfmt, qp=qparams.get(rel))
                _encode.check_round_trip(name, enc, self.wfmt, deq)
                mod.weight.copy_(deq)
                for local, t in enc.items():
                    tensors[f"{name}.{local}"] = t.detach().cpu().contiguous()
                freed = deq.numel() * 4 * 4  # the grid, its decoding and the check's
                del enc, deq
                _memory.give_back(freed)  # Note [Freed memory given back]
            for pname, p in list(block.named_parameters(prefix=bname)) + \
                    list(block.named_buffers(prefix=bname)):
                owner, _, leaf = pname.rpartition(".")
                if owner in quantized and leaf == "weight":
                    continue
                if pname not in self.source.where:
                    continue  # a buffer the model computes (not in the checkpoint)
                stored = p.detach().to(self.source.dtype) if p.is_floating_point() else p.detach()
                if p.is_floating_point():
                    p.copy_(stored.float())
                tensors[pname] = stored.cpu().contiguous().clone()
        return tensors

    def restore(self, b):
        """Block b as written by an earlier run (a resumed run): its outputs the next inputs."""
        bname, block = self.source.blocks[b]
        self.source.materialize(bname, block)
        written = {self.source.names.to_model(k): v for k, v in self.out.read_block(b).items()}
        with self._view(block), torch.no_grad():
            linears = self.linears(bname, block)
            for name, mod in linears:
                local = {k[len(name) + 1:]: v for k, v in written.items()
                         if k.startswith(name + ".") and "." not in k[len(name) + 1:]}
                deq, _ = _encode.decode_weight(local, self.wfmt, tuple(mod.weight.shape))
                mod.weight.copy_(deq)
            quantized = {n for n, _ in linears}
            for pname, p in list(block.named_parameters(prefix=bname)) + \
                    list(block.named_buffers(prefix=bname)):
                owner, _, leaf = pname.rpartition(".")
                if (owner in quantized and leaf == "weight") or pname not in written:
                    continue
                p.copy_(written[pname].to(p.dtype))
            if self.items is not None:
                self.items.advance(block)
        release(block)
        if self.float_items is not None:  # SignRound's float stream: the source block
            self.source.materialize(bname, block)
            self.float_items = _run_block(block, self.float_items)
            release(block)
        entry = self.out.blocks[b]
        if self.opts is not None and "generator" in entry:
            state = entry["generator"]
            if isinstance(state, list):  # one per rank (the manifest's ranks are this run's)
                state = state[self.comm.rank if self.comm is not None else 0]
            state = torch.frombuffer(bytearray.fromhex(state), dtype=torch.uint8)
            self.opts[3].set_state(state.clone())


def quantize_checkpoint(model_dir, save_dir, algorithm, w_qscheme, calib_data=None,
                        nsamples=128, seqlen=512, ignore=("lm_head",), overwrite=False,
                        offload_activations=True, **algorithm_kwargs):
    """Quantizes the transformers checkpoint in ``model_dir`` (config.json and safetensors) with
    ``algorithm`` into a compressed-tensors checkpoint in ``save_dir``, one decoder block at a
    time: its weights read from the shards, the calibration activations run through it, its
    layers quantized, its tensors written, its memory freed. The whole model is never in memory;
    bfloat16 / float16 blocks compute in float32 and their float parts are written back in their
    dtype. The command-line twin is ``python -m mqbench.llm`` (``mqbench-llm``).

    A stopped run (a crash, Ctrl-C) resumes at the first block not written when called again
    with the same arguments; a folder holding a run with other settings is refused
    (``overwrite=True`` starts again). The result equals the in-memory algorithm's on the same
    data for ``gptq``, ``rtn`` and ``signround``; ``awq`` and ``smoothquant`` pass each block's
    quantized outputs to the next (docs/llm-scale.md).

    Args:
        model_dir: a transformers checkpoint folder (``save_pretrained``'s: config.json,
            ``model.safetensors`` or shards with their index).
        save_dir: the output folder (created; resumed when it holds this run).
        algorithm: "gptq", "awq", "signround", "rtn" or "smoothquant" (W8A8: its weights on
            ``w_qscheme``, the inputs INT8 per token at run time).
        w_qscheme: the weights' integer scheme, e.g. ``{"bit": 4, "per_channel": True,
            "group_size": 128}``.
        calib_data: token ids (a LongTensor [n, seq]), or a ``.pt`` file of them, or a ``.jsonl``
            / ``.txt`` file of text tokenized with the checkpoint's tokenizer into ``nsamples``
            rows of ``seqlen`` tokens. Not used by ``rtn``.
        ignore: Linear names (or last components) left float; ``lm_head`` by default.
        overwrite: replace a ``save_dir`` that holds something else.
        offload_activations: the calibration rows' hidden states between blocks live in a
            temporary file of ``save_dir`` (unlinked at once, gone with the run), each row read
            when a pass reaches it, so their memory is one row; False keeps them in memory
            (SignRound stacks its rows in memory while a block learns either way).
        **algorithm_kwargs: the algorithm's own arguments (``gptq``'s ``block_size``, ``damp``,
            ``act_order``; ``signround``'s ``iters``; ...).

    Returns the checkpoint's ``quantization_config``.

    Example::

        from mqbench.llm import quantize_checkpoint
        quantize_checkpoint("Llama-3.2-1B", "Llama-3.2-1B-W4", "gptq",
                            {"bit": 4, "per_channel": True, "group_size": 128}, "calib.jsonl")
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"{WHO}: algorithm must be one of {list(ALGORITHMS)}, got "
                         f"{algorithm!r}")
    if isinstance(ignore, str):
        ignore = (ignore,)
    ignore = tuple(ignore)
    kwargs = _check_kwargs(algorithm, algorithm_kwargs)
    wq = _weights.resolve_w_qscheme(w_qscheme, algorithm)
    scheme = _scheme(wq)
    afmt = _schemes.act_format(_SMOOTHQUANT_ACTS) if algorithm == "smoothquant" else None
    wfmt = _schemes.weight_format(scheme).with_activations(afmt)
    _check_folders(model_dir, save_dir)
    source = Source(model_dir)
    ids = None
    if algorithm != "rtn":
        if calib_data is None:
            raise ValueError(f"{WHO}: {algorithm} needs calibration data (token ids [n, seq], or "
                             "a .pt / .jsonl / .txt file)")
        ids = _calib.load_calibration(calib_data, source.path, nsamples, seqlen)
        vocab = source.model.get_input_embeddings().num_embeddings
        _calib.check_calibration(ids, vocab, wq.group_size)
    comm = _dist.Comm.from_env()
    settings = {"algorithm": algorithm, "w_qscheme": scheme, "arguments": kwargs,
                # GPTQ sums its Hessians in another order on another number of ranks; AWQ and
                # SmoothQuant's searches keep each rank's share of their tokens
                "ranks": comm.world if comm is not None and algorithm != "rtn" else 1,
                "input_activations": afmt.args() if afmt is not None else None,
                "ignore": list(ignore), "source": _source_digest(source),
                "calibration": _calib.fingerprint(ids) if ids is not None else None,
                "format": "compressed-tensors"}
    n_blocks = len(source.blocks)
    with _experts.ExpertView(source.model, names=source.expert_names) as view:
        quantized_names = [n for bname, block in source.blocks
                           for n, m in block.named_modules(prefix=bname)
                           if _layers.is_linear(m) and not _ignored(n, ignore) and
                           n not in source.routers]
        float_linears = sorted(n for n, m in source.model.named_modules()
                               if isinstance(m, torch.nn.Linear) and
                               n not in set(quantized_names))
        experts = [n for n in view.expert_layers() if n in set(quantized_names)]
    _experts.refuse_fused_on_disk(source.config, experts, WHO)
    tied = [n for n in quantized_names if f"{n}.weight" in source.aliases]
    if tied:
        raise ValueError(f"{WHO}: {tied[0]!r} shares its weight with another module; keep it "
                         "in ignore")
    if comm is not None:
        if kwargs.get("objective") == "block" and \
                (algorithm == "awq" or kwargs.get("alpha") == "auto"):
            raise ValueError(f"{WHO}: objective='block' runs in one process; on several ranks "
                             "the candidates are scored on the layers' outputs "
                             "(objective='layer')")
        if view:
            raise ValueError(f"{WHO}: a mixture-of-experts model runs in one process (its "
                             "routed token counts are not reduced over ranks yet)")
        if ids is not None:
            ids = comm.shard(ids)
    qconfig = _schemes.quantization_config(wfmt, afmt, ["Linear"],
                                           [source.names.to_disk(n) for n in float_linears])
    # rank 0 owns the folder; the others read what it has written
    out = _output.Output(save_dir, settings, n_blocks, overwrite) \
        if comm is None or comm.rank == 0 else None
    if comm is not None:
        state = comm.broadcast_object(
            (out.complete, out.blocks) if out is not None else None, 0)
        if out is None:
            out = _output.WrittenBy0(save_dir, n_blocks, *state)
    if out.complete:
        logger.info("%s: %s already holds this run, complete", WHO, out.path)
        return qconfig
    run = _Run(source, out, algorithm, wq, wfmt, kwargs, ignore, comm)
    if ids is not None:
        run.items = _first_inputs(source, ids, out.path if offload_activations else None)
        if algorithm == "signround":
            run.float_items = run.items.copy()
    start = out.done
    try:
        if start:
            logger.info("%s: resuming %s at block %d of %d", WHO, out.path, start, n_blocks)
            for b in _progress(range(start), start, "restoring written blocks", comm=comm):
                run.restore(b)
        for b in _progress(range(start, n_blocks), n_blocks, f"{WHO} ({algorithm})",
                           initial=start, comm=comm):
            run.quantize(b)
    finally:  # the rows' file (unnamed: gone once closed), not kept alive by a traceback
        if run.items is not None:
            run.items.close()
            run.items = None
    if comm is None or comm.rank == 0:
        _finish(source, out, qconfig)
    if comm is not None:
        comm.barrier()  # every rank returns once the folder is whole
    return qconfig


def _progress(items, total, desc, initial=0, comm=None):
    """A bar per block with its ETA (on rank 0 of several)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, total=total, initial=initial, desc=desc, unit="block",
                disable=comm is not None and comm.rank != 0)


def _finish(source, out, qconfig):
    """The tensors outside the blocks in their stored dtype, config.json with the
    quantization_config, the generation config and the tokenizer's files."""
    prefixes = tuple(bname + "." for bname, _ in source.blocks)
    rest = [k for k in source.where if not k.startswith(prefixes)]
    tensors = {source.where[k][1]: t.contiguous()
               for k, t in source.read(rest, dtype=None).items()}
    cfg = dict(source.config_dict)
    cfg["quantization_config"] = qconfig
    json_files = {"config.json": cfg}
    gen = os.path.join(source.path, "generation_config.json")
    if os.path.isfile(gen):
        from mqbench.llm.checkpoint import _files
        json_files["generation_config.json"] = _files.read_json(gen, "generation_config.json",
                                                                WHO)

    def copy_tokenizer(folder):
        for name in _TOKENIZER_FILES:
            src = os.path.join(source.path, name)
            if os.path.isfile(src) and not os.path.islink(src):
                with open(src, "rb") as f:
                    data = f.read()
                _output._write_exclusive(folder, name, lambda p, data=data: _write_bytes(p, data))

    out.finish(tensors, json_files, copy_tokenizer)


def _write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)
