"""The calibration rows' hidden states at a block boundary, carried from block to block by
``quantize_checkpoint`` (Note [Activations at a block boundary])."""
import ctypes
import tempfile

import torch

from mqbench.llm import _blocks, _memory

# Note [Activations at a block boundary]
# Every calibration row's hidden states at the current block boundary are one float32 tensor
# [rows, seq, hidden] (a 1.6B Llama, 64 rows of 512 tokens: 256 MB), each row's other arguments
# (position embeddings, masks) beside it, shared by the rows whose are equal. One tensor, not a
# tensor per row: a row (4 MB there) sits under glibc's mmap threshold once that has risen, and
# rows allocated and freed block after block among the passes' temporaries fragmented the heap
# (the RSS grew by about 12 MB a block). The block's outputs replace its inputs row by row in
# the same tensor, so moving on holds one set, not two.
#
# The layers' quantization step (GPTQ's column loops, the encoding) reads no hidden state, and
# its peak, the widest layer's work on top of the block's Hessians, is the run's peak. There the
# tensor is written to a temporary file of the output folder (created exclusively, unlinked,
# never named) and its memory returned, then read back before the block's outputs are
# computed: the run's peak less the tensor, for a write and a read of it per block (0.3 s of
# 14 s a block on that Llama, through the page cache). ``offload_activations=False`` keeps it
# in memory.


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


class Activations(object):
    """The rows' (hidden, where, rest) block calls (``_blocks._split``), hidden a [1, seq,
    hidden] view of its row of one float32 tensor (Note [Activations at a block boundary]). A
    sequence of those calls; ``advance(block)`` replaces them by the block's outputs;
    ``offload(folder)`` / ``reload()`` move the tensor to a file and back."""

    def __init__(self, rows, first_call):
        hidden, where, rest = first_call
        self.data = torch.empty((rows,) + tuple(hidden.shape[1:]), dtype=torch.float32)
        self._calls = []  # (where, rest) per row
        self._file = None
        self.append(first_call)

    def append(self, call):
        """Row len(self) from a block call; the rest shared with an earlier row's where equal."""
        hidden, where, rest = call
        i = len(self._calls)
        if i >= self.data.shape[0] or tuple(hidden.shape) != (1,) + tuple(self.data.shape[1:]):
            raise ValueError(f"activations: row {i} of hidden states {tuple(hidden.shape)} does "
                             f"not fit [{self.data.shape[0]}, {', '.join(map(str, self.data.shape[1:]))}]")
        self.data[i].copy_(hidden[0])
        for w, r in self._calls[-1:]:
            if w == where and _equal(r, rest):
                rest = r
        self._calls.append((where, rest))

    def __len__(self):
        return len(self._calls)

    def __getitem__(self, i):
        self._check_here()
        where, rest = self._calls[i]
        return self.data[i:i + 1], where, rest

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def copy(self):
        """The calls with their hidden states copied (a stream that ``advance`` leaves alone)."""
        return [(h.clone(), w, r) for h, w, r in self]

    def advance(self, block):
        """Each row replaced by ``block``'s output on it: the next block's inputs."""
        self._check_here()
        with torch.no_grad():
            for i, (hidden, where, rest) in enumerate(self):
                args, kwargs = _blocks.join_call(hidden, where, rest)
                out = _blocks.first_tensor(block(*args, **kwargs))
                if out is None or out.shape != hidden.shape:
                    raise ValueError(f"activations: the block returned "
                                     f"{None if out is None else tuple(out.shape)} for hidden "
                                     f"states {tuple(hidden.shape)}")
                hidden.copy_(out)
                del out

    def offload(self, folder):
        """The hidden states written to a temporary file of ``folder`` and their memory
        returned. Until ``reload`` a row asked for raises; a view of a row taken before must not
        be read (its storage is empty: GPTQ's calls of the block, whose last pass is done)."""
        if self._file is not None:
            return
        f = tempfile.TemporaryFile(dir=folder, prefix=".mqbench-activations-")
        try:
            f.write(self._bytes())
            f.flush()
        except BaseException:
            f.close()
            raise
        self._file = f
        self.data.untyped_storage().resize_(0)
        _memory.give_back()

    def reload(self):
        """The hidden states read back from ``offload``'s file, which is then closed (gone)."""
        if self._file is None:
            return
        f, self._file = self._file, None
        with f:
            self.data.untyped_storage().resize_(self.data.numel() * self.data.element_size())
            view = self._bytes()
            f.seek(0)
            done = 0
            while done < len(view):
                got = f.readinto(view[done:])
                if not got:
                    raise OSError(f"activations: the offload file ended at byte {done} of "
                                  f"{len(view)}")
                done += got

    def _bytes(self):
        """The tensor's bytes as a writable buffer (``numpy()`` would pin its storage's size)."""
        n = self.data.numel() * self.data.element_size()
        return memoryview((ctypes.c_char * n).from_address(self.data.data_ptr())).cast("B")

    def _check_here(self):
        if self._file is not None:
            raise RuntimeError("activations: read while offloaded (reload first)")

    def close(self):
        """The offload file, if any, closed (and so removed)."""
        if self._file is not None:
            self._file.close()
            self._file = None
