"""``FrozenBatchNorm2d``: a BatchNorm2d that always uses (and never updates) its running
statistics, for models whose BN is frozen from the start (detection backbones)."""
import torch.nn as nn

__all__ = ["FrozenBatchNorm2d"]


class FrozenBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose ``training`` is always False; ``train()`` does not change it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.training = False

    def train(self, mode=True):
        self.training = False
        return self
