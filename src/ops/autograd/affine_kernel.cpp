// Autograd for the affine fake-quantize ops. Each forward re-dispatches below autograd to the
// device kernel; each backward calls the op's own `_..._backward` op.
//
// Note [Saving the input instead of a mask]
// torch's fake-quant ops write a bool mask in forward (9 bytes/element moved) and multiply by
// it in backward. We save x and recompute the mask in backward instead: forward then moves
// 8 bytes/element (the copy_ bound), and x is nearly always alive anyway (it is the output of
// the ReLU/conv that feeds the quantizer, or a weight). The learnable ops need x in backward
// regardless.

#include <torch/library.h>

#include "ops/autograd/op_function.h"
#include "ops/common/checks.h"

namespace mqbench {
namespace ops {
namespace {

using T = const at::Tensor&;
using Grads3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using detail::OpFunction;
using detail::OpPair;

constexpr char kFixedTensor[] = "mqbench::fake_quantize_per_tensor_affine";
constexpr char kFixedTensorBwd[] = "mqbench::_fake_quantize_per_tensor_affine_backward";
constexpr char kFixedChannel[] = "mqbench::fake_quantize_per_channel_affine";
constexpr char kFixedChannelBwd[] = "mqbench::_fake_quantize_per_channel_affine_backward";
constexpr char kLearnTensor[] = "mqbench::fake_quantize_learnable_per_tensor_affine";
constexpr char kLearnTensorBwd[] = "mqbench::_fake_quantize_learnable_per_tensor_affine_backward";
constexpr char kLearnChannel[] = "mqbench::fake_quantize_learnable_per_channel_affine";
constexpr char kLearnChannelBwd[] =
    "mqbench::_fake_quantize_learnable_per_channel_affine_backward";

// Fixed: (x, scale, zero_point, [ch_axis,] qmin, qmax) -> dx.
using FixedPerTensor =
    OpFunction<OpPair<kFixedTensor, kFixedTensorBwd, at::Tensor>, T, T, T, int64_t, int64_t>;
using FixedPerChannel = OpFunction<OpPair<kFixedChannel, kFixedChannelBwd, at::Tensor>, T, T, T,
                                   int64_t, int64_t, int64_t>;
// Learnable: (x, scale, zero_point, [ch_axis,] qmin, qmax, grad_factor) -> (dx, ds, dz).
using LearnablePerTensor = OpFunction<OpPair<kLearnTensor, kLearnTensorBwd, Grads3>, T, T, T,
                                      int64_t, int64_t, double>;
using LearnablePerChannel = OpFunction<OpPair<kLearnChannel, kLearnChannelBwd, Grads3>, T, T, T,
                                       int64_t, int64_t, int64_t, double>;

at::Tensor per_tensor_autograd(const at::Tensor& x, const at::Tensor& scale,
                               const at::Tensor& zero_point, int64_t qmin, int64_t qmax) {
  detail::check_devices("fake_quantize_per_tensor_affine", x, {{scale, "scale"}, {zero_point, "zero_point"}});
  return FixedPerTensor::apply(x, scale, zero_point, qmin, qmax);
}

at::Tensor per_channel_autograd(const at::Tensor& x, const at::Tensor& scale,
                                const at::Tensor& zero_point, int64_t ch_axis, int64_t qmin,
                                int64_t qmax) {
  detail::check_devices("fake_quantize_per_channel_affine", x, {{scale, "scale"}, {zero_point, "zero_point"}});
  return FixedPerChannel::apply(x, scale, zero_point, ch_axis, qmin, qmax);
}

at::Tensor learnable_per_tensor_autograd(const at::Tensor& x, const at::Tensor& scale,
                                         const at::Tensor& zero_point, int64_t qmin, int64_t qmax,
                                         double grad_factor) {
  detail::check_devices("fake_quantize_learnable_per_tensor_affine", x, {{scale, "scale"}, {zero_point, "zero_point"}});
  return LearnablePerTensor::apply(x, scale, zero_point, qmin, qmax, grad_factor);
}

at::Tensor learnable_per_channel_autograd(const at::Tensor& x, const at::Tensor& scale,
                                          const at::Tensor& zero_point, int64_t ch_axis,
                                          int64_t qmin, int64_t qmax, double grad_factor) {
  detail::check_devices("fake_quantize_learnable_per_channel_affine", x, {{scale, "scale"}, {zero_point, "zero_point"}});
  return LearnablePerChannel::apply(x, scale, zero_point, ch_axis, qmin, qmax, grad_factor);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) {
  m.impl("fake_quantize_per_tensor_affine", TORCH_FN(per_tensor_autograd));
  m.impl("fake_quantize_per_channel_affine", TORCH_FN(per_channel_autograd));
  m.impl("fake_quantize_learnable_per_tensor_affine", TORCH_FN(learnable_per_tensor_autograd));
  m.impl("fake_quantize_learnable_per_channel_affine", TORCH_FN(learnable_per_channel_autograd));
}

}  // namespace ops
}  // namespace mqbench
