"""The output folder of ``quantize_checkpoint``, written block by block so that a run stopped at
any point resumes where it stopped (docs/design/llm.md, "Checkpoint to checkpoint").

* Block b's tensors go to ``model-<b+1>-of-<N>.safetensors`` (N: the blocks and one shard for
  the tensors outside them): written to a temporary file created exclusively in the folder,
  flushed to disk, then renamed into place, so a shard is whole or absent.
* ``mqbench_quantize.json`` (the manifest) records the run's settings (algorithm, schemes,
  arguments, a digest of the calibration data and of the source's config) and each finished
  shard with its SHA-256. It is replaced atomically after each block.
* A rerun with the same settings keeps the shards the manifest lists whose digest matches, and
  removes any other file it left (a temporary of the block that was being written). A rerun
  with other settings is refused, naming them: one folder never mixes two schemes.
* ``config.json`` is written last: until then no loader takes the folder for a checkpoint.
"""
import hashlib
import json
import os
import shutil
import tempfile

from mqbench.llm.stream._source import WHO

MANIFEST = "mqbench_quantize.json"
_TMP = ".mqbench-"


def shard_name(i, n):
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_exclusive(folder, final, write):
    """``write(path)`` into a fresh temporary file of ``folder``, synced, then renamed to
    ``final``."""
    fd, tmp = tempfile.mkstemp(prefix=_TMP, suffix=".partial", dir=folder)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, os.path.join(folder, final))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(folder, name, content):
    def write(path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(content, f, indent=2, sort_keys=True)
            f.write("\n")
    _write_exclusive(folder, name, write)


class Output(object):
    """The folder being written (module docstring). ``done`` lists the blocks already written
    (0 .. k-1 of a resumed run); ``complete`` says the folder is a finished checkpoint of these
    settings."""

    def __init__(self, save_dir, settings, n_blocks, overwrite=False):
        self.path = os.path.abspath(save_dir)
        self.settings = settings
        self.n_shards = n_blocks + 1
        self.blocks = {}
        self.complete = False
        if os.path.islink(self.path):
            raise ValueError(f"{WHO}: {self.path} is a symbolic link; name a folder")
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            raise ValueError(f"{WHO}: the parent folder {parent} does not exist")
        if not os.path.exists(self.path):
            os.mkdir(self.path)
            self._save_manifest()
            return
        if not os.path.isdir(self.path):
            raise ValueError(f"{WHO}: {self.path} exists and is not a folder")
        entries = os.listdir(self.path)
        manifest = os.path.join(self.path, MANIFEST)
        if not entries:
            self._save_manifest()
            return
        if overwrite:
            self._clear()
            self._save_manifest()
            return
        if not os.path.isfile(manifest):
            raise ValueError(f"{WHO}: {self.path} exists, is not empty and is not a run of "
                             f"quantize_checkpoint (no {MANIFEST}); pass overwrite=True "
                             "(--overwrite) to replace it")
        self._resume(manifest)

    def _clear(self):
        for name in os.listdir(self.path):
            p = os.path.join(self.path, name)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)

    def _resume(self, manifest):
        try:
            with open(manifest, encoding="utf-8") as f:
                old = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{WHO}: {manifest} cannot be read ({e}); pass overwrite=True "
                             "(--overwrite) to start again") from None
        if not isinstance(old, dict) or not isinstance(old.get("settings"), dict) or \
                not isinstance(old.get("blocks", {}), dict):
            raise ValueError(f"{WHO}: {manifest} is not a manifest of quantize_checkpoint; pass "
                             "overwrite=True (--overwrite) to start again")
        if old["settings"] != self.settings:
            keys = sorted(k for k in set(old["settings"]) | set(self.settings)
                          if old["settings"].get(k) != self.settings.get(k))
            raise ValueError(
                f"{WHO}: {self.path} holds a run with other settings ({', '.join(keys)} differ: "
                f"{[old['settings'].get(k) for k in keys]} there, "
                f"{[self.settings.get(k) for k in keys]} now); a folder never mixes two runs: "
                "rerun with the same arguments to resume it, or pass overwrite=True "
                "(--overwrite) to start again")
        kept = {}
        for b in range(self.n_shards - 1):
            entry = old["blocks"].get(str(b))
            if not isinstance(entry, dict):
                break
            fname = shard_name(b, self.n_shards)
            path = os.path.join(self.path, fname)
            if entry.get("file") != fname or not os.path.isfile(path) or \
                    _digest(path) != entry.get("sha256"):
                break
            kept[b] = entry
        self.blocks = kept
        self.complete = bool(old.get("complete")) and len(kept) == self.n_shards - 1 and \
            os.path.isfile(os.path.join(self.path, "config.json"))
        if self.complete:
            return
        wanted = {MANIFEST} | {e["file"] for e in kept.values()}
        for name in os.listdir(self.path):  # the block being written when the run stopped
            if name not in wanted:
                p = os.path.join(self.path, name)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)
                else:
                    os.unlink(p)
        self._save_manifest()

    @property
    def done(self):
        return len(self.blocks)

    def _save_manifest(self, complete=False):
        write_json(self.path, MANIFEST, {
            "settings": self.settings, "complete": complete,
            "blocks": {str(b): e for b, e in sorted(self.blocks.items())}})

    def block_path(self, b):
        return os.path.join(self.path, shard_name(b, self.n_shards))

    def write_block(self, b, tensors, extra=None):
        """Block b's tensors (name -> contiguous CPU tensor) as its shard; ``extra``: what the
        manifest keeps beside its digest (the time it took, the state a resumed run needs)."""
        from safetensors.torch import save_file
        if b != self.done:
            raise RuntimeError(f"{WHO}: block {b} written out of order (next is {self.done})")
        fname = shard_name(b, self.n_shards)
        _write_exclusive(self.path, fname,
                         lambda p: save_file(tensors, p, metadata={"format": "pt"}))
        entry = dict(extra or {})
        entry.update(file=fname, sha256=_digest(os.path.join(self.path, fname)))
        self.blocks[b] = entry
        self._save_manifest()

    def read_block(self, b):
        from safetensors.torch import load_file
        return load_file(self.block_path(b))

    def finish(self, tensors, json_files, extra=None):
        """The last shard (the tensors outside the blocks), the shard index, the JSON files
        (config.json last) and ``extra(folder)`` (the tokenizer)."""
        from safetensors.torch import save_file
        from safetensors import safe_open
        last = shard_name(self.n_shards - 1, self.n_shards)
        _write_exclusive(self.path, last,
                         lambda p: save_file(tensors, p, metadata={"format": "pt"}))
        weight_map, total = {}, 0
        for i in range(self.n_shards):
            fname = shard_name(i, self.n_shards)
            with safe_open(os.path.join(self.path, fname), framework="pt") as f:
                for k in f.keys():
                    if k in weight_map:
                        raise RuntimeError(f"{WHO}: {k} is in two shards")
                    weight_map[k] = fname
                    sl = f.get_slice(k)
                    n = 1
                    for d in sl.get_shape():
                        n *= d
                    total += n * _ITEMSIZE[sl.get_dtype()]
        write_json(self.path, "model.safetensors.index.json",
                   {"metadata": {"total_size": total}, "weight_map": weight_map})
        if extra is not None:
            extra(self.path)
        for name in sorted(json_files, key=lambda n: n == "config.json"):
            write_json(self.path, name, json_files[name])
        self.complete = True
        self._save_manifest(complete=True)


class WrittenBy0(object):
    """The output folder as a rank other than 0 of a torchrun job sees it: rank 0 writes (and
    resumes) it; this rank reads the blocks rank 0 had written, and writes nothing."""

    def __init__(self, save_dir, n_blocks, complete, blocks):
        self.path = os.path.abspath(save_dir)
        self.n_shards = n_blocks + 1
        self.complete, self.blocks = complete, dict(blocks)

    @property
    def done(self):
        return len(self.blocks)

    def read_block(self, b):
        from safetensors.torch import load_file
        return load_file(os.path.join(self.path, shard_name(b, self.n_shards)))

    def write_block(self, b, tensors, extra=None):
        self.blocks[b] = extra

    def finish(self, tensors, json_files, extra=None):
        self.complete = True


_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
             "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
