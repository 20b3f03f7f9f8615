#pragma once
// Shared by the CPU (ops/bn_fold.cpp) and CUDA (ops/cuda/bn_fold_kernel.cu) implementations of
// fold_bn_train (Note [Fused BN folding] in ops/bn_fold.cpp).

#include <ATen/core/Tensor.h>

namespace mqbench {
namespace ops {
namespace detail {

/// torch's running-statistics update from the batch statistics of x (mean_x, biased var_x, per
/// channel, float64) with z = x / s + b: running_mean += f (mean_z - running_mean),
/// running_var += f (var_z m / (m - 1) - running_var). No-op when either buffer is undefined.
void update_bn_running_stats(at::Tensor& running_mean, at::Tensor& running_var,
                             const at::Tensor& mean_x, const at::Tensor& var_x,
                             const at::Tensor& s_f, const at::Tensor& b_f, int64_t m,
                             double factor);

}  // namespace detail
}  // namespace ops
}  // namespace mqbench
