"""Checkpoint folders: written whole or not at all, and read with every size checked.

A save writes into a fresh hidden sibling of ``save_dir`` (created exclusively by ``mkdtemp``),
then renames it into place: an interrupted save leaves no folder that a loader would take for a
checkpoint, and nothing is ever written outside the parent folder the user named.
"""
import json
import os
import re
import shutil
import tempfile


INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?[Bb])?\s*$")
# as transformers reads max_shard_size: KB / MB / ... powers of 10, KiB / MiB / ... powers of 2,
# a lowercase b (Kb, Mb, ...) bits
_UNITS = {None: 1, "B": 1, "b": 1 / 8}
for _i, _p in enumerate("KMGT"):
    _UNITS.update({_p + "B": 10 ** (3 * (_i + 1)), _p + "iB": 2 ** (10 * (_i + 1)),
                   _p + "b": 10 ** (3 * (_i + 1)) / 8, _p + "ib": 2 ** (10 * (_i + 1)) / 8})


def shard_bytes(max_shard_size):
    """``max_shard_size`` (bytes, or a string like transformers': "5GB", "500MB", "2GiB")."""
    if isinstance(max_shard_size, int) and not isinstance(max_shard_size, bool):
        size = max_shard_size
    else:
        m = _SIZE.match(str(max_shard_size))
        unit = m.group(2) if m and m.group(2) in _UNITS else None
        if m is None or (m.group(2) and unit is None):
            raise ValueError(f"max_shard_size must be bytes or a size such as '5GB' or '2GiB', "
                             f"got {max_shard_size!r}")
        size = int(float(m.group(1)) * _UNITS[unit])
    if size < 1:
        raise ValueError(f"max_shard_size must be positive, got {max_shard_size!r}")
    return size


def check_target(save_dir, overwrite):
    """Refuses, before any work, a ``save_dir`` that exists and holds files (unless
    ``overwrite``), or that is not a folder."""
    save_dir = os.path.abspath(save_dir)
    if os.path.islink(save_dir):
        raise ValueError(f"save_quantized: {save_dir} is a symbolic link; name a folder")
    if os.path.exists(save_dir):
        if not os.path.isdir(save_dir):
            raise ValueError(f"save_quantized: {save_dir} exists and is not a folder")
        if os.listdir(save_dir) and not overwrite:
            raise ValueError(f"save_quantized: {save_dir} exists and is not empty; pass "
                             "overwrite=True to replace it")
    parent = os.path.dirname(save_dir)
    if not os.path.isdir(parent):
        raise ValueError(f"save_quantized: the parent folder {parent} does not exist")
    return save_dir


def _shards(tensors, limit):
    shards, current, size = [], {}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if current and size + n > limit:
            shards.append(current)
            current, size = {}, 0
        current[name] = t
        size += n
    if current or not shards:
        shards.append(current)
    return shards


def write_checkpoint(save_dir, tensors, json_files, limit, extra=None, overwrite=False):
    """Writes ``tensors`` (name -> contiguous CPU tensor) as safetensors shards of at most
    ``limit`` bytes (a tensor larger than that gets a shard of its own), the ``json_files``
    (file name -> dict), and whatever ``extra(folder)`` writes (the tokenizer), into a temporary
    sibling that then replaces ``save_dir``."""
    from safetensors.torch import save_file  # transformers' dependency, imported when used
    parent, base = os.path.split(save_dir)
    tmp = tempfile.mkdtemp(prefix=f".{base}.", suffix=".partial", dir=parent)
    os.chmod(tmp, _folder_mode(save_dir))  # mkdtemp's 0700 would hide it from other users
    try:
        shards = _shards(tensors, limit)
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            fname = SINGLE if len(shards) == 1 else \
                f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file({k: v.contiguous() for k, v in shard.items()},
                      os.path.join(tmp, fname), metadata={"format": "pt"})
            for k, v in shard.items():
                weight_map[k] = fname
                total += v.numel() * v.element_size()
        if len(shards) > 1:
            json_files = dict(json_files)
            json_files[INDEX] = {"metadata": {"total_size": total}, "weight_map": weight_map}
        for fname, content in json_files.items():
            with open(os.path.join(tmp, fname), "x", encoding="utf-8") as f:
                json.dump(content, f, indent=2, sort_keys=True)
                f.write("\n")
        if extra is not None:
            extra(tmp)
        _publish(tmp, save_dir, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _folder_mode(save_dir):
    """The mode of the folder being replaced, else what the umask gives a new folder."""
    if os.path.isdir(save_dir):
        return os.stat(save_dir).st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o777 & ~umask


def _publish(tmp, save_dir, overwrite):
    """``tmp`` becomes ``save_dir``:
    * no ``save_dir``: one rename;
    * an empty ``save_dir`` (a mount point cannot be renamed): the files move in, config.json
      last, so the folder is a checkpoint only once it is whole;
    * a non-empty one (``overwrite``): swapped with a rename each way, the old folder put back
      if the second rename fails, and deleted after."""
    if not os.path.exists(save_dir):
        os.rename(tmp, save_dir)
        return
    entries = os.listdir(save_dir)
    if entries and not overwrite:  # filled while the checkpoint was being encoded
        raise ValueError(f"save_quantized: {save_dir} is no longer empty; pass overwrite=True "
                         "to replace it")
    if not entries:
        names = sorted(os.listdir(tmp), key=lambda n: n == "config.json")
        for n in names:
            os.rename(os.path.join(tmp, n), os.path.join(save_dir, n))
        os.rmdir(tmp)
        return
    parent, base = os.path.split(save_dir)
    old = tempfile.mkdtemp(prefix=f".{base}.", suffix=".old", dir=parent)
    try:
        os.rename(save_dir, old)  # replaces the empty folder mkdtemp made
    except BaseException:
        os.rmdir(old)
        raise
    try:
        os.rename(tmp, save_dir)
    except BaseException:
        os.rename(old, save_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)


def read_json(path, what, who="load_quantized"):
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{who}: {what} {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{who}: {path} is not valid JSON ({e})") from None
    if not isinstance(content, dict):
        raise ValueError(f"{who}: {path} holds a {type(content).__name__}, not an object")
    return content


def shard_files(folder, who="load_quantized"):
    """(files, weight_map) of a checkpoint folder: ``model.safetensors`` (weight_map None) or the
    shards its index names, each a plain safetensors file name inside the folder that exists."""
    index = os.path.join(folder, INDEX)
    if os.path.exists(index):
        weight_map = read_json(index, "the shard index", who).get("weight_map")
        if not isinstance(weight_map, dict) or \
                not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{who}: {index} has no weight_map of tensor -> file name")
        files = sorted(set(weight_map.values()))
    elif os.path.exists(os.path.join(folder, SINGLE)):
        files, weight_map = [SINGLE], None
    else:
        raise ValueError(f"{who}: {folder} has neither {SINGLE} nor {INDEX} (a checkpoint in "
                         "safetensors, as transformers' save_pretrained writes it)")
    for fname in files:
        if os.path.basename(fname) != fname or fname in ("", ".", "..") or \
                not fname.endswith(".safetensors"):
            raise ValueError(f"{who}: the shard index names {fname!r}, which is not a "
                             "safetensors file in the checkpoint's folder")
        if not os.path.isfile(os.path.join(folder, fname)):
            raise ValueError(f"{who}: the shard {fname} is missing from {folder}")
    return files, weight_map


def read_tensors(folder):
    """name -> tensor of every shard in ``folder`` (``model.safetensors`` or the shards its
    index names; a shard name must be a plain file name inside the folder)."""
    from safetensors import safe_open
    files, weight_map = shard_files(folder)
    out = {}
    for fname in files:
        with safe_open(os.path.join(folder, fname), framework="pt") as f:
            for k in f.keys():
                if weight_map is not None and weight_map.get(k) != fname:
                    raise ValueError(f"load_quantized: {fname} holds {k!r}, which the index "
                                     f"puts in {weight_map.get(k)!r}")
                out[k] = f.get_tensor(k)
    if weight_map is not None:
        missing = sorted(set(weight_map) - set(out))
        if missing:
            raise ValueError(f"load_quantized: the index names tensors no shard holds: "
                             f"{missing[:5]}")
    return out
