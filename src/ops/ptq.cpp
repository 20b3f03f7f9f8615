// Ops of the advanced post-training quantization algorithms that are not fake quantizers:
// AdaRound's rectified sigmoid, its alpha initialisation and rounding regularizer, and the
// cross-layer-equalization scale of DFQ. They are composites of ATen ops
// (CompositeImplicitAutograd): each runs on every device ATen runs on, the meta device traces
// through them (adaround_alpha_init checks its scales on real tensors only, once per layer),
// and autograd differentiates their parts.
//
// AdaRound (Nagel et al. 2020, "Up or Down? Adaptive Rounding for Post-Training Quantization"),
// with the stretch (gamma, zeta) = (-0.1, 1.1) of the paper, MQBench and our AdaRound kernels
// (src/ops/cpu/adaround_kernel.cpp):
//   h(alpha)   = clamp(sigmoid(alpha) * (zeta - gamma) + gamma, 0, 1)
//   alpha_init = -log((zeta - gamma) / (rest - gamma) - 1),  rest = x/s - floor(x/s),
//                so that h(alpha_init) = rest and the soft-rounded weight starts at x
//   reg(beta)  = sum(1 - |2 h(alpha) - 1|^beta)
//
// DFQ (Nagel et al. 2019, "Data-Free Quantization Through Weight Equalization and Bias
// Correction"), MQBench's rule: for output channel i of layer 1 and the matching input channel
// of layer 2 (grouped and depthwise layer 2 included),
//   r1 = max|W1[i]|,  r2 = max|W2[:, i]|,  s = clip(sqrt(r1 * r2 + eps) / (r2 + eps), s_min, s_max)
//   s = 1 where r1 + r2 < 0.5, or where r1 or r2 is 0 (a dead channel)
// and W1[i] / s, b1[i] / s, W2[:, i] * s leave the float function of conv-relu-conv unchanged.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>

#include "mqbench/ops/ptq.h"
#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace {

constexpr double kGamma = -0.1;
constexpr double kZeta = 1.1;

at::Tensor rectified_sigmoid_impl(const at::Tensor& alpha) {
  TORCH_CHECK(alpha.defined(), "adaround_rectified_sigmoid: alpha is an undefined tensor");
  TORCH_CHECK(at::isFloatingType(alpha.scalar_type()),
              "adaround_rectified_sigmoid: alpha must be a floating tensor, got ",
              alpha.scalar_type());
  return at::clamp(at::sigmoid(alpha) * (kZeta - kGamma) + kGamma, 0.0, 1.0);
}

at::Tensor regularizer_impl(const at::Tensor& alpha, double beta) {
  TORCH_CHECK(std::isfinite(beta) && beta > 0.0,
              "adaround_regularizer: beta must be a positive number, got ", beta);
  const auto h = rectified_sigmoid_impl(alpha);
  return (1.0 - (2.0 * h - 1.0).abs().pow(beta)).sum();
}

at::Tensor alpha_init_impl(const at::Tensor& x, const at::Tensor& scale, int64_t ch_axis) {
  const char* op = "adaround_alpha_init";
  TORCH_CHECK(x.defined() && scale.defined(), op, ": x and scale must be defined");
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), op, ": x must be a floating tensor, got ",
              x.scalar_type());
  TORCH_CHECK(x.device() == scale.device(), op, ": x is on ", x.device(), " but scale is on ",
              scale.device());
  auto s = scale.detach().to(x.scalar_type());
  if (ch_axis < 0 && ch_axis != -1) ch_axis += x.dim();
  if (ch_axis == -1 || x.dim() == 0) {
    TORCH_CHECK(s.numel() == 1, op, ": per-tensor scale must have one element, got ", s.numel(),
                " (pass ch_axis for a per-channel scale)");
    s = s.reshape({});
  } else {
    TORCH_CHECK(ch_axis >= 0 && ch_axis < x.dim(), op, ": ch_axis ", ch_axis,
                " is out of range for x of dim ", x.dim());
    TORCH_CHECK(s.numel() == x.size(ch_axis), op, ": scale has ", s.numel(),
                " elements but x has ", x.size(ch_axis), " channels on axis ", ch_axis);
    std::vector<int64_t> shape(x.dim(), 1);
    shape[ch_axis] = x.size(ch_axis);
    s = s.reshape(shape);
  }
  if (!s.is_meta()) {  // a value check: meta tensors (shape tracing) have no values
    TORCH_CHECK((s > 0).all().item<bool>(), op, ": every scale must be positive (calibrate the "
                "weight quantizer before AdaRound)");
  }
  // Same division as the AdaRound kernel's floor(x / s), so h(alpha) reproduces x exactly.
  const auto v = x.detach() / s;
  const auto rest = v - at::floor(v);
  return -at::log((kZeta - kGamma) / (rest - kGamma) - 1.0);
}

at::Tensor dfq_scale_impl(const at::Tensor& w1, const at::Tensor& w2, double s_min, double s_max,
                          double eps) {
  const char* op = "dfq_equalization_scale";
  TORCH_CHECK(w1.defined() && w2.defined(), op, ": w1 and w2 must be defined");
  TORCH_CHECK(w1.dim() >= 2 && w2.dim() >= 2, op, ": weights must have at least 2 dims "
              "(out, in, ...), got w1 ", w1.sizes(), " and w2 ", w2.sizes());
  TORCH_CHECK(s_min > 0.0 && s_max >= s_min, op, ": need 0 < s_min <= s_max, got s_min=", s_min,
              ", s_max=", s_max);
  TORCH_CHECK(eps >= 0.0, op, ": eps must be >= 0, got ", eps);
  const int64_t c1 = w1.size(0), in2 = w2.size(1), c2 = w2.size(0);
  TORCH_CHECK(in2 > 0 && c1 % in2 == 0, op, ": layer 1 has ", c1,
              " output channels, which is not a multiple of layer 2's ", in2,
              " input channels per group");
  const int64_t groups = c1 / in2;
  TORCH_CHECK(c2 % groups == 0, op, ": layer 2 has ", c2, " output channels, not divisible by ",
              groups, " groups");
  const auto r1 = w1.detach().abs().reshape({c1, -1}).amax(1);
  // |W2| reduced over its kernel dims -> [c2, in2] -> per group [groups, c2/groups, in2] -> the
  // max over each group's output channels: input channel j of group g is channel g*in2 + j.
  const auto r2 = w2.detach().abs().reshape({c2, in2, -1}).amax(2)
                      .reshape({groups, c2 / groups, in2}).amax(1).reshape({c1})
                      .to(r1.scalar_type());
  auto s = at::clamp(at::sqrt(r1 * r2 + eps) / (r2 + eps), s_min, s_max);
  // MQBench's small-range rule, and dead channels (an all-zero row of either layer: 0/0, or a
  // bias divided by s_min) keep their scale
  return at::where((r1 + r2 < 0.5) | (r1 == 0) | (r2 == 0), at::ones_like(s), s);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("adaround_rectified_sigmoid(Tensor alpha) -> Tensor");
  m.def("adaround_regularizer(Tensor alpha, float beta) -> Tensor");
  m.def("adaround_alpha_init(Tensor x, Tensor scale, int ch_axis=-1) -> Tensor");
  m.def("dfq_equalization_scale(Tensor w1, Tensor w2, float s_min=1e-6, float s_max=1e6, "
        "float eps=0.) -> Tensor");
}

TORCH_LIBRARY_IMPL(mqbench, CompositeImplicitAutograd, m) {
  m.impl("adaround_rectified_sigmoid", TORCH_FN(rectified_sigmoid_impl));
  m.impl("adaround_regularizer", TORCH_FN(regularizer_impl));
  m.impl("adaround_alpha_init", TORCH_FN(alpha_init_impl));
  m.impl("dfq_equalization_scale", TORCH_FN(dfq_scale_impl));
}

at::Tensor adaround_rectified_sigmoid(const at::Tensor& alpha) {
  static auto op = detail::op_handle<decltype(adaround_rectified_sigmoid)>(
      "mqbench::adaround_rectified_sigmoid");
  return op.call(alpha);
}

at::Tensor adaround_regularizer(const at::Tensor& alpha, double beta) {
  static auto op =
      detail::op_handle<decltype(adaround_regularizer)>("mqbench::adaround_regularizer");
  return op.call(alpha, beta);
}

at::Tensor adaround_alpha_init(const at::Tensor& x, const at::Tensor& scale, int64_t ch_axis) {
  static auto op =
      detail::op_handle<decltype(adaround_alpha_init)>("mqbench::adaround_alpha_init");
  return op.call(x, scale, ch_axis);
}

at::Tensor dfq_equalization_scale(const at::Tensor& w1, const at::Tensor& w2, double s_min,
                                  double s_max, double eps) {
  static auto op =
      detail::op_handle<decltype(dfq_equalization_scale)>("mqbench::dfq_equalization_scale");
  return op.call(w1, w2, s_min, s_max, eps);
}

}  // namespace ops
}  // namespace mqbench
