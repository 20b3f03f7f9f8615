// Autograd for the FP8 fake-quantize ops (ops/fake_quantize_fp8.cpp): each forward re-dispatches
// below autograd; each backward calls the op's `_..._backward` op (Note [Backward op arguments]).

#include <torch/library.h>

#include "ops/autograd/op_function.h"
#include "ops/common/checks.h"

namespace mqbench {
namespace ops {
namespace {

using T = const at::Tensor&;
using Axis = c10::optional<int64_t>;
using detail::OpFunction;
using detail::OpPair;

constexpr char kFixed[] = "mqbench::fake_quantize_fp8";
constexpr char kFixedBwd[] = "mqbench::_fake_quantize_fp8_backward";
constexpr char kLearn[] = "mqbench::fake_quantize_learnable_fp8";
constexpr char kLearnBwd[] = "mqbench::_fake_quantize_learnable_fp8_backward";

// (x, scale, ch_axis, dtype) -> dx;  (x, scale, ch_axis, dtype, grad_factor) -> (dx, d_scale).
using Fixed = OpFunction<OpPair<kFixed, kFixedBwd, at::Tensor>, T, T, Axis, std::string>;
using Learnable = OpFunction<OpPair<kLearn, kLearnBwd, std::tuple<at::Tensor, at::Tensor>>, T,
                             T, Axis, std::string, double>;

at::Tensor fp8_autograd(const at::Tensor& x, const at::Tensor& scale, Axis ch_axis,
                        std::string dtype) {
  detail::check_devices("fake_quantize_fp8", x, {{scale, "scale"}});
  return Fixed::apply(x, scale, ch_axis, std::move(dtype));
}

at::Tensor learnable_fp8_autograd(const at::Tensor& x, const at::Tensor& scale, Axis ch_axis,
                                  std::string dtype, double grad_factor) {
  detail::check_devices("fake_quantize_learnable_fp8", x, {{scale, "scale"}});
  return Learnable::apply(x, scale, ch_axis, std::move(dtype), grad_factor);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) {
  m.impl("fake_quantize_fp8", TORCH_FN(fp8_autograd));
  m.impl("fake_quantize_learnable_fp8", TORCH_FN(learnable_fp8_autograd));
}

}  // namespace ops
}  // namespace mqbench
