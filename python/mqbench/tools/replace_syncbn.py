"""``replace_bn_to_syncbn``: BatchNorm2d -> synchronised BatchNorm, for QAT on several processes
(MQBench main's ``mqbench.tools.replace_syncbn``).

MQBench's version imports ``SyncBatchNorm2d`` from SenseTime's internal ``spring.linklink`` (so it
does not import anywhere else) and passes its ``custombn`` only to the first level of its
recursion. Here the default is torch's own ``torch.nn.SyncBatchNorm``, ``custombn`` reaches every
level, and the walk is a loop over ``named_modules`` (no recursion over a deep model).

Every ``nn.BatchNorm2d`` (exact type, as MQBench) becomes ``custombn(num_features, eps, momentum,
affine)`` sharing the old one's parameters and running statistics, wherever it sits: a plain
child, the ``bn`` of a fused QAT ConvBn / ConvBnReLU module, the first element of a BNReLU2d.
Example::

    model = prepare_by_platform(model, BackendType.Tensorrt)
    model = replace_bn_to_syncbn(model)            # before wrapping in DDP
    model = torch.nn.parallel.DistributedDataParallel(model.cuda())
"""
import torch

__all__ = ["replace_bn_to_syncbn"]


def _replace_bn(bn, custombn):
    syncbn = custombn(bn.num_features, bn.eps, bn.momentum, bn.affine)
    if bn.affine:
        syncbn.weight = bn.weight
        syncbn.bias = bn.bias
    syncbn.running_mean = bn.running_mean
    syncbn.running_var = bn.running_var
    if getattr(bn, "num_batches_tracked", None) is not None:
        syncbn.num_batches_tracked = bn.num_batches_tracked
    syncbn.train(bn.training)
    return syncbn


def replace_bn_to_syncbn(model, custombn=torch.nn.SyncBatchNorm):
    """Replaces every ``nn.BatchNorm2d`` in ``model`` by ``custombn``, in place.

    Args:
        model: any ``nn.Module`` (a prepared GraphModule included); a BatchNorm2d itself is
            replaced by the returned module.
        custombn: the class to build, called as ``custombn(num_features, eps, momentum,
            affine)``; ``torch.nn.SyncBatchNorm`` by default.

    Returns the model (or the new module, when ``model`` is itself a BatchNorm2d).
    """
    if type(model) is torch.nn.BatchNorm2d:
        return _replace_bn(model, custombn)
    for _, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.BatchNorm2d:
                setattr(parent, name, _replace_bn(child, custombn))
    return model
