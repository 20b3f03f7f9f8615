"""Conv2d + BatchNorm2d (+ ReLU) QAT modules whose training-mode BatchNorm folding runs as one C++
op (``torch.ops.mqbench.fold_bn_train``, Note [Fused BN folding] in src/ops/bn_fold.cpp).

They are torch's ``torch.nn.intrinsic.qat.ConvBn2d`` / ``ConvBnReLU2d`` (same parameters,
buffers, state-dict keys, ``freeze_bn_stats``/``update_bn_stats``, ``from_float``, eval-mode
path), with the training forward replaced: torch divides every conv output by the folding
scale, adds the bias back and runs BatchNorm and ReLU as separate full-size passes, forward and
backward; here that is two passes each way. Numerically the two agree to float rounding.
"""
import torch
import torch.nn.functional as F
import torch.nn.intrinsic.qat as nniqat

__all__ = ["ConvBn2d", "ConvBnReLU2d"]


def _fused_forward(module, input, relu):
    bn = module.bn
    fast = (bn.training and bn.track_running_stats and bn.affine
            and input.dtype == torch.float32 and input.device.type == "cpu"
            and not module._enable_slow_path_for_better_numerical_stability)
    if not fast:
        out = nniqat.ConvBn2d._forward(module, input)
        return F.relu(out) if relu else out
    running_std = torch.sqrt(bn.running_var + bn.eps)
    scale_factor = bn.weight / running_std
    weight_shape = [1] * len(module.weight.shape)
    weight_shape[0] = -1
    scaled_weight = module.weight_fake_quant(module.weight * scale_factor.reshape(weight_shape))
    conv = module._conv_forward(input, scaled_weight, None)
    # torch BatchNorm's running-average factor
    bn.num_batches_tracked.add_(1)
    factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
    return torch.ops.mqbench.fold_bn_train(conv, scale_factor, module.bias, bn.weight, bn.bias,
                                           bn.running_mean, bn.running_var, factor, bn.eps,
                                           relu)[0]


class ConvBn2d(nniqat.ConvBn2d):
    """torch's ConvBn2d QAT module with the fused training-mode folding."""

    def _forward(self, input):
        return _fused_forward(self, input, relu=False)


class ConvBnReLU2d(nniqat.ConvBnReLU2d):
    """torch's ConvBnReLU2d QAT module with the fused training-mode folding and ReLU."""

    def forward(self, input):
        return _fused_forward(self, input, relu=True)
