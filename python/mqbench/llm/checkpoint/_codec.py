"""The bit layouts of compressed-tensors' tensors, in both directions (docs/llm.md, "Serving"):

* ``pack-quantized``: signed ``b``-bit integers (b in 1..8) offset by ``2^(b-1)`` to unsigned,
  then packed densely into int32 words along the last axis (or axis 0 for the zero points of
  an affine scheme): element ``i`` of each run of 32 takes bits ``[i*b, i*b + b)`` of the run's
  ``b`` words, low bits first, an element straddling two words split between them. For b = 4
  this is eight elements per word, the first in the lowest nibble.
* ``nvfp4-pack-quantized`` / ``mxfp4-pack-quantized``: FP4 E2M1 codes (sign in bit 3), two per
  uint8, the even element in the low nibble.
* MX block scales: E8M0, the unsigned biased exponent ``127 + log2(scale)``.

The functions take and give plain tensors; every size they read from a file is checked by
their callers (``load``) before it reaches them.
"""
import math

import torch

# E2M1 magnitudes by code (bits 0-2); bit 3 is the sign.
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_WORD = 32
# rows packed or unpacked at a time: the int64 arithmetic takes several times a row block's size
_ROWS = 256


def packed_words(n, bits):
    """int32 words holding ``n`` dense ``bits``-bit elements."""
    return math.ceil(n * bits / _WORD)


def pack_int(q, bits, dim=-1):
    """Signed integers ``q`` (any integer or float dtype holding integers in
    ``[-2^(bits-1), 2^(bits-1) - 1]``) packed densely into int32 along ``dim`` (-1 or 0) of a
    2-D tensor."""
    if q.dim() != 2:
        raise ValueError(f"pack_int: a 2-D tensor is packed, got {q.dim()}-D")
    if dim == 0:
        return pack_int(q.t(), bits).t().contiguous()
    if q.shape[0] > _ROWS:  # int64 temporaries of a few row blocks, not of the whole weight
        return torch.cat([pack_int(q[i:i + _ROWS], bits) for i in range(0, q.shape[0], _ROWS)])
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = q.to(torch.int64)
    if q.numel() and (int(q.min()) < lo or int(q.max()) > hi):
        raise ValueError(f"pack_int: values outside [{lo}, {hi}] do not fit {bits} bits")
    rows, cols = q.shape
    u = q + (1 << (bits - 1))
    runs = math.ceil(cols / _WORD)
    u = torch.nn.functional.pad(u, (0, runs * _WORD - cols)).reshape(rows, runs, _WORD)
    start = torch.arange(_WORD, dtype=torch.int64) * bits
    word, offset = start // _WORD, start % _WORD
    words = torch.zeros(rows, runs, bits + 1, dtype=torch.int64)
    mask = (1 << _WORD) - 1
    words.index_add_(2, word, (u << offset) & mask)
    # the high part of an element that straddles a word boundary
    spill = offset + bits > _WORD
    if bool(spill.any()):
        words.index_add_(2, word[spill] + 1, u[..., spill] >> (_WORD - offset[spill]))
    words = words[..., :bits].reshape(rows, runs * bits)[:, :packed_words(cols, bits)]
    # the low 32 bits of each word as a signed int32
    words = torch.where(words >= (1 << 31), words - (1 << _WORD), words)
    return words.to(torch.int32).contiguous()


def unpack_int(packed, bits, n, dim=-1):
    """The inverse of ``pack_int``: ``n`` signed ``bits``-bit integers (int8) per row along
    ``dim`` of a 2-D int32 tensor."""
    if packed.dim() != 2 or packed.dtype != torch.int32:
        raise ValueError(f"unpack_int: a 2-D int32 tensor is unpacked, got "
                         f"{packed.dim()}-D {packed.dtype}")
    if dim == 0:
        return unpack_int(packed.t(), bits, n).t().contiguous()
    if packed.shape[1] != packed_words(n, bits):
        raise ValueError(f"unpack_int: {n} elements of {bits} bits take "
                         f"{packed_words(n, bits)} words, the tensor has {packed.shape[1]}")
    if packed.shape[0] > _ROWS:
        return torch.cat([unpack_int(packed[i:i + _ROWS], bits, n)
                          for i in range(0, packed.shape[0], _ROWS)])
    rows = packed.shape[0]
    runs = math.ceil(n / _WORD)
    w = packed.to(torch.int64) & ((1 << _WORD) - 1)
    w = torch.nn.functional.pad(w, (0, runs * bits + 1 - w.shape[1])).reshape(rows, -1)
    start = torch.arange(runs * _WORD, dtype=torch.int64) * bits
    word, offset = start // _WORD, start % _WORD
    both = w[:, word] | (w[:, word + 1] << _WORD)      # 64 bits from the element's first word
    u = (both >> offset) & ((1 << bits) - 1)
    return (u[:, :n] - (1 << (bits - 1))).to(torch.int8)


def e2m1_codes(values):
    """FP4 E2M1 codes (uint8, 0-15) of ``values`` that lie on the E2M1 grid (exactly)."""
    mag = values.abs().float()
    codes = torch.bucketize(mag, E2M1_VALUES)
    if codes.numel() and (int(codes.max()) > 7 or not torch.equal(E2M1_VALUES[codes.clamp(max=7)],
                                                                  mag)):
        raise ValueError("e2m1_codes: values off the FP4 E2M1 grid")
    sign = torch.signbit(values.float()).to(torch.uint8) << 3
    return codes.to(torch.uint8) | sign


def e2m1_values(codes):
    """The float32 values of FP4 E2M1 ``codes`` (uint8, 0-15)."""
    mag = E2M1_VALUES[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def pack_fp4(codes):
    """[rows, cols] E2M1 codes (cols even) -> [rows, cols/2] uint8, even element low."""
    if codes.shape[-1] % 2:
        raise ValueError("pack_fp4: FP4 packs two elements a byte: the row length must be even")
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8).contiguous()


def unpack_fp4(packed):
    """[rows, cols/2] uint8 -> [rows, cols] E2M1 codes."""
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def e8m0_encode(scale):
    """Power-of-two float32 scales -> E8M0 exponents (uint8)."""
    m, e = torch.frexp(scale.float())
    if scale.numel() and not bool(((m == 0.5) & (e - 1 >= -127) & (e - 1 <= 127)).all()):
        raise ValueError("e8m0_encode: MX block scales must be powers of two in [2^-127, 2^127]")
    return (e - 1 + 127).to(torch.uint8)


def e8m0_decode(codes):
    """E8M0 exponents (uint8) -> float32 scales (255, E8M0's NaN, is refused)."""
    if codes.numel() and int(codes.max()) == 255:
        raise ValueError("e8m0_decode: the E8M0 NaN code 255 in a block scale")
    return torch.ldexp(torch.ones(codes.shape), codes.to(torch.int32) - 127)
