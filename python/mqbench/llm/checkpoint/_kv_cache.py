"""compressed-tensors' ``kv_cache_scheme``: the KV cache quantizers of a prepared model
(``prepare_by_platform`` with ``kv_cache_qscheme``, Note [KV cache quantizers]) written as each
attention module's ``k_scale`` / ``v_scale`` (and ``k_zero_point`` / ``v_zero_point`` for an
affine integer grid)."""
import torch

from mqbench.custom_quantizer.kv_cache import FALLBACK, KV_SUFFIXES, kv_cache_scheme_of

__all__ = ["KVFormat", "kv_format", "kv_tensors"]


class KVFormat(object):
    """The KV cache's scheme: ``kind`` "int" / "fp8" (E4M3), ``bits``, ``symmetric``,
    ``per_head``."""

    def __init__(self, kind, bits, symmetric, per_head):
        self.kind, self.bits, self.symmetric, self.per_head = kind, bits, symmetric, per_head

    def args(self):
        """The ``kv_cache_scheme`` entry of quantization_config."""
        return {"num_bits": self.bits, "type": "int" if self.kind == "int" else "float",
                "symmetric": self.symmetric, "group_size": None,
                "strategy": "attn_head" if self.per_head else "tensor",
                "block_structure": None, "dynamic": False, "actorder": None,
                "observer": "minmax", "observer_kwargs": {}}

    def describe(self):
        return (f"INT{self.bits} {'symmetric' if self.symmetric else 'affine'}"
                if self.kind == "int" else "FP8 E4M3") + (" per head" if self.per_head else
                                                          " per tensor")


def kv_format(spec):
    """None, or the KVFormat of ``kv_cache_scheme`` (the dict given to prepare_by_platform's
    ``kv_cache_qscheme``)."""
    if spec is None:
        return None
    try:
        scheme = kv_cache_scheme_of(spec)
    except (TypeError, ValueError) as e:
        raise type(e)(f"save_quantized: {e}") from None
    if scheme.dtype == "fp8_e5m2":
        raise ValueError("save_quantized: compressed-tensors writes FP8 KV caches in E4M3; "
                         "kv_cache_scheme dtype 'fp8_e5m2' is not written")
    if scheme.dtype == "int" and not 2 <= scheme.bit <= 8:
        raise ValueError(f"save_quantized: an integer KV cache has 2 to 8 bits, got {scheme.bit}")
    kind = "int" if scheme.dtype == "int" else "fp8"
    return KVFormat(kind, scheme.bit, scheme.symmetry, scheme.per_channel)


def _owners(model):
    """{attention module name: (k quantizer, v quantizer)}."""
    found = {}
    for name, mod in model.named_modules():
        owner, _, leaf = name.rpartition(".")
        if leaf in KV_SUFFIXES:
            found.setdefault(owner, {})[leaf] = mod
    return {o: (q.get("k_fake_quant"), q.get("v_fake_quant")) for o, q in found.items()}


def _kv_heads(config):
    text = getattr(config, "get_text_config", lambda: config)() or config
    heads = getattr(text, "num_key_value_heads", None) or getattr(text, "num_attention_heads",
                                                                  None)
    if not heads:
        raise ValueError("save_quantized: the config names no num_key_value_heads: per-head KV "
                         "scales need it")
    return int(heads)


def _scale_and_zero(where, fq, fmt, kv_heads):
    fp8 = getattr(fq, "format", "int") not in (None, "int")
    if fp8 != (fmt.kind == "fp8"):
        raise ValueError(f"save_quantized: {where} quantizes "
                         f"{'FP8' if fp8 else 'integers'}, kv_cache_scheme is {fmt.describe()}: "
                         "pass the kv_cache_qscheme the model was prepared with")
    if fp8 and fq.format != "fp8_e4m3":
        raise ValueError(f"save_quantized: {where} is {fq.format}; compressed-tensors' FP8 KV "
                         "cache is E4M3")
    if not fp8:
        levels = int(fq.quant_max) - int(fq.quant_min) + 1
        if levels != 2 ** fmt.bits or bool(fq.is_symmetric_quant) != fmt.symmetric:
            raise ValueError(f"save_quantized: {where}'s grid [{fq.quant_min}, {fq.quant_max}] "
                             f"(symmetric {bool(fq.is_symmetric_quant)}) is not "
                             f"{fmt.describe()}")
    scale = fq.scale.detach().float().cpu().reshape(-1).clone()
    zp = fq.zero_point.detach().float().cpu().reshape(-1).clone()
    if not torch.isfinite(scale).all() or not (scale > 0).all():
        raise ValueError(f"save_quantized: {where} has scales that are not positive and finite: "
                         "calibrate the model first (enable_calibration, run data)")
    if fmt.per_head != (scale.numel() > 1):
        raise ValueError(f"save_quantized: {where} has {scale.numel()} scales; kv_cache_scheme "
                         f"is {fmt.describe()}")
    if fmt.per_head:
        # the attention call reads the KV heads repeated to every query head (grouped KV heads,
        # Note [KV cache quantizers]): keep the first repeat, all of them equal
        if scale.numel() % kv_heads:
            raise ValueError(f"save_quantized: {where} has {scale.numel()} head scales, not a "
                             f"multiple of the {kv_heads} KV heads")
        rep = scale.numel() // kv_heads
        grid = torch.stack([scale, zp]).view(2, kv_heads, rep)
        if not torch.equal(grid, grid[:, :, :1].expand_as(grid)):
            raise ValueError(f"save_quantized: {where}'s scales differ between the repeats of one "
                             "KV head: they were not calibrated on repeated KV heads")
        scale, zp = grid[0, :, 0].reshape(kv_heads, 1, 1), grid[1, :, 0].reshape(kv_heads, 1, 1)
    out = {"scale": scale}
    if fmt.kind == "int" and not fmt.symmetric:
        # ours is unsigned [0, 2^b - 1], compressed-tensors' signed [-2^(b-1), 2^(b-1) - 1]
        out["zero_point"] = (zp - int(fq.quant_min) - 2 ** (fmt.bits - 1)).to(torch.int8)
    return out


def kv_tensors(model, fmt, config):
    """{"<attention>.k_scale": ..., "<attention>.v_scale": ..., zero points} from the KV cache
    quantizers of ``model``; ValueError where there are none or they disagree with ``fmt``."""
    owners = _owners(model)
    if not owners:
        raise ValueError("save_quantized: kv_cache_scheme is given but the model has no KV cache "
                         "quantizers: prepare it with prepare_custom_config_dict"
                         "['kv_cache_qscheme'] and calibrate it")
    kv_heads = _kv_heads(config) if fmt.per_head else 0
    out = {}
    for owner, (kq, vq) in sorted(owners.items()):
        if owner.startswith(FALLBACK):
            raise ValueError(f"save_quantized: the KV cache quantizers {owner!r} name no module "
                             "of the model (the capture recorded no module path for that "
                             "attention call), so their k_scale / v_scale have no place in the "
                             "checkpoint")
        for letter, fq in (("k", kq), ("v", vq)):
            if fq is None:
                raise ValueError(f"save_quantized: {owner} has no {letter}_fake_quant")
            for key, t in _scale_and_zero(f"{owner}.{letter}_fake_quant", fq, fmt,
                                          kv_heads).items():
                out[f"{owner}.{letter}_{key}"] = t.contiguous()
    return out
