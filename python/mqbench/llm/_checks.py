"""Small helpers every LLM algorithm shares: progress over layers (tqdm), the choice between the
C++ ops and their torch formulation (``impl``), and argument checks with the algorithm's name in
the message."""
import numbers

import torch

from mqbench.utils.logger import logger

try:
    from tqdm.auto import tqdm as _tqdm
except ImportError:  # tqdm is a dependency (design.md section 4); plain log lines without it
    _tqdm = None


def progress(items, desc):
    """tqdm over ``items`` (one step per layer), or one log line per step without tqdm."""
    if _tqdm is not None:
        return _tqdm(items, desc=desc, unit="layer", leave=False)

    def gen():
        for i, it in enumerate(items):
            logger.info("%s: %d/%d", desc, i + 1, len(items))
            yield it
    return gen()


def check_impl(impl, algorithm, op):
    """``impl`` of an algorithm that runs its C++ ops only (GPTQ, AWQ): 'auto' or 'cpp'; and
    the extension must have its op ``op``."""
    if impl not in ("auto", "cpp"):
        raise ValueError(f"{algorithm}: impl must be 'auto' or 'cpp' (both run its C++ ops), "
                         f"got {impl!r}")
    if not (hasattr(torch.ops, "mqbench") and hasattr(torch.ops.mqbench, op)):
        raise RuntimeError(f"{algorithm}: this build of mqbench has no LLM ops "
                           f"(torch.ops.mqbench.{op}); rebuild it")


def want_cpp(impl, op):
    """impl 'auto' -> the C++ op ``op`` when the extension has it; 'cpp' requires it; 'python'
    runs the algorithm's torch formulation (SignRound's ATen quantizer)."""
    if impl not in ("auto", "cpp", "python"):
        raise ValueError(f"impl must be 'auto', 'cpp' or 'python', got {impl!r}")
    if impl == "python":
        return False
    has = hasattr(torch.ops, "mqbench") and hasattr(torch.ops.mqbench, op)
    if impl == "cpp" and not has:
        raise RuntimeError(f"impl='cpp' but this build of mqbench has no LLM ops "
                           f"(torch.ops.mqbench.{op}); rebuild it")
    return has


def check_positive_int(value, name, algorithm):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{algorithm}: {name} must be a positive integer, got {value!r}")
    return int(value)
