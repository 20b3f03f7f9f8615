"""Hadamard matrices of every size the constructions below reach, and ``HadamardRotation``, the
module that rotates its input by one at run time (``torch.ops.mqbench.hadamard_transform``).

A Hadamard matrix H of order n has entries +-1 and H H^T = n I, so H / sqrt(n) is orthogonal.
Orders reached here: n = m * 2^k, with H_n = H_m (x) S_{2^k} (Kronecker product; S is
Sylvester's matrix, the op's fast butterflies) and H_m one of
  * m = 1 or 2 (Sylvester),
  * m = q + 1 for a prime q = 3 (mod 4) (Paley's first construction: 4, 8, 12, 20, 24, 32,
    44, 48, 60, 68, 72, 80, 84, 104, 108, ...),
  * m = 2 (q + 1) for a prime q = 1 (mod 4) (Paley's second: 12, 28, 36, 60, 76, 84, 108,
    124, 148, ...),
the smallest such m being taken. The widths of the usual LLMs factor so: 4096 = 2^12,
768 = 12 * 2^6, 14336 = 28 * 2^9 (Llama-3), 18944 = 148 * 2^7 (Qwen2.5-7B). A width with none
(11008 = 172 * 2^6 would need 172, which neither construction gives from a prime) has no
Hadamard here: ``hadamard_factor`` returns None and the callers fall back to a random
orthogonal matrix, with a warning.
"""
import functools
import math

import torch
from torch import nn

__all__ = ["HadamardRotation", "InputRotationHook", "hadamard_factor", "hadamard_matrix",
           "input_rotations", "random_orthogonal", "without_input_rotations"]

# the largest m built by Paley's constructions (an m x m matrix; larger m are not needed by the
# widths above and cost O(m^2) to build)
_MAX_M = 1024


def _is_prime(q):
    if q < 2:
        return False
    for p in range(2, int(math.isqrt(q)) + 1):
        if q % p == 0:
            return False
    return True


def _jacobsthal(q):
    """Q[i][j] = chi(j - i) for the quadratic character chi of GF(q), q prime."""
    chi = [0] + [1 if pow(a, (q - 1) // 2, q) == 1 else -1 for a in range(1, q)]
    return torch.tensor([[chi[(j - i) % q] for j in range(q)] for i in range(q)],
                        dtype=torch.float64)


def _paley_1(q):
    """Order q + 1, q = 3 (mod 4) prime: I + [[0, 1^T], [-1, Q]] (Q antisymmetric)."""
    n = q + 1
    s = torch.zeros(n, n, dtype=torch.float64)
    s[0, 1:] = 1.0
    s[1:, 0] = -1.0
    s[1:, 1:] = _jacobsthal(q)
    return s + torch.eye(n, dtype=torch.float64)


def _paley_2(q):
    """Order 2 (q + 1), q = 1 (mod 4) prime: C = [[0, 1^T], [1, Q]] (symmetric) with each 0
    replaced by [[1, -1], [-1, -1]] and each +-1 by +-[[1, 1], [1, -1]]."""
    n = q + 1
    c = torch.zeros(n, n, dtype=torch.float64)
    c[0, 1:] = 1.0
    c[1:, 0] = 1.0
    c[1:, 1:] = _jacobsthal(q)
    zero = torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
    one = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    return torch.kron(c, one) + torch.kron((c == 0).double(), zero)


@functools.lru_cache(maxsize=None)
def _base(m):
    """An m x m Hadamard matrix (float64) by Paley's constructions, or None."""
    if m == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    if m == 2:
        return torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    if m % 4 or m > _MAX_M:
        return None
    h = None
    if _is_prime(m - 1) and (m - 1) % 4 == 3:
        h = _paley_1(m - 1)
    elif m % 2 == 0 and _is_prime(m // 2 - 1) and (m // 2 - 1) % 4 == 1:
        h = _paley_2(m // 2 - 1)
    if h is None:
        return None
    # the constructions are exact; a wrong one must never rotate a model
    if not torch.equal(h @ h.t(), m * torch.eye(m, dtype=torch.float64)):
        raise AssertionError(f"the Hadamard construction of order {m} is not orthogonal")
    return h


def hadamard_factor(n):
    """``(had, m)`` with ``n = m * 2^k``: ``had`` the m x m matrix (float32, entries +-1; None
    where m is a power of two, the op's butterflies alone), or None where no construction
    reaches ``n``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"hadamard_factor: n must be a positive integer, got {n!r}")
    two = n & -n          # the largest power of two dividing n
    if two == n:
        return None, 1
    m = n // two
    while two >= 1:
        h = _base(m)
        if h is not None:
            return h.float(), m
        m, two = m * 2, two // 2
    return None


def hadamard_matrix(n, dtype=torch.float64):
    """The n x n Hadamard matrix ``HadamardRotation`` and the folds apply (unnormalised, +-1), or
    None where ``hadamard_factor(n)`` is None. Dense: for tests and small n."""
    f = hadamard_factor(n)
    if f is None:
        return None
    had, m = f
    eye = torch.eye(n, dtype=torch.float64)
    rows = torch.ops.mqbench.hadamard_transform(eye, None if had is None else had.double(), 1.0)
    return rows.t().to(dtype).contiguous()


def random_orthogonal(n, generator=None, dtype=torch.float64):
    """A random n x n orthogonal matrix (QR of a Gaussian matrix, signs fixed so the draw is
    uniform on the orthogonal group)."""
    a = torch.randn(n, n, dtype=torch.float64, generator=generator)
    q, r = torch.linalg.qr(a)
    return (q * torch.sign(torch.diagonal(r)).unsqueeze(0)).to(dtype)


class HadamardRotation(nn.Module):
    """Rotates the last dimension of its input: ``y = x @ H^T / sqrt(n)``, H the Hadamard matrix
    of order ``n`` (``hadamard_matrix``), by the fast Walsh-Hadamard transform in C++
    (``torch.ops.mqbench.hadamard_transform``; exported to ONNX as a MatMul with the constant
    matrix). The Linear after it holds its weight rotated the same way (``mqbench.llm.rotate``),
    so the pair computes what the Linear computed alone, and a quantizer between them sees the
    rotated values.

    With ``block`` > 1 the input's last dimension is ``n * block`` and the rotation runs across
    the n blocks, position by position: ``(H / sqrt(n)) kron I_block``, e.g. across an
    attention output's heads (n heads of ``block`` = head_dim values).

    Where no Hadamard matrix of order ``n`` is known, ``matrix`` (an orthogonal n x n tensor)
    is applied instead: ``x @ matrix`` on the rotated axis, in float32 at least (a random
    orthogonal matrix rounded to 16 bits is no longer orthogonal).

    A Hadamard rotation holds no state (its small factor is a non-persistent buffer, rebuilt
    from ``n``): a state_dict does not change when one is added. A dense ``matrix`` cannot be
    rebuilt, so it is a buffer of the state dict (``<module>.matrix``).
    """

    def __init__(self, n, matrix=None, block=1):
        super().__init__()
        self.n = int(n)
        self.block = int(block)
        if self.block < 1:
            raise ValueError(f"HadamardRotation: block must be >= 1, got {block}")
        factor = hadamard_factor(self.n) if matrix is None else None
        if matrix is None and factor is None:
            raise ValueError(f"HadamardRotation: no Hadamard matrix of order {n} is known; pass "
                             "an orthogonal `matrix` (random_orthogonal(n))")
        if matrix is not None:
            if tuple(matrix.shape) != (self.n, self.n):
                raise ValueError(f"HadamardRotation: matrix must be {self.n} x {self.n}, got "
                                 f"{tuple(matrix.shape)}")
            self.register_buffer("had", None, persistent=False)
            self.register_buffer("matrix", matrix.detach().float().clone())
        else:
            self.register_buffer("had", factor[0], persistent=False)
            self.register_buffer("matrix", None, persistent=False)
        self.scale = 1.0 / math.sqrt(self.n)

    def _rotate(self, x):
        if self.matrix is not None:
            dtype = torch.promote_types(x.dtype, torch.float32)
            return (x.to(dtype) @ self.matrix.to(dtype)).to(x.dtype)
        had = None if self.had is None else self.had.to(x.dtype)
        return torch.ops.mqbench.hadamard_transform(x, had, self.scale)

    def forward(self, x):
        if x.shape[-1] != self.n * self.block:
            raise ValueError(f"HadamardRotation({self.n}" +
                             (f", block={self.block}" if self.block > 1 else "") +
                             f"): the input's last dimension is {x.shape[-1]}")
        if self.block == 1:
            return self._rotate(x)
        y = self._rotate(x.unflatten(-1, (self.n, self.block)).transpose(-1, -2))
        return y.transpose(-1, -2).flatten(-2)

    def extra_repr(self):
        return f"n={self.n}" + (f", block={self.block}" if self.block > 1 else "") + \
            (", dense" if self.matrix is not None else "")


class InputRotationHook(object):
    """The forward pre-hook that passes a module's first input through ``rotation`` (a
    ``HadamardRotation`` the model holds: ``mqbench.llm.rotate``'s R4 before down_proj). An
    object, not a closure, so ``copy.deepcopy`` of the model gives the copy's hook the copy's
    rotation, and the captures can find it (Note [Input rotations in a capture])."""

    def __init__(self, rotation):
        self.rotation = rotation

    def __call__(self, module, args):
        if not args:
            return None
        return (self.rotation(args[0]),) + tuple(args[1:])


# Note [Input rotations in a capture]
# torch.export records the rotation a pre-hook applies as part of the hooked module's call (its
# nn_module_stack holds both the Linear and the rotation module, which is not a submodule of the
# Linear). The export capture therefore ends a module's call where a module its hooks called
# begins: the rotation becomes a call of its own, the Linear's input is the rotation's output,
# and the quantizer the rules put at the Linear's input sees rotated values. The lifted graph
# then calls a copy of the Linear without that hook (sharing its parameters), or the rotation
# would run twice. torch.fx does not run a leaf module's hooks at all, so a model holding input
# rotations is captured by torch.export (``capture="auto"`` with ``example_inputs``).

def input_rotations(module):
    """The rotation modules ``module``'s InputRotationHook pre-hooks call, in order."""
    return [h.rotation for h in module._forward_pre_hooks.values()
            if isinstance(h, InputRotationHook)]


def without_input_rotations(module):
    """A shallow copy of ``module`` (the same parameters and buffers) without its
    InputRotationHook pre-hooks."""
    import collections
    import copy
    twin = copy.copy(module)
    twin._forward_pre_hooks = collections.OrderedDict(
        (k, h) for k, h in module._forward_pre_hooks.items() if not isinstance(h, InputRotationHook))
    return twin
