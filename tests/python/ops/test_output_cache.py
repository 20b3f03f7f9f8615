"""The fake-quantize ops' cache of large CPU output buffers (src/ops/common/output_buffers.cpp,
Note [Reused output buffers]): a freed output's buffer is reused by the next output of the same
size; values, strides, storage size and resizing behave as with torch.empty_like; the limit and
the off switch (MQBENCH_OUTPUT_CACHE_MB) hold."""
import os
import subprocess
import sys

import pytest
import torch

import mqbench
from mqbench import _C

ops = torch.ops.mqbench
N = 9 * 1024 * 1024  # 36 MiB of floats: cached (above 32 MiB)


def fq(x):
    return ops.fake_quantize_per_tensor_affine(x, torch.tensor([0.02]),
                                               torch.tensor([0], dtype=torch.int32), -128, 127)


def test_a_freed_output_buffer_is_reused_and_the_values_are_right():
    _C.release_cached_outputs()
    x = torch.randn(4, N // 4)
    y = fq(x)
    first = y.data_ptr()
    assert y.untyped_storage().nbytes() == x.nbytes  # exact: torch.save writes no stale tail
    del y
    assert _C.output_cache_bytes() >= x.nbytes
    y = fq(x * 2)
    assert y.data_ptr() == first and _C.output_cache_bytes() == 0
    torch.testing.assert_close(y, torch.fake_quantize_per_tensor_affine(x * 2, 0.02, 0, -128, 127),
                               rtol=0, atol=0)
    # a second live output of that size gets a buffer of its own
    z = fq(x)
    assert z.data_ptr() != y.data_ptr()
    torch.testing.assert_close(z, torch.fake_quantize_per_tensor_affine(x, 0.02, 0, -128, 127),
                               rtol=0, atol=0)
    # LSQ's backward (dx) goes through the cache too
    grads = []
    for op in (ops.fake_quantize_learnable_per_tensor_affine,
               torch._fake_quantize_learnable_per_tensor_affine):
        xs = x.clone().requires_grad_()
        op(xs, torch.tensor([0.02]), torch.tensor([0.0]), -128, 127, 1.0).sum().backward()
        grads.append(xs.grad)
    assert torch.equal(*grads)
    del y, z
    assert _C.release_cached_outputs() >= 2 * x.nbytes and _C.output_cache_bytes() == 0


def test_strides_are_preserved_and_the_output_resizes():
    x = torch.randn(2, 64, 256, 288).to(memory_format=torch.channels_last)  # 36 MiB
    y = fq(x)
    assert y.data_ptr() % (2 << 20) == 0  # a cache buffer (2 MiB aligned), not torch's memory
    assert y.stride() == x.stride() and y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, torch.fake_quantize_per_tensor_affine(x, 0.02, 0, -128, 127),
                               rtol=0, atol=0)
    before = y.clone()
    y.resize_(y.numel() + 10)  # moves to torch's allocator; the buffer goes back to the cache
    assert torch.equal(y[:before.numel()], before.permute(0, 2, 3, 1).reshape(-1))


def run(env_mb, code):
    package_root = os.path.dirname(os.path.dirname(mqbench.__file__))
    env = dict(os.environ, MQBENCH_OUTPUT_CACHE_MB=env_mb,
               PYTHONPATH=os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


CODE = f"""
import torch, mqbench
from mqbench import _C
ops = torch.ops.mqbench
x = torch.randn({N})
ys = [ops.fake_quantize_per_tensor_affine(x * k, torch.tensor([0.02]),
      torch.tensor([0], dtype=torch.int32), -128, 127) for k in range(3)]
del ys
print(_C.output_cache_bytes())
"""


@pytest.mark.parametrize("mb,held", [("40", 1), ("80", 2), ("0", 0)])
def test_the_limit_and_the_off_switch(mb, held):
    r = run(mb, CODE)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[-1]) == held * 36 * 1024 * 1024


def test_the_least_recently_freed_buffers_make_room():
    # a 36 MiB and a 72 MiB output freed in turn under an 80 MiB limit: the newest size stays
    r = run("80", f"""
import torch, mqbench
from mqbench import _C
ops = torch.ops.mqbench
def fq(x):
    return ops.fake_quantize_per_tensor_affine(x, torch.tensor([0.02]),
                                               torch.tensor([0], dtype=torch.int32), -128, 127)
a = fq(torch.randn({N}))
del a
b = fq(torch.randn({2 * N}))
p = b.data_ptr()
del b
print(_C.output_cache_bytes(), fq(torch.randn({2 * N})).data_ptr() == p)
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-2:] == [str(72 * 1024 * 1024), "True"]


def test_a_bad_limit_is_refused_naming_the_variable():
    r = run("lots", CODE)
    assert r.returncode != 0 and "MQBENCH_OUTPUT_CACHE_MB must be a whole number" in r.stderr
