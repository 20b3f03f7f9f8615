#pragma once
// C++ entry point of the fused BatchNorm-folding op (Note [Fused BN folding] in
// src/ops/bn_fold.cpp): given x = conv(input, fake_quant(W * s)) with s = gamma / sqrt(var + eps),
// computes batch_norm(x / s + bias) with batch statistics (optionally followed by ReLU), updates
// the running statistics in place, and returns (y, mean_x, rstd). Differentiable in x,
// scale_factor, bias, bn_weight and bn_bias. float32, [N, C, ...], CPU.
//
// Example:
//   auto [y, mean, rstd] = mqbench::ops::fold_bn_train(x, s, bias, bn->weight, bn->bias,
//                                                      bn->running_mean, bn->running_var,
//                                                      0.1, 1e-5, /*relu=*/true);

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <tuple>

namespace mqbench {
namespace ops {

std::tuple<at::Tensor, at::Tensor, at::Tensor> fold_bn_train(
    const at::Tensor& x, const at::Tensor& scale_factor, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& bn_weight, const c10::optional<at::Tensor>& bn_bias,
    at::Tensor& running_mean, at::Tensor& running_var, double exponential_average_factor,
    double eps, bool relu);

}  // namespace ops
}  // namespace mqbench
