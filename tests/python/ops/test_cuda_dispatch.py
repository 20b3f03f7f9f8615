"""Which ops have CUDA kernels, and arguments on another device than x (a clear error, never a
CUDA kernel reading a CPU pointer). The harness and the GPU skip: cuda_harness.py."""
import re

import pytest
import torch

import mqbench
from cuda_harness import needs_gpu

ops = torch.ops.mqbench


def test_cuda_kernels_are_compiled_in_with_a_cuda_torch():
    """With a CUDA build of torch, libmqbench carries the CUDA kernels (MQBENCH_CUDA=AUTO)."""
    if torch.version.cuda is None:
        pytest.skip(f"torch {torch.__version__} is a CPU build: no CUDA kernels are built")
    assert mqbench._C.__cuda__
    assert torch._C._dispatch_has_kernel_for_dispatch_key(
        "mqbench::fake_quantize_per_tensor_affine", "CUDA")


def test_every_op_with_a_cpu_kernel_has_a_cuda_kernel():
    """Registration, checked without a GPU: each mqbench op either is a composite (it runs on
    CUDA through other ops) or has a CUDA kernel beside its CPU one, and each observer op with a
    CompositeExplicitAutograd host implementation has a CUDA kernel unless it is made of ATen ops
    only (running / EMA updates, LSQ qparams), which run on CUDA as they are."""
    if torch.version.cuda is None:
        pytest.skip(f"torch {torch.__version__} is a CPU build: no CUDA kernels are built")
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    aten_only = {"observer_running_min_max", "observer_ema_min_max", "observer_lsq_qparams",
                 "observer_lsq_plus_qparams"}
    names = sorted({str(s.name).split("::")[1] for s in torch._C._jit_get_all_schemas()
                    if str(s.name).startswith("mqbench::")})
    assert len(names) > 40, names
    missing = []
    for name in names:
        q = f"mqbench::{name}"
        if has(q, "CompositeImplicitAutograd") or name in aten_only:
            continue
        if (has(q, "CPU") or has(q, "CompositeExplicitAutograd")) and not has(q, "CUDA"):
            missing.append(name)
    assert not missing, f"ops without a CUDA kernel: {missing}"


# ---- device mismatch -----------------------------------------------------------------------

def _mismatch_cases():
    """(argument, call(x_device, arg_device)): the named argument on arg_device, every other
    tensor on x_device."""
    def x(d, shape=(2, 3)):
        return torch.randn(*shape).to(d)

    def t(v, d, dtype=torch.float32):
        return torch.tensor(v, dtype=dtype).to(d)

    def zi(d, n=1):
        return torch.zeros(n, dtype=torch.int32, device=d)

    return [
        ("scale", lambda xd, ad: ops.fake_quantize_per_tensor_affine(
            x(xd), t([0.1], ad), zi(xd), -128, 127)),
        ("zero_point", lambda xd, ad: ops.fake_quantize_per_tensor_affine(
            x(xd), t([0.1], xd), zi(ad), -128, 127)),
        ("grad", lambda xd, ad: ops._fake_quantize_per_tensor_affine_backward(
            x(ad), x(xd), t([0.1], xd), zi(xd), -128, 127)),
        ("scale", lambda xd, ad: ops.fake_quantize_per_channel_affine(
            x(xd), t([0.1] * 3, ad), zi(xd, 3), 1, -128, 127)),
        ("zero_point", lambda xd, ad: ops.fake_quantize_per_channel_affine(
            x(xd), t([0.1] * 3, xd), zi(ad, 3), 1, -128, 127)),
        ("scale", lambda xd, ad: ops.fake_quantize_learnable_per_tensor_affine(
            x(xd), t([0.1], ad), t([0.0], xd), -128, 127, 1.0)),
        ("zero_point", lambda xd, ad: ops.fake_quantize_learnable_per_tensor_affine(
            x(xd), t([0.1], xd), t([0.0], ad), -128, 127, 1.0)),
        ("scale", lambda xd, ad: ops.fake_quantize_learnable_per_channel_affine(
            x(xd), t([0.1] * 2, ad), t([0.0] * 2, xd), 0, -128, 127, 1.0)),
        ("zero_point", lambda xd, ad: ops._fake_quantize_learnable_per_channel_affine_backward(
            x(xd), x(xd), t([0.1] * 2, xd), t([0.0] * 2, ad), 0, -128, 127, 1.0)),
        ("scale", lambda xd, ad: ops.fake_quantize_dsq_per_tensor(
            x(xd), t([0.1], ad), zi(xd), -8, 7, 0.4)),
        ("scale", lambda xd, ad: ops.fake_quantize_dsq_per_channel(
            x(xd), t([0.1] * 3, ad), zi(xd, 3), 1, -8, 7, 0.4)),
        ("scale", lambda xd, ad: ops.fake_quantize_tqt(
            x(xd), t([0.1], ad), t([0.0], xd), -128, 127, 2)),
        ("alpha", lambda xd, ad: ops.fake_quantize_pact(
            x(xd), t([3.0], ad), t([-3.0], xd), t([0.05], xd), zi(xd), -128, 127)),
        ("n_alpha", lambda xd, ad: ops.fake_quantize_pact(
            x(xd), t([3.0], xd), t([-3.0], ad), t([0.05], xd), zi(xd), -128, 127)),
        ("scale", lambda xd, ad: ops.fake_quantize_pact(
            x(xd), t([3.0], xd), t([-3.0], xd), t([0.05], ad), zi(xd), -128, 127)),
        ("data_max", lambda xd, ad: ops.fake_quantize_nnie(x(xd), t(3.0, ad))),
        ("alpha", lambda xd, ad: ops.fake_quantize_adaround_per_tensor(
            x(xd), t([0.1], xd), zi(xd), x(ad), -128, 127)),
        ("scale", lambda xd, ad: ops.fake_quantize_adaround_per_channel(
            x(xd), t([0.1] * 2, ad), zi(xd, 2), x(xd), 0, -128, 127)),
        ("scale", lambda xd, ad: ops.fake_quantize_qdrop_per_tensor(
            x(xd), t([0.1], ad), zi(xd), -128, 127, 1.0)),
        ("scale_factor", lambda xd, ad: ops.fold_bn_train(
            x(xd, (2, 3, 4)), t([1.0] * 3, ad), None, None, None, t([0.0] * 3, xd),
            t([1.0] * 3, xd), 0.1, 1e-5, False)),
        ("running_mean", lambda xd, ad: ops.fold_bn_train(
            x(xd, (2, 3, 4)), t([1.0] * 3, xd), None, None, None, t([0.0] * 3, ad),
            t([1.0] * 3, xd), 0.1, 1e-5, False)),
    ]


MISMATCH = _mismatch_cases()


@needs_gpu
@pytest.mark.parametrize("x_on_cuda", [True, False], ids=["x_cuda", "x_cpu"])
@pytest.mark.parametrize("case", range(len(MISMATCH)),
                         ids=[f"{i}-{name}" for i, (name, _) in enumerate(MISMATCH)])
def test_arguments_on_another_device_than_x_are_an_error(case, x_on_cuda):
    """A qparam on another device than x is a RuntimeError naming the argument and both devices
    (a CUDA kernel must not read a CPU pointer, nor the CPU kernel a device one)."""
    arg, call = MISMATCH[case]
    xd, ad = ("cuda", "cpu") if x_on_cuda else ("cpu", "cuda")
    with pytest.raises(RuntimeError) as info:
        call(xd, ad)
        torch.cuda.synchronize()
    message = str(info.value)
    assert re.search(rf"(?<![A-Za-z_]){arg}(?![A-Za-z_])", message), message
    assert "cpu" in message and "cuda" in message, message


def test_mismatch_cases_run_on_one_device():
    """The calls of the device-mismatch test are valid with every tensor on the CPU (so on the
    GPU they fail for the device alone)."""
    for _, call in MISMATCH:
        call("cpu", "cpu")
