// Autograd for the DSQ ops: gradient to x only (formulas: cpu/dsq_kernel.cpp).

#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "ops/common/checks.h"
#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using T = const at::Tensor&;

class DsqPerTensor : public torch::autograd::Function<DsqPerTensor> {
 public:
  static at::Tensor forward(AutogradContext* ctx, T x, T scale, T zero_point, int64_t qmin,
                            int64_t qmax, double alpha) {
    static auto op = detail::op_handle<at::Tensor(T, T, T, int64_t, int64_t, double)>(
        "mqbench::fake_quantize_dsq_per_tensor");
    ctx->save_for_backward({x, scale, zero_point});
    ctx->saved_data["qmin"] = qmin;
    ctx->saved_data["qmax"] = qmax;
    ctx->saved_data["alpha"] = alpha;
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(x, scale, zero_point, qmin, qmax, alpha);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto op = detail::op_handle<at::Tensor(T, T, T, T, int64_t, int64_t, double)>(
        "mqbench::_fake_quantize_dsq_per_tensor_backward");
    const auto s = ctx->get_saved_variables();
    auto dx = op.call(grads[0], s[0], s[1], s[2], ctx->saved_data["qmin"].toInt(),
                      ctx->saved_data["qmax"].toInt(), ctx->saved_data["alpha"].toDouble());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class DsqPerChannel : public torch::autograd::Function<DsqPerChannel> {
 public:
  static at::Tensor forward(AutogradContext* ctx, T x, T scale, T zero_point, int64_t ch_axis,
                            int64_t qmin, int64_t qmax, double alpha) {
    static auto op = detail::op_handle<at::Tensor(T, T, T, int64_t, int64_t, int64_t, double)>(
        "mqbench::fake_quantize_dsq_per_channel");
    ctx->save_for_backward({x, scale, zero_point});
    ctx->saved_data["ch_axis"] = ch_axis;
    ctx->saved_data["qmin"] = qmin;
    ctx->saved_data["qmax"] = qmax;
    ctx->saved_data["alpha"] = alpha;
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(x, scale, zero_point, ch_axis, qmin, qmax, alpha);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto op =
        detail::op_handle<at::Tensor(T, T, T, T, int64_t, int64_t, int64_t, double)>(
            "mqbench::_fake_quantize_dsq_per_channel_backward");
    const auto s = ctx->get_saved_variables();
    auto dx = op.call(grads[0], s[0], s[1], s[2], ctx->saved_data["ch_axis"].toInt(),
                      ctx->saved_data["qmin"].toInt(), ctx->saved_data["qmax"].toInt(),
                      ctx->saved_data["alpha"].toDouble());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

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
