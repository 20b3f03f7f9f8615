"""The GPTQ checkpoint format (``quant_method: gptq``: AutoGPTQ's, GPTQModel's, the one
transformers, vLLM and SGLang read as "gptq"), for integer weights of 2, 4 or 8 bits in groups or
per channel (docs/serving.md, "The GPTQ format").

Each quantized Linear becomes:

* ``qweight`` int32 ``[in * b / 32, out]``: the unsigned integers ``q_u`` packed along the input
  axis, element ``i`` of each word at bits ``[b * i, b * i + b)``;
* ``qzeros`` int32 ``[groups, out * b / 32]``: the unsigned zero points, packed along the output
  axis; the "v1" convention (``checkpoint_format: gptq``, what every reader takes) stores
  ``zero - 1``, GPTQModel's "v2" (``gptq_v2``) the zero itself;
* ``scales`` float16 ``[groups, out]`` (GPTQModel's and AutoGPTQ's kernels hold them in float16
  whatever the file has, so the file says what they compute); ``g_idx`` int32 ``[in]``
  (``i // group``).

A weight is ``scales[g_idx[i], j] * (q_u[i, j] - zero[g_idx[i], j])``: with the float16 scale,
so the served weights differ from a float32 grid by that rounding (at most 2^-11 relative; the
kernels' float16 product rounds once more). MQBench's symmetric
grids (``[-8, 7]``) have ``q_u = q + 8`` and zero 8; its affine grids (``[0, 15]``) are already
unsigned. 3-bit GPTQ packs with a layout of its own, which is not written.
"""
import torch

from mqbench.llm.checkpoint import _codec
from mqbench.llm.checkpoint._encode import expand_groups
from mqbench.llm.checkpoint._schemes import WeightFormat

GPTQ_BITS = (2, 4, 8)
FORMATS = {"gptq": "gptq", "gptq_v2": "gptq_v2"}


def check(fmt, format_name):
    if fmt.kind != "int" or fmt.bits not in GPTQ_BITS:
        raise ValueError(f"save_quantized: format {format_name!r} holds integer weights of "
                         f"{GPTQ_BITS} bits; w_qscheme is {fmt.describe()}")
    if fmt.strategy == "tensor":
        raise ValueError(f"save_quantized: format {format_name!r} has no per-tensor scale; use "
                         "per_channel=True (with or without group_size)")


def _unsigned_shift(fmt):
    return (1 << (fmt.bits - 1)) if fmt.symmetric else -fmt.quant_min


def tensors(name, q, scale, zp, fmt, format_name):
    """The GPTQ tensors of one layer from its grid (q [out, in] in our range, scale / zero point
    [out, groups])."""
    out_f, in_f = q.shape
    half, shift = 1 << (fmt.bits - 1), _unsigned_shift(fmt)
    groups = scale.shape[1]
    q_u = q + shift
    zero_u = zp + shift
    if format_name == "gptq":
        zero_u = zero_u - 1  # the v1 convention
        if bool((zero_u < 0).any()):
            raise ValueError(f"save_quantized: {name!r} has a zero point of 0, which GPTQ's v1 "
                             "format (zero - 1) cannot hold; use format='gptq_v2'")
    group = in_f // groups
    return {
        "qweight": _codec.pack_int((q_u - half).t().contiguous().to(torch.int64), fmt.bits, dim=0),
        "qzeros": _codec.pack_int((zero_u - half).t().contiguous().to(torch.int64), fmt.bits),
        "scales": scale.t().contiguous().to(torch.float16),
        "g_idx": (torch.arange(in_f, dtype=torch.int32) // group).contiguous(),
    }


def check_round_trip(name, t, q, scale, zp, fmt, format_name):
    """The GPTQ tensors decoded as the readers decode them against the grid on float16
    scales, bit for bit."""
    out_f, in_f = q.shape
    got, _ = decode(name, t, fmt, format_name, (out_f, in_f))
    s16 = expand_groups(scale.half().float(), out_f, in_f)
    want = (q - expand_groups(zp, out_f, in_f)) * s16
    if not torch.equal(got, want):
        raise ValueError(f"save_quantized: {name!r} does not round-trip through the GPTQ format "
                         "(a bug: please report it with the model's config)")


def config(fmt, format_name):
    """The ``quantization_config`` (also written as quantize_config.json)."""
    return {"quant_method": "gptq", "bits": fmt.bits,
            "group_size": fmt.group_size if fmt.strategy == "group" else -1,
            "desc_act": False, "sym": fmt.symmetric, "lm_head": False, "true_sequential": True,
            "checkpoint_format": FORMATS[format_name], "pack_dtype": "int32"}


def read_config(qc):
    """(WeightFormat, checkpoint_format) of a GPTQ ``quantization_config``."""
    bits, group, sym = qc.get("bits"), qc.get("group_size", -1), qc.get("sym", True)
    fmt_name = qc.get("checkpoint_format", "gptq")
    if bits not in GPTQ_BITS or not isinstance(group, int) or isinstance(group, bool) or \
            (group < 1 and group != -1) or fmt_name not in FORMATS or not isinstance(sym, bool):
        raise ValueError(f"load_quantized: GPTQ config bits={bits!r}, group_size={group!r}, "
                         f"sym={sym!r}, checkpoint_format={fmt_name!r}; this reads bits "
                         f"{GPTQ_BITS}, group_size -1 or positive, checkpoint_format "
                         f"{sorted(FORMATS)}")
    if qc.get("desc_act"):
        raise ValueError("load_quantized: GPTQ desc_act=True (a g_idx permutation) is not read")
    half = 1 << (bits - 1)
    lo, hi = (-half, half - 1) if sym else (0, 2 * half - 1)
    return WeightFormat("int", bits, "group" if group > 0 else "channel",
                        group if group > 0 else None, sym, lo, hi), fmt_name


def decode(name, t, fmt, fmt_name, shape):
    """(float32 weight [out, in], qparams) of one layer's GPTQ tensors, every size checked."""
    out_f, in_f = shape
    if fmt.group_size and (fmt.group_size > in_f or in_f % fmt.group_size):
        raise ValueError(f"load_quantized: {name} has {in_f} input channels, not a multiple of "
                         f"the GPTQ group of {fmt.group_size}")
    groups = in_f // fmt.group_size if fmt.group_size else 1
    words = _codec.packed_words
    want = {"qweight": (words(in_f, fmt.bits), out_f), "scales": (groups, out_f),
            "qzeros": (groups, words(out_f, fmt.bits))}
    for key, shp in want.items():
        dtypes = (torch.float16, torch.float32, torch.bfloat16) if key == "scales" else \
            (torch.int32,)
        if key not in t or tuple(t[key].shape) != shp or t[key].dtype not in dtypes:
            got = (list(t[key].shape), t[key].dtype) if key in t else "missing"
            raise ValueError(f"load_quantized: {name}.{key} is {got}; a {[out_f, in_f]} layer "
                             f"at {fmt.describe()} needs {list(shp)}")
    if "g_idx" in t and (tuple(t["g_idx"].shape) != (in_f,) or t["g_idx"].is_floating_point()):
        raise ValueError(f"load_quantized: {name}.g_idx has shape {list(t['g_idx'].shape)}, the "
                         f"layer has {in_f} input channels")
    if "g_idx" in t and not torch.equal(t["g_idx"].long(),
                                        torch.arange(in_f) // (in_f // groups)):
        raise ValueError(f"load_quantized: {name}.g_idx is not i // group_size (act-order "
                         "checkpoints are not read)")
    half, shift = 1 << (fmt.bits - 1), _unsigned_shift(fmt)
    q_u = _codec.unpack_int(t["qweight"], fmt.bits, in_f, dim=0).t().float() + half
    zero_u = _codec.unpack_int(t["qzeros"], fmt.bits, out_f).t().float() + half
    if fmt_name == "gptq":
        zero_u = zero_u + 1
    scale = t["scales"].float().t().contiguous()
    zp = zero_u - shift
    deq = (q_u - shift - expand_groups(zp, out_f, in_f)) * expand_groups(scale, out_f, in_f)
    return deq, {"scale": scale, "zero_point": zp}
