"""Our schemes as compressed-tensors describes them: the ``quantization_config`` of a checkpoint
(``config_groups``' ``weights`` / ``input_activations``, the ``format``), and the way back.

compressed-tensors' integers are signed: ``b`` bits hold ``[-2^(b-1), 2^(b-1) - 1]`` and an
affine scheme's zero point lies in that range too. MQBench's affine ranges are unsigned
(``[0, 2^b - 1]``), so an affine grid is written shifted by ``2^(b-1)``; ``q - z`` and the
dequantized values do not change. Its symmetric ranges (``[-8, 7]``, or ``[-7, 7]`` with
``symmetric_range``) are written as they are.
"""
import numbers

from mqbench.llm import _weights
from mqbench.scheme import QuantizeScheme

FORMAT_VERSION = "0.20.0"  # the compressed-tensors release whose layout this writes and reads

INT_PACKED = "pack-quantized"
INT_PLAIN = "int-quantized"
FLOAT_PLAIN = "float-quantized"
NVFP4_PACKED = "nvfp4-pack-quantized"
MXFP4_PACKED = "mxfp4-pack-quantized"
NAIVE = "naive-quantized"
READ_FORMATS = (INT_PACKED, INT_PLAIN, FLOAT_PLAIN, NVFP4_PACKED, MXFP4_PACKED, NAIVE)

FP8_MAX = 448.0
NVFP4_BLOCK, MX_BLOCK = 16, 32


class WeightFormat(object):
    """One weight scheme: ``kind`` 'int' / 'fp8' / 'nvfp4' / 'mxfp4', and for integers MQBench's
    range ``[quant_min, quant_max]`` with its shift to compressed-tensors' signed one."""

    def __init__(self, kind, bits, strategy, group_size=None, symmetric=True, quant_min=None,
                 quant_max=None):
        self.kind, self.bits, self.strategy = kind, bits, strategy
        self.group_size, self.symmetric = group_size, symmetric
        self.quant_min, self.quant_max = quant_min, quant_max
        # integers packed into int32 (pack-quantized): weight-only and sub-8-bit schemes, as
        # vLLM's W{4,8}A16 kernels read them; 8-bit weights with INT8 activations are plain int8
        # (int-quantized), as its W8A8 kernels read them (``with_activations``)
        self.packed = True
        self.input_zero_shift = 0  # load: what a static affine input zero point is shifted by

    def with_activations(self, afmt):
        """Checks the weights against the activation scheme ``afmt`` (None: weight-only) and sets
        the integer layout. With activations, only the pairs vLLM has kernels for are written
        (W8A8 INT8: symmetric 8-bit weights per channel or tensor; W8A8 FP8: FP8 weights)."""
        if afmt is None:
            return self
        if self.kind in ("nvfp4", "mxfp4"):
            raise ValueError(f"save_quantized: {self.kind.upper()} weights are written "
                             "weight-only; a_qscheme must be None")
        if self.kind == "fp8" and afmt.kind != "fp8":
            raise ValueError("save_quantized: FP8 weights take FP8 activations (W8A8-FP8); "
                             f"a_qscheme is {afmt.kind.upper()}")
        if self.kind == "int":
            if afmt.kind != "int":
                raise ValueError("save_quantized: integer weights with FP8 activations have no "
                                 "compressed-tensors layout (pack-quantized refuses float "
                                 "activations); use FP8 weights")
            if self.bits != 8 or not self.symmetric or self.strategy == "group" or \
                    afmt.bits != 8:
                raise ValueError("save_quantized: with INT activations the weights must be "
                                 "symmetric INT8 per channel or per tensor and the activations "
                                 f"INT8 (W8A8-INT8, what vLLM runs); got {self.describe()} "
                                 f"weights with INT{afmt.bits} activations")
            self.packed = False
        return self

    @property
    def shift(self):
        """What an integer of our range loses to land in compressed-tensors' signed range."""
        if self.kind != "int" or self.symmetric:
            return 0
        return self.quant_min + (1 << (self.bits - 1))

    @property
    def format(self):
        if self.kind == "int":
            return INT_PACKED if self.packed else INT_PLAIN
        return {"fp8": FLOAT_PLAIN, "nvfp4": NVFP4_PACKED, "mxfp4": MXFP4_PACKED}[self.kind]

    def args(self):
        """compressed-tensors' ``QuantizationArgs`` of the weights, as JSON."""
        a = {"num_bits": self.bits, "type": "int" if self.kind == "int" else "float",
             "symmetric": self.symmetric, "group_size": self.group_size,
             "strategy": self.strategy, "block_structure": None, "dynamic": False,
             "actorder": None, "observer": "minmax", "observer_kwargs": {}}
        if self.kind == "nvfp4":
            a.update(scale_dtype="torch.float8_e4m3fn", zp_dtype="torch.float8_e4m3fn")
        elif self.kind == "mxfp4":
            a.update(scale_dtype="torch.uint8", zp_dtype="torch.uint8")
        return a

    def key(self):
        return (self.kind, self.bits, self.strategy, self.group_size, self.symmetric,
                self.quant_min, self.quant_max)

    def describe(self):
        if self.kind != "int":
            return self.kind.upper() + (f" per {self.strategy}" if self.kind == "fp8" else "")
        where = {"group": f"groups of {self.group_size}", "channel": "per channel",
                 "tensor": "per tensor"}[self.strategy]
        return (f"INT{self.bits} {'symmetric' if self.symmetric else 'affine'} {where} "
                f"[{self.quant_min}, {self.quant_max}]")


def weight_format(w_qscheme):
    """``w_qscheme`` (a QuantizeScheme or its dict) -> WeightFormat, or ValueError naming what
    compressed-tensors cannot express."""
    if isinstance(w_qscheme, dict):
        w_qscheme = QuantizeScheme(**w_qscheme)
    if not isinstance(w_qscheme, QuantizeScheme):
        raise TypeError("save_quantized: w_qscheme must be a QuantizeScheme or a dict of its "
                        f"arguments, got {type(w_qscheme).__name__}")
    dtype = w_qscheme.dtype
    if dtype == "fp8_e4m3":
        if w_qscheme.pot_scale:
            raise ValueError("save_quantized: an FP8 scheme with pot_scale=True: compressed-"
                             "tensors' FP8 scales are free floats and record no power-of-two "
                             "constraint")
        return WeightFormat("fp8", 8, "channel" if w_qscheme.per_channel else "tensor")
    if dtype == "nvfp4":
        return WeightFormat("nvfp4", 4, "tensor_group", NVFP4_BLOCK)
    if dtype == "mxfp4":
        return WeightFormat("mxfp4", 4, "group", MX_BLOCK)
    if dtype != "int":
        raise ValueError(f"save_quantized: w_qscheme dtype {dtype!r} has no compressed-tensors "
                         "layout that we write (int, fp8_e4m3, nvfp4 and mxfp4 are written; "
                         "fp8_e5m2 has no compressed-tensors type, and the MXFP8 / MXFP6 "
                         "layouts are not written yet)")
    wq = _weights.resolve_w_qscheme(w_qscheme, "save_quantized")
    strategy = "group" if wq.group_size else ("channel" if wq.per_channel else "tensor")
    fmt = WeightFormat("int", wq.bit, strategy, wq.group_size or None, bool(wq.symmetric),
                       wq.quant_min, wq.quant_max)
    check_int_range(fmt, "w_qscheme")
    return fmt


def check_int_range(fmt, where):
    lo, hi = -(1 << (fmt.bits - 1)), (1 << (fmt.bits - 1)) - 1
    if fmt.symmetric and (fmt.quant_min < lo or fmt.quant_max > hi):
        raise ValueError(f"save_quantized: {where} is symmetric with range [{fmt.quant_min}, "
                         f"{fmt.quant_max}], which {fmt.bits}-bit signed integers "
                         f"([{lo}, {hi}]) do not hold")
    if not fmt.symmetric and fmt.quant_max - fmt.quant_min > hi - lo:
        raise ValueError(f"save_quantized: {where} has range [{fmt.quant_min}, "
                         f"{fmt.quant_max}], wider than {fmt.bits} bits")


class ActFormat(object):
    """The input activations' scheme: INT (``bits``) or FP8 E4M3, dynamic per token or static
    per tensor."""

    def __init__(self, kind, bits, dynamic, symmetric):
        self.kind, self.bits, self.dynamic, self.symmetric = kind, bits, dynamic, symmetric

    def args(self):
        return {"num_bits": self.bits, "type": "int" if self.kind == "int" else "float",
                "symmetric": self.symmetric, "group_size": None,
                "strategy": "token" if self.dynamic else "tensor", "block_structure": None,
                "dynamic": bool(self.dynamic), "actorder": None,
                "observer": None if self.dynamic else "minmax", "observer_kwargs": {}}


_ACT_KEYS = {"bit", "dtype", "dynamic", "symmetry"}


def act_format(a_qscheme):
    """``a_qscheme``: None (weight-only), or a dict ``{"bit": 8, "dtype": "int" | "fp8_e4m3",
    "dynamic": "per_token" | False, "symmetry": True}``."""
    if a_qscheme is None:
        return None
    if isinstance(a_qscheme, QuantizeScheme):
        a_qscheme = {"bit": a_qscheme.bit, "dtype": a_qscheme.dtype,
                     "symmetry": a_qscheme.symmetry}
        if a_qscheme["dtype"] != "int":
            a_qscheme.pop("bit")
    if not isinstance(a_qscheme, dict):
        raise TypeError("save_quantized: a_qscheme must be None or a dict such as {'bit': 8, "
                        f"'dynamic': 'per_token'}}, got {type(a_qscheme).__name__}")
    unknown = sorted(set(a_qscheme) - _ACT_KEYS)
    if unknown:
        raise ValueError(f"save_quantized: a_qscheme keys {unknown} are not understood (it takes "
                         f"{sorted(_ACT_KEYS)})")
    dtype = a_qscheme.get("dtype", "int")
    dynamic = a_qscheme.get("dynamic", False)
    if dynamic not in (False, None, "per_token"):
        raise ValueError(f"save_quantized: a_qscheme dynamic must be 'per_token' or False, got "
                         f"{dynamic!r}")
    symmetric = bool(a_qscheme.get("symmetry", True))
    if dtype == "fp8_e4m3":
        if "bit" in a_qscheme and a_qscheme["bit"] != 8:
            raise ValueError("save_quantized: a_qscheme dtype 'fp8_e4m3' is 8 bits")
        if not symmetric:
            raise ValueError("save_quantized: FP8 activations are symmetric")
        return ActFormat("fp8", 8, bool(dynamic), True)
    if dtype != "int":
        raise ValueError(f"save_quantized: a_qscheme dtype {dtype!r} is not written (int or "
                         "fp8_e4m3)")
    bits = a_qscheme.get("bit", 8)
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or not 2 <= bits <= 8:
        raise ValueError(f"save_quantized: a_qscheme bit must be an integer in [2, 8], got "
                         f"{bits!r}")
    return ActFormat("int", int(bits), bool(dynamic), symmetric)


def quantization_config(wfmt, afmt, targets, ignore):
    """The ``quantization_config`` of config.json: one group, its layers named one by one."""
    group = {"targets": targets, "weights": wfmt.args(),
             "input_activations": afmt.args() if afmt is not None else None,
             "output_activations": None, "format": wfmt.format}
    return {"quant_method": "compressed-tensors", "format": wfmt.format,
            "quantization_status": "compressed", "config_groups": {"group_0": group},
            "ignore": list(ignore), "kv_cache_scheme": None, "global_compression_ratio": None,
            "sparsity_config": {}, "transform_config": {}, "version": FORMAT_VERSION}
