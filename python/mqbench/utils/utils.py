"""Helpers shared by observers and fake quantizers (MQBench's ``mqbench.utils.utils``)."""
import contextlib

import torch
import torch.distributed as dist

__all__ = ["USE_DDP", "USE_LINK", "sync_tensor", "pot_quantization", "is_symmetric_quant",
           "is_per_channel", "no_jit_trace", "is_tracing_state"]

# MQBench fixes these when the module is first imported. SenseTime's linklink is not available
# outside SenseTime, so USE_LINK is always False here.
USE_LINK = False
USE_DDP = dist.is_available() and dist.is_initialized()


def _ddp_active():
    # Checked at call time (not only at import, as MQBench does), so a process group created
    # after `import mqbench` still synchronises qparams (docs/compatibility.md).
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def sync_tensor(tensor):
    """Averages ``tensor`` in place across DDP ranks (a no-op outside DDP); returns it."""
    if _ddp_active():
        if tensor.is_floating_point():
            tensor.data /= dist.get_world_size()
            dist.all_reduce(tensor.data)
        else:  # integer zero points: average in float, round back (MQBench divides ints in place)
            mean = tensor.data.double() / dist.get_world_size()
            dist.all_reduce(mean)
            tensor.data.copy_(mean.round().to(tensor.dtype))
    return tensor


def pot_quantization(tensor, mode="round"):
    """Rounds a scale to a power of two, ``2^round(log2 t)`` (or floor), with a straight-through
    gradient on the rounding."""
    if mode == "round":
        return torch.ops.mqbench.pot_quantization(tensor)
    if mode == "floor":
        log2t = torch.log2(tensor)
        return 2 ** ((torch.floor(log2t) - log2t).detach() + log2t)
    raise ValueError(f"pot_quantization: mode must be 'round' or 'floor', got {mode!r}")


def is_symmetric_quant(qscheme):
    """True for ``torch.per_tensor_symmetric`` and ``torch.per_channel_symmetric``."""
    return qscheme in (torch.per_tensor_symmetric, torch.per_channel_symmetric)


def is_per_channel(qscheme):
    """True for the per-channel qschemes."""
    return qscheme in (torch.per_channel_symmetric, torch.per_channel_affine,
                       torch.per_channel_affine_float_qparams)


def is_tracing_state():
    """True while ``torch.jit.trace`` (and so ``torch.onnx.export``) is tracing."""
    return torch._C._get_tracing_state() is not None


@contextlib.contextmanager
def no_jit_trace():
    """Suspends JIT tracing inside the block (state updates that must not enter the graph)."""
    state = torch._C._get_tracing_state()
    torch._C._set_tracing_state(None)
    try:
        yield
    finally:
        torch._C._set_tracing_state(state)
