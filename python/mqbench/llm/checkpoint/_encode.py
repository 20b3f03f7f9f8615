"""One Linear's weight as compressed-tensors' tensors (``encode_weight``) and back
(``decode_weight``), with the grid it lies on.

Where the grid comes from, in order: the qparams an algorithm returned (GPTQ, SignRound, RTN:
the weight must already lie on that grid, or the layer is refused), the layer's
``weight_fake_quant`` in a prepared model (what it computes is written), or the grid the MinMax
observer would give the weight (round to nearest, what ``prepare_by_platform`` then computes).

Every encoding is checked by decoding it: the values a loader computes from the written tensors
must be the values our fake quantization gives, bit for bit, or nothing is written. NVFP4 is the
one exception, by a few float32 roundings (within 2^-21 relative): compressed-tensors divides
the block scale by a global scale where our op multiplies by its reciprocal (``decode_weight``
follows the format; docs/serving.md).
"""
import torch

from mqbench.llm import _weights
from mqbench.llm.checkpoint import _codec
from mqbench.llm.checkpoint._schemes import FP8_MAX, MX_BLOCK, NVFP4_BLOCK

_NVFP4_SCALE_MIN = 2.0 ** -6


def _ops():
    return torch.ops.mqbench


def expand_groups(t, out_f, in_f):
    """[out, groups] / [out, 1] / [1, 1] qparams -> [out, in]."""
    t = t.reshape(t.shape[0] if t.dim() else 1, -1).float()
    if t.shape[0] == 1:
        t = t.expand(out_f, t.shape[1])
    return t.repeat_interleave(in_f // t.shape[1], dim=1)


def int_grid(name, weight, fmt, qp, fq, dtype):
    """(q in our range, scale [out, groups], zero_point [out, groups], dequantized). ``weight``
    is float32; ``dtype`` the model's: a bfloat16 / float16 model holds each grid value
    rounded to its dtype (the float32 grid value is what the checkpoint's float32 scales give,
    and loaders round it to the model's dtype the same way)."""
    out_f, in_f = weight.shape
    groups = in_f // fmt.group_size if fmt.strategy == "group" else 1
    rows = 1 if fmt.strategy == "tensor" else out_f
    on_grid = qp is not None
    if qp is not None:
        scale, zp = qp["scale"], qp["zero_point"]
        for key, want in (("quant_min", fmt.quant_min), ("quant_max", fmt.quant_max)):
            if key in qp and int(qp[key]) != want:
                raise ValueError(f"save_quantized: {name!r}'s qparams have {key} {qp[key]} but "
                                 f"w_qscheme gives {want}: pass the w_qscheme the algorithm ran "
                                 "with")
    elif fq is not None:
        scale, zp = fq.scale, fq.zero_point
    else:
        _, scale, zp = _weights.rtn_weight(weight, fmt_as_wq(fmt))
    if scale.numel() != rows * groups or zp.numel() != rows * groups:
        raise ValueError(f"save_quantized: {name!r}'s grid has {scale.numel()} scales, but "
                         f"w_qscheme ({fmt.describe()}) wants {rows * groups} for its "
                         f"{list(weight.shape)} weight: pass the w_qscheme the model was "
                         "quantized with")
    # the model may be on a GPU: the grid is computed and written from the CPU
    scale = scale.detach().float().cpu().reshape(rows, groups)
    zp = zp.detach().float().cpu().reshape(rows, groups)
    if not bool(torch.isfinite(scale).all()) or bool((scale <= 0).any()):
        raise ValueError(f"save_quantized: {name!r} has a scale that is not a positive finite "
                         "number (an observer that never observed?)")
    if not torch.equal(zp, zp.round()) or bool((zp < fmt.quant_min).any()) or \
            bool((zp > fmt.quant_max).any()):
        raise ValueError(f"save_quantized: {name!r}'s zero points are not integers in "
                         f"[{fmt.quant_min}, {fmt.quant_max}]")
    if fmt.symmetric and bool((zp != 0).any()):
        raise ValueError(f"save_quantized: {name!r} has non-zero zero points but w_qscheme is "
                         "symmetric")
    # per group through broadcasting, in place where the result is the same bit for bit: a
    # layer's weight-sized temporaries are what bounds the memory of a block-by-block run
    s3, z3 = scale.reshape(rows, groups, 1), zp.reshape(rows, groups, 1)
    q = torch.round(weight.reshape(out_f, groups, -1) * (1.0 / s3))
    q = q.add_(z3).clamp_(fmt.quant_min, fmt.quant_max)
    deq = (q - z3).mul_(s3).reshape(out_f, in_f)
    q = q.reshape(out_f, in_f)
    if on_grid and not torch.equal(deq.to(dtype), weight.to(dtype)):
        bad = int((deq.to(dtype) != weight.to(dtype)).sum())
        raise ValueError(f"save_quantized: {bad} weights of {name!r} are not on the grid of its "
                         "qparams (changed after the algorithm, or qparams of another run): "
                         "pass qparams=None to round them to the nearest grid point")
    return q, scale, zp, deq


def fmt_as_wq(fmt):
    return _weights.WeightQuant({"quant_min": fmt.quant_min, "quant_max": fmt.quant_max,
                                 "symmetric": fmt.symmetric,
                                 "per_channel": fmt.strategy != "tensor",
                                 "group_size": fmt.group_size if fmt.strategy == "group" else 0,
                                 "bit": fmt.bits})


def _fp8_grid(weight, fmt, fq):
    if fq is not None:
        scale = fq.scale.detach().float().cpu().reshape(-1)
    else:
        rows = weight if fmt.strategy == "channel" else weight.reshape(1, -1)
        scale, _ = _weights.minmax_qparams(rows.amin(1), rows.amax(1), -FP8_MAX, FP8_MAX, True)
    s = scale.reshape(-1, 1)
    q = torch.clamp(weight / s, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale, q.float() * s


def _nvfp4_block_scales(weight, amax):
    """NVFP4's (g, block scales s) for ``weight`` [out, in] and its tensor amax: the op's
    formulas (docs/formats-mx.md, "The maths")."""
    out_f, in_f = weight.shape
    g = amax.float().reshape(()) / (448.0 * 6.0)
    blocks = weight.reshape(out_f, in_f // NVFP4_BLOCK, NVFP4_BLOCK)
    s = torch.clamp(blocks.abs().amax(-1) / 6.0 / g, _NVFP4_SCALE_MIN, 448.0)
    return g, s.to(torch.float8_e4m3fn)


def _nearest_e2m1(v):
    mag = v.abs()
    idx = (mag.unsqueeze(-1) - _codec.E2M1_VALUES).abs().argmin(-1)
    return torch.where(torch.signbit(v), -_codec.E2M1_VALUES[idx], _codec.E2M1_VALUES[idx])


def encode_weight(name, weight, fmt, qp=None, fq=None):
    """The compressed-tensors tensors of one layer (local names: ``weight_packed``,
    ``weight_scale``, ...) and the dequantized weight the loaders compute from them."""
    dtype = weight.dtype
    weight = weight.detach().float().cpu()
    out_f, in_f = weight.shape
    if fmt.strategy == "group" or fmt.kind in ("nvfp4", "mxfp4"):
        block = fmt.group_size
        if in_f % block:
            raise ValueError(f"save_quantized: {name!r} has {in_f} input channels, not a multiple "
                             f"of the block of {block} ({fmt.describe()})")
    if fmt.kind == "int":
        q, scale, zp, deq = int_grid(name, weight, fmt, qp, fq, dtype)
        tensors = {}
        q_ct = (q - fmt.shift).to(torch.int8)
        if fmt.format == "pack-quantized":
            tensors["weight_packed"] = _codec.pack_int(q_ct, fmt.bits)
            tensors["weight_shape"] = torch.tensor([out_f, in_f], dtype=torch.int64)
        else:
            tensors["weight"] = q_ct
        tensors["weight_scale"] = scale.reshape(-1) if fmt.strategy == "tensor" else scale
        if not fmt.symmetric:
            z_ct = (zp - fmt.shift).to(torch.int8)
            if fmt.strategy == "tensor":
                z_ct = z_ct.reshape(-1)
            elif fmt.format == "pack-quantized":
                z_ct = _codec.pack_int(z_ct, fmt.bits, dim=0)
            tensors["weight_zero_point"] = z_ct
        return tensors, deq
    if fq is not None and hasattr(fq, "amax") and fmt.kind != "nvfp4":
        raise ValueError(f"save_quantized: {name!r}'s weight quantizer is NVFP4 but w_qscheme is "
                         f"{fmt.describe()}")
    if fmt.kind == "fp8":
        q, scale, deq = _fp8_grid(weight, fmt, fq)
        want = (out_f if fmt.strategy == "channel" else 1)
        if scale.numel() != want:
            raise ValueError(f"save_quantized: {name!r}'s FP8 quantizer has {scale.numel()} "
                             f"scales, w_qscheme ({fmt.describe()}) wants {want}")
        return {"weight": q, "weight_scale": scale.reshape(-1, 1) if want > 1 else scale}, deq
    if fmt.kind == "nvfp4":
        amax = fq.amax.detach().float().cpu() if fq is not None else weight.abs().amax()
        if not bool(torch.isfinite(amax)) or float(amax) <= 0:
            raise ValueError(f"save_quantized: {name!r}'s NVFP4 tensor amax is {float(amax)}: "
                             "calibrate it (or pass a float model with finite weights)")
        deq = _ops().fake_quantize_nvfp4(weight, amax.float().reshape(()), NVFP4_BLOCK, -1)
        g, s8 = _nvfp4_block_scales(weight, amax)
        step = g * expand_groups(s8.float(), out_f, in_f)
        elems = _nearest_e2m1(deq / step)
        if not torch.equal(elems * step, deq):
            raise ValueError(f"save_quantized: {name!r}'s NVFP4 values do not decompose into "
                             "block scales and E2M1 elements (a weight quantizer of another "
                             "NVFP4 variant?)")
        tensors = {"weight_packed": _codec.pack_fp4(_codec.e2m1_codes(elems)),
                   "weight_scale": s8,
                   "weight_global_scale": (1.0 / g).reshape(1)}
        return tensors, deq
    # mxfp4
    deq = _ops().fake_quantize_mx(weight, "mxfp4", MX_BLOCK, -1)
    blocks = weight.reshape(out_f, in_f // MX_BLOCK, MX_BLOCK).abs().amax(-1)
    if not bool(torch.isfinite(blocks).all()):
        raise ValueError(f"save_quantized: {name!r} has a non-finite weight")
    _, exp = torch.frexp(blocks)
    e = torch.where(blocks > 0, exp - 1 - 2, torch.full_like(exp, -127)).clamp(min=-127)
    X = torch.ldexp(torch.ones_like(blocks), e)
    step = expand_groups(X, out_f, in_f)
    elems = _nearest_e2m1(deq / step)
    if not torch.equal(elems * step, deq):
        raise ValueError(f"save_quantized: {name!r}'s MXFP4 values do not decompose into E8M0 "
                         "block scales and E2M1 elements")
    return {"weight_packed": _codec.pack_fp4(_codec.e2m1_codes(elems)),
            "weight_scale": _codec.e8m0_encode(X)}, deq


def check_round_trip(name, tensors, fmt, deq):
    """The loaders' values of the encoded ``tensors`` against ``deq``, our fake quantization of
    the weight: bit for bit (NVFP4: within the few roundings of its reciprocal global scale)."""
    got, _ = decode_weight(tensors, fmt, tuple(deq.shape))
    if fmt.kind == "nvfp4":
        ok = torch.allclose(got, deq, rtol=2 ** -21, atol=0)
    else:
        ok = torch.equal(got, deq)
    if not ok:
        raise ValueError(f"save_quantized: {name!r} does not round-trip: decoding its "
                         f"{fmt.format} tensors gives other weights than the fake quantization "
                         "(a bug: please report it with the model's config)")


def decode_weight(tensors, fmt, shape):
    """The float32 [out, in] weight a compressed-tensors loader computes, and our qparams
    (scale / zero_point in our range, or None for the float formats)."""
    out_f, in_f = shape
    if fmt.kind == "int":
        if "weight_packed" in tensors:
            q = _codec.unpack_int(tensors["weight_packed"], fmt.bits, in_f).float()
        else:
            q = tensors["weight"].float()
        scale = tensors["weight_scale"].float()
        scale = scale.reshape(1, 1) if fmt.strategy == "tensor" else scale.reshape(out_f, -1)
        if "weight_zero_point" in tensors and not fmt.symmetric:
            z = tensors["weight_zero_point"]
            if fmt.strategy != "tensor" and "weight_packed" in tensors:
                z = _codec.unpack_int(z, fmt.bits, out_f, dim=0)
            z = z.float().reshape(scale.shape)
        else:
            z = torch.zeros_like(scale)
        g = scale.shape[1]  # per group through broadcasting, as int_grid
        deq = (q.reshape(out_f, g, -1) - z.reshape(-1, g, 1)).mul_(scale.reshape(-1, g, 1))
        return deq.reshape(out_f, in_f), {"scale": scale, "zero_point": z + fmt.shift}
    if fmt.kind == "fp8":
        scale = tensors["weight_scale"].float()
        return tensors["weight"].float() * scale.reshape(-1, 1), {"scale": scale.reshape(-1)}
    elems = _codec.e2m1_values(_codec.unpack_fp4(tensors["weight_packed"]))
    if fmt.kind == "nvfp4":
        step = tensors["weight_scale"].float() / tensors["weight_global_scale"].float()
    else:
        step = _codec.e8m0_decode(tensors["weight_scale"])
    return elems * expand_groups(step, out_f, in_f), None
