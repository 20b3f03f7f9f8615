"""The calibration rows' hidden states at a block boundary, carried from block to block by
``quantize_checkpoint`` (Note [Activations at a block boundary])."""
import collections.abc
import ctypes
import os
import tempfile

import torch

from mqbench.llm import _blocks

# Note [Activations at a block boundary]
# Every calibration row's hidden states at the current block boundary are one float32 tensor
# [rows, seq, hidden] (a 1.6B Llama, 64 rows of 512 tokens: 256 MB), each row's other arguments
# (position embeddings, masks) beside it, shared by the rows whose are equal. One tensor, not a
# tensor per row: a row (4 MB there) is under glibc's mmap threshold once that has risen, so rows
# allocated and freed every block among the passes' temporaries would live in the heaps, where
# long-lived chunks keep free pages around them from being returned (Note [Freed memory given
# back] in llm/_memory.py). The block's outputs replace its inputs row by row, so moving on
# holds one set, not two.
#
# By default that tensor is a temporary file of the output folder (created
# exclusively and unlinked at once: no name in the folder where the file system allows it; NFS
# keeps a hidden .nfs name while it is open), and a row is read when a pass asks for it and
# written back when the block's output on it is computed: the memory of the calibration data at
# a block boundary is one row, whatever the number of rows (a pass reads each row once, through
# the page cache). GPTQ, AWQ and SmoothQuant take the rows as ``lazy_calls``, keyword arguments
# whose hidden states are read on access; SignRound stacks its rows, so they are in memory while
# its block learns. ``offload_activations=False`` keeps the tensor in memory.


def _equal(a, b, depth=0):
    """a and b hold the same values (tensors of one shape, dtype and content; tuples, lists,
    dicts of those to ``_blocks.MAX_DEPTH``; other values by ``==``)."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and
                a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and
                bool(torch.equal(a, b)))
    if depth >= _blocks.MAX_DEPTH:
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return (type(a) is type(b) and len(a) == len(b) and
                all(_equal(x, y, depth + 1) for x, y in zip(a, b)))
    if a is None or b is None or isinstance(a, (bool, int, float, str)):
        return type(a) is type(b) and a == b
    return False  # another object: kept per row


def block_outputs(block, calls):
    """``block``'s hidden-states output on each of ``calls`` ((hidden, where, rest)), one at a
    time, without gradients; each of the input's shape."""
    for hidden, where, rest in calls:
        args, kwargs = _blocks.join_call(hidden, where, rest)
        with torch.no_grad():  # not held across the yield: the caller's grad mode is its own
            out = _blocks.first_tensor(block(*args, **kwargs))
        if out is None or out.shape != hidden.shape:
            raise ValueError(f"activations: the block returned "
                             f"{None if out is None else tuple(out.shape)} for hidden states "
                             f"{tuple(hidden.shape)}")
        yield out.detach()


class Activations(object):
    """The rows' (hidden, where, rest) block calls (``_blocks._split``): hidden [1, seq, hidden]
    float32, row i of one tensor, in memory or in a file (Note [Activations at a block
    boundary]). A sequence of those calls (in a file: each hidden read afresh);
    ``advance(block)`` replaces them by the block's outputs."""

    def __init__(self, rows, first_call, folder=None):
        """``rows`` rows like ``first_call``'s, in memory, or with ``folder`` in a temporary
        file there (created exclusively, unlinked at once)."""
        hidden = first_call[0]
        self.rows, self.row_shape = rows, (1,) + tuple(hidden.shape[1:])
        self._calls = []  # (where, rest) per row
        self._file, self.data = None, None
        if folder is not None:
            self._file = tempfile.TemporaryFile(dir=folder, prefix=".mqbench-activations-")
        else:
            self.data = torch.empty((rows,) + self.row_shape[1:], dtype=torch.float32)
        self.append(first_call)

    def append(self, call):
        """Row len(self) from a block call; the rest shared with an earlier row's where equal."""
        hidden, where, rest = call
        i = len(self._calls)
        if i >= self.rows or tuple(hidden.shape) != self.row_shape:
            raise ValueError(f"activations: row {i} of hidden states {tuple(hidden.shape)} does "
                             f"not fit {self.rows} rows of {self.row_shape}")
        self._write(i, hidden)
        for w, r in self._calls[-1:]:
            if w == where and _equal(r, rest):
                rest = r
        self._calls.append((where, rest))

    @property
    def on_disk(self):
        return self._file is not None

    def __len__(self):
        return len(self._calls)

    def hidden(self, i):
        """Row i's hidden states: a view of the tensor, or read from the file (a new tensor)."""
        if self._file is None:
            if self.data is None:
                raise ValueError("activations: read after close")
            return self.data[i:i + 1]
        t = torch.empty(self.row_shape, dtype=torch.float32)
        _io(os.preadv, self._file.fileno(), _bytes(t), i * _nbytes(t))
        return t

    def __getitem__(self, i):
        where, rest = self._calls[i]
        return self.hidden(i), where, rest

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def copy(self):
        """The calls with their hidden states copied (a stream that ``advance`` leaves alone)."""
        return [(h.clone() if self._file is None else h, w, r) for h, w, r in self]

    def lazy_calls(self, as_kwargs):
        """Each row's block call as keyword arguments (``as_kwargs(args, kwargs)``: a dict)
        whose hidden states are read when asked for: a pass over them holds one row."""
        out = []
        for i, (where, rest) in enumerate(self._calls):
            kwargs = as_kwargs(*_blocks.join_call(_HIDDEN, where, rest))
            key = [k for k, v in kwargs.items() if v is _HIDDEN]
            if len(key) != 1:
                raise ValueError("activations: the block call takes the hidden states "
                                 f"{len(key)} times by name")
            out.append(_LazyCall(self, i, key[0], kwargs))
        return out

    def _write(self, i, hidden):
        if self._file is None:
            if self.data is None:
                raise ValueError("activations: write after close")
            self.data[i:i + 1].copy_(hidden)
        else:
            row = hidden.detach().to(torch.float32).contiguous()
            _io(os.pwritev, self._file.fileno(), _bytes(row), i * _nbytes(row))

    def advance(self, block):
        """Each row replaced by ``block``'s output on it: the next block's inputs."""
        for i, out in enumerate(block_outputs(block, self)):
            self._write(i, out)
            del out

    def close(self):
        """The file, if any, closed (and so removed); no row can be read after."""
        if self._file is not None:
            self._file.close()
            self._file = None


# the hidden states' place in a call whose keyword names are being found
_HIDDEN = object()


class _LazyCall(collections.abc.Mapping):
    """A block call's keyword arguments with the hidden states read when asked for."""

    def __init__(self, acts, i, key, kwargs):
        self._acts, self._i, self._key, self._kwargs = acts, i, key, kwargs

    def __getitem__(self, k):
        return self._acts.hidden(self._i) if k == self._key else self._kwargs[k]

    def __iter__(self):
        return iter(self._kwargs)

    def __len__(self):
        return len(self._kwargs)


def _nbytes(t):
    return t.numel() * t.element_size()


def _bytes(t):
    """A contiguous CPU tensor's bytes as a writable buffer."""
    n = _nbytes(t)
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


def _io(call, fd, view, offset):
    """``os.preadv`` / ``os.pwritev`` of the whole buffer at ``offset`` (short transfers
    continued)."""
    done = 0
    while done < len(view):
        got = call(fd, [view[done:]], offset + done)
        if got <= 0:
            raise OSError(f"activations: the file ended at byte {offset + done}")
        done += got
