#pragma once
// C++ entry point of the Walsh-Hadamard transform (src/ops/hadamard_transform.cpp), the online
// rotation of LLM activations (QuaRot): it calls the op through torch's dispatcher, so
// autograd, TorchScript and Python (`torch.ops.mqbench.hadamard_transform`) run the same
// kernels (CPU, CUDA). Formula and rounding: docs/ops.md, "Hadamard transform".

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

namespace mqbench {
namespace ops {

/// y = x @ M^T along the last axis, M = scale * (had kron S_p), with S_p Sylvester's Hadamard
/// matrix of order p = 2^k in natural order (S_1 = [1], S_2j = [[S_j, S_j], [S_j, -S_j]]).
///
/// x: float32, float64, float16 or bfloat16, any shape with at least one dimension and any
/// strides; n = x.size(-1). Without `had`, n must be a power of two; with `had` (an [m, m]
/// floating matrix on x's device, any values, usually a Hadamard matrix of order m such as 12,
/// 20, 28 or 172), n must be m * 2^k. Computed in float32 (float64 for float64 x) by
/// butterflies, then the product with had; the output is contiguous, in x's dtype.
/// Gradient: dx = hadamard_transform(dy, had^T, scale); `had` gets none (an `had` that requires
/// grad is refused). With scale = 1 / sqrt(n) and had a Hadamard matrix, M is orthogonal.
///
///   auto x = torch::randn({2048, 4096});
///   auto y = mqbench::ops::hadamard_transform(x, {}, 1.0 / std::sqrt(4096.0));   // |y| == |x|
///   auto h12 = ...;                                      // a 12 x 12 Hadamard matrix
///   auto z = mqbench::ops::hadamard_transform(torch::randn({8, 768}), h12,
///                                             1.0 / std::sqrt(768.0));          // 768 = 12 * 64
at::Tensor hadamard_transform(const at::Tensor& x,
                              const c10::optional<at::Tensor>& had = c10::nullopt,
                              double scale = 1.0);

}  // namespace ops
}  // namespace mqbench
