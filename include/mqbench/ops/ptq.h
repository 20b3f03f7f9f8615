#pragma once
// C++ entry points of the advanced-PTQ ops (src/ops/ptq.cpp): AdaRound's rectified sigmoid,
// alpha initialisation and rounding regularizer, and DFQ's cross-layer-equalization scale.
// Composite ops: they run on any device and autograd differentiates through them.
//
// Example (one AdaRound step on a weight quantized per channel on axis 0):
//   auto alpha = mqbench::ops::adaround_alpha_init(w, scale, 0).requires_grad_();
//   auto w_q = mqbench::ops::fake_quantize_adaround_per_channel(w, scale, zp, alpha, 0, -8, 7,
//                                                               false);
//   auto loss = (conv(x, w_q) - target).pow(2).mean()
//             + 0.01 * mqbench::ops::adaround_regularizer(alpha, beta);

#include <ATen/core/Tensor.h>

namespace mqbench {
namespace ops {

/// h(alpha) = clamp(sigmoid(alpha) * 1.2 - 0.1, 0, 1), AdaRound's soft rounding offset.
at::Tensor adaround_rectified_sigmoid(const at::Tensor& alpha);

/// sum(1 - |2 h(alpha) - 1|^beta): pushes every h(alpha) to 0 or 1 as beta anneals.
at::Tensor adaround_regularizer(const at::Tensor& alpha, double beta);

/// alpha with h(alpha) = x/s - floor(x/s); `ch_axis` -1 for a per-tensor scale.
at::Tensor adaround_alpha_init(const at::Tensor& x, const at::Tensor& scale,
                               int64_t ch_axis = -1);

/// Per output channel of w1, the DFQ equalization scale s (divide layer 1's channel by s,
/// multiply layer 2's matching input channel by s). Grouped and depthwise w2 accepted.
at::Tensor dfq_equalization_scale(const at::Tensor& w1, const at::Tensor& w2,
                                  double s_min = 1e-6, double s_max = 1e6, double eps = 0.0);

}  // namespace ops
}  // namespace mqbench
