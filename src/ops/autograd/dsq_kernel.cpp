// Autograd for the DSQ ops: gradient to x only (formulas: common/algorithm_formula.h).

#include <torch/library.h>

#include "ops/autograd/op_function.h"
#include "ops/common/checks.h"

namespace mqbench {
namespace ops {
namespace {

using T = const at::Tensor&;

constexpr char kPerTensor[] = "mqbench::fake_quantize_dsq_per_tensor";
constexpr char kPerTensorBackward[] = "mqbench::_fake_quantize_dsq_per_tensor_backward";
constexpr char kPerChannel[] = "mqbench::fake_quantize_dsq_per_channel";
constexpr char kPerChannelBackward[] = "mqbench::_fake_quantize_dsq_per_channel_backward";

// (x, scale, zero_point, [ch_axis,] qmin, qmax, alpha) -> dx
using DsqPerTensor = detail::OpFunction<detail::OpPair<kPerTensor, kPerTensorBackward, at::Tensor>,
                                        T, T, T, int64_t, int64_t, double>;
using DsqPerChannel =
    detail::OpFunction<detail::OpPair<kPerChannel, kPerChannelBackward, at::Tensor>, T, T, T,
                       int64_t, int64_t, int64_t, double>;

at::Tensor per_tensor_autograd(T x, T scale, T zero_point, int64_t qmin, int64_t qmax,
                               double alpha) {
  detail::check_devices("fake_quantize_dsq_per_tensor", x,
                        {{scale, "scale"}, {zero_point, "zero_point"}});
  return DsqPerTensor::apply(x, scale, zero_point, qmin, qmax, alpha);
}

at::Tensor per_channel_autograd(T x, T scale, T zero_point, int64_t ch_axis, int64_t qmin,
                                int64_t qmax, double alpha) {
  detail::check_devices("fake_quantize_dsq_per_channel", x,
                        {{scale, "scale"}, {zero_point, "zero_point"}});
  return DsqPerChannel::apply(x, scale, zero_point, ch_axis, qmin, qmax, alpha);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) {
  m.impl("fake_quantize_dsq_per_tensor", TORCH_FN(per_tensor_autograd));
  m.impl("fake_quantize_dsq_per_channel", TORCH_FN(per_channel_autograd));
}

}  // namespace ops
}  // namespace mqbench
