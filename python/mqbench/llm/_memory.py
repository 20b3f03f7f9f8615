"""Freed memory handed back to the system at the points where the LLM algorithms have just freed
a lot of it (Note [Freed memory given back])."""
import ctypes
import sys

# Note [Freed memory given back]
# glibc serves allocations under its mmap threshold (which rises to 32 MB as mapped blocks are
# freed) from its heaps and keeps what is freed there for reuse. A decoder block's passes free
# hundreds of MB of such temporaries (a 512-token row of a 7168-wide MLP: 14.7 MB each), in
# another order every block, and what stays mapped but unused is RSS: on a 1.6B Llama, 16 x 512
# tokens, the RSS after GPTQ's capture pass was 175 MB above what was alive, and each layer's
# quantization left 100 MB more. malloc_trim returns the free pages of every heap (a few ms),
# after the capture pass, after each Hessian batch, layer and encoding that freed 16 MB or more,
# and after each block of a block-by-block run. A fixed, lower mmap threshold (mallopt) gave the same RSS but cost 20 % of
# the time in page faults on fresh mappings. Nothing to do off glibc.


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL("libc.so.6")
        return lib if hasattr(lib, "malloc_trim") else None
    except OSError:  # another C library (musl)
        return None


_LIBC = _libc()


# a step that freed less leaves too little in the heaps to matter, and a model of thousands of
# small layers (the experts of an MoE, one by one) would walk the heaps thousands of times
_MIN_BYTES = 16 << 20


def give_back(freed_bytes=None):
    """The free pages of glibc's heaps returned to the system (Note [Freed memory given back]),
    when the step just done freed at least 16 MB (``freed_bytes``: about what it freed; None:
    always)."""
    if _LIBC is not None and (freed_bytes is None or freed_bytes >= _MIN_BYTES):
        _LIBC.malloc_trim(0)
