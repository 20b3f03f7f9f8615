"""The rotations ``rotate`` folds and the learned ones of ``mode="spinquant"`` share: a random
Hadamard (or dense orthogonal) matrix applied on the right of a tensor's last dimension."""
import math

import torch

from mqbench.nn.modules.hadamard import hadamard_factor, random_orthogonal
from mqbench.utils.logger import logger


class _Rotation(object):
    """Q = diag(signs) H^T / sqrt(n), or a dense orthogonal matrix; ``right(x)`` = x Q on the last
    dimension, in float64."""

    def __init__(self, n, generator, name, randomize=True, dense=None):
        self.n, self.name = n, name
        self.dense = dense
        self.signs = None
        factor = hadamard_factor(n) if dense is None else None
        if dense is None and factor is None:
            logger.warning(f"rotate: no Hadamard matrix of order {n} is known ({name}); a random "
                           "orthogonal matrix is folded instead")
            self.dense = random_orthogonal(n, generator)
        elif dense is None:
            self.had = None if factor[0] is None else factor[0].double()
            if randomize:
                self.signs = torch.randint(0, 2, (n,), generator=generator).double() * 2 - 1

    def right(self, x):
        x = x.double()
        if self.dense is not None:
            return x @ self.dense.to(x.device)
        if self.signs is not None:
            x = x * self.signs.to(x.device)
        had = None if self.had is None else self.had.to(x.device)
        return torch.ops.mqbench.hadamard_transform(x, had, 1.0 / math.sqrt(self.n))
