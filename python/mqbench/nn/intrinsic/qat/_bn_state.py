"""The BatchNorm state rules shared by every fused QAT module with a BatchNorm (``self.bn``):
frozen or updating statistics, and a ``train()`` that leaves a frozen BatchNorm in eval mode."""
from torch.nn import init

__all__ = ["BnStateMixin"]


class BnStateMixin:
    """``freeze_bn_stats`` / ``update_bn_stats`` / ``reset_running_stats`` and the frozen-BN
    ``train()`` rule of torch's fused QAT modules."""

    def reset_running_stats(self):
        self.bn.reset_running_stats()

    def _reset_bn(self):
        """torch's BatchNorm initialisation of a fused QAT module: fresh statistics, weight
        uniform in [0, 1), bias 0."""
        self.bn.reset_running_stats()
        init.uniform_(self.bn.weight)
        init.zeros_(self.bn.bias)

    def _set_bn_mode(self, freeze_bn):
        """The constructor's rule: BatchNorm updates only in training and when not frozen."""
        if self.training and not freeze_bn:
            self.update_bn_stats()
        else:
            self.freeze_bn_stats()

    def _share_float_state(self, layer, bn):
        """``from_float``'s sharing: the float layer's weight and bias and the BatchNorm's
        parameters and statistics become this module's (the same tensors, as torch's)."""
        self.weight, self.bias = layer.weight, layer.bias
        self.bn.weight, self.bn.bias = bn.weight, bn.bias
        self.bn.running_mean, self.bn.running_var = bn.running_mean, bn.running_var
        self.bn.num_batches_tracked = bn.num_batches_tracked
        return self

    def update_bn_stats(self):
        self.freeze_bn = False
        self.bn.training = True
        return self

    def freeze_bn_stats(self):
        self.freeze_bn = True
        self.bn.training = False
        return self

    def train(self, mode=True):
        """A frozen BatchNorm stays in eval mode whatever ``train()`` is called with."""
        self.training = mode
        if not self.freeze_bn:
            for module in self.children():
                module.train(mode)
        return self
